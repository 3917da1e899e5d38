//! Chapter 5's benchmark: every collective hierarchical and flat on the topology of the
//! environment (nodes of LOCAL_WORLD_SIZE, or NVSHMEM_TUTORIAL_NODE_PES), 1 KiB to 64 MiB,
//! timed as CUDA-graph replay (K calls captured, replayed between events, median). With
//! `--nvshmem`, the hierarchical plans on NVSHMEM's team collectives over the node and rail
//! teams instead, which needs `NVSHMEM_DISABLE_NCCL=1` (NVSHMEM 3.4.5 otherwise hands them to
//! NCCL: the row would be NCCL's).
//!
//! ```text
//! NVSHMEM_TUTORIAL_NODE_PES=2 torchrun --standalone --nproc_per_node=4 --no-python \
//!     target/release/ch05-hier-bench [OUT_CSV]
//! NVSHMEM_DISABLE_NCCL=1 NVSHMEM_TUTORIAL_NODE_PES=2 torchrun --standalone --nproc_per_node=4 \
//!     --no-python target/release/ch05-hier-bench --nvshmem [OUT_CSV]
//! ```
//!
//! Writes PE 0's rows (`collective,method,layout,timing,n_pes,node_pes,num_bytes,us,busbw_gb_per_s`)
//! to OUT_CSV (default `hier_ours.csv` or `hier_nvshmem.csv`); `benchmarks/run_coll.sh` runs it
//! for one node of N and for virtual nodes of every smaller divisor of N, ours and --nvshmem,
//! into `hier_<gpu>_<N>gpu.csv`. On one host the "cross-node" steps run over NVLink, and with several PEs on
//! one GPU (folded) nothing here is speed: the CSV says which, and the book quotes only runs of
//! record.

use std::process::ExitCode;

use ch01_bootstrap::World;
use ch02_symmetric_memory::SymmetricBuffer;
use ch03_put_get::bench::{self, median, ops_per_sample};
use ch04_collectives::DType;
use ch04_collectives::team::nccl_disabled;
use ch05_inter_node::{InterNodeConfig, InterNodeError, Method, Topology};
use cudarc::driver::sys;

type AnyError = Box<dyn std::error::Error>;

const NUM_SAMPLES: usize = 7;
const FLUSH_BYTES: usize = 256 << 20;
const MAX_BYTES: usize = 64 << 20;
const COLLECTIVES: [&str; 5] = [
    "all_reduce",
    "reduce_scatter",
    "all_gather",
    "broadcast",
    "all_to_all",
];

fn main() -> ExitCode {
    // SAFETY: first in main, one thread, before NVSHMEM starts.
    unsafe { ch04_collectives::team::default_reduce_scratch() };
    ch01_bootstrap::checks::exit_code("ch05-hier-bench", run())
}

/// nccl-tests' bus bandwidth factor for a call over `n` PEs.
fn busbw_factor(collective: &str, n: usize) -> f64 {
    let n = n as f64;
    match collective {
        "all_reduce" => 2.0 * (n - 1.0) / n,
        "broadcast" => 1.0,
        _ => (n - 1.0) / n,
    }
}

// ANCHOR: timed
/// Median time of one call in us: `enqueue` captured K times into a CUDA graph (K eager calls
/// when NVSHMEM's call cannot be captured), run once to warm up and NUM_SAMPLES times between
/// events, each after an L2 flush and a host barrier. Says which it timed.
fn timed(
    world: &World,
    size: usize,
    mut enqueue: impl FnMut() -> Result<(), InterNodeError>,
) -> Result<(f64, &'static str), AnyError> {
    let stream = world.stream();
    let num_calls = ops_per_sample(size);
    stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let captured = (0..num_calls).try_for_each(|_| enqueue());
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0))?;
    let graph = captured.ok().and(graph);
    let mut flush = stream.alloc_zeros::<u8>(FLUSH_BYTES)?;
    let event = || {
        stream
            .context()
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
    };
    let (start, end) = (event()?, event()?);
    let mut samples = Vec::new();
    for sample in 0..=NUM_SAMPLES {
        stream.memset_zeros(&mut flush)?; // evicts the previous sample's data from L2
        world.barrier_all()?;
        start.record(stream)?;
        match &graph {
            Some(graph) => graph.launch()?,
            None => (0..num_calls).try_for_each(|_| enqueue())?,
        }
        end.record(stream)?;
        if sample > 0 {
            samples.push(start.elapsed_ms(&end)? as f64 * 1e3 / num_calls as f64);
        }
    }
    Ok((
        median(&mut samples),
        if graph.is_some() { "graph" } else { "eager" },
    ))
}
// ANCHOR_END: timed

