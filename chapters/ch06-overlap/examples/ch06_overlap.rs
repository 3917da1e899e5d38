//! Chapter 6's example: all-gather + GEMM, serial and overlapped, checked against a host
//! reference on every PE, then the overlapped call many times in a row with new data each time
//! (the signals carry call numbers and are never reset), then bad input refused.
//!
//!     torchrun --nproc_per_node=2 --no-python target/release/ch06-overlap [--calls N]

use std::process::ExitCode;

use ch01_bootstrap::World;
use ch01_bootstrap::checks::Tally;
use ch06_overlap::{AgGemm, GemmRs, TpPlan};
use cudarc::driver::{CudaSlice, DevicePtr};
use half::bf16;

type AnyError = Box<dyn std::error::Error>;

/// Rows per PE, K, output columns per PE, chunks per shard: small enough for a host reference.
const ROWS: usize = 64;
const K: usize = 256;
const COLS: usize = 128;
const CHUNKS: usize = 4;
/// Calls in a row of each layer, each with new input: the first serial, the rest overlapped
/// (`--calls N`; scripts/gpu_test.sh passes 2 under compute-sanitizer, whose initcheck reports
/// every heap copy).
const CALLS: usize = 20;

fn main() -> ExitCode {
    ch01_bootstrap::checks::exit_code("ch06-overlap", run())
}

/// Input row `row` of PE `pe` in call `call`: quarters in [-1, 1], so every product is exact.
fn x_value(pe: usize, row: usize, k: usize, call: usize) -> f32 {
    ((pe * 7 + row * 3 + k + call * 5) % 9) as f32 / 4.0 - 1.0
}
fn w_value(pe: usize, k: usize, col: usize) -> f32 {
    ((pe * 3 + k * 5 + col) % 7) as f32 / 4.0 - 0.75
}

/// `--calls N` (N >= 2) from the command line, else CALLS; anything else is an error.
fn calls_arg() -> Result<usize, AnyError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => Ok(CALLS),
        [flag, n] if flag == "--calls" => match n.parse() {
            Ok(calls) if calls >= 2 => Ok(calls),
            _ => Err(
                format!("--calls {n}: not a count of 2 or more (call 0 is the serial one)").into(),
            ),
        },
        _ => Err(format!("unknown arguments {args:?} (takes --calls N)").into()),
    }
}

fn run() -> Result<bool, AnyError> {
    let calls = calls_arg()?;
    let world = World::from_env()?;
    let (me, n) = (world.my_pe(), world.n_pes());
    let mut tally = Tally::default();
    // ANCHOR: setup
    let plan = TpPlan::new(n, ROWS, K, COLS, CHUNKS)?;
    let layer = AgGemm::new(&world, plan)?;
    // ANCHOR_END: setup
    let stream = world.stream();
    let w_host: Vec<bf16> = (0..K * COLS)
        .map(|i| bf16::from_f32(w_value(me, i / COLS, i % COLS)))
        .collect();
    let w: CudaSlice<bf16> = stream.clone_htod(&w_host)?;
    let mut y: CudaSlice<bf16> = stream.alloc_zeros(n * ROWS * COLS)?;
    let (w_ptr, y_ptr) = (w.device_ptr(stream).0, y.device_ptr(stream).0);
    stream.synchronize()?;

    for call in 0..calls {
        write_shard(&layer, me, call)?;
        let serial = call == 0;
        stream.memset_zeros(&mut y)?;
        // SAFETY: w is [K, COLS] and y [N x ROWS, COLS] bf16 on this GPU, live until the end.
        unsafe {
            match serial {
                true => layer.serial(w_ptr, y_ptr)?,
                false => layer.overlapped(w_ptr, y_ptr)?,
            }
        }
        let got = stream.clone_dtoh(&y)?;
        let wrong = count_wrong(&got, &w_host, n, call);
        let how = if serial { "serial" } else { "overlapped" };
        tally.check(me, wrong == 0, || {
            format!(
                "call {call} ({how}): {wrong} of {} outputs off the reference",
                got.len()
            )
        });
        if call < 2 || call == calls - 1 {
            println!(
                "pe {me}: call {call} ({how}): {} outputs, {wrong} wrong",
                got.len()
            );
        }
    }
    check_gemm_rs(&world, plan, &w_host, calls, &mut tally)?;
    let refused = AgGemm::new(&world, TpPlan::new(n + 1, ROWS, K, COLS, CHUNKS)?);
    let message = tally.expect_error(me, "a plan for another job", refused, "the plan is for");
    println!("pe {me}: refused: {message}");
    let all_passed = tally.finish(&world)?;
    drop(layer);
    world.barrier_all()?;
    Ok(all_passed)
}

