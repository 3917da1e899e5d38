//! Rank 0's side of the rendezvous: listen on MASTER_ADDR, run each connection's handshake in
//! a task of its own, and serve the payload once every rank has proved it belongs to the job
//! (the protocol and the threat model: the parent module's header).

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep, sleep_until, timeout_at};

use super::{
    HELLO_BYTES, MAGIC, MAX_HANDSHAKES, NONCE_BYTES, PROBE_TIMEOUT, PROTOCOL, REPLY_HEADER_BYTES,
    RETRY_INTERVAL, RendezvousConfig, RendezvousError, Role, STATUS_ACCEPTED, STATUS_CHALLENGE,
    STATUS_ERROR, STATUS_OK, STATUS_OTHER_JOB, STATUS_PROOF, TAG_BYTES, Transcript, random_nonce,
    read_exact, resolve,
};
use crate::launch_env::JobToken;

/// A connection that proved the job token: a rank of this job, whose hello is still to be
/// checked against rank 0's and the other ranks'.
struct Member {
    stream: TcpStream,
    addr: SocketAddr,
    transcript: Transcript,
}

pub(super) async fn serve(
    config: &RendezvousConfig,
    payload: &[u8],
    deadline: Instant,
) -> Result<(), RendezvousError> {
    let listener = bind(config, deadline).await?;
    let port = listener
        .local_addr()
        .map_err(|source| RendezvousError::Io {
            peer: "listener".into(),
            source,
        })?
        .port();
    let mut members: BTreeMap<usize, Member> = BTreeMap::new();
    let mut handshakes = JoinSet::new();
    while members.len() < config.world_size - 1 {
        tokio::select! {
            // At MAX_HANDSHAKES, new connections wait in the backlog until one finishes.
            accepted = listener.accept(), if handshakes.len() < MAX_HANDSHAKES => match accepted {
                Ok((stream, addr)) => {
                    let by = deadline.min(Instant::now() + PROBE_TIMEOUT);
                    handshakes.spawn(handshake(stream, addr, config.job, port, by));
                }
                // Out of descriptors, or a connection reset before we took it: the listener
                // itself is fine, and the ranks retry.
                Err(error) => {
                    eprintln!("rendezvous: accepting a connection failed: {error}");
                    sleep(RETRY_INTERVAL).await;
                }
            },
            Some(done) = handshakes.join_next() => match done {
                Ok(Ok(member)) => admit(config, &mut members, member).await?,
                // A stray connection (a port scanner, a client of some other service, a rank
                // of another job) must not take the job down: drop it, keep waiting.
                Ok(Err((addr, reason))) => {
                    eprintln!("rendezvous: ignoring connection from {addr}: {reason}");
                }
                Err(error) => eprintln!("rendezvous: a handshake task failed: {error}"),
            },
            () = sleep_until(deadline) => {
                let missing: Vec<usize> = (1..config.world_size)
                    .filter(|r| !members.contains_key(r))
                    .collect();
                let error = RendezvousError::PeersMissing {
                    missing,
                    world_size: config.world_size,
                    timeout: config.timeout,
                };
                reject_all(&config.job, members.into_values(), &error.to_string()).await;
                return Err(error);
            }
        }
    }
    // Handshakes still running are strays: dropping the set closes them.
    drop(handshakes);
    let mut failed = None;
    let sent = timeout_at(Instant::now() + PROBE_TIMEOUT, async {
        for (rank, mut member) in members {
            let reply = frame(&config.job, Some(&member.transcript), STATUS_OK, payload);
            if let Err(source) = send(&mut member.stream, &reply).await {
                failed.get_or_insert(RendezvousError::Io {
                    peer: format!("rank {rank} at {}", member.addr),
                    source,
                });
            }
        }
    })
    .await;
    match (failed, sent) {
        (Some(error), _) => Err(error),
        (None, Err(_elapsed)) => Err(RendezvousError::Io {
            peer: "a rank".into(),
            source: io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the id could not be sent within {PROBE_TIMEOUT:?}"),
            ),
        }),
        (None, Ok(())) => Ok(()),
    }
}

