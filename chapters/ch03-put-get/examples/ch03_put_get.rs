//! Chapter 3's runnable step (setup and the run line: book/src/introduction.md, "Before you
//! start"):
//!
//! ```text
//! torchrun --standalone --nproc_per_node=2 --no-python target/release/ch03-put-get
//! ```
//!
//! On a ring (every PE sends to the next, receives from the previous, as in chapter 1), runs
//! every way of moving bytes this chapter teaches ([`move_bytes`]). Each is checked against a
//! host reference on fresh random data, into a poisoned destination (the harness:
//! `ch01_bootstrap::checks`). Then the mistakes are made on purpose, and each must be an
//! error before anything is enqueued.

use std::process::ExitCode;

use ch01_bootstrap::World;
use ch01_bootstrap::checks::{POISON_BYTE, POISON_WORD, Tally, count_wrong, fresh_words, poison};
use ch02_symmetric_memory::SymmetricBuffer;
use ch03_put_get::config::{EXAMPLE_DST_OFFSET_WORDS as OFFSET, EXAMPLE_SIZES_WORDS};
use ch03_put_get::{
    Completion, DeviceOps, Get, LaunchShape, LocalBuffer, Put, PutGetError, Scope, SignalOp,
    SignalWord, Wait, get_on_stream, put_on_stream, put_signal_on_stream, quiet_on_stream,
};
use cudarc::driver::CudaSlice;

type AnyError = Box<dyn std::error::Error>;

fn main() -> ExitCode {
    ch01_bootstrap::checks::exit_code("ch03-put-get", run())
}

fn run() -> Result<bool, AnyError> {
    let world = World::from_env()?;
    let (me, n) = (world.my_pe(), world.n_pes());
    let (next, previous) = ring_neighbours(&world);
    let ops = DeviceOps::new(&world)?;
    let mut tally = Tally::default();
    println!(
        "pe {me}/{n}: sending to pe {next}, receiving from pe {previous}; {} variants x {} sizes",
        Variant::all().len(),
        EXAMPLE_SIZES_WORDS.len()
    );
    let mut case_idx = 0u64;
    for count in EXAMPLE_SIZES_WORDS {
        let mut buffers = Buffers::new(&world, count)?;
        for variant in Variant::all() {
            case_idx += 1;
            buffers.prepare(case_idx)?;
            let landing = move_bytes(&ops, &mut buffers, variant)?;
            // Completes every PE's puts: after it, each inbox holds what its sender put there.
            world.barrier_all()?;
            buffers.check(variant, landing, case_idx, &mut tally)?;
        }
    }
    mistakes_are_caught(&ops, &mut tally)?;
    drop(ops);
    Ok(tally.finish(&world)?)
}

/// (next, previous) PE on the ring.
fn ring_neighbours(world: &World) -> (usize, usize) {
    let (me, n) = (world.my_pe(), world.n_pes());
    ((me + 1) % n, (me + n - 1) % n)
}

/// Every way of moving bytes the chapter shows.
#[derive(Debug, Clone, Copy)]
enum Variant {
    DevicePut(Scope, Completion),
    DeviceGet(Scope, Completion),
    DevicePutSignal,
    DeviceStore,
    DeviceStorePut,
    DeviceBulkPut,
    HostPut(Completion),
    HostGet(Completion),
    HostPutSignal,
}

/// Where a variant's result lands, and so what to compare against what.
enum Landing {
    /// My symmetric inbox holds the previous PE's words 0..count at OFFSET.
    Inbox,
    /// The same at 0 (16-byte aligned: the vector path of the store-based put).
    InboxAtZero,
    /// My local buffer holds the next PE's words OFFSET..OFFSET + count at 0.
    Local,
    /// My inbox holds the previous PE's words at 0, and so does what the consumer copied out
    /// of it right after its signal arrived.
    InboxAndSeen,
}