// ANCHOR: check_gemm_rs
/// GEMM + reduce-scatter: PE `me` holds every token's K-slice, x [N x ROWS, K], and keeps rows
/// me x ROWS .. of the sum over PEs of x @ w. Serial once, then overlapped, new data each call.
fn check_gemm_rs(
    world: &World,
    plan: TpPlan,
    w_host: &[bf16],
    calls: usize,
    tally: &mut Tally,
) -> Result<(), AnyError> {
    let (me, n) = (world.my_pe(), world.n_pes());
    let layer = GemmRs::new(world, plan)?;
    let stream = world.stream();
    let w: CudaSlice<bf16> = stream.clone_htod(w_host)?;
    let mut y: CudaSlice<bf16> = stream.alloc_zeros(ROWS * COLS)?;
    for call in 0..calls {
        let x_host: Vec<bf16> = (0..n * ROWS * K)
            .map(|i| bf16::from_f32(x_value(me, i / K, i % K, call)))
            .collect();
        let x: CudaSlice<bf16> = stream.clone_htod(&x_host)?;
        stream.memset_zeros(&mut y)?;
        let (xp, wp, yp) = (
            x.device_ptr(stream).0,
            w.device_ptr(stream).0,
            y.device_ptr(stream).0,
        );
        // SAFETY: x [N x ROWS, K], w [K, COLS], y [ROWS, COLS] bf16, live until the copy back.
        unsafe {
            match call {
                0 => layer.serial(xp, wp, yp)?,
                _ => layer.overlapped(xp, wp, yp)?,
            }
        }
        let got = stream.clone_dtoh(&y)?;
        let wrong = count_wrong_rs(&got, me, n, call);
        let how = if call == 0 { "serial" } else { "overlapped" };
        tally.check(me, wrong == 0, || {
            format!("GEMM + reduce-scatter call {call} ({how}): {wrong} outputs off")
        });
        if call < 2 || call == calls - 1 {
            println!("pe {me}: GEMM + reduce-scatter call {call} ({how}): {wrong} wrong");
        }
    }
    Ok(())
}
// ANCHOR_END: check_gemm_rs

/// Off the fp32 reference by more than the roundings on the way: each PE's partial is rounded
/// to bf16 once, and the sum at most once per PE (chapter 4's reduce-scatter adds in bf16).
fn count_wrong_rs(got: &[bf16], me: usize, n: usize, call: usize) -> usize {
    let mut wrong = 0;
    for row in 0..ROWS {
        for col in 0..COLS {
            let partials: Vec<f32> = (0..n)
                .map(|pe| {
                    (0..K)
                        .map(|k| x_value(pe, me * ROWS + row, k, call) * w_value(pe, k, col))
                        .sum()
                })
                .collect();
            let reference: f32 = partials.iter().sum();
            let scale: f32 = partials.iter().map(|v| v.abs()).sum::<f32>() + reference.abs();
            let value = got[row * COLS + col].to_f32();
            if (value - reference).abs() > scale * n as f32 / 256.0 + 1e-6 {
                wrong += 1;
            }
        }
    }
    wrong
}

fn write_shard(layer: &AgGemm<&World>, me: usize, call: usize) -> Result<(), AnyError> {
    let bytes: Vec<u8> = (0..ROWS * K)
        .flat_map(|i| bf16::from_f32(x_value(me, i / K, i % K, call)).to_le_bytes())
        .collect();
    layer.shard().copy_from_host(&bytes)?;
    Ok(())
}

/// Outputs off the fp32 host reference by more than bf16's rounding: half a unit in the last
/// place, at most 2^-8 of the value, plus a hair for values near zero.
fn count_wrong(got: &[bf16], w: &[bf16], n: usize, call: usize) -> usize {
    let mut wrong = 0;
    for pe in 0..n {
        for row in 0..ROWS {
            for col in 0..COLS {
                let reference: f32 = (0..K)
                    .map(|k| x_value(pe, row, k, call) * w[k * COLS + col].to_f32())
                    .sum();
                let value = got[(pe * ROWS + row) * COLS + col].to_f32();
                if (value - reference).abs() > reference.abs() / 256.0 + 1e-6 {
                    wrong += 1;
                }
            }
        }
    }
    wrong
}
