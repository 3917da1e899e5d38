//! Moving NVSHMEM's unique id from rank 0 to every other rank over TCP.
//!
//! NVSHMEM cannot bootstrap itself from nothing: its processes first need one shared secret,
//! the 128-byte unique id that rank 0 creates (it encodes rank 0's bootstrap address). MPI
//! or a PMI server would carry it; under torchrun we carry it ourselves:
//!
//! ```text
//! rank 0: listen on rdzv_port ─┬─ accept rank 1: hello(rank=1, world=N) ─┐
//!                              ├─ accept rank 2: hello(rank=2, world=N) ─┤ all N-1 here?
//!                              └─ ...                                     ┘ reply id to each
//! rank k: connect (retrying until rank 0 listens), send hello, read the id
//! ```
//!
//! Every wait is bounded by one deadline. Whatever goes wrong (a peer that never comes, two
//! processes claiming one rank, a rank from another job, garbage on the socket) ends in an
//! error that says what happened and, where rank 0 knows it, is also sent to the peers so
//! they fail at once instead of waiting out their own timeout.
//!
//! Wire format (all integers little-endian):
//! ```text
//! hello  = "NVTR" | u16 protocol | u32 rank | u32 world_size          (14 bytes)
//! reply  = "NVTR" | u8 status | u32 len | len bytes                    (status 0: payload,
//!                                                                       status 1: UTF-8 error)
//! ```

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, sleep, timeout_at};

const MAGIC: &[u8; 4] = b"NVTR";
const PROTOCOL: u16 = 1;
const HELLO_BYTES: usize = 14;
const STATUS_OK: u8 = 0;
const STATUS_ERROR: u8 = 1;
/// Largest payload or error message accepted: a unique id is 128 bytes.
const MAX_MESSAGE_BYTES: u32 = 64 * 1024;
/// Pause between connection attempts while rank 0 is not listening yet.
const RETRY_INTERVAL: Duration = Duration::from_millis(100);

/// Who takes part and how long anyone waits.
#[derive(Debug, Clone)]
pub struct RendezvousConfig {
    pub rank: usize,
    pub world_size: usize,
    /// Rank 0's host (MASTER_ADDR).
    pub master_addr: String,
    pub port: u16,
    pub timeout: Duration,
}

/// What went wrong, with enough context to fix it.
#[derive(Debug, thiserror::Error)]
pub enum RendezvousError {
    #[error(
        "rank 0 cannot listen on port {port}: {source}. Another job may hold it: set \
         NVSHMEM_TUTORIAL_RDZV_PORT to a free port on every rank"
    )]
    Bind {
        port: u16,
        #[source]
        source: io::Error,
    },
    #[error(
        "rank 0 at {addr} was unreachable for {timeout:?} (last error: {last_error}). Is rank 0 \
         running, is MASTER_ADDR right, and does every rank use the same \
         NVSHMEM_TUTORIAL_RDZV_PORT?"
    )]
    Unreachable {
        addr: String,
        timeout: Duration,
        last_error: String,
    },
    #[error("cannot resolve MASTER_ADDR {addr:?}: {reason}")]
    Resolve { addr: String, reason: String },
    #[error(
        "rank 0 gave up after {timeout:?}: rank(s) {missing:?} of {world_size} never connected. \
         Did every process start, with the same MASTER_ADDR and port?"
    )]
    PeersMissing {
        missing: Vec<usize>,
        world_size: usize,
        timeout: Duration,
    },
    #[error("connected to rank 0 at {addr}, but no reply came within {timeout:?}")]
    NoReply { addr: String, timeout: Duration },
    #[error("rank 0 refused this rank: {0}")]
    Rejected(String),
    #[error("the job is misconfigured: {0}")]
    Conflict(String),
    #[error("malformed rendezvous data from {peer}: {detail}")]
    Malformed { peer: String, detail: String },
    #[error(
        "connection to {peer} closed after {received} of {expected} bytes (did the peer exit?)"
    )]
    Truncated {
        peer: String,
        received: usize,
        expected: usize,
    },
    #[error("rendezvous I/O with {peer} failed: {source}")]
    Io {
        peer: String,
        #[source]
        source: io::Error,
    },
}

