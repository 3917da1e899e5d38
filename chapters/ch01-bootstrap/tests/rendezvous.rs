//! The unique-id rendezvous with real processes on loopback: the good path for several world
//! sizes, and every failure the bootstrap must turn into a clear error within its timeout.

use std::io::Write;
use std::net::TcpListener;
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use ch01_bootstrap::rendezvous::{RendezvousConfig, broadcast_from_rank0};

mod common;
use common::*;

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
