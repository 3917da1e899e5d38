//! The unique-id rendezvous with real processes on loopback: the good path for several world
//! sizes, and every failure the bootstrap must turn into a clear error within its timeout.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ch01_bootstrap::rendezvous::{JobToken, RendezvousConfig, broadcast_from_rank0};

const PROBE: &str = env!("CARGO_BIN_EXE_ch01-rendezvous-probe");

/// A port per test, away from common services; tests in one binary run in parallel.
fn free_port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    loop {
        let offset = NEXT.fetch_add(1, Ordering::SeqCst);
        let port = 20000 + (std::process::id() as u16 % 20000) + offset * 7;
        if TcpListener::bind(("0.0.0.0", port)).is_ok() {
            return port;
        }
    }
}

/// Starts one probe as `rank` of `world_size`, rendezvous on `port`, bounded by `timeout_ms`.
fn spawn(rank: &str, world_size: &str, port: u16, timeout_ms: u64) -> Child {
    let mut command = probe(rank, world_size, timeout_ms);
    command
        .env("MASTER_PORT", "1")
        .env("NVSHMEM_TUTORIAL_RDZV_PORT", port.to_string());
    command.spawn().expect("start the probe")
}

/// Starts one probe of job `run_id` with the default port window after `master_port`.
fn spawn_in_window(rank: &str, world_size: &str, master_port: u16, run_id: &str) -> Child {
    let mut command = probe(rank, world_size, 20_000);
    command
        .env("MASTER_PORT", master_port.to_string())
        .env("TORCHELASTIC_RUN_ID", run_id);
    command.spawn().expect("start the probe")
}

