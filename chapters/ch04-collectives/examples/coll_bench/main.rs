//! Chapter 4's benchmark: every collective and algorithm of ours, 1 KiB to 256 MiB, timed as
//! CUDA-graph replay (K calls captured, replayed between events, median), plus NVSHMEM's own
//! barrier beside our signal barrier. With `--nvshmem`, NVSHMEM's own team collectives
//! instead (on the stream, over the world team), the same sizes timed the same way.
//!
//! ```text
//! NVSHMEM_SYMMETRIC_SIZE=8G torchrun --standalone --nproc_per_node=N --no-python \
//!     target/release/ch04-coll-bench [OUT_CSV]
//! NVSHMEM_DISABLE_NCCL=1 NVSHMEM_SYMMETRIC_SIZE=8G torchrun --standalone --nproc_per_node=N \
//!     --no-python target/release/ch04-coll-bench --nvshmem [OUT_CSV]
//! ```
//!
//! Writes PE 0's rows (`collective,algorithm,method,timing,n_pes,num_bytes,us,busbw_gb_per_s`)
//! to OUT_CSV (default `coll_ours.csv`, or `coll_nvshmem.csv`); `benchmarks/run_coll.sh` runs
//! both, adds NCCL and torch from `benchmarks/coll_bench.py` and plots. Sizes and busbw follow
//! nccl-tests. `COLL_ONLY` (collective names, comma-separated, e.g. `all_reduce,broadcast`)
//! times only those, for short experiments.
//!
//! `--nvshmem` refuses to run unless `NVSHMEM_DISABLE_NCCL` is set: NVSHMEM 3.4.5 hands its
//! on-stream collectives to NCCL whenever libnccl loads, and the row would be NCCL timed twice.
//! Each of its (collective, size) pairs up to 16 MiB is first checked against the host
//! reference; a call NVSHMEM cannot capture in a graph is timed eagerly and its row says so.

use std::process::ExitCode;
use std::sync::Arc;

use ch01_bootstrap::World;
use ch02_symmetric_memory::SymmetricBuffer;
use ch03_put_get::bench::{self, median, ops_per_sample};
use ch04_collectives::{
    Algorithm, Collective, CollectivesConfig, Communicator, DType, SIZE_TABLE, algorithm, team,
};
use cudarc::driver::{CudaGraph, CudaStream, sys};

mod nvshmem_peer;

type AnyError = Box<dyn std::error::Error>;

const NUM_SAMPLES: usize = 7;
const FLUSH_BYTES: usize = 256 << 20;
const MAX_BYTES: usize = 256 << 20;
fn main() -> ExitCode {
    // SAFETY: first in main, one thread, before NVSHMEM starts.
    unsafe { ch04_collectives::team::default_reduce_scratch() };
    ch01_bootstrap::checks::exit_code("ch04-coll-bench", run())
}

/// Sizes of the sweep: 1 KiB to 256 MiB by x4.
fn sizes() -> Vec<usize> {
    std::iter::successors(Some(1usize << 10), |&s| Some(s * 4))
        .take_while(|&s| s <= MAX_BYTES)
        .collect()
}

/// nccl-tests' bus bandwidth factor: what each link carries relative to the call's size.
fn busbw_factor(collective: Collective, n: usize) -> f64 {
    let n = n as f64;
    match collective {
        Collective::AllReduce => 2.0 * (n - 1.0) / n,
        Collective::AllGather
        | Collective::ReduceScatter
        | Collective::AllToAll
        | Collective::AllToAllV => (n - 1.0) / n,
        Collective::Broadcast => 1.0,
        Collective::SyncAll => 0.0,
    }
}

struct Timer {
    stream: Arc<CudaStream>,
    flush: cudarc::driver::CudaSlice<u8>,
    start: cudarc::driver::CudaEvent,
    end: cudarc::driver::CudaEvent,
}

impl Timer {
    fn new(stream: &Arc<CudaStream>) -> Result<Self, AnyError> {
        // Timing events: cudarc's default disables timing.
        let event = || {
            stream
                .context()
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
        };
        Ok(Self {
            flush: stream.alloc_zeros::<u8>(FLUSH_BYTES)?,
            start: event()?,
            end: event()?,
            stream: stream.clone(),
        })
    }