// ANCHOR: move_bytes
// ANCHOR: move_bytes_transfers
/// The lesson: moves `b.count` words one step around the ring the way `variant` says, and
/// says where they land.
fn move_bytes(ops: &DeviceOps, b: &mut Buffers, variant: Variant) -> Result<Landing, AnyError> {
    let world = ops.world();
    let (next, previous) = ring_neighbours(world);
    let shape = LaunchShape::one_per_sm(world);
    // My words into the next PE's inbox, at an offset; the next PE's words into my buffer.
    let put = Put::new(&b.inbox, OFFSET, &b.src_local, b.count, next)?;
    let get = Get::new(&b.dst_local, &b.src_sym, OFFSET, b.count, next)?;
    // The signal variants put at offset 0 and raise the next PE's signal word; the put
    // written as stores goes there too (aligned, so its 16-byte path runs).
    let signal_put = Put::new(&b.inbox, 0, &b.src_local, b.count, next)?;
    let word = SignalWord::new(&b.signal, 0)?;
    // ANCHOR_END: move_bytes_transfers
    // ANCHOR: move_bytes_variants
    let landing = match variant {
        Variant::DevicePut(scope, completion) => {
            ops.put(scope, completion, shape, &put)?;
            Landing::Inbox
        }
        Variant::DeviceGet(scope, completion) => {
            ops.get(scope, completion, shape, &get)?;
            Landing::Local
        }
        Variant::DeviceStore => {
            ops.store(shape, &put, true)?;
            Landing::Inbox
        }
        Variant::DeviceStorePut => {
            ops.put_stores(shape, &signal_put)?;
            Landing::InboxAtZero
        }
        Variant::DeviceBulkPut => {
            ops.put_bulk(shape, &put)?;
            Landing::Inbox
        }
        Variant::HostPut(completion) => {
            put_on_stream(completion, &put);
            Landing::Inbox
        }
        Variant::HostGet(completion) => {
            get_on_stream(completion, &get);
            Landing::Local
        }
        Variant::DevicePutSignal => {
            // Every block of the previous PE adds 1 to my word, which is never reset: wait
            // for the running total.
            b.signal_total += u64::from(shape.num_blocks);
            let wait = Wait::new(word, b.signal_total, previous)?;
            ops.put_signal_ring(shape, &signal_put, &wait, &b.seen)?;
            Landing::InboxAndSeen
        }
        Variant::HostPutSignal => {
            // The host produces (the put, then ADD 1 to the next PE's word), a kernel here
            // consumes (waits for the previous PE's add), both in stream order.
            b.signal_total += 1;
            let wait = Wait::new(word, b.signal_total, previous)?;
            put_signal_on_stream(&signal_put, &word, SignalOp::Add, 1);
            ops.wait_signal_copy(shape, &wait, &b.inbox, b.count, &b.seen)?;
            Landing::InboxAndSeen
        }
    };
    // `_nbi` from the host: quiet completes it, in stream order.
    if let Variant::HostPut(c) | Variant::HostGet(c) = variant
        && c == Completion::NonBlockingQuiet
    {
        quiet_on_stream(world);
    }
    Ok(landing)
}
// ANCHOR_END: move_bytes_variants
// ANCHOR_END: move_bytes

impl Variant {
    fn all() -> Vec<Variant> {
        let mut variants = Vec::new();
        for scope in Scope::ALL {
            for completion in Completion::ALL {
                variants.push(Variant::DevicePut(scope, completion));
                variants.push(Variant::DeviceGet(scope, completion));
            }
        }
        variants.extend([
            Variant::DevicePutSignal,
            Variant::DeviceStore,
            Variant::DeviceStorePut,
            Variant::DeviceBulkPut,
        ]);
        for completion in Completion::ALL {
            variants.extend([Variant::HostPut(completion), Variant::HostGet(completion)]);
        }
        variants.push(Variant::HostPutSignal);
        variants
    }

