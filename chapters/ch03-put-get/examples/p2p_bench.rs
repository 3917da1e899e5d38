//! The p2p benchmark: PE 0 -> PE 1 on one node, every method timed in the same run.
//!
//! ```text
//! benchmarks/run_p2p.sh            # sets the heap size, NCCL's name, multicast off; runs this
//! torchrun --nproc_per_node=2 --no-python target/release/ch03-p2p-bench
//! ```
//!
//! Bandwidth (16 KiB .. 1 GiB, x4): the device put (warp and block scope, a sweep of launch
//! shapes, the best reported per size), plain stores through `nvshmem_ptr` (swept the same
//! way), the copy engine (`cuMemcpyDtoDAsync` into the peer pointer) and NCCL send/recv.
//! Every method is timed the same way: a CUDA graph of K back-to-back operations, replayed
//! between two CUDA events, L2 flushed before each of several samples, the median kept.
//! Latency (8 B, 1 KiB, 16 KiB): the put-with-signal ping-pong inside one kernel, against
//! NCCL send/recv round trips captured in one CUDA graph (an eager NCCL call costs 30-50 us
//! of host overhead; graph replay leaves the link's time). One-way latency = round trip / 2.
//!
//! Writes `<out>/p2p_<gpu>.csv`, `<out>/p2p_<gpu>_sweep.csv` (out: `$P2P_BENCH_OUT`, else
//! benchmarks/results).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use ch01_bootstrap::World;
use ch02_symmetric_memory::SymmetricBuffer;
use ch03_put_get::bench::{self, Row};
use ch03_put_get::{DeviceOps, LaunchShape, LocalBuffer, Scope, get_on_stream, put_on_stream};
use cudarc::driver::{CudaEvent, CudaGraph, CudaSlice, CudaStream, sys};
use cudarc::nccl::sys as nccl;

type AnyError = Box<dyn std::error::Error>;

/// Timed samples per measurement (after one warm-up replay); the median is reported.
const NUM_SAMPLES: usize = 7;
/// Launch shapes the device put is swept over, per size.
const PUT_SCOPES: [Scope; 2] = [Scope::Warp, Scope::Block];
const PUT_BLOCKS: [u32; 6] = [8, 16, 32, 66, 132, 264];
/// Blocks of the bulk-copy put (one issuing thread each, 32 KiB of shared memory).
const BULK_BLOCKS: [u32; 5] = [16, 66, 132, 264, 528];
const STORE_BLOCKS: [u32; 5] = [66, 132, 264, 528, 1056];
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

/// What every measurement needs.
struct Bench<'w> {
    world: &'w World,
    stream: Arc<CudaStream>,
    flush: CudaSlice<u8>,
    start: CudaEvent,
    end: CudaEvent,
}

/// One point of a sweep.
struct SweepPoint {
    method: &'static str,
    scope: &'static str,
    shape: LaunchShape,
    num_bytes: usize,
    us: f64,
}

