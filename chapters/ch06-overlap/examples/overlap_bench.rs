//! Chapter 6's benchmark at a 70B-class tensor-parallel MLP (8192 tokens, hidden 8192, 28672
//! intermediate columns, bf16): all-gather + GEMM into the 28672 / N columns of the up
//! projection, timed as the GEMM alone, the communication alone, serial, and overlapped at
//! several chunk counts; then GEMM + reduce-scatter back from them (the down projection), as
//! the GEMM alone, serial and overlapped. Each sample: a host barrier, then CALLS calls between
//! two CUDA events on the world's stream; the median of SAMPLES, on PE 0. Writes OUT_CSV
//! (default overlap.csv) with the bound and the overlap efficiency of each overlapped row (for
//! GEMM + reduce-scatter the communication time is serial minus the GEMM).
//!
//!     torchrun --nproc_per_node=2 --no-python target/release/ch06-overlap-bench [OUT_CSV]
//!       [--tokens T] [--k K] [--cols C]

use std::process::ExitCode;

use ch01_bootstrap::World;
use ch03_put_get::bench;
use ch06_overlap::{AgGemm, GemmRs, OverlapError, TpPlan, overlap_bound, overlap_efficiency};
use cudarc::driver::{CudaSlice, DevicePtr, sys};
use half::bf16;

type AnyError = Box<dyn std::error::Error>;

const SAMPLES: usize = 7;
const CALLS: usize = 5;
const CHUNK_COUNTS: [usize; 4] = [1, 2, 4, 8];

fn main() -> ExitCode {
    ch01_bootstrap::checks::exit_code("ch06-overlap-bench", run())
}

/// `--name value` from the command line, or `default`.
fn arg(args: &[String], name: &str, default: usize) -> Result<usize, AnyError> {
    match args.iter().position(|a| a == name) {
        Some(i) => Ok(args
            .get(i + 1)
            .ok_or(format!("{name} needs a value"))?
            .parse()?),
        None => Ok(default),
    }
}

fn run() -> Result<bool, AnyError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let out_path = args.first().filter(|a| !a.starts_with("--")).cloned();
    let out_path = out_path.unwrap_or_else(|| "overlap.csv".into());
    let world = World::from_env()?;
    let n = world.n_pes();
    let (tokens, k) = (arg(&args, "--tokens", 8192)?, arg(&args, "--k", 8192)?);
    let cols = arg(&args, "--cols", 28672)? / n;
    let stream = world.stream();
    // Random operands: a GEMM of zeros (or of one repeated value) draws less power and runs
    // faster than one of real data, which would shrink the compute time overlap hides.
    let w: CudaSlice<bf16> = stream.clone_htod(&random_bf16(k * cols, 1))?;
    let y: CudaSlice<bf16> = stream.alloc_zeros(tokens * cols)?;
    let (w, y) = (w.device_ptr(stream).0, y.device_ptr(stream).0);
    let mut table = Table::new(world.my_pe());
    // The GEMMs' SM targets: every SM (0), then a few left to the puts' kernels.
    let sms = world.num_sms() as usize;
    let gemm_sms: Vec<usize> = [0, 8, 16, 32]
        .iter()
        .filter(|&&free| free < sms / 2)
        .map(|&free| if free == 0 { 0 } else { sms - free })
        .collect();
    let (mut compute_us, mut comm_us, mut serial_us) = (0.0, 0.0, 0.0);
    for (i, &chunks) in CHUNK_COUNTS.iter().enumerate() {
        let plan = TpPlan::new(n, tokens / n, k, cols, chunks)?;
        let layer = AgGemm::new(&world, plan)?;
        let shard = random_bf16(plan.rows * k, 2 + world.my_pe() as u64);
        let shard: Vec<u8> = shard.iter().flat_map(|v| v.to_le_bytes()).collect();
        layer.shard().copy_from_host(&shard)?;
        if i == 0 {
            // Serial first: its all-gather fills the gathered rows with every PE's random data,
            // which the compute rows then multiply (a GEMM of zeros runs faster).
            // SAFETY (each closure): w [K, cols] and y [tokens, cols] bf16, live here.
            serial_us = timed(&world, || unsafe { layer.serial(w, y) })?;
            compute_us = timed(&world, || unsafe { layer.compute(w, y) })?;
            comm_us = timed(&world, || layer.communicate())?;
            table.row("ag_compute", &plan, 0, compute_us, None);
            table.row("ag_communicate", &plan, 0, comm_us, None);
            table.row("ag_serial", &plan, 0, serial_us, None);
        }
        let split_us = timed(&world, || unsafe { layer.compute_split(w, y) })?;
        table.row("ag_compute_split", &plan, 0, split_us, None);
        for &target in &gemm_sms {
            layer.set_gemm_sms(target)?;
            let us = timed(&world, || unsafe { layer.overlapped(w, y) })?;
            let times = (serial_us, comm_us, compute_us);
            table.overlapped_row("ag_overlapped", &plan, target, us, times);
        }
        // The peers' chunks' GEMMs on a side stream, beside our own rows' GEMM.
        layer.set_gemm_sms(0)?;
        layer.set_side_gemms(true);
        // SAFETY: as above.
        let us = timed(&world, || unsafe { layer.overlapped(w, y) })?;
        let times = (serial_us, comm_us, compute_us);
        table.overlapped_row("ag_overlapped_side", &plan, 0, us, times);
    }
    // GEMM + reduce-scatter at the next projection's shape (row-parallel): x is this PE's
    // K-slice of every token, [tokens, cols] (y above), w [cols, k], out [tokens / N, k].
    // y now holds the last overlapped all-gather + GEMM's output: random-looking, finite.
    let rs_w: CudaSlice<bf16> = stream.clone_htod(&random_bf16(cols * k, 3))?;
    let rs_y: CudaSlice<bf16> = stream.alloc_zeros(tokens / n * k)?;
    let (rs_w, rs_y) = (rs_w.device_ptr(stream).0, rs_y.device_ptr(stream).0);
    for (i, &chunks) in CHUNK_COUNTS.iter().enumerate() {
        let plan = TpPlan::new(n, tokens / n, cols, k, chunks)?;
        let layer = GemmRs::new(&world, plan)?;
        if i == 0 {
            // SAFETY (each closure): y [tokens, cols], rs_w [cols, k], rs_y [tokens / N, k].
            compute_us = timed(&world, || unsafe { layer.compute(y, rs_w) })?;
            serial_us = timed(&world, || unsafe { layer.serial(y, rs_w, rs_y) })?;
            comm_us = serial_us - compute_us; // the reduce-scatter and its copy
            table.row("rs_compute", &plan, 0, compute_us, None);
            table.row("rs_serial", &plan, 0, serial_us, None);
        }
        let split_us = timed(&world, || unsafe { layer.compute_split(y, rs_w) })?;
        table.row("rs_compute_split", &plan, 0, split_us, None);
        for &target in &gemm_sms {
            layer.set_gemm_sms(target)?;
            let us = timed(&world, || unsafe { layer.overlapped(y, rs_w, rs_y) })?;
            let times = (serial_us, comm_us, compute_us);
            table.overlapped_row("rs_overlapped", &plan, target, us, times);
        }
    }
    let rows = table.rows;
    if world.my_pe() == 0 {
        let text: String = header(&world)?
            .lines()
            .chain(rows.iter().map(String::as_str))
            .map(|l| format!("{l}\n"))
            .collect();
        std::fs::write(&out_path, text)?;
        println!("pe 0: wrote {out_path}");
    }
    world.barrier_all()?;
    Ok(true)
}

