//! `World`: NVSHMEM initialised on this process's GPU, finalised on drop.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaStream};
use nvshmem_sys::{Nvshmem, UniqueId};

use crate::BootstrapError;
use crate::launch_env::LaunchEnv;
use crate::rendezvous::{RendezvousConfig, broadcast_from_rank0};

/// What `World::init` needs: who we are, and the id every rank shares.
#[derive(Debug, Clone)]
pub struct InitSpec {
    pub rank: usize,
    pub world_size: usize,
    /// GPU ordinal on this host.
    pub local_rank: usize,
    pub unique_id: UniqueId,
}

// ANCHOR: world
/// This process's membership in the NVSHMEM job. One per process: NVSHMEM is a process-wide
/// singleton, and a second `World` while one is alive is an error.
pub struct World {
    nvshmem: &'static Nvshmem,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    my_pe: usize,
    n_pes: usize,
    node_pe: usize,
    node_size: usize,
    gpu_pes: usize,
    num_sms: u32,
    init_time: Duration,
    job_seed: u64,
    /// Kernel modules registered with NVSHMEM so far, by name (see `load_module`).
    modules: Mutex<HashMap<&'static str, Arc<kernels::NvshmemModule>>>,
}
// ANCHOR_END: world

static ALIVE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

// ANCHOR: broken
/// Set once this PE knows the job is broken: a wait for a peer timed out, so that peer is
/// dead or stalled. NVSHMEM's teardown is collective (`nvshmem_free` and finalize wait for
/// every PE), and a dead PE never arrives: from then on, this process skips both, leaves its
/// symmetric heap to the driver (which reclaims it when the process exits), and exits instead
/// of waiting forever. NCCL's `ncclCommAbort` and torch's watchdog make the same trade.
static BROKEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Marks the job broken (see `BROKEN`): every later collective teardown of this process is
/// skipped. Called where a wait for a peer timed out.
pub fn mark_broken() {
    mark_broken_because("a peer did not arrive in time");
}

/// `mark_broken` for another `reason`: this PE stopped on an error of its own between
/// collective calls, so the peers it leaves waiting in a call it never makes will not join
/// its teardown either.
pub fn mark_broken_because(reason: &str) {
    if !BROKEN.swap(true, std::sync::atomic::Ordering::SeqCst) {
        eprintln!(
            "nvshmem_tutorial: {reason}: this process will skip NVSHMEM's collective teardown \
             (free, finalize) and leave its memory to the driver"
        );
    }
}

/// Whether the job is known broken (`mark_broken`).
pub fn is_broken() -> bool {
    BROKEN.load(std::sync::atomic::Ordering::SeqCst)
}
// ANCHOR_END: broken

impl World {
    // ANCHOR: from_env
    /// torchrun's path: read the environment, fetch the unique id from rank 0, initialise.
    pub fn from_env() -> Result<Self, BootstrapError> {
        let env = LaunchEnv::from_env()?;
        let nvshmem = load_library()?;
        let unique_id = share_unique_id(&env, || create_unique_id(nvshmem))?;
        Self::init(&InitSpec {
            rank: env.rank,
            world_size: env.world_size,
            local_rank: env.local_rank,
            unique_id,
        })
    }
    // ANCHOR_END: from_env