/// Records one sweep point and keeps it in `best` if it is the fastest so far.
fn keep_best(
    best: &mut Option<SweepPoint>,
    sweep: &mut Vec<SweepPoint>,
    method: &'static str,
    scope: &'static str,
    shape: LaunchShape,
    num_bytes: usize,
    us: f64,
) {
    let point = SweepPoint {
        method,
        scope,
        shape,
        num_bytes,
        us,
    };
    if best.as_ref().is_none_or(|b| us < b.us) {
        *best = Some(SweepPoint { ..point });
    }
    sweep.push(point);
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
    let stream = world.stream().clone();
    let ctx = world.context();
    let bench = Bench {
        world: &world,
        stream: stream.clone(),
        flush: stream.alloc_zeros(FLUSH_BYTES)?,
        start: ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?,
        end: ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?,
    };
    let sizes = bench::sizes();
    let max_bytes = *sizes.last().unwrap();
    // The symmetric destination (PE 1's copy is the target) and a local source.
    let dst = SymmetricBuffer::<_, u8>::new(&world, max_bytes)?;
    let src: CudaSlice<u8> = stream.alloc_zeros(max_bytes)?;
    let src_ptr = src.device_address(&stream);
    // SAFETY: `src_ptr` holds max_bytes; content is irrelevant to the link but not zero.
    unsafe {
        cudarc::driver::result::memset_d8_async(src_ptr, 0x5A, max_bytes, stream.cu_stream())
    }?;
    let peer_dst = dst
        .peer_ptr(1 - me)?
        .ok_or("PE 1 is not load/store reachable from PE 0")?;

    let gpu_name = ctx.name()?;
    let tag = bench::gpu_tag(&gpu_name);
    let mut comments = header(&world, &gpu_name)?;
    let mut rows = Vec::new();
    let mut sweep = Vec::new();

    // ---- bandwidth: device put, stores, copy engine (PE 0 works, PE 1 waits) ----------
    if me == 0 {
        println!("pe 0: {gpu_name}; sizes {sizes:?}");
        let mut best_put = Vec::new();
        for &num_bytes in &sizes {
            // Device put, every scope and shape.
            let mut best: Option<SweepPoint> = None;
            for scope in PUT_SCOPES {
                for num_blocks in PUT_BLOCKS {
                    for threads_per_block in THREADS {
                        let shape = LaunchShape {
                            num_blocks,
                            threads_per_block,
                        };
                        let config = shape.checked()?;
                        let us = bench.time_ops(num_bytes, || {
                            Ok(ops.launch_put_raw(
                                scope,
                                config,
                                dst.device_ptr(),
                                src_ptr,
                                num_bytes,
                                1,
                            )?)
                        })?;
                        keep_best(
                            &mut best,
                            &mut sweep,
                            "put",
                            scope.name(),
                            shape,
                            num_bytes,
                            us,
                        );
                    }
                }
            }
            // The same put through the bulk-copy unit: one issuing thread per block, so the
            // sweep is over blocks (shared memory allows several per SM).
            for num_blocks in BULK_BLOCKS {
                let shape = LaunchShape {
                    num_blocks,
                    threads_per_block: 32,
                };
                let config = shape.checked()?;
                let us = bench.time_ops(num_bytes, || {
                    Ok(ops.launch_put_bulk_raw(config, dst.device_ptr(), src_ptr, num_bytes, 1)?)
                })?;
                keep_best(&mut best, &mut sweep, "put", "bulk", shape, num_bytes, us);
            }
            let best = best.unwrap();
            rows.push(row("put", num_bytes, best.us));
            best_put.push(format!(
                "{num_bytes}:{}:{}x{}",
                best.scope, best.shape.num_blocks, best.shape.threads_per_block
            ));
            // Stores through nvshmem_ptr, every shape.
            let mut best_store: Option<SweepPoint> = None;
            for num_blocks in STORE_BLOCKS {
                for threads_per_block in THREADS {
                    let shape = LaunchShape {
                        num_blocks,
                        threads_per_block,
                    };
                    let config = shape.checked()?;
                    let us = bench.time_ops(num_bytes, || {
                        Ok(ops.launch_store(config, peer_dst, src_ptr, num_bytes as u64)?)
                    })?;
                    keep_best(
                        &mut best_store,
                        &mut sweep,
                        "store",
                        "grid",
                        shape,
                        num_bytes,
                        us,
                    );
                }
            }
            rows.push(row("store", num_bytes, best_store.unwrap().us));
            // ANCHOR: copy_engine
            // The copy engine: a DMA unit, no SM involved, fed one descriptor per copy.
            let us = bench.time_ops(num_bytes, || {
                // SAFETY: `peer_dst` is PE 1's copy of `dst` (max_bytes), `src_ptr` local.
                unsafe {
                    cudarc::driver::result::memcpy_dtod_async(
                        peer_dst,
                        src_ptr,
                        num_bytes,
                        stream.cu_stream(),
                    )
                }?;
                Ok(())
            })?;
            // ANCHOR_END: copy_engine
            rows.push(row("copy_engine", num_bytes, us));
            print_size(&rows, num_bytes);
        }
        comments.push(format!(
            "put: best launch shape per size (bytes:scope:blocks x threads): {}",
            best_put.join(" ")
        ));
        let tuned = sweep
            .iter()
            .filter(|p| p.method == "put" && p.num_bytes == max_bytes)
            .min_by(|a, b| a.us.total_cmp(&b.us))
            .unwrap();
        comments.push(format!(
            "put: tuned shape at 1 GiB: {} scope, {} blocks x {} threads (swept {:?} x {:?} x {:?}, \
             and bulk (TMA) x {:?} blocks x 32 threads)",
            tuned.scope, tuned.shape.num_blocks, tuned.shape.threads_per_block, PUT_SCOPES.map(Scope::name),
            PUT_BLOCKS, THREADS, BULK_BLOCKS
        ));
    }
    world.barrier_all()?;

    // ---- latency: put-with-signal ping-pong in one kernel per PE ---------------------------
    let ping_buffer = SymmetricBuffer::<_, u8>::new(&world, *LATENCY_BYTES.iter().max().unwrap())?;
    let ping_signal = SymmetricBuffer::<_, u64>::new(&world, 1)?;
    for num_bytes in LATENCY_BYTES {
        let mut samples = Vec::new();
        for sample in 0..=NUM_SAMPLES {
            ping_signal.fill_bytes(0)?;
            world.barrier_all()?;
            bench.start.record(&stream)?;
            ops.launch_pingpong(
                PINGPONG_THREADS,
                &ping_buffer,
                &src,
                num_bytes,
                &ping_signal,
                1 - me,
                me == 0,
                PUT_PINGPONG_ITERS,
            )?;
            bench.end.record(&stream)?;
            ops.finish_waiting("pingpong")?;
            let ms = bench.start.elapsed_ms(&bench.end)? as f64;
            if sample > 0 {
                samples.push(ms * 1e3 / (2 * PUT_PINGPONG_ITERS) as f64);
            }
        }
        let us = bench::median(&mut samples);
        if me == 0 {
            println!("pe 0: put_signal_pingpong {num_bytes:>6} B: one-way {us:.2} us");
            rows.push(row("put_signal_pingpong", num_bytes, us));
        }
    }
    comments.push(format!(
        "put_signal_pingpong: {PUT_PINGPONG_ITERS} round trips in one kernel per PE (1 block of \
         {PINGPONG_THREADS} threads; thread-scope putmem_signal_nbi up to 256 B, block-scope above), \
         CUDA events around the kernel on PE 0; one-way = time / (2 x round trips)"
    ));
    if me == 0 {
        write_results(&out_dir, &tag, &comments, &rows, &sweep)?;
    }

    // ---- NCCL: bandwidth and latency, both PEs work -----------------------------------------
    bench::probe_nccl()?;
    let nccl_version =
        cudarc::nccl::result::get_nccl_version().map_err(|e| format!("ncclGetVersion: {e:?}"))?;
    comments.push(format!(
        "nccl: {}",
        bench::nccl_version_string(nccl_version)
    ));
    let comm = NcclComm::new(&world)?;
    // Both PEs receive into / send from their own 1 GiB `src` buffer.
    let peer = (1 - me) as i32;
    let mut own_samples = Vec::new();
    for &num_bytes in &sizes {
        let samples = bench.time_ops_both(num_bytes, || {
            // SAFETY: `src_ptr` holds max_bytes on both PEs; PE 0 sends, PE 1 receives.
            unsafe {
                if me == 0 {
                    nccl::ncclSend(
                        src_ptr as _,
                        num_bytes,
                        nccl::ncclDataType_t::ncclUint8,
                        peer,
                        comm.0,
                        stream.cu_stream() as _,
                    )
                } else {
                    nccl::ncclRecv(
                        src_ptr as _,
                        num_bytes,
                        nccl::ncclDataType_t::ncclUint8,
                        peer,
                        comm.0,
                        stream.cu_stream() as _,
                    )
                }
            }
            .result()
            .map_err(|e| format!("ncclSend/ncclRecv: {e:?}"))?;
            Ok(())
        })?;
        own_samples.extend(samples);
    }
    // A send/recv is done when both sides are: take the slower PE's time, sample by sample.
    let peer_samples = exchange(&world, &own_samples)?;
    if me == 0 {
        for (i, &num_bytes) in sizes.iter().enumerate() {
            let range = i * NUM_SAMPLES..(i + 1) * NUM_SAMPLES;
            let mut slower: Vec<f64> = own_samples[range.clone()]
                .iter()
                .zip(&peer_samples[range])
                .map(|(a, b)| a.max(*b))
                .collect();
            rows.push(row("nccl", num_bytes, bench::median(&mut slower)));
            print_size(&rows, num_bytes);
        }
    }
    // ANCHOR: nccl_pingpong
    // NCCL latency: R round trips captured in one graph on each PE (PE 0 sends then receives,
    // PE 1 receives then sends), replayed; one-way = time / 2R.
    for num_bytes in LATENCY_BYTES {
        let graph = capture(&stream, NCCL_PINGPONG_ROUND_TRIPS, || {
            // SAFETY: `src_ptr` holds at least `num_bytes` on both PEs.
            let (send, recv) = unsafe {
                let send = || {
                    nccl::ncclSend(
                        src_ptr as _,
                        num_bytes,
                        nccl::ncclDataType_t::ncclUint8,
                        peer,
                        comm.0,
                        stream.cu_stream() as _,
                    )
                };
                let recv = || {
                    nccl::ncclRecv(
                        src_ptr as _,
                        num_bytes,
                        nccl::ncclDataType_t::ncclUint8,
                        peer,
                        comm.0,
                        stream.cu_stream() as _,
                    )
                };
                if me == 0 {
                    (send(), recv())
                } else {
                    let r = recv();
                    (send(), r)
                }
            };
            send.result()
                .and(recv.result())
                .map_err(|e| format!("ncclSend/ncclRecv: {e:?}"))?;
            Ok(())
        })?;
        let mut samples = bench.replay_both(&graph)?;
        let us = bench::median(&mut samples) * 1e3 / (2 * NCCL_PINGPONG_ROUND_TRIPS) as f64;
        if me == 0 {
            println!("pe 0: nccl_pingpong {num_bytes:>6} B: one-way {us:.2} us");
            rows.push(row("nccl_pingpong", num_bytes, us));
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
    if me == 0 {
        rows.sort_by_key(|r| (method_rank(&r.method), r.num_bytes));
        write_results(&out_dir, &tag, &comments, &rows, &sweep)?;
    }
    drop(ops);
    world.barrier_all()?;
    Ok(true)
}

impl Bench<'_> {
    // ANCHOR: time_ops
    /// Median time of one operation, in us, on this PE: `enqueue` is captured K times into a
    /// CUDA graph (K from [`bench::ops_per_sample`]); the graph is replayed once to warm up,
    /// then NUM_SAMPLES times between two events, each after an L2 flush.
    fn time_ops(
        &self,
        num_bytes: usize,
        enqueue: impl FnMut() -> Result<(), AnyError>,
    ) -> Result<f64, AnyError> {
        let num_ops = bench::ops_per_sample(num_bytes);
        let graph = capture(&self.stream, num_ops, enqueue)?;
        let mut samples = self.replay(&graph, false)?;
        Ok(bench::median(&mut samples) * 1e3 / num_ops as f64)
    }
    // ANCHOR_END: time_ops

    /// Like `time_ops`, with a barrier before each replay so both PEs start together; returns
    /// this PE's NUM_SAMPLES times of one operation in us (unsorted).
    fn time_ops_both(
        &self,
        num_bytes: usize,
        enqueue: impl FnMut() -> Result<(), AnyError>,
    ) -> Result<Vec<f64>, AnyError> {
        let num_ops = bench::ops_per_sample(num_bytes);
        let graph = capture(&self.stream, num_ops, enqueue)?;
        Ok(self
            .replay(&graph, true)?
            .into_iter()
            .map(|ms| ms * 1e3 / num_ops as f64)
            .collect())
    }

    fn replay_both(&self, graph: &CudaGraph) -> Result<Vec<f64>, AnyError> {
        self.replay(graph, true)
    }

    /// One warm-up replay, then NUM_SAMPLES timed replays in ms (flush, barrier if `both`).
    fn replay(&self, graph: &CudaGraph, both: bool) -> Result<Vec<f64>, AnyError> {
        graph.upload()?;
        let mut samples = Vec::with_capacity(NUM_SAMPLES);
        for sample in 0..=NUM_SAMPLES {
            let flush_ptr = self.flush.device_address(&self.stream);
            // SAFETY: `flush` holds FLUSH_BYTES.
            unsafe {
                cudarc::driver::result::memset_d8_async(
                    flush_ptr,
                    sample as u8,
                    FLUSH_BYTES,
                    self.stream.cu_stream(),
                )
            }?;
            if both {
                self.world.barrier_all()?;
            }
            self.start.record(&self.stream)?;
            graph.launch()?;
            self.end.record(&self.stream)?;
            let ms = self.start.elapsed_ms(&self.end)? as f64;
            if sample > 0 {
                samples.push(ms);
            }
        }
        Ok(samples)
    }
}

/// Captures `num_ops` calls of `enqueue` on `stream` into an instantiated graph.
fn capture(
    stream: &Arc<CudaStream>,
    num_ops: usize,
    mut enqueue: impl FnMut() -> Result<(), AnyError>,
) -> Result<CudaGraph, AnyError> {
    stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let enqueued = (0..num_ops).try_for_each(|_| enqueue());
    // End the capture even when enqueueing failed, or the stream stays in capture mode.
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0));
    enqueued?;
    Ok(graph?.ok_or("stream capture produced no graph")?)
}

