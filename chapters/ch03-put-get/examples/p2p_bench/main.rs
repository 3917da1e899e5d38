//! The p2p benchmark: PE 0 -> PE 1 on one node, every implementation timed in the same run,
//! the same way.
//!
//! ```text
//! benchmarks/run_p2p.sh            # sets the heap size, NCCL's name, multicast off; runs this
//! torchrun --standalone --nproc_per_node=2 --no-python target/release/ch03-p2p-bench
//! ```
//!
//! Bandwidth (16 KiB .. 1 GiB, x4), one row per implementation, each the best of its sweep of
//! launch shapes: NVSHMEM's put (`nvshmemx_putmem_nbi_{warp,block}` + `nvshmem_quiet`), the
//! bulk-copy put (TMA stores through the `nvshmem_ptr` peer pointer), the block put written
//! as stores (`put_stores`), plain int4 stores through that pointer without and with a
//! system fence at the end, the copy engine (`cuMemcpyDtoDAsync` into it) and NCCL
//! send/recv.
//! Latency (8 B, 1 KiB, 16 KiB): the put-with-signal ping-pong inside one kernel, against
//! NCCL send/recv round trips captured in one CUDA graph (an eager NCCL call costs 30-50 us
//! of host overhead; graph replay leaves the link's time). One-way latency = round trip / 2.
//! Every measurement goes through one timing loop ([`Bench::samples_ms`]).
//!
//! Writes `<out>/p2p_<gpu>.csv`, `<out>/p2p_<gpu>_sweep.csv` (out: `$P2P_BENCH_OUT`, else
//! benchmarks/results).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use ch01_bootstrap::World;
use ch02_symmetric_memory::SymmetricBuffer;
use ch03_put_get::bench::{self, Row, SweepPoint};
use ch03_put_get::nccl::{self, NcclPair};
use ch03_put_get::{
    Completion, DeviceOps, Get, LaunchShape, LocalBuffer, Put, PutGetError, Scope, SignalWord,
    get_on_stream,
};
use cudarc::driver::{CudaEvent, CudaGraph, CudaSlice, CudaStream, sys};

mod few_sms;
mod timing;

use few_sms::{FEW_SMS_BLOCKS, FEW_SMS_BYTES, few_sms};
use timing::{Bench, capture, scaled};

type AnyError = Box<dyn std::error::Error>;

/// Timed samples per measurement (after one warm-up); the median is reported.
const NUM_SAMPLES: usize = 7;
/// Launch shapes each kernel is swept over, per size.
const PUT_BLOCKS: [u32; 6] = [8, 16, 32, 66, 132, 264];
/// Blocks of the bulk-copy put (one issuing thread each, 32 KiB of shared memory).
const BULK_BLOCKS: [u32; 5] = [16, 66, 132, 264, 528];
const STORE_BLOCKS: [u32; 5] = [66, 132, 264, 528, 1056];
/// Blocks of the put written as stores: one slice each, so small puts want few of them.
const STORE_PUT_BLOCKS: [u32; 7] = [8, 16, 32, 66, 132, 264, 528];
const THREADS: [u32; 3] = [256, 512, 1024];
/// Latency message sizes, and round trips per timed kernel or graph.
const LATENCY_BYTES: [usize; 3] = [8, 1024, 16384];
const PUT_PINGPONG_ITERS: u64 = 2000;
const NCCL_PINGPONG_ROUND_TRIPS: usize = 100;
const PINGPONG_THREADS: u32 = 256;
/// Bytes written before each sample to evict the previous sample's data from L2 (50 MiB on
/// H100/H200).
const FLUSH_BYTES: usize = 256 << 20;

fn main() -> ExitCode {
    ch01_bootstrap::checks::exit_code("ch03-p2p-bench", run())
}

/// The kernels' CSV methods, one per implementation.
const KERNEL_METHODS: [&str; 5] = [
    "nvshmem_put",
    "bulk_put",
    "store_put",
    "store",
    "store_fenced",
];

/// A kernel that moves the bytes, with the launch shapes it is swept over.
#[derive(Clone, Copy)]
enum Kernel {
    NvshmemPut(Scope),
    BulkPut,
    /// The block put written as stores (`put_stores`: one fence per block).
    StorePut,
    /// Plain stores; `true`: every thread ends with a system fence (a put's completion).
    Store(bool),
}

