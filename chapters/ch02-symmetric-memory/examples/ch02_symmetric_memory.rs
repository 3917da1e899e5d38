//! Chapter 2's runnable step (setup and the run line: book/src/introduction.md, "Before you
//! start"):
//!
//! ```text
//! torchrun --standalone --nproc_per_node=2 --no-python target/release/ch02-symmetric-memory
//! ```
//!
//! Shows that one symmetric offset names the same buffer on every PE, that stores through a
//! peer view land in the peer's buffer once a barrier has passed, and that the mistakes
//! symmetric memory invites (different sizes on different PEs, a PE that does not exist, an
//! index past the end, a pointer from outside the heap) are caught on the host. The checks
//! use the shared harness, `ch01_bootstrap::checks`.

use std::process::ExitCode;

use ch01_bootstrap::World;
use ch01_bootstrap::checks::{POISON_BYTE, POISON_WORD, Tally, count_wrong};
use ch02_symmetric_memory::{
    SymmetricBuffer, SymmetricError, check_sizes_agree, check_symmetric, configured_heap_bytes,
};
use cudarc::driver::{LaunchConfig, PushKernelArg};

const INBOX_WORDS: usize = 3 << 20;

type AnyError = Box<dyn std::error::Error>;

fn main() -> ExitCode {
    ch01_bootstrap::checks::exit_code("ch02-symmetric-memory", run())
}

fn run() -> Result<bool, AnyError> {
    let world = World::from_env()?;
    let me = world.my_pe();
    let n = world.n_pes();
    let mut tally = Tally::default();
    // The per-allocation size check of SymmetricBuffer::new; the example also calls the same
    // check directly, below, whatever this says.
    let automatic = if ch02_symmetric_memory::size_checks_enabled() {
        "on"
    } else {
        "off (release build)"
    };
    println!(
        "pe {me}/{n}: symmetric heap {} MiB (NVSHMEM_SYMMETRIC_SIZE), size check in every \
         allocation {automatic}",
        configured_heap_bytes().map_err(|t| format!("NVSHMEM_SYMMETRIC_SIZE={t:?}"))? >> 20,
    );

    same_offset_everywhere(&world, &mut tally)?;
    peer_stores_land_after_a_barrier(&world, &mut tally)?;
    mistakes_are_caught(&world, &mut tally)?;
    past_the_heap(&world, &mut tally)?;

    Ok(tally.finish(&world)?)
}

// ANCHOR: same_offset
/// Two allocations made in the same order sit at the same distance from each other on every
/// PE: the heap's layout is symmetric, so an offset is a name every PE understands.
fn same_offset_everywhere(world: &World, tally: &mut Tally) -> Result<(), AnyError> {
    let (me, n) = (world.my_pe(), world.n_pes());
    let first = SymmetricBuffer::<_, u8>::new(world, 1000)?;
    let second = SymmetricBuffer::<_, u32>::new(world, 4096)?;
    let distance = second.device_ptr() - first.device_ptr();
    // Every PE writes its distance into slot `me` of every PE's table, through peer views.
    let table = SymmetricBuffer::<_, u64>::new(world, n)?;
    table.fill_bytes(0xFF)?;
    world.barrier_all()?;
    for pe in 0..n {
        let Some(peer_table) = table.peer_ptr(pe)? else {
            println!("pe {me}: pe {pe} is not load/store reachable; skipping it");
            continue;
        };
        let stream = world.stream();
        // SAFETY: `peer_table` is pe's copy of `table`, n u64 long; slot `me` is in range.
        unsafe {
            cudarc::driver::result::memcpy_htod_async(
                peer_table + 8 * me as u64,
                &[distance][..],
                stream.cu_stream(),
            )
        }?;
        stream.synchronize()?;
    }
    world.barrier_all()?;
    let distances = table.copy_to_host()?;
    println!("pe {me}: second - first = {distance} bytes; as seen by every PE: {distances:?}");
    tally.check(me, distances.iter().all(|&d| d == distance), || {
        format!("symmetric offsets differ across PEs: {distances:?}")
    });
    Ok(())
}
// ANCHOR_END: same_offset

// ANCHOR: peer_stores
/// Each PE stores a pattern into the next PE's inbox with a plain kernel through the peer
/// view, then everyone passes a barrier and checks its own inbox.
fn peer_stores_land_after_a_barrier(world: &World, tally: &mut Tally) -> Result<(), AnyError> {
    let (me, n) = (world.my_pe(), world.n_pes());
    let next = (me + 1) % n;
    let inbox = SymmetricBuffer::<_, u32>::new(world, INBOX_WORDS)?; // nvshmem_align
    inbox.fill_bytes(POISON_BYTE)?; // what nobody writes keeps the poison
    world.barrier_all()?; // no peer may store before our poison has landed
    let seed = world.job_seed() as u32;
    let Some(next_inbox) = inbox.peer_ptr(next)? else {
        println!(
            "pe {me}: pe {next} is not load/store reachable (another node?); chapter 3's put reaches it"
        );
        return Ok(());
    };
    let module = world.load_module("symmetric")?;
    let store = module.function("store_pattern")?;
    let num_words = INBOX_WORDS as u64;
    let source_pe = me as i32;
    let mut launch = world.stream().launch_builder(&store);
    launch
        .arg(&next_inbox)
        .arg(&num_words)
        .arg(&source_pe)
        .arg(&seed);
    // SAFETY: matches store_pattern(uint32_t*, uint64_t, int, uint32_t); next_inbox holds
    // INBOX_WORDS words on the peer.
    unsafe { launch.launch(LaunchConfig::for_num_elems(INBOX_WORDS as u32)) }?;
    // The kernel's stores are complete when the stream is; the barrier tells the peer so.
    world.barrier_all()?;
    check_inbox(world, &inbox.copy_to_host()?, seed, tally);
    Ok(())
}
// ANCHOR_END: peer_stores

