//! Moving NVSHMEM's unique id from rank 0 to every other rank over TCP.
//!
//! NVSHMEM cannot bootstrap itself from nothing: its processes first need one shared secret,
//! the 128-byte unique id that rank 0 creates (it encodes rank 0's bootstrap address). MPI
//! or a PMI server would carry it; under torchrun we carry it ourselves:
//!
//! ```text
//! rank 0: listen on MASTER_ADDR, first free port ─┬─ rank 1: handshake → accepted ─┐
//!                                                 ├─ rank 2: handshake → accepted ─┤ all N-1?
//!                                                 └─ ...                           ┘ id to each
//! rank k: try each port of the window in turn (retrying until rank 0 listens); a port whose
//!         answer proves the job's secret is our rank 0: prove it back, wait for the id
//! ```
//!
//! The window is one port when NVSHMEM_TUTORIAL_RDZV_PORT fixes it, else MASTER_PORT + 1 and
//! the next ones (`LaunchEnv::rdzv_ports`): a port can be held by any socket of the host, and
//! rank 0 cannot tell the others which one it got except by being the one that answers.
//! Rank 0 listens on the address MASTER_ADDR resolves to on its own host (loopback for
//! `localhost`), not on every interface; a MASTER_ADDR that is no address of rank 0's host is
//! an error that names it.
//!
//! # Threat model
//!
//! The ranks of a job share a secret, the job token (`LaunchEnv::job_token`), derived from
//! torchrun's environment. A process *without* that environment (a port scanner, a client of
//! some other service, a rank of another job, a hostile process squatting on a port of the
//! window) must not be able to stall the job or hand a rank an id. A process *with* the
//! environment is trusted, as torchrun's own store trusts it. Out of scope: an attacker on the
//! network path (the id travels in clear, as torchrun's store traffic does) and the strength
//! of the run id, which is the part of the secret that others cannot guess.
//!
//! - **Stalling.** Rank 0 runs each connection's handshake in a task of its own with its own
//!   deadline (PROBE_TIMEOUT), reads a fixed number of bytes from it (a hello and a proof),
//!   and runs at most MAX_HANDSHAKES of them at once; connections past that wait in the
//!   kernel's backlog until a slot frees. A silent or slow connection holds one slot for at
//!   most PROBE_TIMEOUT and delays no one else.
//! - **Forged ids.** Both sides prove the token with HMAC-SHA-256 over both sides' random
//!   nonces, the rank's hello and the port it dialled, each side under its own role, before
//!   anything is trusted; every later reply from rank 0 carries a tag as well. A rank goes on
//!   to the next port when an answer does not prove the token, and a relay on one port
//!   cannot pass rank 0's proof along from another (the port is in the tag).
//! - **What no handshake prevents.** A process that holds the fixed port, or every port of the
//!   window, keeps rank 0 from listening at all: rank 0 fails at once, naming the ports and
//!   the fix. A sustained flood of connections can delay the ranks up to the timeout, and
//!   then ends in an error too, not in a hang.
//!
//! Every wait is bounded by one deadline. Whatever goes wrong (a peer that never comes, two
//! processes claiming one rank, a rank from another job, garbage on the socket) ends in an
//! error that says what happened and, where rank 0 knows it, is also sent to the peers so
//! they fail at once instead of waiting out their own timeout.
//!
//! Wire format (all integers little-endian; a tag is 32 bytes of HMAC-SHA-256):
//! ```text
//! rank k → rank 0  hello = "NVTR" | u16 protocol | u32 rank | u32 world_size | nonce_k  (30 bytes)
//! rank 0 → rank k  reply = "NVTR" | u8 status | u32 len | len bytes | tag
//!                      status 4: challenge, the body is nonce_0 (16 bytes), tagged
//! rank k → rank 0  proof = tag                                                         (32 bytes)
//! rank 0 → rank k  status 2: accepted, wait (len 0); then status 0: the payload; both tagged
//!                  status 1: UTF-8 error (last reply): tagged once rank k has proved the token
//!                  status 3: this is another job's rendezvous: look elsewhere (untagged)
//! tag = HMAC(job token, "NVTR" | u8 role | u16 port | u32 rank | u32 world_size
//!                       | nonce_k | nonce_0 | u8 status | u32 len | body)
//!       role 0: rank 0 speaks, role 1: rank k speaks (its proof: status 5, no body)
//! ```
//! Untagged replies have a tag of zeros; a rank trusts none of them once the handshake is done.