impl Kernel {
    const ALL: [Kernel; 6] = [
        Kernel::NvshmemPut(Scope::Warp),
        Kernel::NvshmemPut(Scope::Block),
        Kernel::BulkPut,
        Kernel::StorePut,
        Kernel::Store(false),
        Kernel::Store(true),
    ];

    /// The CSV's method: one per implementation.
    fn method(self) -> &'static str {
        match self {
            Kernel::NvshmemPut(_) => "nvshmem_put",
            Kernel::BulkPut => "bulk_put",
            Kernel::StorePut => "store_put",
            Kernel::Store(false) => "store",
            Kernel::Store(true) => "store_fenced",
        }
    }

    /// The sweep CSV's scope column: which threads share one call or one chunk.
    fn scope(self) -> &'static str {
        match self {
            Kernel::NvshmemPut(scope) => scope.name(),
            Kernel::BulkPut | Kernel::StorePut => "block",
            Kernel::Store(_) => "grid",
        }
    }

    fn shapes(self) -> Vec<LaunchShape> {
        let (blocks, threads): (&[u32], &[u32]) = match self {
            Kernel::NvshmemPut(_) => (&PUT_BLOCKS, &THREADS),
            Kernel::BulkPut => (&BULK_BLOCKS, &[32]),
            Kernel::StorePut => (&STORE_PUT_BLOCKS, &THREADS),
            Kernel::Store(_) => (&STORE_BLOCKS, &THREADS),
        };
        let shape = |num_blocks, threads_per_block| LaunchShape {
            num_blocks,
            threads_per_block,
        };
        let for_blocks = |&b: &u32| threads.iter().map(move |&t| shape(b, t));
        blocks.iter().flat_map(for_blocks).collect()
    }

    fn point(self, shape: LaunchShape, num_bytes: usize, us: f64) -> SweepPoint {
        SweepPoint {
            method: self.method(),
            scope: self.scope(),
            num_blocks: shape.num_blocks,
            threads_per_block: shape.threads_per_block,
            num_bytes,
            us,
        }
    }

    fn enqueue(self, ops: &DeviceOps, shape: LaunchShape, put: &Put) -> Result<(), PutGetError> {
        match self {
            Kernel::NvshmemPut(scope) => ops.put(scope, Completion::NonBlockingQuiet, shape, put),
            Kernel::BulkPut => ops.put_bulk(shape, put),
            Kernel::StorePut => ops.put_stores(shape, put),
            Kernel::Store(fenced) => ops.store(shape, put, fenced),
        }
    }
}

fn run() -> Result<bool, AnyError> {
    let world = World::from_env()?;
    let me = world.my_pe();
    if world.n_pes() != 2 {
        return Err(format!(
            "the p2p benchmark measures PE 0 -> PE 1 and needs exactly 2 PEs, got {}: \
             torchrun --nproc_per_node=2",
            world.n_pes()
        )
        .into());
    }
    let out_dir = PathBuf::from(
        std::env::var("P2P_BENCH_OUT").unwrap_or_else(|_| "benchmarks/results".into()),
    );
    let ops = DeviceOps::new(&world)?;
    let bench = Bench::new(&ops)?;
    let stream = world.stream();
    let sizes = bench::sizes();
    let max_bytes = *sizes.last().unwrap();
    // The symmetric destination (PE 1's copy is the target) and a local source.
    let dst = SymmetricBuffer::<_, u8>::new(&world, max_bytes)?;
    let src: CudaSlice<u8> = stream.alloc_zeros(max_bytes)?;
    let src_ptr = src.device_address(stream);
    // SAFETY: `src_ptr` holds max_bytes; content is irrelevant to the link but not zero.
    unsafe {
        cudarc::driver::result::memset_d8_async(src_ptr, 0x5A, max_bytes, stream.cu_stream())
    }?;
    let gpu_name = world.context().name()?;
    let tag = bench::gpu_tag(&gpu_name);
    let mut comments = header(&world)?;
    let mut rows = Vec::new();
    let mut sweep = Vec::new();

    // ---- bandwidth: kernels and the copy engine (PE 0 works, PE 1 waits) ------------------
    if me == 0 {
        println!("pe 0: {gpu_name}; sizes {sizes:?}");
        let best_shapes = bandwidth(&bench, &ops, (&dst, &src), &sizes, (&mut rows, &mut sweep))?;
        comments.extend(best_shapes);
    }
    world.barrier_all()?;

    // ---- latency: put-with-signal ping-pong in one kernel per PE ---------------------------
    comments.push(put_latency(&world, &bench, &ops, &src, &mut rows)?);
    if me == 0 {
        write_results(&out_dir, &tag, &comments, &rows, &sweep)?;
    }

    // ---- NCCL: bandwidth and latency, both PEs work -----------------------------------------
    comments.extend(nccl_rows(&world, &bench, &src, &sizes, &mut rows)?);
    if me == 0 {
        bench::sort_rows(&mut rows);
        write_results(&out_dir, &tag, &comments, &rows, &sweep)?;
    }
    drop(ops);
    world.barrier_all()?;
    Ok(true)
}