    fn name(self) -> String {
        match self {
            Variant::DevicePut(s, c) => format!("device put  {:<6} {}", s.name(), c.name()),
            Variant::DeviceGet(s, c) => format!("device get  {:<6} {}", s.name(), c.name()),
            Variant::DevicePutSignal => "device putmem_signal (block) + signal wait".into(),
            Variant::DeviceStore => "device stores through nvshmem_ptr (fenced)".into(),
            Variant::DeviceStorePut => "device put written as stores (one fence per block)".into(),
            Variant::DeviceBulkPut => "device put through the bulk-copy (TMA) unit".into(),
            Variant::HostPut(c) => format!("host put on stream  {}", c.name()),
            Variant::HostGet(c) => format!("host get on stream  {}", c.name()),
            Variant::HostPutSignal => "host putmem_signal on stream + device wait".into(),
        }
    }
}

/// The buffers one message size needs, allocated once (symmetric allocations are collective).
struct Buffers<'w> {
    world: &'w World,
    /// Words moved per case.
    count: usize,
    /// Length of every buffer: room for the offset and poison after the written range.
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
    /// One signal word, zeroed once; it only ever rises after that.
    signal: SymmetricBuffer<&'w World, u64>,
    /// The value this PE's signal word reaches once the current round has arrived.
    signal_total: u64,
}

impl<'w> Buffers<'w> {
    fn new(world: &'w World, count: usize) -> Result<Self, AnyError> {
        let len = count + OFFSET + 16;
        let stream = world.stream();
        let signal = SymmetricBuffer::new(world, 1)?;
        // The first case's barrier makes this land before any peer adds to the word.
        signal.fill_bytes(0)?;
        Ok(Self {
            world,
            count,
            len,
            src_local: stream.alloc_zeros(len)?,
            src_sym: SymmetricBuffer::new(world, len)?,
            inbox: SymmetricBuffer::new(world, len)?,
            dst_local: stream.alloc_zeros(len)?,
            seen: stream.alloc_zeros(len)?,
            signal,
            signal_total: 0,
        })
    }

    /// Fresh data in both sources, poison in every destination; the barrier makes all of it
    /// land on every PE before any PE starts writing into a peer.
    fn prepare(&mut self, case_idx: u64) -> Result<(), AnyError> {
        let (world, stream) = (self.world, self.world.stream());
        let mine = fresh_words(world.job_seed(), world.my_pe(), case_idx, self.len);
        stream.memcpy_htod(&mine, &mut self.src_local)?;
        stream.synchronize()?;
        self.src_sym.copy_from_host(&mine)?;
        self.inbox.fill_bytes(POISON_BYTE)?;
        for local in [&self.dst_local, &self.seen] {
            // SAFETY: a live local allocation of `len` words.
            unsafe { poison(local.device_address(stream), self.len * 4, stream) }?;
        }
        world.barrier_all()?;
        Ok(())
    }

    /// Compares every word of the destination, including the poison that must survive
    /// around the written range, with what the sender's words must have produced.
    fn check(
        &self,
        variant: Variant,
        landing: Landing,
        case_idx: u64,
        tally: &mut Tally,
    ) -> Result<(), AnyError> {
        let (world, stream) = (self.world, self.world.stream());
        let (me, count) = (world.my_pe(), self.count);
        let (next, previous) = ring_neighbours(world);
        let words_of = |pe| fresh_words(world.job_seed(), pe, case_idx, self.len);
        let wrong = match landing {
            Landing::Inbox => {
                let sent = words_of(previous);
                count_wrong(
                    &self.inbox.copy_to_host()?,
                    OFFSET,
                    &sent[..count],
                    POISON_WORD,
                )
            }
            Landing::InboxAtZero => {
                let sent = words_of(previous);
                count_wrong(&self.inbox.copy_to_host()?, 0, &sent[..count], POISON_WORD)
            }
            Landing::Local => {
                let sent = words_of(next);
                let got = stream.clone_dtoh(&self.dst_local)?;
                count_wrong(&got, 0, &sent[OFFSET..OFFSET + count], POISON_WORD)
            }
            Landing::InboxAndSeen => {
                let sent = &words_of(previous)[..count];
                let seen = stream.clone_dtoh(&self.seen)?;
                count_wrong(&self.inbox.copy_to_host()?, 0, sent, POISON_WORD)
                    + count_wrong(&seen, 0, sent, POISON_WORD)
            }
        };
        if me == 0 {
            let verdict = if wrong == 0 { "ok" } else { "WRONG" };
            println!(
                "pe {me}: {:<46} {:>8} bytes  {verdict}",
                variant.name(),
                count * 4
            );
        }
        tally.check(me, wrong == 0, || {
            format!(
                "{} of {count} words: {wrong} words differ from the host reference",
                variant.name()
            )
        });
        Ok(())
    }
}