/// `len` values in [-1/16, 1/16) from a xorshift seeded with `seed`: small enough that the
/// GEMMs' sums stay finite at any K, varied enough to draw a real GEMM's power.
fn random_bf16(len: usize, seed: u64) -> Vec<bf16> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            bf16::from_f32(((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) / 8.0)
        })
        .collect()
}

/// The CSV's rows, printed on PE 0 as they come.
struct Table {
    me: usize,
    rows: Vec<String>,
}

impl Table {
    fn new(me: usize) -> Self {
        let head = "variant,n_pes,rows,k,cols,chunks,gemm_sms,us,tflops,bound,efficiency";
        let head = head.to_string();
        Self {
            me,
            rows: vec![head],
        }
    }
    /// An overlapped row, with its bound and efficiency from the layer's (serial,
    /// communication, compute) times.
    fn overlapped_row(
        &mut self,
        variant: &str,
        p: &TpPlan,
        gemm_sms: usize,
        us: f64,
        (serial_us, comm_us, compute_us): (f64, f64, f64),
    ) {
        let bound = overlap_bound(comm_us, compute_us);
        let efficiency = overlap_efficiency(serial_us, us, comm_us, compute_us);
        self.row(variant, p, gemm_sms, us, Some((bound, efficiency)));
    }

    /// `gemm_sms`: the GEMMs' SM target (0: every SM).
    fn row(
        &mut self,
        variant: &str,
        p: &TpPlan,
        gemm_sms: usize,
        us: f64,
        overlap: Option<(f64, f64)>,
    ) {
        let tflops = match variant.ends_with("communicate") {
            true => 0.0,
            false => p.flops() / us / 1e6,
        };
        let extra = overlap.map_or(",".into(), |(b, e)| format!("{b:.3},{e:.3}"));
        let (n, rows, k, cols, chunks) = (p.n_pes, p.rows, p.k, p.cols, p.chunks);
        self.rows.push(format!(
            "{variant},{n},{rows},{k},{cols},{chunks},{gemm_sms},{us:.1},{tflops:.1},{extra}"
        ));
        if self.me == 0 {
            println!(
                "pe 0: {variant:<16} chunks {chunks} GEMM SMs {gemm_sms:>3}: {us:>9.1} us \
                 {tflops:>7.1} TFLOP/s {extra}"
            );
        }
    }
}

/// Median time of one call in us: CALLS calls between events, after a host barrier.
fn timed(
    world: &World,
    mut call: impl FnMut() -> Result<(), OverlapError>,
) -> Result<f64, AnyError> {
    let stream = world.stream();
    let event = || {
        stream
            .context()
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
    };
    let (start, end) = (event()?, event()?);
    let mut samples = Vec::new();
    for sample in 0..=SAMPLES {
        world.barrier_all()?;
        start.record(stream)?;
        for _ in 0..CALLS {
            call()?;
        }
        end.record(stream)?;
        end.synchronize()?;
        if sample > 0 {
            samples.push(start.elapsed_ms(&end)? as f64 * 1e3 / CALLS as f64);
        }
    }
    Ok(bench::median(&mut samples))
}

/// The CSV's `#` lines: GPU, date, driver, what the rows mean.
fn header(world: &World) -> Result<String, AnyError> {
    let mut lines = vec![
        format!("gpu: {} x {}", world.context().name()?, world.n_pes()),
        bench::date_line(),
        bench::driver_line()?,
        format!(
            "timing: {CALLS} eager calls between CUDA events after a host barrier, median of \
             {SAMPLES}, PE 0; bound = (communicate + compute) / max(both), efficiency = \
             (serial - overlapped) / min(communicate, compute)"
        ),
    ];
    if world.gpu_pes() > 1 {
        lines.push("where: several PEs per GPU (folded): correctness only, not speed".into());
    }
    Ok(lines.iter().map(|l| format!("# {l}\n")).collect())
}