/// Bandwidth, PE 0 alone: every kernel's launch shapes at every size (the sweep), the fastest
/// shape per method as its row, the copy engine, then the few-SM rows. Returns the comments
/// naming each method's best shapes.
fn bandwidth(
    bench: &Bench,
    ops: &DeviceOps,
    (dst, src): (&SymmetricBuffer<&World, u8>, &CudaSlice<u8>),
    sizes: &[usize],
    (rows, sweep): (&mut Vec<Row>, &mut Vec<SweepPoint>),
) -> Result<Vec<String>, AnyError> {
    let stream = ops.world().stream();
    let src_ptr = src.device_address(stream);
    for &num_bytes in sizes {
        let put = Put::new(dst, 0, src, num_bytes, 1)?;
        for kernel in Kernel::ALL {
            for shape in kernel.shapes() {
                let enqueue = || Ok(kernel.enqueue(ops, shape, &put)?);
                let us = bench.time_ops(num_bytes, enqueue)?;
                sweep.push(kernel.point(shape, num_bytes, us));
            }
        }
        for method in KERNEL_METHODS {
            let fastest = bench::best(sweep, method, num_bytes).ok_or("empty sweep")?;
            rows.push(Row::new(method, num_bytes, fastest.us));
        }
        // ANCHOR: copy_engine
        // The copy engine: a DMA unit, no SM involved, fed one descriptor per copy.
        let peer_dst = dst.peer_ptr(1)?.ok_or("PE 1 is not load/store reachable")?;
        let us = bench.time_ops(num_bytes, || {
            // SAFETY: `peer_dst` is PE 1's copy of `dst` (max_bytes), `src_ptr` local.
            let (dst, src, s) = (peer_dst, src_ptr, stream.cu_stream());
            unsafe { cudarc::driver::result::memcpy_dtod_async(dst, src, num_bytes, s) }?;
            Ok(())
        })?;
        // ANCHOR_END: copy_engine
        rows.push(Row::new("copy_engine", num_bytes, us));
        println!("pe 0: {}", bench::size_line(rows, num_bytes));
    }
    let best_shapes = KERNEL_METHODS.map(|m| bench::best_shapes_comment(sweep, m, sizes));
    few_sms(bench, ops, dst, src, sweep, rows)?;
    Ok(best_shapes.into())
}

