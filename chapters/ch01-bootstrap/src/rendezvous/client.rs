//! The other ranks' side of the rendezvous: look for rank 0 along MASTER_ADDR's addresses and
//! the port window, prove the job token both ways, wait for the id (the protocol and the
//! threat model: the parent module's header).

use std::net::SocketAddr;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::{Instant, sleep, timeout_at};

use super::{
    HELLO_BYTES, MAGIC, MAX_MESSAGE_BYTES, NONCE_BYTES, PROBE_TIMEOUT, PROTOCOL,
    REPLY_HEADER_BYTES, RETRY_INTERVAL, RendezvousConfig, RendezvousError, Role, STATUS_ACCEPTED,
    STATUS_CHALLENGE, STATUS_ERROR, STATUS_OK, STATUS_OTHER_JOB, STATUS_PROOF, TAG_BYTES,
    Transcript, random_nonce, read_exact, resolve,
};

pub(super) async fn fetch(
    config: &RendezvousConfig,
    deadline: Instant,
) -> Result<Vec<u8>, RendezvousError> {
    let ips = resolve(&config.master_addr, deadline).await?;
    // With one place to look, there is nowhere else to go: every wait runs to the deadline.
    let strict = config.num_ports <= 1 && ips.len() == 1;
    let mut last_error = String::from("no attempt finished");
    loop {
        for port in config.ports() {
            for &ip in &ips {
                match probe(config, SocketAddr::new(ip, port), strict, deadline).await? {
                    Probe::Found(payload) => return Ok(payload),
                    Probe::Elsewhere(why) => last_error = why,
                }
            }
        }
        if Instant::now() + RETRY_INTERVAL >= deadline {
            let addr = if config.num_ports > 1 {
                format!(
                    "{}:{}..={}",
                    config.master_addr,
                    config.port,
                    config.last_port()
                )
            } else {
                format!("{}:{}", config.master_addr, config.port)
            };
            return Err(RendezvousError::Unreachable {
                addr,
                timeout: config.timeout,
                last_error,
            });
        }
        sleep(RETRY_INTERVAL).await;
    }
}

/// What one address and port turned out to be.
enum Probe {
    /// Our rank 0's answer: the payload.
    Found(Vec<u8>),
    /// Not our rank 0 (nothing listening, another job, silence, garbage, no proof), and why.
    Elsewhere(String),
}

/// Runs the handshake with whatever listens on `addr`. Strict (one place to look): every wait
/// runs to the deadline and anything odd is an error. Otherwise a port that does not connect
/// and send a challenge within PROBE_TIMEOUT is someone else's. Either way an answer that does
/// not prove the job token is someone else's; once it has, waits and errors are as when strict.
async fn probe(
    config: &RendezvousConfig,
    addr: SocketAddr,
    strict: bool,
    deadline: Instant,
) -> Result<Probe, RendezvousError> {
    let peer = addr.to_string();
    let step = || {
        if strict {
            deadline
        } else {
            deadline.min(Instant::now() + PROBE_TIMEOUT)
        }
    };
    let elsewhere = |error: RendezvousError| {
        if strict {
            Err(error)
        } else {
            Ok(Probe::Elsewhere(error.to_string()))
        }
    };
    let mut stream = match timeout_at(step(), TcpStream::connect(addr)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(error)) => return Ok(Probe::Elsewhere(format!("{peer}: {error}"))),
        Err(_elapsed) => return Ok(Probe::Elsewhere(format!("{peer}: no connection"))),
    };
    let nonce_rank = random_nonce();
    let mut hello = Vec::with_capacity(HELLO_BYTES);
    hello.extend_from_slice(MAGIC);
    hello.extend_from_slice(&PROTOCOL.to_le_bytes());
    hello.extend_from_slice(&(config.rank as u32).to_le_bytes());
    hello.extend_from_slice(&(config.world_size as u32).to_le_bytes());
    hello.extend_from_slice(&nonce_rank);
    match timeout_at(step(), stream.write_all(&hello)).await {
        Ok(Ok(())) => {}
        Ok(Err(source)) => return Ok(Probe::Elsewhere(format!("{peer}: {source}"))),
        Err(_elapsed) => return Ok(Probe::Elsewhere(format!("{peer}: hello not taken"))),
    }
    let challenge = match timeout_at(step(), read_reply(&mut stream, &peer)).await {
        Ok(Ok(reply)) => reply,
        Ok(Err(error)) => return elsewhere(error),
        Err(_elapsed) if strict => return Err(no_reply(config, &peer)),
        Err(_elapsed) => {
            return Ok(Probe::Elsewhere(format!(
                "{peer} did not answer within {PROBE_TIMEOUT:?}"
            )));
        }
    };
    // ANCHOR: challenge
    let nonce_root = match challenge.status {
        STATUS_CHALLENGE => match <[u8; NONCE_BYTES]>::try_from(challenge.body.as_slice()) {
            Ok(nonce) => nonce,
            Err(_) => return elsewhere(malformed(&peer, "a challenge of the wrong length")),
        },
        STATUS_OTHER_JOB => return Ok(Probe::Elsewhere(challenge.text())),
        STATUS_ERROR => return elsewhere(RendezvousError::Rejected(challenge.text())),
        _ => {
            return elsewhere(malformed(
                &peer,
                "a reply before any proof of the job token",
            ));
        }
    };
    let transcript = Transcript {
        port: addr.port(),
        rank: config.rank as u32,
        world_size: config.world_size as u32,
        nonce_rank,
        nonce_root,
    };
    let (job, body) = (&config.job, &challenge.body);
    if !transcript.verify(job, Role::Root, STATUS_CHALLENGE, body, &challenge.tag) {
        return Ok(Probe::Elsewhere(format!(
            "{peer} answered without proving this job's token (another job's rank 0, or no \
             rank 0 at all)"
        )));
    }
    // Our rank 0: prove the token back, then trust only replies that carry its tag.
    let proof = transcript.tag(job, Role::Rank, STATUS_PROOF, &[]);
    // ANCHOR_END: challenge
    match timeout_at(deadline, stream.write_all(&proof)).await {
        Ok(Ok(())) => {}
        Ok(Err(source)) => return Err(RendezvousError::Io { peer, source }),
        Err(_elapsed) => return Err(no_reply(config, &peer)),
    }
    receive_id(config, (&mut stream, &peer), &transcript, deadline).await
}