/// The mistakes made on purpose, and a piece of the error each must produce.
const MISTAKES: [(&str, &str); 8] = [
    ("put to a PE that does not exist", "out of range"),
    ("put past the end of the allocation", "past the end"),
    ("get from a PE that does not exist", "out of range"),
    (
        "put of more words than the source holds",
        "local source holds 2 elements",
    ),
    ("device put with 100 threads per block", "multiple of 32"),
    (
        "device ring with more blocks than can be resident at once",
        "resident at once",
    ),
    (
        "raw put to a cudaMalloc pointer",
        "not inside NVSHMEM's symmetric heap",
    ),
    (
        "raw put that runs off the end of the heap",
        "past the end of NVSHMEM's symmetric heap",
    ),
];

/// Each call below is wrong in one way and must come back as an error before anything is
/// enqueued: afterwards the poisoned inbox must still be all poison on every PE.
fn mistakes_are_caught(ops: &DeviceOps, tally: &mut Tally) -> Result<(), AnyError> {
    let world = ops.world();
    let stream = world.stream();
    let (me, n) = (world.my_pe(), world.n_pes());
    let (next, previous) = ring_neighbours(world);
    let len = 64;
    let inbox = SymmetricBuffer::<_, u32>::new(world, len)?;
    let signal = SymmetricBuffer::<_, u64>::new(world, 1)?;
    let src: CudaSlice<u32> = stream.alloc_zeros(len)?;
    let short_src: CudaSlice<u32> = stream.alloc_zeros(2)?;
    let private: CudaSlice<u32> = stream.alloc_zeros(len)?;
    inbox.fill_bytes(POISON_BYTE)?;
    world.barrier_all()?;
    let (src_ptr, private_ptr) = (src.device_address(stream), private.device_address(stream));
    let put = Put::new(&inbox, 0, &src, 4, next)?;
    let wait = Wait::new(SignalWord::new(&signal, 0)?, 1, previous)?;
    let too_many_blocks = LaunchShape {
        num_blocks: i32::MAX as u32,
        threads_per_block: 256,
    };
    let warp_of_100 = LaunchShape {
        num_blocks: 4,
        threads_per_block: 100,
    };
    // In the order of MISTAKES: each result must be the error that entry names.
    let results: [Result<(), PutGetError>; MISTAKES.len()] = [
        Put::new(&inbox, 0, &src, 4, n).map(drop),
        Put::new(&inbox, len - 2, &src, 4, next).map(drop),
        Get::new(&src, &inbox, 0, 4, n + 3).map(drop),
        Put::new(&inbox, 0, &short_src, 4, next).map(drop),
        ops.put(Scope::Warp, Completion::Blocking, warp_of_100, &put),
        ops.put_signal_ring(too_many_blocks, &put, &wait, &src),
        // SAFETY: `src_ptr` holds 16 bytes; the call must fail before using it.
        unsafe { Put::raw(world, private_ptr, src_ptr, 16, next) }.map(drop),
        // SAFETY: as above; 1 TiB cannot fit any heap, so nothing is read.
        unsafe { Put::raw(world, inbox.device_ptr(), src_ptr, 1 << 40, next) }.map(drop),
    ];
    for ((what, expected), result) in MISTAKES.into_iter().zip(results) {
        let message = tally.expect_error(me, what, result, expected);
        if me == 0 {
            println!("pe {me}: {what}: {message}");
        }
    }
    // Had any of them been enqueued, some PE's inbox would hold zeros from `src`.
    world.barrier_all()?;
    let untouched = inbox.copy_to_host()?.iter().all(|&w| w == POISON_WORD);
    tally.check(me, untouched, || {
        "a rejected call wrote into the inbox".into()
    });
    Ok(())
}
