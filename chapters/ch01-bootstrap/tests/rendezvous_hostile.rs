//! The rendezvous against connections that are not ranks of the job: silent ones, a flood of
//! them, a squatter and a relay on the port window, none of them holding the job's token.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use ch01_bootstrap::rendezvous::{JobToken, RendezvousConfig, broadcast_from_rank0};

mod common;
use common::*;

#[test]
fn silent_and_slow_connections_do_not_hold_up_the_job() {
    // The default port window. Two connections that say nothing and one that stops halfway
    // through its hello reach rank 0 before rank 1 does: each gets a handshake of its own,
    // with its own deadline, and rank 1 is served beside them.
    let first = free_run();
    let root = spawn_in_window("0", "2", first - 1, "job");
    let silent = [connect_when_listening(first), connect_when_listening(first)];
    let mut slow = connect_when_listening(first);
    slow.write_all(b"NVTR").unwrap();
    let peer = spawn_in_window("1", "2", first - 1, "job");
    let peer = finish(peer, Duration::from_secs(30));
    let root = finish(root, Duration::from_secs(30));
    drop((silent, slow));
    assert!(root.status.success(), "{}", stderr(&root));
    assert!(peer.status.success(), "{}", stderr(&peer));
    assert_eq!(fingerprint(&root), fingerprint(&peer));
}

#[test]
fn a_flood_of_silent_connections_past_the_cap_only_delays_the_job() {
    // More silent connections than rank 0 runs handshakes at once (64): the ones past the cap
    // wait in the listen backlog, every handshake ends within its own window, and the rank
    // behind them all is served once slots free up.
    let port = free_port();
    let config = |rank| RendezvousConfig {
        rank,
        world_size: 2,
        master_addr: "127.0.0.1".into(),
        port,
        num_ports: 1,
        job: JobToken::derive("flood", "127.0.0.1", 1),
        timeout: Duration::from_secs(20),
    };
    let root_config = config(0);
    let root = std::thread::spawn(move || broadcast_from_rank0(&root_config, Some(b"the id")));
    let flood: Vec<TcpStream> = (0..100).map(|_| connect_when_listening(port)).collect();
    let received = broadcast_from_rank0(&config(1), None).expect("rank 1 is served");
    assert_eq!(received, b"the id");
    root.join().unwrap().expect("rank 0 serves rank 1");
    drop(flood);
}

/// Runs a handler on every connection to a listener, each in a thread of its own, until
/// dropped; counts the connections.
struct FakeServer {
    stop: Arc<AtomicBool>,
    connections: Arc<AtomicUsize>,
}