fn row(method: &str, num_bytes: usize, us: f64) -> Row {
    Row {
        method: method.into(),
        num_bytes,
        gb_per_s: bench::gb_per_s(num_bytes, us),
        us,
    }
}

fn method_rank(method: &str) -> usize {
    [
        "put",
        "store",
        "copy_engine",
        "nccl",
        "put_signal_pingpong",
        "nccl_pingpong",
    ]
    .iter()
    .position(|m| *m == method)
    .unwrap_or(usize::MAX)
}

fn print_size(rows: &[Row], num_bytes: usize) {
    let line: Vec<String> = rows
        .iter()
        .filter(|r| r.num_bytes == num_bytes)
        .map(|r| format!("{} {:.1} GB/s ({:.1} us)", r.method, r.gb_per_s, r.us))
        .collect();
    println!("pe 0: {num_bytes:>10} B: {}", line.join(", "));
}

/// The CSV's `#` lines: hardware, software and method.
fn header(world: &World, gpu_name: &str) -> Result<Vec<String>, AnyError> {
    let mut cuda = 0;
    // SAFETY: writes one int.
    unsafe { sys::cuDriverGetVersion(&mut cuda) }.result()?;
    let proc_text = std::fs::read_to_string("/proc/driver/nvidia/version").ok();
    Ok(vec![
        "p2p: PE 0 -> PE 1 (one node, NVLink), every method timed in the same run".into(),
        format!("gpu: {gpu_name} x {}", world.n_pes()),
        format!(
            "driver: {}; CUDA driver API {}; kernels: nvcc 13.0 wheels, {:?}",
            bench::driver_version(proc_text.as_deref()),
            bench::cuda_version_string(cuda),
            kernels::BUILT_ARCHS
        ),
        format!("nvshmem: {}", world.nvshmem().version()),
        "bandwidth: gb_per_s = bytes moved by one operation / its median time (1 GB = 1e9 B); us = that time".into(),
        format!(
            "timing: CUDA graph of K back-to-back operations (K = min(100, ceil(256 MiB / size))), \
             1 warm-up + {NUM_SAMPLES} replays between CUDA events, {} MiB L2 flush before each, median",
            FLUSH_BYTES >> 20
        ),
        "methods: put = the best device put per size, either nvshmemx_putmem_nbi_{warp,block} + \
         nvshmem_quiet in one kernel or put_bulk (bulk-copy/TMA stores into the nvshmem_ptr peer \
         pointer; the sweep csv's scope column says which); store = int4 stores through nvshmem_ptr; copy_engine = cuMemcpyDtoDAsync into the peer pointer; \
         nccl = ncclSend/ncclRecv"
            .into(),
    ])
}

