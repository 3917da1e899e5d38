//! The soak options of chapters 7 and 8's programs (in `shared`, which both include):
//! `--pairs N` dispatch/combine pairs in a row (new routing each, every result checked),
//! `--create-destroy N` buffers made and dropped in a loop with this GPU's free memory read
//! before and after (a buffer that leaks shows as memory that does not come back, or as a
//! symmetric heap that runs out), and `--timeout-ms N`, the buffer's bound on every wait
//! (scripts/dead_rank.py kills a rank mid-loop and times how soon the others exit).

use std::ops::Deref;
use std::time::Instant;

use ch01_bootstrap::World;
use ch01_bootstrap::checks::Tally;
use nvshmem_tutorial::{BufferError, BufferOptions, NvshmemBuffer};

pub(crate) struct SoakArgs {
    pub(crate) pairs: Option<usize>,
    pub(crate) create_destroy: Option<usize>,
    pub(crate) timeout_ms: Option<usize>,
}

impl SoakArgs {
    /// `options` with this run's timeout, if one was given.
    pub(crate) fn apply(&self, options: BufferOptions) -> BufferOptions {
        BufferOptions {
            timeout_ms: self.timeout_ms.map_or(options.timeout_ms, |t| t as u64),
            ..options
        }
    }
}

/// `--pairs N`, `--create-destroy N`, `--timeout-ms N` from the command line; anything else
/// is an error.
pub(crate) fn soak_args() -> Result<SoakArgs, String> {
    let mut args = SoakArgs {
        pairs: None,
        create_destroy: None,
        timeout_ms: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let slot = match flag.as_str() {
            "--pairs" => &mut args.pairs,
            "--create-destroy" => &mut args.create_destroy,
            "--timeout-ms" => &mut args.timeout_ms,
            other => {
                return Err(format!(
                    "unknown argument {other:?} (takes --pairs N, --create-destroy N and \
                     --timeout-ms N)"
                ));
            }
        };
        let value = it.next().ok_or(format!("{flag} needs a count"))?;
        *slot = Some(
            value
                .parse()
                .map_err(|_| format!("{flag} {value}: not a count"))?,
        );
    }
    Ok(args)
}

/// How far a loop of many calls has got, printed by PE 0 at every tenth of it (at most one line
/// per 100 iterations) and at its end: a run that a wall-clock bound cuts still says where it
/// was and how long one iteration takes, which is what sizing the next bound needs.
pub(crate) struct Progress {
    me: usize,
    what: &'static str,
    total: usize,
    step: usize,
    start: Instant,
}

impl Progress {
    pub(crate) fn new(me: usize, what: &'static str, total: usize) -> Self {
        Self {
            me,
            what,
            total,
            step: (total / 10).max(100),
            start: Instant::now(),
        }
    }

    /// Call after iteration `done` (counting from 1) finished.
    pub(crate) fn done(&self, done: usize) {
        if self.me != 0 || !(done == self.total || done.is_multiple_of(self.step)) {
            return;
        }
        let seconds = self.start.elapsed().as_secs_f64();
        println!(
            "pe 0: {done} of {} {} in {seconds:.1} s ({:.2} ms each)",
            self.total,
            self.what,
            1e3 * seconds / done as f64
        );
    }
}

/// Makes and drops `count` buffers of `options` (collective), then checks that this GPU's
/// free memory came back to within 1 MiB of what it was after the first one. Free memory is
/// read after synchronising and trimming the device's default memory pool (cudarc allocates
/// stream-ordered, and a pool's cached blocks are not a leak); the readings after 1, 2,
/// count/4, count/2 and count buffers are printed, so a leak (growing) shows apart from a
/// one-off (flat after the first few).
pub(crate) fn create_destroy<W: Deref<Target = World> + Clone>(
    world: W,
    count: usize,
    options: BufferOptions,
    tally: &mut Tally,
) -> Result<(), BufferError> {
    let me = world.my_pe();
    let free = || -> Result<usize, BufferError> {
        world
            .barrier_all()
            .map_err(|e| BufferError::invalid("soak", e.to_string()))?;
        trim_default_pool(&world)?;
        let (free, _) = cudarc::driver::result::mem_get_info()
            .map_err(BufferError::cuda("reading the GPU's free memory"))?;
        Ok(free)
    };
    drop(NvshmemBuffer::new(world.clone(), options)?); // the first loads what stays loaded
    let before = free()?;
    let checkpoints = [1, 2, count / 4, count / 2, count];
    let mut curve = Vec::new();
    for made in 1..=count {
        let buffer = NvshmemBuffer::new(world.clone(), options)?;
        buffer.check()?;
        drop(buffer);
        if checkpoints.contains(&made) {
            let lost = before.saturating_sub(free()?);
            curve.push(format!("{made}: {} KiB", lost >> 10));
        }
    }
    let after = free()?;
    let lost = before.saturating_sub(after);
    println!(
        "pe {me}: {count} buffers made and dropped: free GPU memory {} -> {} MiB (lost after \
         {})",
        before >> 20,
        after >> 20,
        curve.join(", ")
    );
    tally.check(me, lost <= 1 << 20, || {
        format!(
            "{count} buffers made and dropped: {} KiB of GPU memory did not come back",
            lost >> 10
        )
    });
    Ok(())
}

/// Synchronises this PE's context and returns the default memory pool's unused blocks to the
/// driver.
fn trim_default_pool(world: &World) -> Result<(), BufferError> {
    let ctx = world.context();
    ctx.synchronize().map_err(BufferError::cuda(
        "synchronising before reading free memory",
    ))?;
    let mut pool: cudarc::driver::sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: an out-pointer and this context's device.
    unsafe { cudarc::driver::sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) }
        .result()
        .map_err(BufferError::cuda("looking up the default memory pool"))?;
    // SAFETY: the device's default pool; trimming frees only blocks no allocation holds.
    unsafe { cudarc::driver::sys::cuMemPoolTrimTo(pool, 0) }
        .result()
        .map_err(BufferError::cuda("trimming the default memory pool"))
}