    /// Median time of one call in us, `launch` issuing K calls per sample: an L2 flush and a
    /// host barrier (so every PE starts together) before each sample, events around it.
    fn samples(
        &self,
        world: &World,
        num_calls: usize,
        mut launch: impl FnMut() -> Result<(), AnyError>,
    ) -> Result<f64, AnyError> {
        let mut samples = Vec::new();
        for sample in 0..=NUM_SAMPLES {
            let (flush, _) = cudarc::driver::DevicePtr::device_ptr(&self.flush, &self.stream);
            // SAFETY: `flush` holds FLUSH_BYTES; evicts the previous sample's data from L2.
            unsafe {
                cudarc::driver::result::memset_d8_async(
                    flush,
                    sample as u8,
                    FLUSH_BYTES,
                    self.stream.cu_stream(),
                )
            }?;
            world.barrier_all()?;
            self.start.record(&self.stream)?;
            launch()?;
            self.end.record(&self.stream)?;
            let ms = self.start.elapsed_ms(&self.end)? as f64;
            if sample > 0 {
                samples.push(ms * 1e3 / num_calls as f64);
            }
        }
        Ok(median(&mut samples))
    }

    /// As `time`, falling back to K eager calls per sample when the calls cannot be captured
    /// in a graph; says which it measured ("graph" or "eager").
    fn time_or_eager(
        &self,
        world: &World,
        size: usize,
        mut enqueue: impl FnMut() -> Result<(), AnyError>,
    ) -> Result<(f64, &'static str), AnyError> {
        match self.time(world, size, &mut enqueue) {
            Ok(us) => Ok((us, "graph")),
            Err(error) => {
                if world.my_pe() == 0 {
                    println!("pe 0: {size} B: capture failed ({error}); timing eager calls");
                }
                let num_calls = ops_per_sample(size);
                let us = self.samples(world, num_calls, || {
                    (0..num_calls).try_for_each(|_| enqueue())
                })?;
                Ok((us, "eager"))
            }
        }
    }

    // ANCHOR: time_graph
    /// Median time of one call in us: `enqueue` captured K times into one graph, the graph
    /// replayed once to warm up and NUM_SAMPLES times between events, each after an L2
    /// flush and a host barrier (so every PE starts the replay together).
    fn time(
        &self,
        world: &World,
        size: usize,
        mut enqueue: impl FnMut() -> Result<(), AnyError>,
    ) -> Result<f64, AnyError> {
        let num_calls = ops_per_sample(size);
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        let enqueued = (0..num_calls).try_for_each(|_| enqueue());
        let graph: Option<CudaGraph> = self.stream.end_capture(sys::CUgraphInstantiate_flags(0))?;
        enqueued?;
        let graph = graph.ok_or("stream capture produced no graph")?;
        graph.upload()?;
        self.samples(world, num_calls, || Ok(graph.launch()?))
    }
    // ANCHOR_END: time_graph
}

fn wanted(name: &str) -> bool {
    std::env::var("COLL_ONLY")
        .ok()
        .is_none_or(|list| list.split(',').any(|c| c == name))
}

/// The output CSV's path (the first argument that is not a flag) and whether this run times
/// NVSHMEM's team collectives (`--nvshmem`) instead of ours.
fn args() -> Result<(String, bool), AnyError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let nvshmem_peer = args.iter().any(|a| a == "--nvshmem");
    let default = if nvshmem_peer {
        "coll_nvshmem.csv"
    } else {
        "coll_ours.csv"
    };
    let out_path = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .cloned()
        .unwrap_or_else(|| default.into());
    if nvshmem_peer {
        // Checked before NVSHMEM starts: the variable is read at initialisation.
        let value = std::env::var("NVSHMEM_DISABLE_NCCL").ok();
        if !team::nccl_disabled(value.as_deref()) {
            return Err("ch04-coll-bench --nvshmem: set NVSHMEM_DISABLE_NCCL=1 (benchmarks/run_coll.sh \
                        does): NVSHMEM 3.4.5 otherwise hands its on-stream collectives to NCCL, and \
                        this row would be NCCL timed twice"
                .into());
        }
    }
    Ok((out_path, nvshmem_peer))
}

fn run() -> Result<bool, AnyError> {
    let (out_path, nvshmem_peer) = args()?;
    let world = World::from_env()?;
    let timer = Timer::new(world.stream())?;
    if nvshmem_peer {
        return nvshmem_peer::nvshmem_team_peer(&world, &timer, &out_path);
    }
    let comm = Communicator::new(&world, CollectivesConfig::default())?;
    let input = SymmetricBuffer::<_, u8>::new(&world, MAX_BYTES)?;
    let out = SymmetricBuffer::<_, u8>::new(&world, MAX_BYTES)?;
    input.fill_bytes(0x3C)?; // bf16 1.1719 everywhere: finite sums at any PE count
    let bench = Bench {
        world: &world,
        timer: &timer,
        comm: &comm,
        input: input.device_ptr(),
        out: out.device_ptr(),
    };
    let mut rows = Rows::new(&world);
    bench.barriers(&mut rows)?;
    bench.collectives(&mut rows)?;
    bench.all_to_all_v(&mut rows)?;
    if world.my_pe() == 0 {
        print_table(&rows.lines);
        write_csv(&out_path, header(&world)?, &rows.lines)?;
    }
    drop(comm);
    world.barrier_all()?;
    Ok(true)
}