/// One-way latency of put-with-signal ping-pongs, a kernel per PE, both PEs working (PE 0
/// times). Returns the method's comment.
fn put_latency(
    world: &World,
    bench: &Bench,
    ops: &DeviceOps,
    src: &CudaSlice<u8>,
    rows: &mut Vec<Row>,
) -> Result<String, AnyError> {
    let me = world.my_pe();
    let ping_buffer = SymmetricBuffer::<_, u8>::new(world, *LATENCY_BYTES.iter().max().unwrap())?;
    let ping_signal = SymmetricBuffer::<_, u64>::new(world, 1)?;
    // Zeroed once (the timing loop's barrier before the first sample makes the zero land
    // first); after that every launch, of every size, continues from the value the last one
    // left, which both PEs track in `signal_value`.
    ping_signal.fill_bytes(0)?;
    let word = SignalWord::new(&ping_signal, 0)?;
    let mut signal_value = 0u64;
    for num_bytes in LATENCY_BYTES {
        let put = Put::new(&ping_buffer, 0, src, num_bytes, 1 - me)?;
        let samples = bench.samples_ms(true, |_| {
            let (first_value, iters) = (signal_value, PUT_PINGPONG_ITERS);
            signal_value += iters;
            Ok(ops.launch_pingpong(PINGPONG_THREADS, &put, &word, first_value, me == 0, iters)?)
        })?;
        let us = bench::median(&mut scaled(samples, 1e3 / (2 * PUT_PINGPONG_ITERS) as f64));
        if me == 0 {
            println!("pe 0: put_signal_pingpong {num_bytes:>6} B: one-way {us:.2} us");
            rows.push(Row::new("put_signal_pingpong", num_bytes, us));
        }
    }
    Ok(format!(
        "put_signal_pingpong: {PUT_PINGPONG_ITERS} round trips in one kernel per PE (1 block of \
         {PINGPONG_THREADS} threads; thread-scope putmem_signal_nbi up to 256 B, block-scope above), \
         CUDA events around the kernel on PE 0; one-way = time / (2 x round trips)"
    ))
}

/// NCCL beside the kernels: send/recv bandwidth at every size (the slower PE's time, sample by
/// sample) and the ping-pong latency, both PEs working. Returns the methods' comments.
fn nccl_rows(
    world: &World,
    bench: &Bench,
    src: &CudaSlice<u8>,
    sizes: &[usize],
    rows: &mut Vec<Row>,
) -> Result<Vec<String>, AnyError> {
    let (me, stream) = (world.my_pe(), world.stream());
    nccl::probe_nccl()?;
    let nccl_version =
        cudarc::nccl::result::get_nccl_version().map_err(|e| format!("ncclGetVersion: {e:?}"))?;
    let mut comments = vec![format!("nccl: {}", nccl::nccl_version_string(nccl_version))];
    // Both PEs receive into / send from their own 1 GiB `src` buffer.
    let comm = NcclPair::new(world, src)?;
    let mut own_samples = Vec::new();
    for &num_bytes in sizes {
        let samples =
            bench.time_ops_samples(true, num_bytes, || Ok(comm.p2p(me == 0, num_bytes)?))?;
        own_samples.extend(samples);
    }
    // A send/recv is done when both sides are: take the slower PE's time, sample by sample.
    let peer_samples = exchange(world, &own_samples)?;
    if me == 0 {
        for (i, &num_bytes) in sizes.iter().enumerate() {
            let range = i * NUM_SAMPLES..(i + 1) * NUM_SAMPLES;
            let mut slower: Vec<f64> = own_samples[range.clone()]
                .iter()
                .zip(&peer_samples[range])
                .map(|(a, b)| a.max(*b))
                .collect();
            rows.push(Row::new("nccl", num_bytes, bench::median(&mut slower)));
            println!("pe 0: {}", bench::size_line(rows, num_bytes));
        }
    }
    // ANCHOR: nccl_pingpong
    // NCCL latency: R round trips captured in one graph on each PE (PE 0 sends then receives,
    // PE 1 receives then sends), replayed; one-way = time / 2R.
    for num_bytes in LATENCY_BYTES {
        let graph = capture(stream, NCCL_PINGPONG_ROUND_TRIPS, || {
            let first_sends = me == 0;
            comm.p2p(first_sends, num_bytes)?;
            Ok(comm.p2p(!first_sends, num_bytes)?)
        })?;
        graph.upload()?;
        let samples = bench.samples_ms(true, |_| Ok(graph.launch()?))?;
        let one_way = 1e3 / (2 * NCCL_PINGPONG_ROUND_TRIPS) as f64;
        let us = bench::median(&mut scaled(samples, one_way));
        if me == 0 {
            println!("pe 0: nccl_pingpong {num_bytes:>6} B: one-way {us:.2} us");
            rows.push(Row::new("nccl_pingpong", num_bytes, us));
        }
    }
    // ANCHOR_END: nccl_pingpong
    comments.push(format!(
        "nccl_pingpong: {NCCL_PINGPONG_ROUND_TRIPS} round trips (ncclSend + ncclRecv, uint8) captured \
         in one CUDA graph per PE, replayed between CUDA events on PE 0; one-way = time / (2 x round trips)"
    ));
    comments.push(
        "nccl: graph of K ncclSend (PE 0) / ncclRecv (PE 1), time of the slower PE per sample"
            .into(),
    );
    drop(comm);
    Ok(comments)
}