    /// Initialises NVSHMEM on GPU `local_rank` as PE `rank` of `world_size`. Collective: every
    /// rank must call it with the same id, and it returns once all of them have.
    pub fn init(spec: &InitSpec) -> Result<Self, BootstrapError> {
        if spec.rank >= spec.world_size {
            return Err(BootstrapError::Env(crate::EnvError::RankOutOfRange {
                rank: spec.rank,
                world_size: spec.world_size,
            }));
        }
        if ALIVE.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return Err(BootstrapError::AlreadyInitialized);
        }
        let result = Self::init_inner(spec);
        if result.is_err() {
            ALIVE.store(false, std::sync::atomic::Ordering::SeqCst);
        }
        result
    }

    fn init_inner(spec: &InitSpec) -> Result<Self, BootstrapError> {
        let nvshmem = load_library()?;
        let ctx = open_gpu(spec.local_rank)?;
        // NVSHMEM attaches to the calling thread's current context: make it ours.
        ctx.bind_to_thread()
            .map_err(BootstrapError::cuda("binding the context"))?;
        let stream = ctx
            .new_stream()
            .map_err(BootstrapError::cuda("creating a stream"))?;
        let started = Instant::now();
        init_with_unique_id(nvshmem, spec)?;
        let init_time = started.elapsed();
        // SAFETY: NVSHMEM is initialised from here on.
        let (my_pe, n_pes, node_pe, node_size, gpu_pes) = unsafe {
            (
                (nvshmem.my_pe)(),
                (nvshmem.n_pes)(),
                (nvshmem.team_my_pe)(nvshmem_sys::TEAM_NODE),
                (nvshmem.team_n_pes)(nvshmem_sys::TEAM_NODE),
                (nvshmem.team_n_pes)(nvshmem_sys::TEAM_SAME_GPU),
            )
        };
        if gpu_pes < 1 || gpu_pes > node_size {
            return Err(BootstrapError::Nvshmem(format!(
                "NVSHMEM's same-GPU team reports {gpu_pes} PEs on this GPU, outside 1..={node_size} \
                 (the PEs of this node): this build expects NVSHMEM {}",
                kernels::NVSHMEM_DEVICE_VERSION
            )));
        }
        let device_sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(BootstrapError::cuda("reading the SM count"))? as u32;
        let context_sms = context_sm_count()?.min(device_sms);
        let num_sms = sm_share(context_sms, gpu_pes as usize);
        Ok(Self {
            nvshmem,
            ctx,
            stream,
            my_pe: my_pe as usize,
            n_pes: n_pes as usize,
            node_pe: node_pe as usize,
            node_size: node_size as usize,
            gpu_pes: gpu_pes as usize,
            num_sms,
            init_time,
            job_seed: spec.unique_id.fingerprint(),
            modules: Mutex::default(),
        })
    }

    /// This PE's number in `0..n_pes()`.
    pub fn my_pe(&self) -> usize {
        self.my_pe
    }
    pub fn n_pes(&self) -> usize {
        self.n_pes
    }
    /// This PE's number among the PEs of its host (`NVSHMEMX_TEAM_NODE`).
    pub fn node_pe(&self) -> usize {
        self.node_pe
    }
    pub fn node_size(&self) -> usize {
        self.node_size
    }
    /// NVSHMEM's account of this PE, for [`crate::check_placement`].
    pub fn place(&self) -> crate::NvshmemPlace {
        crate::NvshmemPlace {
            my_pe: self.my_pe,
            n_pes: self.n_pes,
            node_pe: self.node_pe,
            node_size: self.node_size,
        }
    }
    /// How many PEs share this PE's GPU, this one included: 1 unless PEs are folded onto
    /// fewer GPUs. Kernels whose blocks wait for each other's PEs must then leave room on the
    /// GPU for the other PEs' blocks (chapter 4, `Kernels`).
    pub fn gpu_pes(&self) -> usize {
        self.gpu_pes
    }
    /// The SMs this PE's kernels may occupy at once: the GPU's, or this PE's share when
    /// several PEs share the GPU ([`sm_share`]). Kernels whose blocks wait for other PEs'
    /// blocks size their grids from it (chapters 3 and 4).
    pub fn num_sms(&self) -> u32 {
        self.num_sms
    }
    /// Wall time of `nvshmemx_hostlib_init_attr` (after the rendezvous).
    pub fn init_time(&self) -> Duration {
        self.init_time
    }
    /// A number every PE of this job shares and that differs between jobs (a hash of the
    /// unique id): a seed for test data that sender and receiver derive independently.
    pub fn job_seed(&self) -> u64 {
        self.job_seed
    }
    /// The host API table.
    pub fn nvshmem(&self) -> &'static Nvshmem {
        self.nvshmem
    }
    /// The CUDA primary context of this PE's GPU (shared with PyTorch, if present).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
    /// A stream owned by this world for the chapters' work.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
    /// An embedded kernel module, loaded and registered with NVSHMEM on first use, then shared
    /// by everything this world runs. Registered once per world because
    /// `nvshmemx_cumodule_finalize` does not give back all that `nvshmemx_cumodule_init` took
    /// (about 16 KiB of GPU memory per module in NVSHMEM 3.4.5; benchmarks/notes/reliability.md):
    /// a loop that made and dropped buffers would otherwise lose memory with every buffer.
    pub fn load_module(
        &self,
        name: &'static str,
    ) -> Result<Arc<kernels::NvshmemModule>, BootstrapError> {
        let mut modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(module) = modules.get(name) {
            return Ok(module.clone());
        }
        let module = Arc::new(kernels::NvshmemModule::load(&self.ctx, self.nvshmem, name)?);
        modules.insert(name, module.clone());
        Ok(module)
    }
    /// Host-blocking barrier across all PEs; also completes every outstanding put.
    pub fn barrier_all(&self) -> Result<(), BootstrapError> {
        // nvshmem_barrier_all orders with the device only through a stream synchronise.
        self.stream
            .synchronize()
            .map_err(BootstrapError::cuda("synchronising"))?;
        // SAFETY: initialised; collective.
        unsafe { (self.nvshmem.barrier_all)() };
        Ok(())
    }
}