fn probe(rank: &str, world_size: &str, timeout_ms: u64) -> Command {
    let mut command = Command::new(PROBE);
    command
        .env_clear()
        .env("RANK", rank)
        .env("WORLD_SIZE", world_size)
        .env("MASTER_ADDR", "127.0.0.1")
        .env("NVSHMEM_TUTORIAL_TIMEOUT_MS", timeout_ms.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// A port p with p + 1 .. p + 4 free as well (for the window tests).
fn free_run() -> u16 {
    loop {
        let port = free_port();
        if (1..5).all(|i| TcpListener::bind(("0.0.0.0", port + i)).is_ok()) {
            return port;
        }
    }
}

/// Waits for a child, failing the test if it outlives `limit` (a hang is a failure).
fn finish(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("probe still running after {limit:?}: the rendezvous hung");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn fingerprint(output: &Output) -> String {
    let out = String::from_utf8_lossy(&output.stdout);
    out.split("fingerprint: ")
        .nth(1)
        .expect(&out)
        .trim()
        .to_string()
}

#[test]
fn every_rank_receives_rank_zeros_id() {
    for world_size in [2usize, 3, 8] {
        let port = free_port();
        // Rank 0 starts last: the others must retry until it listens.
        let mut children: Vec<Child> = (1..world_size)
            .map(|r| spawn(&r.to_string(), &world_size.to_string(), port, 20_000))
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        children.insert(0, spawn("0", &world_size.to_string(), port, 20_000));
        let outputs: Vec<Output> = children
            .into_iter()
            .map(|c| finish(c, Duration::from_secs(30)))
            .collect();
        for (rank, output) in outputs.iter().enumerate() {
            assert!(output.status.success(), "rank {rank}: {}", stderr(output));
        }
        let first = fingerprint(&outputs[0]);
        for output in &outputs {
            assert_eq!(fingerprint(output), first, "ranks disagree on the id");
        }
    }
}

#[test]
fn two_runs_get_different_ids() {
    let run = || {
        let port = free_port();
        let peer = spawn("1", "2", port, 20_000);
        let root = spawn("0", "2", port, 20_000);
        let (root, peer) = (
            finish(root, Duration::from_secs(30)),
            finish(peer, Duration::from_secs(30)),
        );
        assert!(
            root.status.success() && peer.status.success(),
            "{}{}",
            stderr(&root),
            stderr(&peer)
        );
        fingerprint(&root)
    };
    assert_ne!(run(), run());
}

#[test]
fn unreachable_rank_zero_fails_within_the_timeout() {
    let port = free_port();
    let started = Instant::now();
    let output = finish(spawn("1", "2", port, 1_000), Duration::from_secs(10));
    assert_eq!(output.status.code(), Some(2));
    let err = stderr(&output);
    assert!(err.contains("unreachable"), "{err}");
    assert!(err.contains("MASTER_ADDR"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn a_missing_peer_is_named_by_rank_zero_and_reported_to_the_others() {
    let port = free_port();
    let root = spawn("0", "3", port, 1_500);
    let peer = spawn("1", "3", port, 10_000);
    let root = finish(root, Duration::from_secs(10));
    let peer = finish(peer, Duration::from_secs(10));
    let (root_err, peer_err) = (stderr(&root), stderr(&peer));
    assert_eq!(root.status.code(), Some(2), "{root_err}");
    assert!(
        root_err.contains("[2]") && root_err.contains("never connected"),
        "{root_err}"
    );
    // Rank 1 learns from rank 0 at once instead of waiting out its own 10 s.
    assert_eq!(peer.status.code(), Some(2), "{peer_err}");
    assert!(
        peer_err.contains("refused") && peer_err.contains("never connected"),
        "{peer_err}"
    );
}

#[test]
fn two_processes_claiming_one_rank_fail_everyone() {
    let port = free_port();
    let root = spawn("0", "3", port, 10_000);
    let a = spawn("1", "3", port, 10_000);
    let b = spawn("1", "3", port, 10_000);
    for output in [root, a, b].map(|c| finish(c, Duration::from_secs(15))) {
        let err = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "{err}");
        assert!(err.contains("two processes claim rank 1"), "{err}");
    }
}

#[test]
fn a_world_size_mismatch_is_a_misconfiguration() {
    let port = free_port();
    let root = spawn("0", "2", port, 10_000);
    let peer = spawn("1", "3", port, 10_000);
    for output in [root, peer].map(|c| finish(c, Duration::from_secs(15))) {
        let err = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "{err}");
        assert!(
            err.contains("WORLD_SIZE=3") && err.contains("WORLD_SIZE=2"),
            "{err}"
        );
    }
}

/// A rank's hello: magic, protocol, rank, world size and its nonce.
const HELLO_BYTES: usize = 30;
/// The HMAC-SHA-256 tag that ends every reply of rank 0 and makes up a rank's proof.
const TAG_BYTES: usize = 32;

/// A fake rank 0 that answers every connection with `reply` and then closes.
fn fake_rank_zero(reply: Vec<u8>) -> u16 {
    // Bound here, not probed: a port probed free can be taken by a parallel test before we
    // bind it.
    let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        if let Ok((mut stream, _)) = listener.accept() {
            let mut hello = [0u8; HELLO_BYTES];
            let _ = stream.read_exact(&mut hello);
            let _ = stream.write_all(&reply);
        }
    });
    port
}

#[test]
fn garbage_from_rank_zero_is_reported_as_malformed() {
    let port = fake_rank_zero(b"HTTP/1.1 400 Bad Request\r\n\r\n".to_vec());
    let output = finish(spawn("1", "2", port, 5_000), Duration::from_secs(10));
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{err}");
    assert!(err.contains("malformed") && err.contains("magic"), "{err}");
}

#[test]
fn a_truncated_id_is_reported_with_how_much_arrived() {
    let mut reply = b"NVTR\0".to_vec();
    reply.extend_from_slice(&128u32.to_le_bytes());
    reply.extend_from_slice(&[7u8; 50]); // then the connection closes
    let port = fake_rank_zero(reply);
    let output = finish(spawn("1", "2", port, 5_000), Duration::from_secs(10));
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{err}");
    assert!(err.contains("closed after 50 of 128 bytes"), "{err}");
}

/// The job token of the probes that `spawn` starts: only a process that has it can serve them.
fn spawned_job_token() -> JobToken {
    JobToken::derive("", "127.0.0.1", 1)
}

#[test]
fn a_complete_reply_of_the_wrong_length_is_not_an_id() {
    // Only a process with the job's environment can send a rank anything it accepts; it is
    // trusted, but a reply of the wrong length still does not reach NVSHMEM.
    let port = free_port();
    let config = RendezvousConfig {
        rank: 0,
        world_size: 2,
        master_addr: "127.0.0.1".into(),
        port,
        num_ports: 1,
        job: spawned_job_token(),
        timeout: Duration::from_secs(10),
    };
    let root = std::thread::spawn(move || broadcast_from_rank0(&config, Some(&[7u8; 60])));
    let output = finish(spawn("1", "2", port, 5_000), Duration::from_secs(10));
    root.join().unwrap().expect("rank 0 serves its 60 bytes");
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{err}");
    assert!(err.contains("60-byte unique id"), "{err}");
}

#[test]
fn a_stray_connection_does_not_disturb_the_job() {
    let port = free_port();
    let root = spawn("0", "2", port, 20_000);
    // Something that is not a rank connects first and sends junk.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut stray = loop {
        match std::net::TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("rank 0 never listened: {e}"),
        }
    };
    stray.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let peer = spawn("1", "2", port, 20_000);
    let root = finish(root, Duration::from_secs(30));
    let peer = finish(peer, Duration::from_secs(30));
    assert!(root.status.success(), "{}", stderr(&root));
    assert!(peer.status.success(), "{}", stderr(&peer));
    assert!(
        stderr(&root).contains("ignoring connection"),
        "{}",
        stderr(&root)
    );
}