/// The CSV's `#` lines: hardware, software and method.
fn header(world: &World) -> Result<Vec<String>, AnyError> {
    let mut lines =
        vec!["p2p: PE 0 -> PE 1 (one node, NVLink), every method timed in the same run".into()];
    lines.extend(bench::machine_lines(world)?);
    lines.extend([
        "bandwidth: gb_per_s = bytes moved by one operation / its median time (1 GB = 1e9 B); us = that time".into(),
        format!(
            "timing: CUDA graph of K back-to-back operations (K = min(100, ceil(256 MiB / size))), \
             1 warm-up + {NUM_SAMPLES} replays between CUDA events, {} MiB L2 flush before each, median",
            FLUSH_BYTES >> 20
        ),
        format!(
            "methods (each kernel: the best of its launch shapes, all in the sweep csv): \
             nvshmem_put = nvshmemx_putmem_nbi_{{warp,block}} + nvshmem_quiet in one kernel, \
             {PUT_BLOCKS:?} blocks x {THREADS:?} threads; bulk_put = bulk-copy (TMA) stores into \
             the nvshmem_ptr peer pointer, one issuing thread per block, {BULK_BLOCKS:?} blocks; \
             store_put = the block put written as int4 stores into the peer pointer, one system \
             fence per block, {STORE_PUT_BLOCKS:?} blocks x {THREADS:?} threads; \
             store = int4 stores through nvshmem_ptr, no fence (the kernel's end completes \
             them), {STORE_BLOCKS:?} blocks x {THREADS:?} threads; store_fenced = the same with \
             a system fence in every thread at the end (a put's completion); copy_engine = cuMemcpyDtoDAsync into the peer pointer; nccl = ncclSend/ncclRecv; \
             at {} MiB only: store_by_sms / store_local_by_sms = store with {FEW_SMS_BLOCKS:?} blocks x 1024 threads to the peer / \
             within this GPU (sweep csv), copy_engine_local = cuMemcpyDtoDAsync within this GPU",
            FEW_SMS_BYTES >> 20
        ),
    ]);
    Ok(lines)
}

fn write_results(
    out_dir: &Path,
    tag: &str,
    comments: &[String],
    rows: &[Row],
    sweep: &[SweepPoint],
) -> Result<(), AnyError> {
    std::fs::create_dir_all(out_dir)?;
    let path = bench::result_path(out_dir, tag, ".csv");
    std::fs::write(&path, bench::csv(comments, rows))?;
    let sweep_path = bench::result_path(out_dir, tag, "_sweep.csv");
    // The sweep's second line is the run's date, as in the main CSV (the book quotes both).
    let mut sweep_text = bench::sweep_csv(sweep);
    let first_line_end = sweep_text.find('\n').map_or(0, |i| i + 1);
    sweep_text.insert_str(first_line_end, &format!("# {}\n", bench::date_line()));
    std::fs::write(sweep_path, sweep_text)?;
    println!("pe 0: wrote {}", path.display());
    Ok(())
}

/// This PE's `values` go to the other PE and the other's come back (2 PEs): each PE writes
/// its own symmetric copy, a barrier, then each gets the peer's copy with chapter 3's get.
fn exchange(world: &World, values: &[f64]) -> Result<Vec<f64>, AnyError> {
    let table = SymmetricBuffer::<_, f64>::new(world, values.len())?;
    table.copy_from_host(values)?;
    world.barrier_all()?;
    let theirs: CudaSlice<f64> = world.stream().alloc_zeros(values.len())?;
    let get = Get::new(&theirs, &table, 0, values.len(), 1 - world.my_pe())?;
    get_on_stream(Completion::Blocking, &get);
    let host = world.stream().clone_dtoh(&theirs)?;
    world.barrier_all()?;
    Ok(host)
}
