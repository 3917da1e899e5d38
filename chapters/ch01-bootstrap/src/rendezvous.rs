//! Moving NVSHMEM's unique id from rank 0 to every other rank over TCP.
//!
//! NVSHMEM cannot bootstrap itself from nothing: its processes first need one shared secret,
//! the 128-byte unique id that rank 0 creates (it encodes rank 0's bootstrap address). MPI
//! or a PMI server would carry it; under torchrun we carry it ourselves:
//!
//! ```text
//! rank 0: listen on the first free port ─┬─ rank 1: hello(rank=1, world=N, job) → accepted ─┐
//!                                        ├─ rank 2: hello(rank=2, world=N, job) → accepted ─┤ all N-1?
//!                                        └─ ...                                             ┘ id to each
//! rank k: connect to each port of the window in turn (retrying until rank 0 listens), send
//!         hello; "accepted" says this is our rank 0, "another job" says look further; read the id
//! ```
//!
//! The window is one port when NVSHMEM_TUTORIAL_RDZV_PORT fixes it, else MASTER_PORT + 1 and
//! the next ones (`LaunchEnv::rdzv_ports`): a port can be held by any socket of the host, and
//! rank 0 cannot tell the others which one it got except by being the one that answers.
//!
//! Every wait is bounded by one deadline. Whatever goes wrong (a peer that never comes, two
//! processes claiming one rank, a rank from another job, garbage on the socket) ends in an
//! error that says what happened and, where rank 0 knows it, is also sent to the peers so
//! they fail at once instead of waiting out their own timeout.
//!
//! Wire format (all integers little-endian):
//! ```text
//! hello  = "NVTR" | u16 protocol | u32 rank | u32 world_size | u64 job    (22 bytes)
//! reply  = "NVTR" | u8 status | u32 len | len bytes       status 0: the payload (last reply)
//!                                                         status 1: UTF-8 error (last reply)
//!                                                         status 2: accepted, wait (len 0)
//!                                                         status 3: another job: look elsewhere
//! ```

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, timeout_at};

mod client;

const MAGIC: &[u8; 4] = b"NVTR";
const PROTOCOL: u16 = 2;
const HELLO_BYTES: usize = 22;
const STATUS_OK: u8 = 0;
const STATUS_ERROR: u8 = 1;
const STATUS_ACCEPTED: u8 = 2;
const STATUS_OTHER_JOB: u8 = 3;
/// Largest payload or error message accepted: a unique id is 128 bytes.
const MAX_MESSAGE_BYTES: u32 = 64 * 1024;
/// Pause between connection attempts while rank 0 is not listening yet.
const RETRY_INTERVAL: Duration = Duration::from_millis(100);
/// With several ports to try: how long one connection attempt, and then rank 0's
/// "accepted", may take before the port is taken to be someone else's.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Who takes part and how long anyone waits.
#[derive(Debug, Clone)]
pub struct RendezvousConfig {
    pub rank: usize,
    pub world_size: usize,
    /// Rank 0's host (MASTER_ADDR).
    pub master_addr: String,
    /// Rank 0 listens on the first free port of `port .. port + num_ports`.
    pub port: u16,
    pub num_ports: u16,
    /// Equal on every rank of this job, different from other jobs' (`LaunchEnv::job_token`).
    pub job: u64,
    pub timeout: Duration,
}

impl RendezvousConfig {
    fn ports(&self) -> impl Iterator<Item = u16> + use<> {
        let first = self.port;
        (0..self.num_ports.max(1)).map_while(move |i| first.checked_add(i))
    }
    fn last_port(&self) -> u16 {
        self.ports().last().unwrap_or(self.port)
    }
}

/// What went wrong, with enough context to fix it.
#[derive(Debug, thiserror::Error)]
pub enum RendezvousError {
    #[error(
        "rank 0 cannot listen on port(s) {first}..={last}: {source}. Another job may hold them: \
         set NVSHMEM_TUTORIAL_RDZV_PORT to a free port on every rank"
    )]
    Bind {
        first: u16,
        last: u16,
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
            (_, _) => client::fetch(config, deadline).await,
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
    let listener = bind_first_free(config).await?;
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
        // A hello comes right after connecting; a silent connection must not hold up the job.
        let hello_by = deadline.min(Instant::now() + PROBE_TIMEOUT);
        let hello = match timeout_at(hello_by, read_hello(&mut stream, &peer)).await {
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
        // A rank of another job whose port window overlaps ours: not our business. It is
        // told so, and goes on to its next port.
        if hello.job != config.job {
            let note = format!("this is another job's rendezvous (at {peer})");
            let _ = write_reply(&mut stream, STATUS_OTHER_JOB, note.as_bytes()).await;
            continue;
        }
        // From here on the peer is a rank of this job: a mismatch is a misconfiguration
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
        // Accepted at once, so that the rank stops looking at other ports; the id follows
        // when every rank is here. A rank that has gone away fails at that later write.
        let _ = write_reply(&mut stream, STATUS_ACCEPTED, &[]).await;
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

/// Rank 0's listener on the first port of the window it can bind. Listens on every interface:
/// MASTER_ADDR names this host as the others see it, which need not be an address of a local
/// interface (NAT, DNS aliases).
async fn bind_first_free(config: &RendezvousConfig) -> Result<TcpListener, RendezvousError> {
    let mut last_error = None;
    for port in config.ports() {
        match TcpListener::bind(("0.0.0.0", port)).await {
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

async fn reject_all(peers: BTreeMap<usize, Peer>, message: &str) {
    for (_, mut peer) in peers {
        let _ = write_reply(&mut peer.stream, STATUS_ERROR, message.as_bytes()).await;
    }
}

struct Hello {
    rank: usize,
    world_size: usize,
    job: u64,
}

async fn read_hello(stream: &mut TcpStream, peer: &str) -> Result<Hello, RendezvousError> {
    // Magic and protocol first: a hello of another protocol has another length.
    let mut buf = [0u8; HELLO_BYTES];
    read_exact(stream, &mut buf[..6], peer).await?;
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
    read_exact(stream, &mut buf[6..], peer).await?;
    Ok(Hello {
        rank: u32::from_le_bytes(buf[6..10].try_into().unwrap()) as usize,
        world_size: u32::from_le_bytes(buf[10..14].try_into().unwrap()) as usize,
        job: u64::from_le_bytes(buf[14..22].try_into().unwrap()),
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