use std::io;
use std::net::IpAddr;
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout_at};

pub use crate::launch_env::JobToken;

mod client;
mod server;

const MAGIC: &[u8; 4] = b"NVTR";
const PROTOCOL: u16 = 3;
const NONCE_BYTES: usize = 16;
const HELLO_BYTES: usize = 14 + NONCE_BYTES;
const TAG_BYTES: usize = 32;
const REPLY_HEADER_BYTES: usize = 9;
const STATUS_OK: u8 = 0;
const STATUS_ERROR: u8 = 1;
const STATUS_ACCEPTED: u8 = 2;
const STATUS_OTHER_JOB: u8 = 3;
const STATUS_CHALLENGE: u8 = 4;
/// Not a reply: what a rank's proof is computed over.
const STATUS_PROOF: u8 = 5;
/// Largest payload or error message accepted: a unique id is 128 bytes.
const MAX_MESSAGE_BYTES: u32 = 64 * 1024;
/// Pause between connection attempts while rank 0 is not listening yet.
const RETRY_INTERVAL: Duration = Duration::from_millis(100);
/// How long rank 0 gives one connection to finish its handshake, and, with several ports or
/// addresses to try, how long a rank gives one connection attempt and then rank 0's challenge
/// before the port is taken to be someone else's.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Handshakes rank 0 runs at once; more connections wait in the listen backlog.
const MAX_HANDSHAKES: usize = 64;

/// Who takes part and how long anyone waits.
#[derive(Debug, Clone)]
pub struct RendezvousConfig {
    pub rank: usize,
    pub world_size: usize,
    /// Rank 0's host (MASTER_ADDR): rank 0 listens on the address it resolves to.
    pub master_addr: String,
    /// Rank 0 listens on the first free port of `port .. port + num_ports`.
    pub port: u16,
    pub num_ports: u16,
    /// The secret every rank of this job shares (`LaunchEnv::job_token`).
    pub job: JobToken,
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
        "MASTER_ADDR={addr:?} resolves to {resolved:?}, none of them an address of this host, so \
         rank 0 cannot listen there. Set MASTER_ADDR, on every rank, to an address of rank 0's \
         host that the other ranks can reach (`hostname -I` lists this host's)"
    )]
    NotLocal { addr: String, resolved: Vec<IpAddr> },
    #[error(
        "rank 0 at {addr} was unreachable for {timeout:?} (last error: {last_error}). Is rank 0 \
         running, is MASTER_ADDR right (rank 0 listens only on the address it resolves to on \
         rank 0's host), and does every rank use the same NVSHMEM_TUTORIAL_RDZV_PORT, \
         TORCHELASTIC_RUN_ID and MASTER_PORT?"
    )]
    Unreachable {
        addr: String,
        timeout: Duration,
        last_error: String,
    },
    #[error(
        "cannot resolve MASTER_ADDR {addr:?}: {reason}. Set MASTER_ADDR, the same on every rank, \
         to rank 0's host name or IP address"
    )]
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
            (0, Some(payload)) => server::serve(config, payload, deadline)
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

/// Who computes a tag: rank 0 and the other ranks never sign the same bytes.
#[derive(Clone, Copy)]
enum Role {
    Root = 0,
    Rank = 1,
}

/// What one handshake's tags are computed over: the rank's hello, the port it dialled and
/// both sides' nonces. Equal on both ends of a connection, and on no other.
#[derive(Clone, Copy)]
struct Transcript {
    port: u16,
    rank: u32,
    world_size: u32,
    nonce_rank: [u8; NONCE_BYTES],
    nonce_root: [u8; NONCE_BYTES],
}