/// Every word of the inbox must be the previous PE's pattern word.
fn check_inbox(world: &World, received: &[u32], seed: u32, tally: &mut Tally) {
    let (me, n) = (world.my_pe(), world.n_pes());
    let (next, previous) = ((me + 1) % n, (me + n - 1) % n);
    let sent: Vec<u32> = (0..received.len() as u64)
        .map(|i| kernels::pattern_word(previous, i, seed))
        .collect();
    let wrong = count_wrong(received, 0, &sent, POISON_WORD);
    println!(
        "pe {me}: stored {INBOX_WORDS} words into pe {next}; {wrong} wrong words from pe {previous}"
    );
    tally.check(me, wrong == 0, || {
        format!("{wrong} words from pe {previous} are wrong")
    });
}
// ANCHOR_END: peer_stores

/// The mistakes made on purpose below, and a piece of the error each must produce.
const MISTAKES: [(&str, &str); 5] = [
    ("a peer view of a PE that does not exist", "out of range"),
    ("elements past the end", "past the end"),
    ("a host copy of the wrong length", "host slice has 3"),
    ("an allocation larger than the GPU", "larger than the GPU"),
    (
        "a cudaMalloc pointer passed as symmetric",
        "not inside NVSHMEM's symmetric heap",
    ),
];

fn mistakes_are_caught(world: &World, tally: &mut Tally) -> Result<(), AnyError> {
    let (me, n) = (world.my_pe(), world.n_pes());
    // Different sizes on different PEs: every PE gets the same error (with 2+ PEs). Called
    // directly, so it runs in release builds too, where SymmetricBuffer::new skips it.
    let asked = 4096 + if n > 1 { 4096 * me as u64 } else { 0 };
    match check_sizes_agree(world, asked) {
        Err(SymmetricError::SizeMismatch { sizes }) if n > 1 => {
            println!(
                "pe {me}: check_sizes_agree, called directly: mismatch caught: {}",
                SymmetricError::SizeMismatch { sizes }
            );
            tally.check(me, true, String::new);
        }
        Ok(()) if n == 1 => tally.check(me, true, String::new),
        other => tally.check(me, false, || {
            format!("size mismatch not reported: {other:?}")
        }),
    }
    tally.check(me, check_sizes_agree(world, 4096).is_ok(), || {
        "equal sizes reported as a mismatch".into()
    });

    let buffer = SymmetricBuffer::<_, f32>::new(world, 1024)?;
    let private = world.stream().alloc_zeros::<u32>(16)?;
    let (private_ptr, _sync) = cudarc::driver::DevicePtr::device_ptr(&private, world.stream());
    // In the order of MISTAKES.
    let results: [Result<(), SymmetricError>; MISTAKES.len()] = [
        buffer.peer_ptr(n).map(drop),
        buffer.element_ptr(1000, 25).map(drop),
        buffer.copy_from_host(&[0.0; 3]),
        SymmetricBuffer::<_, u64>::new(world, usize::MAX / 16).map(drop),
        check_symmetric(world, private_ptr),
    ];
    for ((what, expected), result) in MISTAKES.into_iter().zip(results) {
        tally.expect_error(me, what, result, expected);
    }
    tally.check(
        me,
        check_symmetric(world, buffer.device_ptr()).is_ok(),
        || "a symmetric pointer rejected".into(),
    );
    Ok(())
}

// ANCHOR: past_the_heap
/// With a small heap configured (`NVSHMEM_SYMMETRIC_SIZE=256M`, say), ask for twice that.
/// NVSHMEM 3.x reserves virtual space and may map more physical memory on demand, so either
/// outcome is legitimate; what is not is a crash, a hang, or an error that does not say which
/// variable to raise.
fn past_the_heap(world: &World, tally: &mut Tally) -> Result<(), AnyError> {
    let me = world.my_pe();
    let heap = configured_heap_bytes().map_err(|t| format!("NVSHMEM_SYMMETRIC_SIZE={t:?}"))?;
    if std::env::var(ch02_symmetric_memory::SYMMETRIC_SIZE_VAR).is_err()
        || heap as usize > world.context().total_mem()? / 8
    {
        return Ok(()); // only meaningful with a small explicit heap
    }
    let words = (2 * heap / 4) as usize;
    match SymmetricBuffer::<_, u32>::new(world, words) {
        Ok(big) => {
            // The heap grew: prove the far end is real memory.
            big.fill_bytes(0xA5)?;
            let last = big.element_ptr(words - 1, 1)?;
            let mut word = [0u32];
            let stream = world.stream();
            // SAFETY: `last` is the buffer's final element.
            unsafe {
                cudarc::driver::result::memcpy_dtoh_async(&mut word[..], last, stream.cu_stream())
            }?;
            stream.synchronize()?;
            println!(
                "pe {me}: {} MiB with a {} MiB heap: NVSHMEM grew the heap",
                (words * 4) >> 20,
                heap >> 20
            );
            tally.check(me, word[0] == 0xA5A5_A5A5, || {
                format!("last word reads {:#x}", word[0])
            });
        }
        Err(error) => {
            println!("pe {me}: {error}");
            tally.check(
                me,
                error.to_string().contains("Raise NVSHMEM_SYMMETRIC_SIZE"),
                || format!("heap exhaustion reported without the fix: {error}"),
            );
        }
    }
    Ok(())
}
// ANCHOR_END: past_the_heap
