//! Chapter 3's runnable step:
//!
//! ```text
//! torchrun --nproc_per_node=N --no-python target/release/ch03-put-get
//! ```
//!
//! On a ring (every PE sends to the next, receives from the previous, as in chapter 1), runs
//! every way of moving bytes this chapter teaches: device put and get at thread, warp and
//! block scope, blocking and `_nbi` + quiet; the putmem_signal handshake; plain stores
//! through `nvshmem_ptr`; host-initiated put, get and put-with-signal on a stream. Each is
//! checked against a host reference on fresh random data, into a poisoned destination. Then
//! the mistakes are made on purpose, and each must be an error before anything is enqueued.

use std::process::ExitCode;

use ch01_bootstrap::World;
use ch01_bootstrap::checks::Tally;
use ch02_symmetric_memory::SymmetricBuffer;
use ch03_put_get::config::{EXAMPLE_DST_OFFSET_WORDS as OFFSET, EXAMPLE_SIZES_WORDS, POISON_BYTE};
use ch03_put_get::{
    Completion, DeviceOps, LaunchShape, LocalBuffer, Scope, SignalOp, get_nbi_on_stream,
    get_on_stream, put_nbi_on_stream, put_on_stream, put_raw_on_stream, put_signal_on_stream,
    quiet_on_stream,
};
use cudarc::driver::CudaSlice;
use rand::{Rng, SeedableRng, rngs::StdRng};

type AnyError = Box<dyn std::error::Error>;

const POISON_WORD: u32 = u32::from_ne_bytes([POISON_BYTE; 4]);

fn main() -> ExitCode {
    ch01_bootstrap::checks::exit_code("ch03-put-get", run())
}

/// Every way of moving bytes the chapter shows.
#[derive(Debug, Clone, Copy)]
enum Op {
    DevicePut(Scope, Completion),
    DeviceGet(Scope, Completion),
    DevicePutSignal,
    DeviceStore,
    DeviceBulkPut,
    HostPut(Completion),
    HostGet(Completion),
    HostPutSignal,
}

impl Op {
    fn all() -> Vec<Op> {
        let mut ops = Vec::new();
        for scope in Scope::ALL {
            for completion in Completion::ALL {
                ops.push(Op::DevicePut(scope, completion));
                ops.push(Op::DeviceGet(scope, completion));
            }
        }
        ops.extend([Op::DevicePutSignal, Op::DeviceStore, Op::DeviceBulkPut]);
        for completion in Completion::ALL {
            ops.extend([Op::HostPut(completion), Op::HostGet(completion)]);
        }
        ops.push(Op::HostPutSignal);
        ops
    }

    fn name(self) -> String {
        match self {
            Op::DevicePut(s, c) => format!("device put  {:<6} {}", s.name(), c.name()),
            Op::DeviceGet(s, c) => format!("device get  {:<6} {}", s.name(), c.name()),
            Op::DevicePutSignal => "device putmem_signal (block) + signal wait".into(),
            Op::DeviceStore => "device stores through nvshmem_ptr".into(),
            Op::DeviceBulkPut => "device put through the bulk-copy (TMA) unit".into(),
            Op::HostPut(c) => format!("host put on stream  {}", c.name()),
            Op::HostGet(c) => format!("host get on stream  {}", c.name()),
            Op::HostPutSignal => "host putmem_signal on stream + device wait".into(),
        }
    }
}

/// Where a case's result lands, and so what to compare against what.
enum Expect {
    /// My symmetric inbox holds the previous PE's words 0..count at OFFSET.
    PutInbox,
    /// My local buffer holds the next PE's words OFFSET..OFFSET + count at 0.
    GetLocal,
    /// My inbox holds the previous PE's words at 0, and so does what the consumer saw.
    SignalInboxAndSeen,
}