// ANCHOR: finalize
impl Drop for World {
    fn drop(&mut self) {
        // Finalize is collective and frees the symmetric heap: pending work on our stream
        // must finish first, or it would touch freed memory.
        let _ = self.stream.synchronize();
        let _ = self.ctx.bind_to_thread();
        // The modules' NVSHMEM state goes before NVSHMEM does.
        self.modules
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        if !is_broken() {
            // SAFETY: initialised by `init`; every rank drops its World at the end of the job.
            unsafe { (self.nvshmem.hostlib_finalize)() };
        }
        ALIVE.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}
// ANCHOR_END: finalize

// ANCHOR: init
/// The two calls that turn a shared unique id into a running NVSHMEM job: fill an init
/// attribute with (rank, world size, id), then initialise with it. Collective: returns on each
/// rank once every rank has called it. A CUDA context must be current on this thread.
fn init_with_unique_id(nvshmem: &Nvshmem, spec: &InitSpec) -> Result<(), BootstrapError> {
    let mut attr = nvshmem_sys::InitAttr::new();
    // SAFETY: `attr` and `unique_id` are valid host structs of the 3.4 ABI.
    let status = unsafe {
        (nvshmem.set_attr_uniqueid_args)(
            spec.rank as i32,
            spec.world_size as i32,
            &spec.unique_id,
            &mut attr,
        )
    };
    if status != 0 {
        return Err(BootstrapError::Nvshmem(format!(
            "nvshmemx_set_attr_uniqueid_args returned {status}"
        )));
    }
    // SAFETY: collective; the caller made a context current on this thread.
    let status = unsafe { (nvshmem.hostlib_init_attr)(nvshmem_sys::INIT_WITH_UNIQUEID, &mut attr) };
    if status != 0 {
        return Err(BootstrapError::Nvshmem(format!(
            "nvshmemx_hostlib_init_attr returned {status} (rank {} of {}). Run with \
             NVSHMEM_DEBUG=INFO for NVSHMEM's own account",
            spec.rank, spec.world_size
        )));
    }
    Ok(())
}
// ANCHOR_END: init

// ANCHOR: sm_share
/// How many SMs one PE's kernels may occupy at once, when `gpu_pes` PEs share a GPU of which
/// this PE's CUDA context may use `context_sms`.
///
/// A block that spins on a flag another PE raises makes progress only if the block that
/// raises it runs too. With one PE per GPU, a cooperative launch proves that the PE's own
/// grid fits, and the other PEs have GPUs of their own. PEs that share a GPU under MPS run at
/// the same time and compete for its SMs: a PE whose grid fills the GPU keeps the others'
/// kernels from starting, and every PE then waits until it times out. So each PE keeps to an
/// equal part of the SMs it may use. `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` caps how many SMs a
/// client uses (the context reports the cap), but outside MPS's static partitioning it does
/// not give clients SMs of their own: two PEs at 50% of one H100, each filling its 66 SMs
/// with one block per SM, waited for each other until they timed out.
pub fn sm_share(context_sms: u32, gpu_pes: usize) -> u32 {
    (context_sms / u32::try_from(gpu_pes.max(1)).unwrap_or(u32::MAX)).max(1)
}
// ANCHOR_END: sm_share

/// The SMs the current context may use (`cuCtxGetExecAffinity`): all of the GPU's, unless
/// MPS gave this process a share.
fn context_sm_count() -> Result<u32, BootstrapError> {
    use cudarc::driver::sys;
    let mut affinity = std::mem::MaybeUninit::<sys::CUexecAffinityParam>::zeroed();
    // SAFETY: the caller made a context current on this thread; the driver fills `affinity`.
    unsafe {
        sys::cuCtxGetExecAffinity(
            affinity.as_mut_ptr(),
            sys::CUexecAffinityType::CU_EXEC_AFFINITY_TYPE_SM_COUNT,
        )
    }
    .result()
    .map_err(BootstrapError::cuda("reading the context's SM count"))?;
    // SAFETY: filled by the driver, for the SM-count type.
    Ok(unsafe { affinity.assume_init().param.smCount.val })
}

/// Opens the host library, requiring the release the embedded kernels were linked against.
pub fn load_library() -> Result<&'static Nvshmem, BootstrapError> {
    Ok(nvshmem_sys::load(kernels::NVSHMEM_DEVICE_VERSION)?)
}