/// The CSV rows of this run, each printed on PE 0 as it comes.
struct Rows {
    n: usize,
    me: usize,
    lines: Vec<String>,
}

impl Rows {
    fn new(world: &World) -> Self {
        Rows {
            n: world.n_pes(),
            me: world.my_pe(),
            lines: Vec::new(),
        }
    }

    /// One row: `us` per call of `size` bytes; busbw = size / time x `factor` (0: none).
    fn add(
        &mut self,
        (collective, algorithm, method): (&str, &str, &str),
        size: usize,
        us: f64,
        factor: f64,
    ) {
        let n = self.n;
        let busbw = if factor > 0.0 {
            size as f64 / (us * 1e-6) / 1e9 * factor
        } else {
            0.0
        };
        self.lines.push(format!(
            "{collective},{algorithm},{method},graph,{n},{size},{us:.3},{busbw:.3}"
        ));
        if self.me == 0 {
            println!(
                "pe 0: {collective:<14} {algorithm:<14} {method:<7} {size:>10} B {us:>10.2} us {busbw:>8.1} GB/s"
            );
        }
    }
}

/// What every timing of ours needs: the job, the timer, the communicator and the two
/// symmetric buffers of MAX_BYTES (input, out).
struct Bench<'a> {
    world: &'a World,
    timer: &'a Timer,
    comm: &'a Communicator<&'a World>,
    input: u64,
    out: u64,
}

impl Bench<'_> {
    /// The barriers: ours and NVSHMEM's, 100 in a graph.
    fn barriers(&self, rows: &mut Rows) -> Result<(), AnyError> {
        let (world, cs) = (self.world, self.world.stream().cu_stream());
        let us = self
            .timer
            .time(world, 0, || Ok(self.comm.sync_all_raw(cs)?))?;
        rows.add(("barrier", "signal", "ours"), 0, us, 0.0);
        let us = self.timer.time(world, 0, || {
            // SAFETY: initialised; a stream of this context.
            unsafe { (world.nvshmem().barrier_all_on_stream)(cs as _) };
            Ok(())
        })?;
        rows.add(("barrier", "barrier_all_on_stream", "nvshmem"), 0, us, 0.0);
        Ok(())
    }

    /// Every collective `wanted`, at every size, by each of its algorithms (those that plan:
    /// LL stops at its scratch).
    fn collectives(&self, rows: &mut Rows) -> Result<(), AnyError> {
        let (comm, n) = (self.comm, self.world.n_pes());
        let cs = self.world.stream().cu_stream();
        let (input_ptr, out_ptr, bf16) = (self.input, self.out, DType::Bf16);
        for size in sizes() {
            for collective in [
                Collective::AllReduce,
                Collective::ReduceScatter,
                Collective::AllGather,
                Collective::Broadcast,
                Collective::AllToAll,
            ] {
                if !wanted(collective.name()) {
                    continue;
                }
                for &algorithm in collective.algorithms() {
                    if comm
                        .plan(collective, Some(algorithm), size, Some(bf16))
                        .is_err()
                    {
                        continue; // LL past its scratch
                    }
                    let a = Some(algorithm);
                    let us = self.timer.time(self.world, size, || {
                        match collective {
                            Collective::AllReduce => {
                                comm.all_reduce_raw(out_ptr, input_ptr, size / 2, bf16, a, cs)?
                            }
                            Collective::ReduceScatter => comm.reduce_scatter_raw(
                                out_ptr,
                                input_ptr,
                                size / 2 / n,
                                bf16,
                                a,
                                cs,
                            )?,
                            Collective::AllGather => {
                                comm.all_gather_raw(out_ptr, input_ptr, size / n, a, cs)?
                            }
                            Collective::Broadcast => {
                                comm.broadcast_raw(input_ptr, input_ptr, size, 0, a, cs)?
                            }
                            _ => comm.all_to_all_raw(out_ptr, input_ptr, size / n, a, cs)?,
                        }
                        Ok(())
                    })?;
                    comm.check()?;
                    let what = (collective.name(), algorithm.name(), "ours");
                    rows.add(what, size, us, busbw_factor(collective, n));
                }
            }
        }
        Ok(())
    }

    /// The MoE shape of ANCHORS.md: tokens x 7168 bf16 per PE, equal splits, all-to-all-v.
    fn all_to_all_v(&self, rows: &mut Rows) -> Result<(), AnyError> {
        if !wanted("all_to_all_v") {
            return Ok(());
        }
        let (comm, n) = (self.comm, self.world.n_pes());
        let stream = self.world.stream();
        let cs = stream.cu_stream();
        for tokens in [128, 4096] {
            let row_bytes = 7168 * 2;
            let splits: Vec<i64> = (0..n)
                .map(|q| (tokens / n + usize::from(q < tokens % n)) as i64)
                .collect();
            let in_splits = stream.clone_htod(&splits)?;
            let out_splits_offsets = stream.alloc_zeros::<i64>(2 * n)?;
            let (splits_ptr, _) = cudarc::driver::DevicePtr::device_ptr(&in_splits, stream);
            let (outputs_ptr, _) =
                cudarc::driver::DevicePtr::device_ptr(&out_splits_offsets, stream);
            let rows_cap = MAX_BYTES / row_bytes;
            let us = self.timer.time(self.world, tokens * row_bytes, || {
                // SAFETY: both count arrays are device memory of n and 2n int64.
                unsafe {
                    comm.all_to_all_v_raw(
                        self.out,
                        rows_cap,
                        self.input,
                        tokens,
                        row_bytes,
                        splits_ptr,
                        outputs_ptr,
                        cs,
                    )?
                };
                Ok(())
            })?;
            comm.check()?;
            let algorithm = format!("direct_{tokens}tok");
            let factor = busbw_factor(Collective::AllToAllV, n);
            rows.add(
                ("all_to_all_v", &algorithm, "ours"),
                tokens * row_bytes,
                us,
                factor,
            );
        }
        Ok(())
    }
}

