//! The MoE layer of scripts/moe_model.py in Rust, in low-latency mode (the decode path):
//!
//! ```text
//! torchrun --standalone --nproc_per_node=N --no-python target/release/moe-layer
//! ```
//!
//! Every rank makes its experts from the seed (each expert's matrices from a seed of its own,
//! so any rank can make any expert), then, for two decode steps of fresh tokens: the router
//! (scores = x @ router through cuBLAS, softmax and top-k on the host), the buffer's
//! low-latency dispatch, its experts (gate / up / down with SiLU) as batched GEMMs over the
//! received layout, and the low-latency combine with the top-k weights (layer.rs). Each step
//! is checked against the same layer computed on the host in f32 from the same seeds (every
//! rank computes its own tokens through each expert they were routed to): the router's
//! scores and the layer's output within 1e-2 of the reference's norm. Ends
//! `N passed, M failed`.
//!
//! Options: --tokens (per rank, at most T = 128), --hidden, --experts, --top-k, --ffn, --seed;
//! by default Python's small shape with 64 tokens per rank (hidden 1024, 16 experts, top-4,
//! FFN 256) and the job's seed. N must divide the experts: a shape the layer cannot run is
//! refused before NVSHMEM starts.

use std::process::ExitCode;

use ch01_bootstrap::checks::{Tally, exit_code};
use ch01_bootstrap::{LaunchEnv, World};
use nvshmem_tutorial::buffer::heap_bytes;
use nvshmem_tutorial::symmetric_memory::SYMMETRIC_SIZE_VAR;
use nvshmem_tutorial::{BufferOptions, DeviceArray, NvshmemBuffer, get_low_latency_rdma_size_hint};

mod gpu;
mod host;
mod layer;

use host::{Args, ExpertF32, MAX_TOKENS, relative, to_f32};
use layer::MoeLayer;

pub(crate) type AnyError = Box<dyn std::error::Error>;

/// Relative error allowed (norm of the difference / norm of the reference), as Python's:
/// bf16 operands and intermediates against f32 throughout.
const LIMIT: f64 = 1e-2;
/// Decode steps, each with fresh tokens through the same buffer and layer.
const STEPS: usize = 2;

fn main() -> ExitCode {
    exit_code("moe-layer", run())
}

fn run() -> Result<bool, AnyError> {
    let Args { shape, seed } = Args::parse(std::env::args().skip(1))?;
    let ranks = LaunchEnv::from_env()?.world_size;
    // Everything the shape must satisfy, and the libraries, before NVSHMEM starts.
    shape.check(ranks)?;
    let num_rdma_bytes =
        get_low_latency_rdma_size_hint(MAX_TOKENS, shape.hidden, ranks, shape.experts);
    size_the_heap(ranks, num_rdma_bytes);
    ch06_overlap::probe_cublas()?;
    gpu::probe_nvrtc()?;
    let world = World::from_env()?;
    let (me, stream) = (world.my_pe(), world.stream().clone());
    let seed = seed.unwrap_or(world.job_seed());
    // ANCHOR: create
    let options = BufferOptions::low_latency(num_rdma_bytes);
    let mut buffer = NvshmemBuffer::new(&world, options)?;
    let mut layer = MoeLayer::new(&world, shape, seed)?;
    // ANCHOR_END: create
    // Rows no kernel wrote are NaN: the experts compute them, and combine must never read them.
    buffer.set_poison_outputs(true);
    if me == 0 {
        println!(
            "pe 0: MoE layer, low-latency mode, {ranks} ranks: {} tokens per rank, hidden {}, {} \
             experts ({} per rank), top-{}, FFN {}, T = {MAX_TOKENS}",
            shape.tokens,
            shape.hidden,
            shape.experts,
            shape.local_experts(ranks),
            shape.top_k,
            shape.ffn
        );
    }
    // The reference: every expert (a token may go to any), and the router, in f32.
    let experts: Vec<ExpertF32> = (0..shape.experts)
        .map(|e| ExpertF32::new(seed, &shape, e))
        .collect();
    let router = to_f32(&host::router(seed, &shape));
    let mut tally = Tally::default();
    for step in 0..STEPS {
        let x_host = host::tokens(seed, &shape, me, step);
        let x = DeviceArray::from_host(&stream, &x_host, shape.tokens, shape.hidden)?;
        let (out, routing) = layer.forward(&mut buffer, &x)?;
        let out = to_f32(&out.to_host(&stream)?);
        let x = to_f32(&x_host);
        let scores = host::matmul(&x, &router, (shape.tokens, shape.hidden, shape.experts));
        let error = relative(&routing.scores, &scores);
        check(&mut tally, me, format!("step {step}: router scores"), error);
        // The reference takes the layer's routing: a near tie between a token's k-th and
        // (k+1)-th expert may fall the other way in f32 (the scores are checked just above).
        let want = host::reference(&x, &routing.choice, &experts, &shape);
        check(
            &mut tally,
            me,
            format!("step {step}: layer output"),
            relative(&out, &want),
        );
    }
    Ok(tally.finish(&world)?)
}

fn check(tally: &mut Tally, me: usize, what: String, error: f64) {
    println!("pe {me}: {what}: relative error {error:.2e} (limit {LIMIT:.0e})");
    tally.check(me, error <= LIMIT, || {
        format!("{what}: relative error {error:.2e} > {LIMIT:.0e}")
    });
}

/// NVSHMEM sizes its symmetric heap once, at initialisation, from NVSHMEM_SYMMETRIC_SIZE: set
/// it for this program's buffer before the World exists, unless the user chose a size (as
/// chapter 8's program does).
fn size_the_heap(ranks: usize, num_rdma_bytes: usize) {
    if std::env::var_os(SYMMETRIC_SIZE_VAR).is_some() {
        return;
    }
    let num_bytes = heap_bytes(ranks, 0, num_rdma_bytes);
    // SAFETY: nothing else runs yet: main has started no thread and loaded no library.
    unsafe { std::env::set_var(SYMMETRIC_SIZE_VAR, format!("{}G", (num_bytes >> 30) + 2)) };
}
