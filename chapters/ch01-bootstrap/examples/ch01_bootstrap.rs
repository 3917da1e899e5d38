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

use ch01_bootstrap::{BootstrapError, World};
use cudarc::driver::{LaunchConfig, PushKernelArg};

/// Message sizes of the ring test, in 4-byte words: one word, an odd size that no block
/// count divides, and 64 MiB.
const RING_SIZES_WORDS: [u64; 3] = [1, 1_000_003, 16 << 20];

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("ch01-bootstrap: error: {error}");
            ExitCode::from(2)
        }
    }
}

/// Counts checks on this PE.
#[derive(Default)]
struct Tally {
    passed: u32,
    failed: u32,
}

impl Tally {
    fn check(&mut self, pe: usize, ok: bool, what: String) {
        if ok {
            self.passed += 1;
        } else {
            self.failed += 1;
            eprintln!("pe {pe}: FAILED: {what}");
        }
    }
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
    tally.check(me, me == env.rank, format!("my_pe {me} != RANK {}", env.rank));
    tally.check(
        me,
        world.n_pes() == env.world_size,
        format!("n_pes {} != WORLD_SIZE {}", world.n_pes(), env.world_size),
    );
    tally.check(
        me,
        world.node_size() == env.local_world_size && world.node_pe() == env.local_rank,
        format!(
            "node pe {}/{} != LOCAL_RANK/LOCAL_WORLD_SIZE {}/{}",
            world.node_pe(),
            world.node_size(),
            env.local_rank,
            env.local_world_size
        ),
    );

    let module = world.load_module("ring")?;
    for num_words in RING_SIZES_WORDS {
        ring_round(&world, &module, num_words, &mut tally)?;
    }
    report(&world, &tally)
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
        unsafe { cudarc::driver::result::memset_d8_async(received, 0xFF, num_bytes, stream.cu_stream()) }
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
        launch.arg(&received).arg(&staging).arg(&num_words).arg(&seed);
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
        stream.synchronize().map_err(BootstrapError::cuda("synchronising"))?;

        let me = world.my_pe();
        let source = (me + world.n_pes() - 1) % world.n_pes();
        let wrong = host
            .iter()
            .enumerate()
            .filter(|&(i, &w)| w != ring_pattern(source, i as u64, seed))
            .count();
        tally.check(
            me,
            wrong == 0,
            format!("{wrong} of {num_words} words from pe {source} are wrong"),
        );
        Ok(())
    })();
    // SAFETY: collective free of the pointer allocated above (every PE reaches this line).
    unsafe { (nvshmem.free)(received as *mut _) };
    result
}
// ANCHOR_END: ring

/// Host reference of `ring_pattern` in `kernels/cuda/ring.cu`.
fn ring_pattern(source_pe: usize, index: u64, seed: u32) -> u32 {
    let mut x = (index as u32).wrapping_mul(0x9E37_79B1)
        ^ (source_pe as u32 + 1).wrapping_mul(0x85EB_CA77);
    x ^= seed;
    x ^= x >> 15;
    x.wrapping_mul(0x2C1B_3C6D)
}

/// Every PE puts its (passed, failed) into PE 0's symmetric tally array; PE 0 prints the sum.
fn report(world: &World, tally: &Tally) -> Result<bool, BootstrapError> {
    let nvshmem = world.nvshmem();
    let stream = world.stream();
    let n = world.n_pes();
    let bytes = n * 8;
    let tallies = unsafe { (nvshmem.malloc)(bytes) } as u64;
    if tallies == 0 {
        return Err(BootstrapError::Nvshmem("nvshmem_malloc for the tally failed".into()));
    }
    // Zero PE 0's copy before anyone writes into it.
    unsafe { cudarc::driver::result::memset_d8_async(tallies, 0, bytes, stream.cu_stream()) }
        .map_err(BootstrapError::cuda("zeroing the tallies"))?;
    world.barrier_all()?;
    let mine = stream
        .clone_htod(&[tally.passed, tally.failed])
        .map_err(BootstrapError::cuda("uploading the tally"))?;
    let (mine_ptr, _guard) = cudarc::driver::DevicePtr::device_ptr(&mine, stream);
    unsafe {
        (nvshmem.putmem_on_stream)(
            (tallies + 8 * world.my_pe() as u64) as *mut _,
            mine_ptr as *const _,
            8,
            0,
            stream.cu_stream() as _,
        );
        (nvshmem.barrier_all_on_stream)(stream.cu_stream() as _);
    }
    let mut all = vec![0u32; 2 * n];
    unsafe { cudarc::driver::result::memcpy_dtoh_async(&mut all, tallies, stream.cu_stream()) }
        .map_err(BootstrapError::cuda("reading the tallies"))?;
    stream.synchronize().map_err(BootstrapError::cuda("synchronising"))?;
    drop(_guard);
    unsafe { (nvshmem.free)(tallies as *mut _) };
    println!("pe {}: {} passed, {} failed", world.my_pe(), tally.passed, tally.failed);
    if world.my_pe() == 0 {
        let passed: u32 = all.iter().step_by(2).sum();
        let failed: u32 = all.iter().skip(1).step_by(2).sum();
        // A PE whose put never arrived left 0/0: count it as a failure, not as silence.
        let silent = all.chunks(2).filter(|c| c[0] + c[1] == 0).count() as u32;
        println!("{passed} passed, {} failed", failed + silent);
        return Ok(failed + silent == 0);
    }
    Ok(tally.failed == 0)
}