/// The buffers one message size needs, allocated once (symmetric allocations are collective).
struct Buffers<'w> {
    len: usize,
    /// Local source of puts: this PE's words.
    src_local: CudaSlice<u32>,
    /// Symmetric source of gets: this PE's words, read by the previous PE.
    src_sym: SymmetricBuffer<&'w World, u32>,
    /// Symmetric destination of puts.
    inbox: SymmetricBuffer<&'w World, u32>,
    /// Local destination of gets.
    dst_local: CudaSlice<u32>,
    /// What a consumer kernel copied out of its inbox right after its signal arrived.
    seen: CudaSlice<u32>,
    signal: SymmetricBuffer<&'w World, u64>,
}

fn run() -> Result<bool, AnyError> {
    let world = World::from_env()?;
    let (me, n) = (world.my_pe(), world.n_pes());
    let (next, previous) = ((me + 1) % n, (me + n - 1) % n);
    let ops = DeviceOps::new(&world)?;
    let mut tally = Tally::default();
    println!(
        "pe {me}/{n}: sending to pe {next}, receiving from pe {previous}; {} variants x {} sizes",
        Op::all().len(),
        EXAMPLE_SIZES_WORDS.len()
    );
    let mut case_idx = 0u64;
    for count in EXAMPLE_SIZES_WORDS {
        let mut buffers = Buffers::new(&world, count)?;
        for op in Op::all() {
            case_idx += 1;
            run_case(&ops, &mut buffers, op, count, case_idx, &mut tally)?;
        }
    }
    mistakes_are_caught(&ops, &mut tally)?;
    drop(ops);
    Ok(tally.finish(&world)?)
}

impl<'w> Buffers<'w> {
    fn new(world: &'w World, count: usize) -> Result<Self, AnyError> {
        let len = count + OFFSET + 16;
        let stream = world.stream();
        Ok(Self {
            len,
            src_local: stream.alloc_zeros(len)?,
            src_sym: SymmetricBuffer::new(world, len)?,
            inbox: SymmetricBuffer::new(world, len)?,
            dst_local: stream.alloc_zeros(len)?,
            seen: stream.alloc_zeros(len)?,
            signal: SymmetricBuffer::new(world, 1)?,
        })
    }
}

/// The words PE `pe` sends in case `case_idx`: random, fresh in every job (the seed mixes in
/// the job's unique id), and reproducible by any PE without communication.
fn words_of(world: &World, pe: usize, case_idx: u64, len: usize) -> Vec<u32> {
    let seed =
        world.job_seed() ^ case_idx.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ ((pe as u64) << 48);
    let mut rng = StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.random::<u32>()).collect()
}

fn poison(world: &World, ptr: u64, num_bytes: usize) -> Result<(), AnyError> {
    // SAFETY: callers pass a live device allocation of at least `num_bytes`.
    unsafe {
        cudarc::driver::result::memset_d8_async(
            ptr,
            POISON_BYTE,
            num_bytes,
            world.stream().cu_stream(),
        )
    }?;
    Ok(())
}

