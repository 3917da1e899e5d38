//! Chapter 1's runnable step (setup and the run line: book/src/introduction.md, "Before you
//! start"):
//!
//! ```text
//! torchrun --standalone --nproc_per_node=2 --no-python target/release/ch01-bootstrap
//! ```
//!
//! Every PE initialises NVSHMEM from torchrun's environment, prints where it stands, then
//! writes a pattern derived from its rank into the next PE's symmetric buffer with a kernel
//! and checks what the previous PE wrote into its own. PE 0 collects every PE's tally and
//! prints `N passed, M failed` for the whole job (the harness: `ch01_bootstrap::checks`).

use std::process::ExitCode;

use ch01_bootstrap::checks::{POISON_WORD, Tally, count_wrong, poison};
use ch01_bootstrap::{BootstrapError, LaunchEnv, Placement, World, check_placement, placement};
use cudarc::driver::{LaunchConfig, PushKernelArg};

/// Message sizes of the ring test, in 4-byte words: one word, an odd size that no block
/// count divides, and 64 MiB.
const RING_SIZES_WORDS: [u64; 3] = [1, 1_000_003, 16 << 20];

fn main() -> ExitCode {
    ch01_bootstrap::checks::exit_code("ch01-bootstrap", run().map_err(Into::into))
}

fn run() -> Result<bool, BootstrapError> {
    // ANCHOR: lesson
    // Rank 0 creates the unique id, the rendezvous carries it to every rank, and every rank
    // initialises NVSHMEM with it (nvshmemx_hostlib_init_attr).
    let world = World::from_env()?;
    println!(
        "pe {}/{} (node pe {}/{}) on cuda:{} {}: NVSHMEM {} initialised in {:.1} ms",
        world.my_pe(),
        world.n_pes(),
        world.node_pe(),
        world.node_size(),
        world.context().ordinal(),
        world
            .context()
            .name()
            .unwrap_or_else(|_| "unknown GPU".into()),
        world.nvshmem().version(),
        world.init_time().as_secs_f64() * 1e3
    );
    // The ring kernel's cubin, registered with NVSHMEM (nvshmemx_cumodule_init).
    let module = world.load_module("ring")?;
    let mut tally = Tally::default();
    check_place_in_job(&world, &mut tally)?;
    for num_words in RING_SIZES_WORDS {
        // Sender and receiver must agree on the pattern without talking: the seed comes from
        // the job's unique id (random per job, the same on every PE) and the round's size.
        let seed = (world.job_seed() as u32) ^ (num_words as u32).wrapping_mul(0x9E37_79B9);
        let received = ring_round(&world, &module, num_words, seed)?;
        check_round(&world, &received, seed, &mut tally);
    }
    // Dropping `world` at the end of `run` finalises NVSHMEM (nvshmemx_hostlib_finalize).
    tally.finish(&world)
    // ANCHOR_END: lesson
}

// ANCHOR: ring
/// One pass around the ring: every PE puts `num_words` words of its pattern into the next
/// PE's symmetric buffer; returns what arrived in this PE's copy from the previous PE.
fn ring_round(
    world: &World,
    module: &kernels::NvshmemModule,
    num_words: u64,
    seed: u32,
) -> Result<Vec<u32>, BootstrapError> {
    let nvshmem = world.nvshmem();
    let stream = world.stream();
    let num_bytes = num_words as usize * 4;
    // Symmetric allocation: collective, same size on every PE (chapter 2 wraps this).
    // SAFETY: NVSHMEM is initialised; the pointer is freed below on every path.
    let received = unsafe { (nvshmem.malloc)(num_bytes) } as u64;
    if received == 0 {
        return Err(BootstrapError::Nvshmem(format!(
            "nvshmem_malloc({num_bytes}) failed: raise NVSHMEM_SYMMETRIC_SIZE"
        )));
    }
    let result = (|| {
        // SAFETY: `received` holds `num_bytes` bytes.
        unsafe { poison(received, num_bytes, stream) }?;
        // No peer may write into our buffer before the poison has landed.
        world.barrier_all()?;
        let staging = stream
            .alloc_zeros::<u32>(num_words as usize)
            .map_err(BootstrapError::cuda("allocating the staging buffer"))?;
        let ring_put = module.function("ring_put")?;
        let config = LaunchConfig {
            grid_dim: (num_words.div_ceil(256 * 16).clamp(1, 132) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = stream.launch_builder(&ring_put);
        launch
            .arg(&received)
            .arg(&staging)
            .arg(&num_words)
            .arg(&seed);
        // SAFETY: argument types match `ring_put(uint32_t*, uint32_t*, uint64_t, uint32_t)`.
        unsafe { launch.launch(config) }.map_err(BootstrapError::cuda("launching ring_put"))?;
        // The barrier completes every PE's puts: after it, our buffer holds the previous
        // PE's pattern.
        // SAFETY: initialised; collective, every PE enqueues it once per round.
        unsafe { (nvshmem.barrier_all_on_stream)(stream.cu_stream() as _) };
        let mut host = vec![0u32; num_words as usize];
        // SAFETY: `received` holds `num_words` words; we synchronise before reading `host`.
        unsafe {
            cudarc::driver::result::memcpy_dtoh_async(&mut host, received, stream.cu_stream())
        }
        .map_err(BootstrapError::cuda("copying the result back"))?;
        stream
            .synchronize()
            .map_err(BootstrapError::cuda("synchronising"))?;
        Ok(host)
    })();
    // SAFETY: collective free of the pointer allocated above (every PE reaches this line).
    unsafe { (nvshmem.free)(received as *mut _) };
    result
}
// ANCHOR_END: ring

/// NVSHMEM's view of the job must be torchrun's: PE number, job size and place on the host
/// (NVSHMEM's node may hold several torchrun nodes: `check_placement`).
fn check_place_in_job(world: &World, tally: &mut Tally) -> Result<(), BootstrapError> {
    let env = LaunchEnv::from_env()?;
    let me = world.my_pe();
    let local_rank = placement::torchrun_local_rank(&env, |name| std::env::var(name).ok());
    match check_placement(&env, local_rank, world.place()) {
        Ok(Placement::SameNode) => tally.check(me, true, String::new),
        Ok(Placement::VirtualNodes { per_host }) => {
            println!(
                "pe {me}: torchrun's node is one of {per_host} on this host (NVSHMEM's node team \
                 spans them all)"
            );
            tally.check(me, true, String::new);
        }
        Err(why) => tally.check(me, false, || why),
    }
    // torchrun gives every local rank a GPU of its own (LOCAL_RANK is the ordinal).
    tally.check(me, world.gpu_pes() == 1, || {
        format!(
            "NVSHMEM counts {} PEs on cuda:{}, expected 1 (one GPU per local rank)",
            world.gpu_pes(),
            world.context().ordinal()
        )
    });
    Ok(())
}

/// Every word of `received` must be the previous PE's pattern word (none left as poison).
fn check_round(world: &World, received: &[u32], seed: u32, tally: &mut Tally) {
    let me = world.my_pe();
    let source = (me + world.n_pes() - 1) % world.n_pes();
    let sent: Vec<u32> = (0..received.len() as u64)
        .map(|i| kernels::pattern_word(source, i, seed))
        .collect();
    let wrong = count_wrong(received, 0, &sent, POISON_WORD);
    tally.check(me, wrong == 0, || {
        format!(
            "{wrong} of {} words from pe {source} are wrong",
            received.len()
        )
    });
}
