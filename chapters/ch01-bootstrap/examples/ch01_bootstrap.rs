//! Chapter 1's runnable step:
//!
//! ```text
//! torchrun --nproc_per_node=N --no-python target/release/ch01-bootstrap
//! ```
//!
//! Every PE initialises NVSHMEM from torchrun's environment, prints where it stands, then
//! writes a pattern derived from its rank into the next PE's symmetric buffer with a kernel
//! and checks what the previous PE wrote into its own. PE 0 collects every PE's tally and
//! prints `N passed, M failed` for the whole job.

use std::process::ExitCode;

use ch01_bootstrap::checks::Tally;
use ch01_bootstrap::{BootstrapError, World};
use cudarc::driver::{LaunchConfig, PushKernelArg};

/// Message sizes of the ring test, in 4-byte words: one word, an odd size that no block
/// count divides, and 64 MiB.
const RING_SIZES_WORDS: [u64; 3] = [1, 1_000_003, 16 << 20];

fn main() -> ExitCode {
    ch01_bootstrap::checks::exit_code("ch01-bootstrap", run().map_err(Into::into))
}

fn run() -> Result<bool, BootstrapError> {
    // ANCHOR: init
    let world = World::from_env()?;
    let env = ch01_bootstrap::LaunchEnv::from_env()?;
    let gpu = world
        .context()
        .name()
        .unwrap_or_else(|_| "unknown GPU".into());
    println!(
        "pe {}/{} (node pe {}/{}) on cuda:{} {gpu}: NVSHMEM {} initialised in {:.1} ms",
        world.my_pe(),
        world.n_pes(),
        world.node_pe(),
        world.node_size(),
        env.local_rank,
        world.nvshmem().version(),
        world.init_time().as_secs_f64() * 1e3
    );
    // ANCHOR_END: init
    let me = world.my_pe();
    let mut tally = Tally::default();
    tally.check(me, me == env.rank, || {
        format!("my_pe {me} != RANK {}", env.rank)
    });
    tally.check(me, world.n_pes() == env.world_size, || {
        format!("n_pes {} != WORLD_SIZE {}", world.n_pes(), env.world_size)
    });
    tally.check(
        me,
        world.node_size() == env.local_world_size && world.node_pe() == env.local_rank,
        || {
            format!(
                "node pe {}/{} != LOCAL_RANK/LOCAL_WORLD_SIZE {}/{}",
                world.node_pe(),
                world.node_size(),
                env.local_rank,
                env.local_world_size
            )
        },
    );

    let module = world.load_module("ring")?;
    for num_words in RING_SIZES_WORDS {
        ring_round(&world, &module, num_words, &mut tally)?;
    }
    tally.finish(&world)
}

// ANCHOR: ring
/// One ring pass of `num_words` u32: put to the next PE, check what came from the previous.
fn ring_round(
    world: &World,
    module: &kernels::NvshmemModule,
    num_words: u64,
    tally: &mut Tally,
) -> Result<(), BootstrapError> {
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
        // Poison: 0xFFFFFFFF is never produced for every word by the pattern, and a slot the
        // kernel forgot keeps it.
        unsafe {
            cudarc::driver::result::memset_d8_async(received, 0xFF, num_bytes, stream.cu_stream())
        }
        .map_err(BootstrapError::cuda("poisoning the receive buffer"))?;
        let staging = stream
            .alloc_zeros::<u32>(num_words as usize)
            .map_err(BootstrapError::cuda("allocating the staging buffer"))?;
        // Sender and receiver must agree on the seed without talking: it comes from the job's
        // unique id (random per job, the same on every PE) and the round's size, so data left
        // over from another round or another run cannot pass.
        let seed = (world.job_seed() as u32) ^ (num_words as u32).wrapping_mul(0x9E37_79B9);
        // Make the poison land before any peer writes into this buffer.
        world.barrier_all()?;
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
        unsafe { (nvshmem.barrier_all_on_stream)(stream.cu_stream() as _) };
        let mut host = vec![0u32; num_words as usize];
        unsafe {
            cudarc::driver::result::memcpy_dtoh_async(&mut host, received, stream.cu_stream())
        }
        .map_err(BootstrapError::cuda("copying the result back"))?;
        stream
            .synchronize()
            .map_err(BootstrapError::cuda("synchronising"))?;

        let me = world.my_pe();
        let source = (me + world.n_pes() - 1) % world.n_pes();
        let wrong = host
            .iter()
            .enumerate()
            .filter(|&(i, &w)| w != kernels::pattern_word(source, i as u64, seed))
            .count();
        tally.check(me, wrong == 0, || {
            format!("{wrong} of {num_words} words from pe {source} are wrong")
        });
        Ok(())
    })();
    // SAFETY: collective free of the pointer allocated above (every PE reaches this line).
    unsafe { (nvshmem.free)(received as *mut _) };
    result
}
// ANCHOR_END: ring