// ANCHOR: run_case
fn run_case(
    ops: &DeviceOps,
    b: &mut Buffers,
    op: Op,
    count: usize,
    case_idx: u64,
    tally: &mut Tally,
) -> Result<(), AnyError> {
    let world = ops.world();
    let stream = world.stream();
    let (me, n) = (world.my_pe(), world.n_pes());
    let (next, previous) = ((me + 1) % n, (me + n - 1) % n);
    let shape = LaunchShape::default();

    // Fresh data in both sources; poison in every destination; signals at 0. The barrier
    // makes all of it land on every PE before any PE starts writing into a peer.
    let mine = words_of(world, me, case_idx, b.len);
    stream.memcpy_htod(&mine, &mut b.src_local)?;
    stream.synchronize()?;
    b.src_sym.copy_from_host(&mine)?;
    b.inbox.fill_bytes(POISON_BYTE)?;
    poison(world, b.dst_local.device_address(stream), b.len * 4)?;
    poison(world, b.seen.device_address(stream), b.len * 4)?;
    b.signal.fill_bytes(0)?;
    world.barrier_all()?;

    let expect = match op {
        Op::DevicePut(scope, completion) => {
            ops.put(
                scope,
                completion,
                shape,
                &b.inbox,
                OFFSET,
                &b.src_local,
                count,
                next,
            )?;
            Expect::PutInbox
        }
        Op::DeviceGet(scope, completion) => {
            ops.get(
                scope,
                completion,
                shape,
                &b.dst_local,
                &b.src_sym,
                OFFSET,
                count,
                next,
            )?;
            Expect::GetLocal
        }
        Op::DevicePutSignal => {
            ops.put_signal_ring(
                shape,
                &b.inbox,
                &b.src_local,
                count,
                &b.signal,
                &b.seen,
                next,
                previous,
            )?;
            Expect::SignalInboxAndSeen
        }
        Op::DeviceStore => {
            ops.store(shape, &b.inbox, OFFSET, &b.src_local, count, next)?;
            Expect::PutInbox
        }
        Op::DeviceBulkPut => {
            ops.put_bulk(shape, &b.inbox, OFFSET, &b.src_local, count, next)?;
            Expect::PutInbox
        }
        Op::HostPut(Completion::Blocking) => {
            put_on_stream(&b.inbox, OFFSET, &b.src_local, count, next)?;
            Expect::PutInbox
        }
        Op::HostPut(Completion::NonBlockingQuiet) => {
            put_nbi_on_stream(&b.inbox, OFFSET, &b.src_local, count, next)?;
            quiet_on_stream(world);
            Expect::PutInbox
        }
        Op::HostGet(Completion::Blocking) => {
            get_on_stream(&b.dst_local, &b.src_sym, OFFSET, count, next)?;
            Expect::GetLocal
        }
        Op::HostGet(Completion::NonBlockingQuiet) => {
            get_nbi_on_stream(&b.dst_local, &b.src_sym, OFFSET, count, next)?;
            quiet_on_stream(world);
            Expect::GetLocal
        }
        Op::HostPutSignal => {
            // The host produces, a kernel on the receiver consumes: the stream carries the
            // put (to the next PE), then this PE's own wait for the previous PE's signal.
            put_signal_on_stream(
                &b.inbox,
                0,
                &b.src_local,
                count,
                &b.signal,
                0,
                1,
                SignalOp::Add,
                next,
            )?;
            ops.wait_signal_copy(shape, &b.inbox, count, &b.signal, 1, &b.seen, previous)?;
            Expect::SignalInboxAndSeen
        }
    };
    // Completes every PE's puts: after it, each inbox holds what its sender put there.
    world.barrier_all()?;

    let poison_word = POISON_WORD;
    let wrong = match expect {
        Expect::PutInbox => {
            let sent = words_of(world, previous, case_idx, b.len);
            count_wrong(
                &b.inbox.copy_to_host()?,
                OFFSET,
                &sent[..count],
                poison_word,
            )
        }
        Expect::GetLocal => {
            let sent = words_of(world, next, case_idx, b.len);
            let got = stream.clone_dtoh(&b.dst_local)?;
            count_wrong(&got, 0, &sent[OFFSET..OFFSET + count], poison_word)
        }
        Expect::SignalInboxAndSeen => {
            let sent = words_of(world, previous, case_idx, b.len);
            let inbox = b.inbox.copy_to_host()?;
            let seen = stream.clone_dtoh(&b.seen)?;
            count_wrong(&inbox, 0, &sent[..count], poison_word)
                + count_wrong(&seen, 0, &sent[..count], poison_word)
        }
    };
    if me == 0 {
        println!(
            "pe {me}: {:<46} {:>8} bytes  {}",
            op.name(),
            count * 4,
            if wrong == 0 { "ok" } else { "WRONG" }
        );
    }
    tally.check(me, wrong == 0, || {
        format!(
            "{} of {count} words: {wrong} words differ from the host reference",
            op.name()
        )
    });
    Ok(())
}

/// Words of `got` that differ from: poison before `offset`, `expected` from `offset`, poison
/// after it. A write past either end shows up as much as a missing one.
fn count_wrong(got: &[u32], offset: usize, expected: &[u32], poison: u32) -> usize {
    got.iter()
        .enumerate()
        .filter(|&(i, &word)| {
            let want = if (offset..offset + expected.len()).contains(&i) {
                expected[i - offset]
            } else {
                poison
            };
            word != want
        })
        .count()
}
// ANCHOR_END: run_case