fn write_csv(path: &str, header: String, rows: &[String]) -> Result<(), AnyError> {
    let mut text = header;
    text.push_str("collective,algorithm,method,timing,n_pes,num_bytes,us,busbw_gb_per_s\n");
    for row in rows {
        text.push_str(row);
        text.push('\n');
    }
    std::fs::write(path, text)?;
    println!("pe 0: wrote {path}");
    Ok(())
}
/// The CSV's `#` lines: GPU, driver, CUDA, NVSHMEM, how we time.
fn header(world: &World) -> Result<String, AnyError> {
    let mut lines = bench::machine_lines(world)?;
    lines.extend([
        format!(
            "timing: CUDA graph of K calls (K = min(100, ceil(256 MiB / size))), 1 warm-up + {NUM_SAMPLES} \
             replays between CUDA events, {} MiB L2 flush and a host barrier before each, median, PE 0",
            FLUSH_BYTES >> 20
        ),
        "sizes and busbw: nccl-tests (all-reduce, broadcast: the buffer; all-gather: output; \
         reduce-scatter: input; all-to-all(-v): one rank's input; busbw = size / time x 2(n-1)/n \
         for all-reduce, (n-1)/n for the others, 1 for broadcast)"
            .into(),
        "ours: broadcast in place (out == input), as torch.distributed.broadcast; the rest out of place".into(),
    ]);
    Ok(lines.iter().map(|l| format!("# {l}\n")).collect())
}

// ANCHOR: print_table
/// The size table in the code (and the PE count's rule of `choose`) next to what this run
/// measured: per collective and size, the fastest algorithm.
fn print_table(rows: &[String]) {
    println!(
        "pe 0: SIZE_TABLE (code): {:?}",
        SIZE_TABLE
            .iter()
            .map(|(c, up_to, a)| (c.name(), *up_to, a.name()))
            .collect::<Vec<_>>()
    );
    println!(
        "pe 0: and at n > 2 from {} B to {} B: broadcast by {} (choose)",
        algorithm::BROADCAST_UNITS_FROM,
        algorithm::BROADCAST_UNITS_UP_TO,
        Algorithm::ScatterGatherUnits.name()
    );
    let parsed: Vec<(&str, &str, usize, f64)> = rows
        .iter()
        .filter_map(|r| {
            let f: Vec<&str> = r.split(',').collect();
            Some((f[0], f[1], f[5].parse().ok()?, f[6].parse().ok()?))
        })
        .collect();
    for collective in [
        "all_reduce",
        "reduce_scatter",
        "all_gather",
        "broadcast",
        "all_to_all",
    ] {
        let best: Vec<String> = sizes()
            .into_iter()
            .filter_map(|size| {
                parsed
                    .iter()
                    .filter(|r| r.0 == collective && r.2 == size)
                    .min_by(|a, b| a.3.total_cmp(&b.3))
                    .map(|r| format!("{}K:{}", size >> 10, r.1))
            })
            .collect();
        println!("pe 0: fastest measured {collective}: {}", best.join(" "));
    }
}
// ANCHOR_END: print_table