fn run() -> Result<bool, AnyError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let teams = args.iter().any(|a| a == "--nvshmem");
    let default_out = if teams {
        "hier_nvshmem.csv"
    } else {
        "hier_ours.csv"
    };
    let out_path = args.iter().find(|a| !a.starts_with("--")).cloned();
    let out_path = out_path.unwrap_or_else(|| default_out.into());
    if teams && !nccl_disabled(std::env::var("NVSHMEM_DISABLE_NCCL").ok().as_deref()) {
        return Err(
            "ch05-hier-bench --nvshmem: set NVSHMEM_DISABLE_NCCL=1 (benchmarks/run_coll.sh \
                    does): NVSHMEM 3.4.5 otherwise hands its team collectives to NCCL"
                .into(),
        );
    }
    let world = World::from_env()?;
    let topo = Topology::from_env(&world, InterNodeConfig::default())?;
    let (layout, n) = (*topo.layout(), world.n_pes());
    let input = SymmetricBuffer::<_, u8>::new(&world, MAX_BYTES)?;
    let out = SymmetricBuffer::<_, u8>::new(&world, MAX_BYTES)?;
    input.fill_bytes(0x3C)?; // bf16 1.1719 everywhere: finite sums at any PE count
    let (i, o, s) = (
        input.device_ptr(),
        out.device_ptr(),
        world.stream().cu_stream(),
    );
    let methods: &[Method] = match teams {
        true => &[Method::NvshmemTeams],
        false => &[Method::Hierarchical, Method::Flat],
    };
    let scratch = ch04_collectives::team::process_reduce_scratch_bytes()?;
    let sizes = std::iter::successors(Some(1usize << 10), |&s| Some(s * 4));
    let mut rows = Vec::new();
    for size in sizes.take_while(|&s| s <= MAX_BYTES) {
        for collective in COLLECTIVES {
            for &method in methods {
                if method == Method::NvshmemTeams && collective == "all_to_all" {
                    continue; // NVSHMEM has no hierarchical all-to-all (chapter 4 times its own)
                }
                // The node step of both reductions is a team reduce-scatter of the whole
                // buffer, which NVSHMEM stages in half of its scratch (chapter 4's team.rs).
                let staged = matches!(collective, "all_reduce" | "reduce_scatter");
                if method == Method::NvshmemTeams && staged && size > scratch / 2 {
                    if world.my_pe() == 0 {
                        println!(
                            "pe 0: {collective} nvshmem_teams {size} B: past NVSHMEM's reduction scratch, not timed"
                        );
                    }
                    continue;
                }
                let (us, timing) = timed(&world, size, || match collective {
                    "all_reduce" => topo.all_reduce_raw(method, o, i, size / 2, DType::Bf16, s),
                    "reduce_scatter" => {
                        topo.reduce_scatter_raw(method, o, i, size / 2 / n, DType::Bf16, s)
                    }
                    "all_gather" => topo.all_gather_raw(method, o, i, size / n, s),
                    "broadcast" => topo.broadcast_raw(method, o, i, size, 0, s),
                    _ => topo.all_to_all_raw(method, o, i, size / n, s),
                })?;
                topo.check()?;
                let busbw = size as f64 / (us * 1e-6) / 1e9 * busbw_factor(collective, n);
                let (name, g) = (method.name(), layout.node_pes);
                let shape = format!("{}x{g}", layout.num_nodes());
                rows.push(format!(
                    "{collective},{name},{shape},{timing},{n},{g},{size},{us:.3},{busbw:.3}"
                ));
                if world.my_pe() == 0 {
                    println!(
                        "pe 0: {collective:<14} {name:<13} {shape:>5} {size:>10} B {us:>10.2} us \
                         {busbw:>8.1} GB/s ({timing})"
                    );
                }
            }
        }
    }
    if world.my_pe() == 0 {
        write_csv(&out_path, &header(&world, &topo)?, &rows)?;
    }
    drop(topo);
    world.barrier_all()?;
    Ok(true)
}

fn write_csv(path: &str, header: &str, rows: &[String]) -> Result<(), AnyError> {
    let mut text = header.to_string();
    text.push_str("collective,method,layout,timing,n_pes,node_pes,num_bytes,us,busbw_gb_per_s\n");
    rows.iter()
        .for_each(|row| text.push_str(&format!("{row}\n")));
    std::fs::write(path, text)?;
    println!("pe 0: wrote {path}");
    Ok(())
}

/// The CSV's `#` lines: GPU, date, driver, NVSHMEM, the layout and what its timings mean.
fn header(world: &World, topo: &Topology<&World>) -> Result<String, AnyError> {
    let layout = topo.layout();
    let virtual_nodes = layout.num_nodes() > 1 && world.node_size() == world.n_pes();
    let nccl = std::env::var("NVSHMEM_DISABLE_NCCL").unwrap_or_default();
    let mut lines = vec![
        format!("gpu: {} x {}", world.context().name()?, world.n_pes()),
        bench::date_line(),
        format!(
            "{}; kernels: {:?}",
            bench::driver_line()?,
            kernels::BUILT_ARCHS
        ),
        format!(
            "nvshmem: {}; NVSHMEM_DISABLE_NCCL={nccl}; NVSHMEM_REDUCE_SCRATCH_SIZE={} bytes \
             (its team reductions timed up to half of it)",
            world.nvshmem().version(),
            ch04_collectives::team::process_reduce_scratch_bytes()?
        ),
        format!(
            "layout: {} ({} PE(s) per GPU)",
            layout.describe(),
            world.gpu_pes()
        ),
        format!(
            "timing: CUDA graph of K calls (K = min(100, ceil(256 MiB / size))), 1 warm-up + \
             {NUM_SAMPLES} replays between CUDA events, {} MiB L2 flush and a host barrier \
             before each, median, PE 0; sizes and busbw as nccl-tests",
            FLUSH_BYTES >> 20
        ),
    ];
    if virtual_nodes {
        lines.push(
            "where: virtual nodes on one host: the cross-node steps ran over NVLink, not a network"
                .into(),
        );
    }
    if world.gpu_pes() > 1 {
        lines.push("where: several PEs per GPU (folded): correctness only, not speed".into());
    }
    Ok(lines.iter().map(|l| format!("# {l}\n")).collect())
}