// ANCHOR: mistakes
/// Each call below is wrong in one way and must come back as an error before anything is
/// enqueued: afterwards the poisoned inbox must still be all poison on every PE.
fn mistakes_are_caught(ops: &DeviceOps, tally: &mut Tally) -> Result<(), AnyError> {
    let world = ops.world();
    let stream = world.stream();
    let (me, n) = (world.my_pe(), world.n_pes());
    let next = (me + 1) % n;
    let len = 64;
    let inbox = SymmetricBuffer::<_, u32>::new(world, len)?;
    let src: CudaSlice<u32> = stream.alloc_zeros(len)?;
    let short_src: CudaSlice<u32> = stream.alloc_zeros(2)?;
    let private: CudaSlice<u32> = stream.alloc_zeros(len)?;
    inbox.fill_bytes(POISON_BYTE)?;
    world.barrier_all()?;
    let shape = LaunchShape::default();
    let src_ptr = src.device_address(stream);
    let attempts: Vec<(&str, Option<String>, &str)> = vec![
        (
            "host put to a PE that does not exist",
            put_on_stream(&inbox, 0, &src, 4, n)
                .err()
                .map(|e| e.to_string()),
            "out of range",
        ),
        (
            "host put past the end of the allocation",
            put_on_stream(&inbox, len - 2, &src, 4, next)
                .err()
                .map(|e| e.to_string()),
            "past the end",
        ),
        (
            "device get from a PE that does not exist",
            ops.get(
                Scope::Warp,
                Completion::Blocking,
                shape,
                &src,
                &inbox,
                0,
                4,
                n + 3,
            )
            .err()
            .map(|e| e.to_string()),
            "out of range",
        ),
        (
            "device put of more words than the source holds",
            ops.put(
                Scope::Block,
                Completion::Blocking,
                shape,
                &inbox,
                0,
                &short_src,
                4,
                next,
            )
            .err()
            .map(|e| e.to_string()),
            "local source holds 2 elements",
        ),
        (
            "device put with 100 threads per block",
            ops.put(
                Scope::Warp,
                Completion::Blocking,
                LaunchShape {
                    num_blocks: 4,
                    threads_per_block: 100,
                },
                &inbox,
                0,
                &src,
                4,
                next,
            )
            .err()
            .map(|e| e.to_string()),
            "multiple of 32",
        ),
        (
            "raw put to a cudaMalloc pointer",
            // SAFETY: `src_ptr` holds 16 bytes; the call must fail before using it.
            unsafe { put_raw_on_stream(world, private.device_address(stream), src_ptr, 16, next) }
                .err()
                .map(|e| e.to_string()),
            "not inside NVSHMEM's symmetric heap",
        ),
        (
            "raw put that runs off the end of the heap",
            // SAFETY: as above; 1 TiB cannot fit any heap, so nothing is read.
            unsafe { put_raw_on_stream(world, inbox.device_ptr(), src_ptr, 1 << 40, next) }
                .err()
                .map(|e| e.to_string()),
            "past the end of NVSHMEM's symmetric heap",
        ),
    ];
    for (what, error, expected) in &attempts {
        let ok = error.as_deref().is_some_and(|e| e.contains(expected));
        if me == 0 {
            println!(
                "pe {me}: {what}: {}",
                error.as_deref().unwrap_or("NOT REJECTED")
            );
        }
        tally.check(me, ok, || {
            format!("{what}: expected an error containing {expected:?}, got {error:?}")
        });
    }
    // Had any of them been enqueued, some PE's inbox would hold zeros from `src`.
    world.barrier_all()?;
    let untouched = inbox.copy_to_host()?.iter().all(|&w| w == POISON_WORD);
    tally.check(me, untouched, || {
        "a rejected call wrote into the inbox".into()
    });
    Ok(())
}
// ANCHOR_END: mistakes