fn write_results(
    out_dir: &std::path::Path,
    tag: &str,
    comments: &[String],
    rows: &[Row],
    sweep: &[SweepPoint],
) -> Result<(), AnyError> {
    std::fs::create_dir_all(out_dir)?;
    let path = bench::result_path(out_dir, tag, ".csv");
    std::fs::write(&path, bench::csv(comments, rows))?;
    let mut text = String::from(
        "# launch-shape sweep of the device put and the stores (same timing as p2p csv)\n",
    );
    text.push_str("method,scope,num_blocks,threads_per_block,num_bytes,gb_per_s,us\n");
    for p in sweep {
        text.push_str(&format!(
            "{},{},{},{},{},{:.3},{:.3}\n",
            p.method,
            p.scope,
            p.shape.num_blocks,
            p.shape.threads_per_block,
            p.num_bytes,
            bench::gb_per_s(p.num_bytes, p.us),
            p.us
        ));
    }
    std::fs::write(bench::result_path(out_dir, tag, "_sweep.csv"), text)?;
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
    get_on_stream(&theirs, &table, 0, values.len(), 1 - world.my_pe())?;
    let host = world.stream().clone_dtoh(&theirs)?;
    world.barrier_all()?;
    Ok(host)
}

// ANCHOR: nccl_comm
/// An NCCL communicator over the same two PEs. Its 128-byte unique id travels through
/// NVSHMEM itself: PE 0 puts it into every PE's symmetric copy, a barrier completes the puts.
struct NcclComm(nccl::ncclComm_t);