/// Takes a rank that proved the token into the job, or fails everyone on a misconfiguration
/// that would otherwise hang the whole job.
async fn admit(
    config: &RendezvousConfig,
    members: &mut BTreeMap<usize, Member>,
    mut member: Member,
) -> Result<(), RendezvousError> {
    let (rank, world_size) = (
        member.transcript.rank as usize,
        member.transcript.world_size as usize,
    );
    let peer = member.addr;
    let conflict = if world_size != config.world_size {
        Some(format!(
            "rank {rank} from {peer} says WORLD_SIZE={world_size}, rank 0 has WORLD_SIZE={}",
            config.world_size
        ))
    } else if rank == 0 || rank >= config.world_size {
        Some(format!(
            "a process at {peer} claims rank {rank} (valid: 1..{})",
            config.world_size
        ))
    } else {
        members
            .get(&rank)
            .map(|first| format!("two processes claim rank {rank}: {} and {peer}", first.addr))
    };
    if let Some(detail) = conflict {
        let error = RendezvousError::Conflict(detail);
        let message = error.to_string();
        let everyone = std::mem::take(members).into_values().chain([member]);
        reject_all(&config.job, everyone, &message).await;
        return Err(error);
    }
    // Accepted at once, so that the rank stops looking at other ports; the id follows when
    // every rank is here. A rank that has gone away fails at that later write.
    let reply = frame(&config.job, Some(&member.transcript), STATUS_ACCEPTED, &[]);
    let _ = timeout_at(
        Instant::now() + PROBE_TIMEOUT,
        send(&mut member.stream, &reply),
    )
    .await;
    members.insert(rank, member);
    Ok(())
}

/// One connection's handshake, within `by`: hello, challenge, proof. Returns the member, or
/// why the connection is not one.
async fn handshake(
    mut stream: TcpStream,
    addr: SocketAddr,
    job: JobToken,
    port: u16,
    by: Instant,
) -> Result<Member, (SocketAddr, String)> {
    let outcome = timeout_at(by, async {
        let result = challenge(&mut stream, &addr.to_string(), &job, port).await;
        if let Err((status, reason)) = &result {
            // Tell it why (untagged: it has proved nothing), so that a rank of another job
            // goes on to its next port and a mixed build learns what is wrong.
            let _ = send(&mut stream, &frame(&job, None, *status, reason.as_bytes())).await;
        }
        result
    })
    .await;
    match outcome {
        Ok(Ok(transcript)) => Ok(Member {
            stream,
            addr,
            transcript,
        }),
        Ok(Err((_status, reason))) => Err((addr, reason)),
        Err(_elapsed) => Err((
            addr,
            format!("no complete handshake within {PROBE_TIMEOUT:?}"),
        )),
    }
}

/// Reads the hello, answers with a tagged challenge, checks the proof: the only bytes rank 0
/// reads from a connection before it is known to be a rank of this job.
async fn challenge(
    stream: &mut TcpStream,
    peer: &str,
    job: &JobToken,
    port: u16,
) -> Result<Transcript, (u8, String)> {
    let failed = |error: RendezvousError| (STATUS_ERROR, error.to_string());
    let mut hello = [0u8; HELLO_BYTES];
    // Magic and protocol first: a hello of another protocol has another length.
    read_exact(stream, &mut hello[..6], peer)
        .await
        .map_err(failed)?;
    let protocol = u16::from_le_bytes([hello[4], hello[5]]);
    let malformed = |detail: String| {
        failed(RendezvousError::Malformed {
            peer: peer.into(),
            detail,
        })
    };
    if &hello[..4] != MAGIC {
        return Err(malformed(format!(
            "expected magic {MAGIC:?}, got {:?}",
            &hello[..4]
        )));
    }
    if protocol != PROTOCOL {
        return Err(malformed(format!(
            "protocol {protocol}, expected {PROTOCOL} (mixed builds?)"
        )));
    }
    read_exact(stream, &mut hello[6..], peer)
        .await
        .map_err(failed)?;
    let transcript = Transcript {
        port,
        rank: u32::from_le_bytes(hello[6..10].try_into().unwrap()),
        world_size: u32::from_le_bytes(hello[10..14].try_into().unwrap()),
        nonce_rank: hello[14..].try_into().unwrap(),
        nonce_root: random_nonce(),
    };
    let nonce: [u8; NONCE_BYTES] = transcript.nonce_root;
    let reply = frame(job, Some(&transcript), STATUS_CHALLENGE, &nonce);
    send(stream, &reply).await.map_err(|source| {
        failed(RendezvousError::Io {
            peer: peer.into(),
            source,
        })
    })?;
    let mut proof = [0u8; TAG_BYTES];
    read_exact(stream, &mut proof, peer)
        .await
        .map_err(|error| match error {
            // The usual end of a rank of another job: our challenge did not prove its token.
            RendezvousError::Truncated { received: 0, .. } => (
                STATUS_OTHER_JOB,
                "closed instead of proving the job token (a rank of another job?)".into(),
            ),
            error => failed(error),
        })?;
    if !transcript.verify(job, Role::Rank, STATUS_PROOF, &[], &proof) {
        return Err((
            STATUS_OTHER_JOB,
            format!(
                "this is another job's rendezvous (at {peer}): the proof of the job token does \
                 not match"
            ),
        ));
    }
    Ok(transcript)
}

