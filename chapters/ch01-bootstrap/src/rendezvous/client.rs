//! The other ranks' side of the rendezvous: look for rank 0 along the port window, say
//! hello, wait for the id (the protocol: the parent module's header).

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::{Instant, sleep, timeout_at};

use super::{
    HELLO_BYTES, MAGIC, MAX_MESSAGE_BYTES, PROBE_TIMEOUT, PROTOCOL, RETRY_INTERVAL,
    RendezvousConfig, RendezvousError, STATUS_ACCEPTED, STATUS_ERROR, STATUS_OK, STATUS_OTHER_JOB,
    read_exact,
};

pub(super) async fn fetch(
    config: &RendezvousConfig,
    deadline: Instant,
) -> Result<Vec<u8>, RendezvousError> {
    let mut last_error = String::from("no attempt finished");
    loop {
        for port in config.ports() {
            let addr = format!("{}:{port}", config.master_addr);
            match probe(config, &addr, deadline).await? {
                Probe::Found(payload) => return Ok(payload),
                Probe::Elsewhere(why) => last_error = why,
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

/// What one port of the window turned out to be.
enum Probe {
    /// Our rank 0's answer: the payload.
    Found(Vec<u8>),
    /// Not our rank 0 (nothing listening, another job, silence or garbage), and why.
    Elsewhere(String),
}

/// Says hello on `addr`. With one port there is nowhere else to look: every wait runs to the
/// deadline and anything odd is an error. With several, a port that does not connect and say
/// "accepted" (or give the id) within PROBE_TIMEOUT is someone else's; once our rank 0 has
/// accepted us, waits and errors are as with one port.
async fn probe(
    config: &RendezvousConfig,
    addr: &str,
    deadline: Instant,
) -> Result<Probe, RendezvousError> {
    let strict = config.num_ports <= 1;
    let step = || {
        if strict {
            deadline
        } else {
            deadline.min(Instant::now() + PROBE_TIMEOUT)
        }
    };
    let mut stream = match timeout_at(step(), TcpStream::connect(addr)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(error)) => {
            // Name resolution failures will not fix themselves: fail now.
            if error.kind() == std::io::ErrorKind::InvalidInput
                || error.to_string().contains("failed to lookup")
            {
                return Err(RendezvousError::Resolve {
                    addr: addr.into(),
                    reason: error.to_string(),
                });
            }
            return Ok(Probe::Elsewhere(error.to_string()));
        }
        Err(_elapsed) => return Ok(Probe::Elsewhere(format!("{addr}: no connection"))),
    };
    let mut hello = Vec::with_capacity(HELLO_BYTES);
    hello.extend_from_slice(MAGIC);
    hello.extend_from_slice(&PROTOCOL.to_le_bytes());
    hello.extend_from_slice(&(config.rank as u32).to_le_bytes());
    hello.extend_from_slice(&(config.world_size as u32).to_le_bytes());
    hello.extend_from_slice(&config.job.to_le_bytes());
    if let Err(source) = stream.write_all(&hello).await {
        return Ok(Probe::Elsewhere(format!("{addr}: {source}")));
    }
    let no_reply = || RendezvousError::NoReply {
        addr: addr.into(),
        timeout: config.timeout,
    };
    let first = match timeout_at(step(), read_reply(&mut stream, addr)).await {
        Ok(Ok(reply)) => reply,
        // Rank 0 of this job refused us: a misconfiguration, wherever we found it.
        Ok(Err(error @ RendezvousError::Rejected(_))) => return Err(error),
        Ok(Err(error)) if strict => return Err(error),
        Ok(Err(error)) => return Ok(Probe::Elsewhere(error.to_string())),
        Err(_elapsed) if strict => return Err(no_reply()),
        Err(_elapsed) => {
            return Ok(Probe::Elsewhere(format!(
                "{addr} did not answer within {PROBE_TIMEOUT:?}"
            )));
        }
    };
    match first {
        Reply::Payload(payload) => Ok(Probe::Found(payload)),
        Reply::OtherJob(note) => Ok(Probe::Elsewhere(note)),
        Reply::Accepted => match timeout_at(deadline, read_reply(&mut stream, addr)).await {
            Ok(Ok(Reply::Payload(payload))) => Ok(Probe::Found(payload)),
            Ok(Ok(_)) => Err(RendezvousError::Malformed {
                peer: addr.into(),
                detail: "a second status after 'accepted' instead of the id".into(),
            }),
            Ok(Err(error)) => Err(error),
            Err(_elapsed) => Err(no_reply()),
        },
    }
}

/// One reply from rank 0 (status 1, an error, comes back as `Err(Rejected)`).
enum Reply {
    Payload(Vec<u8>),
    Accepted,
    OtherJob(String),
}

async fn read_reply(stream: &mut TcpStream, peer: &str) -> Result<Reply, RendezvousError> {
    let mut header = [0u8; 9];
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
    let len = u32::from_le_bytes(header[5..9].try_into().unwrap());
    if len > MAX_MESSAGE_BYTES {
        return Err(RendezvousError::Malformed {
            peer: peer.into(),
            detail: format!("announced {len} bytes, more than the {MAX_MESSAGE_BYTES} allowed"),
        });
    }
    let mut body = vec![0u8; len as usize];
    read_exact(stream, &mut body, peer).await?;
    let text = |body: &[u8]| String::from_utf8_lossy(body).into_owned();
    match header[4] {
        STATUS_OK => Ok(Reply::Payload(body)),
        STATUS_ACCEPTED => Ok(Reply::Accepted),
        STATUS_OTHER_JOB => Ok(Reply::OtherJob(text(&body))),
        STATUS_ERROR => Err(RendezvousError::Rejected(text(&body))),
        other => Err(RendezvousError::Malformed {
            peer: peer.into(),
            detail: format!("unknown status byte {other}"),
        }),
    }
}