/// Rank 0's part of the bootstrap: a fresh unique id.
pub fn create_unique_id(nvshmem: &Nvshmem) -> Result<UniqueId, BootstrapError> {
    let mut id = UniqueId::new();
    // SAFETY: `id` is a valid, versioned 128-byte struct.
    let status = unsafe { (nvshmem.get_uniqueid)(&mut id) };
    if status != 0 {
        return Err(BootstrapError::Nvshmem(format!(
            "nvshmemx_get_uniqueid returned {status}"
        )));
    }
    Ok(id)
}

// ANCHOR: share_unique_id
/// Rank 0 creates the id with `create` and serves it; every other rank fetches it.
pub fn share_unique_id(
    env: &LaunchEnv,
    create: impl FnOnce() -> Result<UniqueId, BootstrapError>,
) -> Result<UniqueId, BootstrapError> {
    let config = RendezvousConfig {
        rank: env.rank,
        world_size: env.world_size,
        master_addr: env.master_addr.clone(),
        port: env.rdzv_port,
        num_ports: env.rdzv_ports,
        job: env.job_token,
        timeout: env.timeout,
    };
    let created = if env.rank == 0 {
        Some(create()?.to_bytes())
    } else {
        None
    };
    let bytes = broadcast_from_rank0(&config, created.as_ref().map(|id| id.as_slice()))?;
    let bytes: &[u8; nvshmem_sys::UNIQUE_ID_BYTES] = bytes
        .as_slice()
        .try_into()
        .map_err(|_| BootstrapError::BadUniqueId { len: bytes.len() })?;
    Ok(UniqueId::from_bytes(bytes))
}
// ANCHOR_END: share_unique_id

/// Checks that a driver and the GPU exist before cudarc touches them: cudarc panics when
/// libcuda is missing, and a panic must not be how a CPU-only machine learns it has no GPU.
fn open_gpu(ordinal: usize) -> Result<Arc<CudaContext>, BootstrapError> {
    probe_driver()?;
    let count = CudaContext::device_count().map_err(BootstrapError::cuda("counting GPUs"))?;
    if ordinal >= count as usize {
        return Err(BootstrapError::NoSuchGpu {
            ordinal,
            count: count as usize,
        });
    }
    CudaContext::new(ordinal).map_err(BootstrapError::cuda("opening the GPU"))
}

/// `Err` with the fix when `libcuda.so.1` cannot be opened.
pub fn probe_driver() -> Result<(), BootstrapError> {
    // SAFETY: libcuda's initialisers only set up the driver's own state.
    unsafe { libloading::Library::new("libcuda.so.1") }
        .map(drop)
        .map_err(|e| BootstrapError::NoDriver(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::sm_share;

    #[test]
    fn one_pe_per_gpu_gets_its_context() {
        assert_eq!(sm_share(132, 1), 132);
        assert_eq!(sm_share(66, 1), 66);
    }

    #[test]
    fn pes_sharing_a_gpu_split_what_each_may_use() {
        // MPS without a percentage: every client may use every SM.
        assert_eq!(sm_share(132, 2), 66);
        assert_eq!(sm_share(132, 8), 16);
        // 25% of an H100 at 4 PEs: each client is capped at 32 SMs, which may be the same 32.
        assert_eq!(sm_share(32, 4), 8);
    }

    #[test]
    fn never_zero() {
        assert_eq!(sm_share(14, 16), 1);
        assert_eq!(sm_share(0, 1), 1);
    }
}