#[test]
fn a_taken_default_port_sends_rank_zero_to_the_next_one() {
    // MASTER_PORT + 1 is held by something that listens and never answers (the worst case:
    // a connection succeeds, then silence). Rank 0 binds MASTER_PORT + 2; rank 1 gives the
    // first port its probe time, then finds rank 0 on the next.
    let first = free_run();
    let squatter = TcpListener::bind(("0.0.0.0", first)).unwrap();
    let root = spawn_in_window("0", "2", first - 1, "job");
    let peer = spawn_in_window("1", "2", first - 1, "job");
    let root = finish(root, Duration::from_secs(30));
    let peer = finish(peer, Duration::from_secs(30));
    drop(squatter);
    assert!(root.status.success(), "{}", stderr(&root));
    assert!(peer.status.success(), "{}", stderr(&peer));
    assert_eq!(fingerprint(&root), fingerprint(&peer));
}

#[test]
fn a_rank_of_another_job_is_sent_on_without_harm() {
    // Two jobs whose windows overlap: job a's rank 0 takes the first port, job b's the next.
    // Job b's rank 1 meets job a's rank 0 first and is told to look further; neither job
    // fails, and each gets its own id.
    let first = free_run();
    let a_root = spawn_in_window("0", "2", first - 1, "job-a");
    std::thread::sleep(Duration::from_millis(300)); // job a's rank 0 holds the first port
    let b_root = spawn_in_window("0", "2", first - 1, "job-b");
    let b_peer = spawn_in_window("1", "2", first - 1, "job-b");
    let b_root = finish(b_root, Duration::from_secs(30));
    let b_peer = finish(b_peer, Duration::from_secs(30));
    let a_peer = spawn_in_window("1", "2", first - 1, "job-a");
    let a_root = finish(a_root, Duration::from_secs(30));
    let a_peer = finish(a_peer, Duration::from_secs(30));
    for output in [&a_root, &a_peer, &b_root, &b_peer] {
        assert!(output.status.success(), "{}", stderr(output));
    }
    assert_eq!(fingerprint(&a_root), fingerprint(&a_peer));
    assert_eq!(fingerprint(&b_root), fingerprint(&b_peer));
    assert_ne!(fingerprint(&a_root), fingerprint(&b_root));
}

/// Connects to 127.0.0.1:`port`, retrying until something listens there (10 s at most).
fn connect_when_listening(port: u16) -> TcpStream {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(stream) => return stream,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("nothing listened on {port}: {e}"),
        }
    }
}

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

#[test]
fn rank_zero_with_a_master_addr_of_another_host_fails_at_once() {
    // 192.0.2.0/24 is reserved for documentation: no host has it. Only rank 0 runs, and
    // binding sends nothing on the network.
    let mut command = probe("0", "2", 20_000);
    command
        .env("MASTER_ADDR", "192.0.2.1")
        .env("MASTER_PORT", free_port().to_string());
    let started = Instant::now();
    let output = finish(command.spawn().unwrap(), Duration::from_secs(10));
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{err}");
    assert!(
        err.contains("MASTER_ADDR=\"192.0.2.1\"")
            && err.contains("none of them an address of this host"),
        "{err}"
    );
    assert!(err.contains("Set MASTER_ADDR"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn bad_environment_fails_before_any_network_wait() {
    let output = Command::new(PROBE)
        .env_clear()
        .env("WORLD_SIZE", "2")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("RANK is not set"),
        "{}",
        stderr(&output)
    );
    let output = finish(spawn("5", "2", free_port(), 60_000), Duration::from_secs(5));
    assert!(
        stderr(&output).contains("RANK=5 is out of range"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn without_a_driver_init_is_an_error_not_a_panic() {
    if ch01_bootstrap::probe_driver().is_ok() {
        return; // a GPU machine: scripts/gpu_test.sh covers the real initialisation
    }
    let spec = ch01_bootstrap::InitSpec {
        rank: 0,
        world_size: 1,
        local_rank: 0,
        unique_id: nvshmem_sys::UniqueId::new(),
    };
    let err = ch01_bootstrap::World::init(&spec)
        .err()
        .expect("no driver, no World");
    assert!(err.to_string().contains("no NVIDIA driver"), "{err}");
}