// ANCHOR: tag
impl Transcript {
    /// HMAC-SHA-256, keyed by the job token, of everything that identifies this message.
    fn mac(&self, job: &JobToken, role: Role, status: u8, body: &[u8]) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(job.key()).expect("HMAC takes any key");
        mac.update(MAGIC);
        mac.update(&[role as u8]);
        mac.update(&self.port.to_le_bytes());
        mac.update(&self.rank.to_le_bytes());
        mac.update(&self.world_size.to_le_bytes());
        mac.update(&self.nonce_rank);
        mac.update(&self.nonce_root);
        mac.update(&[status]);
        mac.update(&(body.len() as u32).to_le_bytes());
        mac.update(body);
        mac
    }

    fn tag(&self, job: &JobToken, role: Role, status: u8, body: &[u8]) -> [u8; TAG_BYTES] {
        self.mac(job, role, status, body)
            .finalize()
            .into_bytes()
            .into()
    }

    /// Whether `tag` proves that its sender holds the job token (compared in constant time).
    fn verify(&self, job: &JobToken, role: Role, status: u8, body: &[u8], tag: &[u8]) -> bool {
        self.mac(job, role, status, body).verify_slice(tag).is_ok()
    }
}
// ANCHOR_END: tag

fn random_nonce() -> [u8; NONCE_BYTES] {
    let mut nonce = [0u8; NONCE_BYTES];
    rand::fill(&mut nonce);
    nonce
}

/// MASTER_ADDR's addresses, in the resolver's order, each once. Bounded by `deadline`.
async fn resolve(master_addr: &str, deadline: Instant) -> Result<Vec<IpAddr>, RendezvousError> {
    let failed = |reason: String| RendezvousError::Resolve {
        addr: master_addr.into(),
        reason,
    };
    let found = match timeout_at(deadline, tokio::net::lookup_host((master_addr, 0))).await {
        Ok(Ok(found)) => found,
        Ok(Err(error)) => return Err(failed(error.to_string())),
        Err(_elapsed) => return Err(failed("no answer before the timeout".into())),
    };
    let mut ips: Vec<IpAddr> = Vec::new();
    for addr in found {
        if !ips.contains(&addr.ip()) {
            ips.push(addr.ip());
        }
    }
    if ips.is_empty() {
        return Err(failed("the resolver returned no address".into()));
    }
    Ok(ips)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn transcript() -> Transcript {
        Transcript {
            port: 29501,
            rank: 1,
            world_size: 2,
            nonce_rank: [1; NONCE_BYTES],
            nonce_root: [2; NONCE_BYTES],
        }
    }

    #[test]
    fn a_tag_proves_the_token_for_one_role_port_and_pair_of_nonces() {
        let job = JobToken::derive("run", "127.0.0.1", 29500);
        let t = transcript();
        let tag = t.tag(&job, Role::Root, STATUS_CHALLENGE, &t.nonce_root);
        assert!(t.verify(&job, Role::Root, STATUS_CHALLENGE, &t.nonce_root, &tag));
        // Another job's token, the other role, another port or nonce, another status: no.
        let other_job = JobToken::derive("other run", "127.0.0.1", 29500);
        assert!(!t.verify(
            &other_job,
            Role::Root,
            STATUS_CHALLENGE,
            &t.nonce_root,
            &tag
        ));
        assert!(!t.verify(&job, Role::Rank, STATUS_CHALLENGE, &t.nonce_root, &tag));
        let moved = Transcript { port: 29502, ..t };
        assert!(!moved.verify(&job, Role::Root, STATUS_CHALLENGE, &t.nonce_root, &tag));
        let replayed = Transcript {
            nonce_rank: [3; NONCE_BYTES],
            ..t
        };
        assert!(!replayed.verify(&job, Role::Root, STATUS_CHALLENGE, &t.nonce_root, &tag));
        assert!(!t.verify(&job, Role::Root, STATUS_OK, &t.nonce_root, &tag));
        assert!(!t.verify(
            &job,
            Role::Root,
            STATUS_CHALLENGE,
            &t.nonce_root,
            &[0; TAG_BYTES]
        ));
    }
}