// ANCHOR: broadcast
/// Rank 0 passes `Some(payload)` and serves it to every other rank; the others pass `None`
/// and receive it. Returns the payload on every rank, or an error within `config.timeout`.
pub fn broadcast_from_rank0(
    config: &RendezvousConfig,
    payload: Option<&[u8]>,
) -> Result<Vec<u8>, RendezvousError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| RendezvousError::Io {
            peer: "tokio runtime".into(),
            source,
        })?;
    let deadline = Instant::now() + config.timeout;
    runtime.block_on(async {
        match (config.rank, payload) {
            (0, Some(payload)) => serve(config, payload, deadline)
                .await
                .map(|()| payload.to_vec()),
            (0, None) => Err(RendezvousError::Conflict(
                "rank 0 must provide the payload".into(),
            )),
            (_, _) => fetch(config, deadline).await,
        }
    })
}
// ANCHOR_END: broadcast

/// One accepted peer that sent a valid hello.
struct Peer {
    stream: TcpStream,
    addr: SocketAddr,
}

async fn serve(
    config: &RendezvousConfig,
    payload: &[u8],
    deadline: Instant,
) -> Result<(), RendezvousError> {
    // Listen on every interface: MASTER_ADDR names this host as the others see it, which
    // need not be an address of a local interface (NAT, DNS aliases).
    let listener = TcpListener::bind(("0.0.0.0", config.port))
        .await
        .map_err(|source| RendezvousError::Bind {
            port: config.port,
            source,
        })?;
    let mut peers: BTreeMap<usize, Peer> = BTreeMap::new();
    let expected = config.world_size - 1;
    while peers.len() < expected {
        let accepted = timeout_at(deadline, listener.accept()).await;
        let (mut stream, addr) = match accepted {
            Err(_elapsed) => {
                let missing: Vec<usize> = (1..config.world_size)
                    .filter(|r| !peers.contains_key(r))
                    .collect();
                let error = RendezvousError::PeersMissing {
                    missing,
                    world_size: config.world_size,
                    timeout: config.timeout,
                };
                reject_all(peers, &error.to_string()).await;
                return Err(error);
            }
            Ok(Err(source)) => {
                return Err(RendezvousError::Io {
                    peer: "listener".into(),
                    source,
                });
            }
            Ok(Ok(conn)) => conn,
        };
        let peer = addr.to_string();
        let hello = match timeout_at(deadline, read_hello(&mut stream, &peer)).await {
            Ok(Ok(hello)) => hello,
            // A stray connection (a port scanner, a client of some other service) must not
            // take the job down: tell it, drop it, keep waiting for real ranks.
            Ok(Err(error)) => {
                eprintln!("rendezvous: ignoring connection from {peer}: {error}");
                let _ = write_reply(&mut stream, STATUS_ERROR, error.to_string().as_bytes()).await;
                continue;
            }
            Err(_elapsed) => continue,
        };
        // From here on the peer is a rank of some job: a mismatch is a misconfiguration
        // that would otherwise hang the whole job, so it fails everyone.
        let conflict = if hello.world_size != config.world_size {
            Some(format!(
                "rank {} from {peer} says WORLD_SIZE={}, rank 0 has WORLD_SIZE={}",
                hello.rank, hello.world_size, config.world_size
            ))
        } else if hello.rank == 0 || hello.rank >= config.world_size {
            Some(format!(
                "a process at {peer} claims rank {} (valid: 1..{})",
                hello.rank, config.world_size
            ))
        } else {
            peers.get(&hello.rank).map(|first| {
                format!(
                    "two processes claim rank {}: {} and {peer}",
                    hello.rank, first.addr
                )
            })
        };
        if let Some(detail) = conflict {
            let error = RendezvousError::Conflict(detail);
            let message = error.to_string();
            let _ = write_reply(&mut stream, STATUS_ERROR, message.as_bytes()).await;
            reject_all(peers, &message).await;
            return Err(error);
        }
        peers.insert(hello.rank, Peer { stream, addr });
    }
    for (rank, mut peer) in peers {
        write_reply(&mut peer.stream, STATUS_OK, payload)
            .await
            .map_err(|source| RendezvousError::Io {
                peer: format!("rank {rank} at {}", peer.addr),
                source,
            })?;
    }
    Ok(())
}

async fn reject_all(peers: BTreeMap<usize, Peer>, message: &str) {
    for (_, mut peer) in peers {
        let _ = write_reply(&mut peer.stream, STATUS_ERROR, message.as_bytes()).await;
    }
}

struct Hello {
    rank: usize,
    world_size: usize,
}