impl NcclComm {
    fn new(world: &World) -> Result<Self, AnyError> {
        let me = world.my_pe();
        let id_buffer = SymmetricBuffer::<_, u8>::new(world, 128)?;
        if me == 0 {
            let id = cudarc::nccl::result::get_uniqueid()
                .map_err(|e| format!("ncclGetUniqueId: {e:?}"))?;
            let bytes: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
            id_buffer.copy_from_host(&bytes)?;
            for pe in 1..world.n_pes() {
                put_on_stream(&id_buffer, 0, &id_buffer, 128, pe)?;
            }
        }
        world.barrier_all()?;
        let bytes = id_buffer.copy_to_host()?;
        let mut id = nccl::ncclUniqueId { internal: [0; 128] };
        for (dst, &src) in id.internal.iter_mut().zip(&bytes) {
            *dst = src as _;
        }
        let mut comm = std::ptr::null_mut();
        world.context().bind_to_thread()?;
        // SAFETY: collective over the job's PEs with the same id; `comm` is an out-parameter.
        unsafe {
            cudarc::nccl::result::comm_init_rank(&mut comm, world.n_pes() as i32, id, me as i32)
        }
        .map_err(|e| format!("ncclCommInitRank: {e:?}"))?;
        let comm = NcclComm(comm);
        // Connect the pair now, outside any graph capture: NCCL sets up a peer's channels on
        // the first send/recv to it.
        let stream = world.stream();
        let scratch: CudaSlice<u8> = stream.alloc_zeros(8)?;
        let ptr = scratch.device_address(stream);
        let peer = (1 - me) as i32;
        // SAFETY: `ptr` holds 8 bytes; grouped so that neither side blocks the other.
        let warm_up = unsafe {
            let u8_type = nccl::ncclDataType_t::ncclUint8;
            let cu_stream = stream.cu_stream() as _;
            nccl::ncclGroupStart()
                .result()
                .and_then(|_| {
                    nccl::ncclSend(ptr as _, 8, u8_type, peer, comm.0, cu_stream).result()
                })
                .and_then(|_| {
                    nccl::ncclRecv(ptr as _, 8, u8_type, peer, comm.0, cu_stream).result()
                })
                .and_then(|_| nccl::ncclGroupEnd().result())
        };
        warm_up.map_err(|e| format!("NCCL warm-up send/recv: {e:?}"))?;
        stream.synchronize()?;
        Ok(comm)
    }
}
// ANCHOR_END: nccl_comm

impl Drop for NcclComm {
    fn drop(&mut self) {
        // SAFETY: created by comm_init_rank; no work of ours is pending on it after a sync.
        unsafe {
            let _ = nccl::ncclCommDestroy(self.0);
        }
    }
}