impl FakeServer {
    fn start(listener: TcpListener, handle: impl Fn(TcpStream) + Send + Sync + 'static) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(AtomicUsize::new(0));
        let (stop_, connections_, handle) = (stop.clone(), connections.clone(), Arc::new(handle));
        listener.set_nonblocking(true).unwrap();
        std::thread::spawn(move || {
            while !stop_.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        stream.set_nonblocking(false).unwrap();
                        let timeout = Some(Duration::from_secs(10));
                        stream.set_read_timeout(timeout).unwrap();
                        connections_.fetch_add(1, Ordering::SeqCst);
                        let handle = handle.clone();
                        std::thread::spawn(move || handle(stream));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Self { stop, connections }
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// An id that no rank 0 made.
const FORGED_ID: [u8; 128] = [0x42; 128];

/// A reply of rank 0's format with a made-up tag.
fn forged_reply(status: u8, body: &[u8]) -> Vec<u8> {
    let mut reply = b"NVTR".to_vec();
    reply.push(status);
    reply.extend_from_slice(&(body.len() as u32).to_le_bytes());
    reply.extend_from_slice(body);
    reply.extend_from_slice(&[0x5a; TAG_BYTES]);
    reply
}

/// The squatter that fed rank 1 a forged id before ranks had to prove anything: "accepted"
/// and an id, right after the hello.
fn squat_accepting_at_once(mut stream: TcpStream) {
    let mut hello = [0u8; HELLO_BYTES];
    if stream.read_exact(&mut hello).is_ok() {
        let mut reply = forged_reply(2, &[]);
        reply.extend(forged_reply(0, &FORGED_ID));
        let _ = stream.write_all(&reply);
    }
}

/// A squatter that knows the protocol but not the token: a challenge with a made-up tag, then
/// "accepted" and an id to whoever answers it.
fn squat_with_a_made_up_challenge(mut stream: TcpStream) {
    let mut hello = [0u8; HELLO_BYTES];
    if stream.read_exact(&mut hello).is_ok() && stream.write_all(&forged_reply(4, &[9; 16])).is_ok()
    {
        let mut proof = [0u8; TAG_BYTES];
        if stream.read_exact(&mut proof).is_ok() {
            let mut reply = forged_reply(2, &[]);
            reply.extend(forged_reply(0, &FORGED_ID));
            let _ = stream.write_all(&reply);
        }
    }
}

#[test]
fn a_squatter_without_the_token_cannot_hand_out_an_id() {
    // The squatter holds MASTER_PORT + 1, the first port of the window, so rank 0 takes the
    // next one; rank 1 meets the squatter first, and must get its id from rank 0 all the same.
    type Squat = fn(TcpStream);
    let attacks: [(&str, Squat); 2] = [
        ("accepted at once", squat_accepting_at_once),
        ("a made-up challenge", squat_with_a_made_up_challenge),
    ];
    for (attack, squat) in attacks {
        let first = free_run();
        let squatter = FakeServer::start(TcpListener::bind(("127.0.0.1", first)).unwrap(), squat);
        let root = spawn_in_window("0", "2", first - 1, "job");
        let peer = spawn_in_window("1", "2", first - 1, "job");
        let root = finish(root, Duration::from_secs(30));
        let peer = finish(peer, Duration::from_secs(30));
        assert!(root.status.success(), "{attack}: {}", stderr(&root));
        assert!(peer.status.success(), "{attack}: {}", stderr(&peer));
        assert_eq!(
            fingerprint(&peer),
            fingerprint(&root),
            "{attack}: a forged id"
        );
        assert!(
            squatter.connections() > 0,
            "{attack}: rank 1 never met the squatter"
        );
    }
}

/// Copies rank 0's replies to the rank frame by frame, with every id replaced by a forged one
/// of the same length (tag kept).
fn relay_replies_forging_ids(mut root: TcpStream, mut rank: TcpStream) {
    loop {
        let mut header = [0u8; 9];
        if root.read_exact(&mut header).is_err() {
            return;
        }
        let len = u32::from_le_bytes(header[5..9].try_into().unwrap()) as usize;
        let mut rest = vec![0u8; len + TAG_BYTES];
        if root.read_exact(&mut rest).is_err() {
            return;
        }
        if header[4] == 0 {
            rest[..len].fill(0x42);
        }
        if rank.write_all(&header).is_err() || rank.write_all(&rest).is_err() {
            return;
        }
    }
}

#[test]
fn a_relay_cannot_pass_rank_zeros_proof_off_as_its_own() {
    // A process on MASTER_PORT + 1 relays each connection to the real rank 0 on the next
    // port, and would swap the id on the way back. Rank 0's challenge names the port it
    // listens on, so rank 1 rejects it on the relay's port, never proves the token there,
    // and fetches the id from rank 0 directly.
    let first = free_run();
    let proofs_relayed = Arc::new(AtomicUsize::new(0));
    let counter = proofs_relayed.clone();
    let relay = FakeServer::start(
        TcpListener::bind(("127.0.0.1", first)).unwrap(),
        move |mut rank| {
            let Ok(root) = TcpStream::connect(("127.0.0.1", first + 1)) else {
                return; // rank 0 not up yet: the rank comes back later
            };
            let (mut up, down) = (root.try_clone().unwrap(), rank.try_clone().unwrap());
            std::thread::spawn(move || relay_replies_forging_ids(root, down));
            let (mut buf, mut relayed) = ([0u8; 256], 0);
            while let Ok(n @ 1..) = rank.read(&mut buf) {
                relayed += n;
                if up.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            if relayed > HELLO_BYTES {
                counter.fetch_add(1, Ordering::SeqCst);
            }
            let _ = up.shutdown(std::net::Shutdown::Write);
        },
    );
    let root = spawn_in_window("0", "2", first - 1, "job");
    let peer = spawn_in_window("1", "2", first - 1, "job");
    let root = finish(root, Duration::from_secs(30));
    let peer = finish(peer, Duration::from_secs(30));
    assert!(root.status.success(), "{}", stderr(&root));
    assert!(peer.status.success(), "{}", stderr(&peer));
    assert_eq!(fingerprint(&peer), fingerprint(&root));
    assert!(relay.connections() > 0, "rank 1 never met the relay");
    assert_eq!(
        proofs_relayed.load(Ordering::SeqCst),
        0,
        "a proof went through the relay"
    );
}