/// One reply: tagged by rank 0 when the connection has a transcript, zeros otherwise.
fn frame(job: &JobToken, transcript: Option<&Transcript>, status: u8, body: &[u8]) -> Vec<u8> {
    let mut message = Vec::with_capacity(REPLY_HEADER_BYTES + body.len() + TAG_BYTES);
    message.extend_from_slice(MAGIC);
    message.push(status);
    message.extend_from_slice(&(body.len() as u32).to_le_bytes());
    message.extend_from_slice(body);
    let tag = transcript.map_or([0; TAG_BYTES], |t| t.tag(job, Role::Root, status, body));
    message.extend_from_slice(&tag);
    message
}

async fn send(stream: &mut TcpStream, message: &[u8]) -> io::Result<()> {
    stream.write_all(message).await?;
    stream.flush().await
}

/// Sends `message` as a tagged error to every member, all of it within PROBE_TIMEOUT.
async fn reject_all(job: &JobToken, members: impl IntoIterator<Item = Member>, message: &str) {
    let _ = timeout_at(Instant::now() + PROBE_TIMEOUT, async {
        for mut member in members {
            let reply = frame(
                job,
                Some(&member.transcript),
                STATUS_ERROR,
                message.as_bytes(),
            );
            let _ = send(&mut member.stream, &reply).await;
        }
    })
    .await;
}

/// Rank 0's listener: on the first address MASTER_ADDR resolves to that belongs to this host,
/// on the first port of the window it can bind there. Not on every interface: a process that
/// can reach some other address of the host has no business with the rendezvous.
async fn bind(
    config: &RendezvousConfig,
    deadline: Instant,
) -> Result<TcpListener, RendezvousError> {
    let resolved = resolve(&config.master_addr, deadline).await?;
    // An address of another host cannot be bound (EADDRNOTAVAIL); port 0 takes no port.
    let Some(ip) = resolved
        .iter()
        .copied()
        .find(|&ip| std::net::TcpListener::bind((ip, 0)).is_ok())
    else {
        return Err(RendezvousError::NotLocal {
            addr: config.master_addr.clone(),
            resolved,
        });
    };
    let mut last_error = None;
    for port in config.ports() {
        match TcpListener::bind((ip, port)).await {
            Ok(listener) => return Ok(listener),
            // Taken by some other socket: the others will find us on a later port.
            Err(error) if error.kind() == io::ErrorKind::AddrInUse => last_error = Some(error),
            Err(source) => {
                return Err(RendezvousError::Bind {
                    first: port,
                    last: port,
                    source,
                });
            }
        }
    }
    Err(RendezvousError::Bind {
        first: config.port,
        last: config.last_port(),
        source: last_error.unwrap_or_else(|| io::Error::other("no port in the window")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn config(master_addr: &str) -> RendezvousConfig {
        RendezvousConfig {
            rank: 0,
            world_size: 2,
            master_addr: master_addr.into(),
            port: 0, // any free port
            num_ports: 1,
            job: JobToken::derive("run", master_addr, 29500),
            timeout: Duration::from_secs(5),
        }
    }

    fn bound(master_addr: &str) -> Result<TcpListener, RendezvousError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        runtime.block_on(bind(&config(master_addr), deadline))
    }

    #[test]
    fn rank_zero_listens_on_master_addr_not_on_every_interface() {
        let listener = bound("127.0.0.2").unwrap();
        let local = listener.local_addr().unwrap();
        assert_eq!(local.ip().to_string(), "127.0.0.2");
        // Another address of this host does not reach it.
        let refused = std::net::TcpStream::connect(("127.0.0.1", local.port()));
        assert!(refused.is_err(), "rank 0 answers on 127.0.0.1 too");
        for name in ["localhost", "127.0.0.1"] {
            let listener = bound(name).unwrap();
            assert!(listener.local_addr().unwrap().ip().is_loopback(), "{name}");
        }
    }

    #[test]
    fn a_master_addr_of_another_host_is_named_with_the_fix() {
        // 192.0.2.0/24 is reserved for documentation: no host has it. Binding sends nothing.
        let err = bound("192.0.2.1").unwrap_err();
        assert!(matches!(err, RendezvousError::NotLocal { .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("MASTER_ADDR=\"192.0.2.1\"") && text.contains("Set MASTER_ADDR"),
            "{text}"
        );
    }
}
