//! What the rendezvous tests share: probes started as real processes on loopback, their
//! outcome, and fakes of rank 0.

#![allow(dead_code)] // each test binary uses its own part of it

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use ch01_bootstrap::rendezvous::JobToken;

pub const PROBE: &str = env!("CARGO_BIN_EXE_ch01-rendezvous-probe");

/// A port per test, away from common services; tests in one binary run in parallel.
pub fn free_port() -> u16 {
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
pub fn spawn(rank: &str, world_size: &str, port: u16, timeout_ms: u64) -> Child {
    let mut command = probe(rank, world_size, timeout_ms);
    command
        .env("MASTER_PORT", "1")
        .env("NVSHMEM_TUTORIAL_RDZV_PORT", port.to_string());
    command.spawn().expect("start the probe")
}

/// Starts one probe of job `run_id` with the default port window after `master_port`.
pub fn spawn_in_window(rank: &str, world_size: &str, master_port: u16, run_id: &str) -> Child {
    let mut command = probe(rank, world_size, 20_000);
    command
        .env("MASTER_PORT", master_port.to_string())
        .env("TORCHELASTIC_RUN_ID", run_id);
    command.spawn().expect("start the probe")
}

pub fn probe(rank: &str, world_size: &str, timeout_ms: u64) -> Command {
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
pub fn free_run() -> u16 {
    loop {
        let port = free_port();
        if (1..5).all(|i| TcpListener::bind(("0.0.0.0", port + i)).is_ok()) {
            return port;
        }
    }
}

/// Waits for a child, failing the test if it outlives `limit` (a hang is a failure).
pub fn finish(mut child: Child, limit: Duration) -> Output {
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

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

pub fn fingerprint(output: &Output) -> String {
    let out = String::from_utf8_lossy(&output.stdout);
    out.split("fingerprint: ")
        .nth(1)
        .expect(&out)
        .trim()
        .to_string()
}

/// A rank's hello: magic, protocol, rank, world size and its nonce.
pub const HELLO_BYTES: usize = 30;
/// The HMAC-SHA-256 tag that ends every reply of rank 0 and makes up a rank's proof.
pub const TAG_BYTES: usize = 32;

/// A fake rank 0 that answers every connection with `reply` and then closes.
pub fn fake_rank_zero(reply: Vec<u8>) -> u16 {
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

/// The job token of the probes that `spawn` starts: only a process that has it can serve them.
pub fn spawned_job_token() -> JobToken {
    JobToken::derive("", "127.0.0.1", 1)
}

/// Connects to 127.0.0.1:`port`, retrying until something listens there (10 s at most).
pub fn connect_when_listening(port: u16) -> TcpStream {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(stream) => return stream,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("nothing listened on {port}: {e}"),
        }
    }
}