async fn read_hello(stream: &mut TcpStream, peer: &str) -> Result<Hello, RendezvousError> {
    let mut buf = [0u8; HELLO_BYTES];
    read_exact(stream, &mut buf, peer).await?;
    if &buf[..4] != MAGIC {
        return Err(RendezvousError::Malformed {
            peer: peer.into(),
            detail: format!("expected magic {MAGIC:?}, got {:?}", &buf[..4]),
        });
    }
    let protocol = u16::from_le_bytes([buf[4], buf[5]]);
    if protocol != PROTOCOL {
        return Err(RendezvousError::Malformed {
            peer: peer.into(),
            detail: format!("protocol {protocol}, expected {PROTOCOL} (mixed builds?)"),
        });
    }
    Ok(Hello {
        rank: u32::from_le_bytes(buf[6..10].try_into().unwrap()) as usize,
        world_size: u32::from_le_bytes(buf[10..14].try_into().unwrap()) as usize,
    })
}

async fn write_reply(stream: &mut TcpStream, status: u8, body: &[u8]) -> io::Result<()> {
    let mut message = Vec::with_capacity(9 + body.len());
    message.extend_from_slice(MAGIC);
    message.push(status);
    message.extend_from_slice(&(body.len() as u32).to_le_bytes());
    message.extend_from_slice(body);
    stream.write_all(&message).await?;
    stream.flush().await
}

async fn fetch(config: &RendezvousConfig, deadline: Instant) -> Result<Vec<u8>, RendezvousError> {
    let addr = format!("{}:{}", config.master_addr, config.port);
    let mut stream = connect_with_retry(&addr, config.timeout, deadline).await?;
    let mut hello = Vec::with_capacity(HELLO_BYTES);
    hello.extend_from_slice(MAGIC);
    hello.extend_from_slice(&PROTOCOL.to_le_bytes());
    hello.extend_from_slice(&(config.rank as u32).to_le_bytes());
    hello.extend_from_slice(&(config.world_size as u32).to_le_bytes());
    stream
        .write_all(&hello)
        .await
        .map_err(|source| RendezvousError::Io {
            peer: addr.clone(),
            source,
        })?;
    match timeout_at(deadline, read_reply(&mut stream, &addr)).await {
        Ok(reply) => reply,
        Err(_elapsed) => Err(RendezvousError::NoReply {
            addr,
            timeout: config.timeout,
        }),
    }
}

async fn connect_with_retry(
    addr: &str,
    timeout: Duration,
    deadline: Instant,
) -> Result<TcpStream, RendezvousError> {
    let mut last_error = String::from("no attempt finished");
    loop {
        match timeout_at(deadline, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => return Ok(stream),
            Ok(Err(error)) => {
                // Name resolution failures will not fix themselves: fail now.
                if error.kind() == io::ErrorKind::InvalidInput
                    || error.to_string().contains("failed to lookup")
                {
                    return Err(RendezvousError::Resolve {
                        addr: addr.into(),
                        reason: error.to_string(),
                    });
                }
                last_error = error.to_string();
            }
            Err(_elapsed) => {}
        }
        if Instant::now() + RETRY_INTERVAL >= deadline {
            return Err(RendezvousError::Unreachable {
                addr: addr.into(),
                timeout,
                last_error,
            });
        }
        sleep(RETRY_INTERVAL).await;
    }
}

async fn read_reply(stream: &mut TcpStream, peer: &str) -> Result<Vec<u8>, RendezvousError> {
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
    match header[4] {
        STATUS_OK => Ok(body),
        STATUS_ERROR => Err(RendezvousError::Rejected(
            String::from_utf8_lossy(&body).into_owned(),
        )),
        other => Err(RendezvousError::Malformed {
            peer: peer.into(),
            detail: format!("unknown status byte {other}"),
        }),
    }
}

/// `read_exact` that reports how far it got when the peer hangs up.
async fn read_exact(
    stream: &mut TcpStream,
    buf: &mut [u8],
    peer: &str,
) -> Result<(), RendezvousError> {
    let mut filled = 0;
    while filled < buf.len() {
        match stream.read(&mut buf[filled..]).await {
            Ok(0) => {
                return Err(RendezvousError::Truncated {
                    peer: peer.into(),
                    received: filled,
                    expected: buf.len(),
                });
            }
            Ok(n) => filled += n,
            Err(source) => {
                return Err(RendezvousError::Io {
                    peer: peer.into(),
                    source,
                });
            }
        }
    }
    Ok(())
}