/// After the handshake with our rank 0: at most one "accepted", then the id, each carrying
/// rank 0's tag over `transcript`; anything else, or nothing by `deadline`, is an error.
async fn receive_id(
    config: &RendezvousConfig,
    (stream, peer): (&mut TcpStream, &str),
    transcript: &Transcript,
    deadline: Instant,
) -> Result<Probe, RendezvousError> {
    let mut accepted = false;
    loop {
        let reply = match timeout_at(deadline, read_reply(stream, peer)).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(error)) => return Err(error),
            Err(_elapsed) => return Err(no_reply(config, peer)),
        };
        let job = &config.job;
        if !transcript.verify(job, Role::Root, reply.status, &reply.body, &reply.tag) {
            return Err(malformed(
                peer,
                "a reply without rank 0's tag after the handshake",
            ));
        }
        match reply.status {
            STATUS_ACCEPTED if !accepted => accepted = true,
            STATUS_OK => return Ok(Probe::Found(reply.body)),
            STATUS_ERROR => return Err(RendezvousError::Rejected(reply.text())),
            _ => return Err(malformed(peer, "another status instead of the id")),
        }
    }
}

fn no_reply(config: &RendezvousConfig, peer: &str) -> RendezvousError {
    RendezvousError::NoReply {
        addr: peer.into(),
        timeout: config.timeout,
    }
}

fn malformed(peer: &str, detail: &str) -> RendezvousError {
    RendezvousError::Malformed {
        peer: peer.into(),
        detail: detail.into(),
    }
}

/// One reply from rank 0, its tag not yet checked.
struct Reply {
    status: u8,
    body: Vec<u8>,
    tag: [u8; TAG_BYTES],
}

impl Reply {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

async fn read_reply(stream: &mut TcpStream, peer: &str) -> Result<Reply, RendezvousError> {
    let mut header = [0u8; REPLY_HEADER_BYTES];
    read_exact(stream, &mut header, peer).await?;
    if &header[..4] != MAGIC {
        return Err(RendezvousError::Malformed {
            peer: peer.into(),
            detail: format!(
                "expected magic {MAGIC:?}, got {:?}; is something else listening on that port?",
                &header[..4]
            ),
        });
    }
    let status = header[4];
    if !(STATUS_OK..=STATUS_CHALLENGE).contains(&status) {
        return Err(RendezvousError::Malformed {
            peer: peer.into(),
            detail: format!("unknown status byte {status}"),
        });
    }
    let len = u32::from_le_bytes(header[5..9].try_into().unwrap());
    if len > MAX_MESSAGE_BYTES {
        return Err(RendezvousError::Malformed {
            peer: peer.into(),
            detail: format!("announced {len} bytes, more than the {MAX_MESSAGE_BYTES} allowed"),
        });
    }
    let mut body = vec![0u8; len as usize];
    read_exact(stream, &mut body, peer).await?;
    let mut tag = [0u8; TAG_BYTES];
    read_exact(stream, &mut tag, peer).await?;
    Ok(Reply { status, body, tag })
}
