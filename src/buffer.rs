//! `NvshmemBuffer`: one symmetric allocation (a chapter-4 communicator plus the buffer's
//! regions, src/regions.rs), the kernels of kernels/cuda/buffer, and the small local state the
//! rings need. This module makes the buffer, checks its error records and launches plans; the
//! calls are in their own modules, each a pure `plan_*` function (checks and argument
//! structs) and an `unsafe fn *_raw` that launches the plan (the raw layer, over device
//! views), and typed.rs is the safe layer over typed device arrays.

use std::ffi::c_void;
use std::ops::Deref;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use ch01_bootstrap::World;
use ch04_collectives::config::MAX_PES;
use ch04_collectives::{
    CollectivesConfig, Communicator, HostMapped, Kernels, LaunchSpec, Workspace,
};
use ch05_inter_node::config::NODE_PES_VAR;
use ch05_inter_node::layout::resolve_node_pes;
use cudarc::driver::{CudaEvent, CudaSlice, DevicePtr, sys};

use crate::config::{CHANNEL_THREADS, MAX_CHANNELS};
use crate::error::{BufferError, LastRingCall, describe};
use crate::internode_notify::NotifyArea;
use crate::low_latency::phases::PendingReceive;
use crate::mode_sharing::RdmaUser;
use crate::regions::{MAX_EXPERTS, Regions};
use crate::spec::{
    BufferOptions, BufferSpec, PROGRESS_WORDS, node_members, options_need_notify_area,
};
use kernels::contract::{InputError, InternodeNotifyState, LlState, MAX_LL_BLOCKS};

const MODULES: [&str; 7] = [
    "buffer/layout",
    "buffer/notify",
    "buffer/dispatch",
    "buffer/combine",
    "buffer/ll_dispatch",
    "buffer/ll_combine",
    "buffer/ll_barrier",
];
/// Words of the notify step's host-mapped counts: [0] tokens to receive (i32), then one i32
/// per local expert.
const COUNT_WORDS: usize = 1 + MAX_EXPERTS / 2;
/// u64 words of the per-rank device state of low-latency mode (`LlState` of the contract).
pub(crate) const LL_STATE_WORDS: usize = std::mem::size_of::<LlState>().div_ceil(8);
/// u64 words of the internode notify's per-rank state (`InternodeNotifyState`).
const INTERNODE_STATE_WORDS: usize = std::mem::size_of::<InternodeNotifyState>().div_ceil(8);
/// The internode notify's, dispatch's and combine's modules, loaded by buffers that span nodes
/// with an rdma region (normal mode, or low-latency mode serving normal calls too).
const INTERNODE_MODULES: [&str; 3] = [
    "buffer/internode_notify",
    "buffer/internode_dispatch",
    "buffer/internode_combine",
];

/// Symmetric heap bytes one buffer takes on `n_pes` PEs: the communicator's own (it spans one
/// node, at most MAX_PES of them: the most it can take), then the buffer's regions
/// (src/regions.rs).
///
/// A buffer with an rdma region may span nodes and then gets the internode notify's area (in
/// normal mode, or in low-latency mode, which serves normal calls too up to MAX_NORMAL_RANKS:
/// `options_need_notify_area`): as the node size is not an argument here, the largest any node
/// size of `n_pes` needs (`NotifyArea::most_bytes`, under 2 MB), reserved for every such buffer.
pub fn heap_bytes(n_pes: usize, num_nvl_bytes: usize, num_rdma_bytes: usize) -> usize {
    let spans_nodes = num_rdma_bytes > 0 && n_pes <= crate::config::MAX_NORMAL_RANKS;
    let regions = Regions {
        num_nvl_bytes,
        num_rdma_bytes,
        notify_area_bytes: if spans_nodes {
            NotifyArea::most_bytes(n_pes)
        } else {
            0
        },
    };
    let node_pes = n_pes.min(MAX_PES);
    ch04_collectives::workspace::symmetric_bytes(
        node_pes,
        CollectivesConfig::default().ll_max_bytes,
    ) + regions.total()
}

// ANCHOR: node_pes
/// G, the ranks of this rank's node, as chapter 5 decides it: torchrun's LOCAL_WORLD_SIZE
/// (else NVSHMEM's node team), cut smaller by NVSHMEM_TUTORIAL_NODE_PES (virtual nodes: one
/// host runs the paths of several nodes).
pub fn node_pes_from_env(world: &World) -> Result<usize, BufferError> {
    let env = std::env::var(NODE_PES_VAR).ok();
    let torchrun_node = std::env::var("LOCAL_WORLD_SIZE")
        .ok()
        .and_then(|v| v.trim().parse().ok());
    resolve_node_pes(
        env.as_deref(),
        torchrun_node,
        world.node_size(),
        world.n_pes(),
    )
    .map_err(|e| BufferError::invalid("Buffer", e.to_string()))
}
// ANCHOR_END: node_pes

/// How a buffer kernel's blocks behave, which decides how it is launched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Blocks {
    /// They may wait for each other or for a peer, so every block must be resident at once:
    /// `Kernels::launch` checks that first (a grid that cannot be would hang).
    MayWait,
    /// They never wait for each other or for a peer: no residency check
    /// ([`ch04_collectives::Kernels::launch_independent`]).
    Independent,
}

// ANCHOR: buffer
pub struct NvshmemBuffer<W: Deref<Target = World>> {
    pub(crate) comm: Communicator<W>,
    pub(crate) kernels: Kernels,
    /// What the plans know of this buffer: options, PE, addresses.
    pub(crate) spec: BufferSpec,
    /// Local device [PROGRESS_WORDS] u64: the ring progress (`Progress`).
    _progress: CudaSlice<u64>,
    /// The notify step's counts (host-mapped i32, see COUNT_WORDS).
    pub(crate) counts: HostMapped,
    /// Marks when the notify step's first kernel started (its host deadline counts from it).
    started: CudaEvent,
    /// Bad input found on the device: [kind, token, value, limit] (host-mapped) and its claim.
    input_error: HostMapped,
    input_claim: CudaSlice<u64>,
    /// Low-latency mode's per-rank state (call count, finish counters, slot counters; see
    /// `LlState` in kernels/contract/defs.rs).
    _ll_state: CudaSlice<u64>,
    /// The internode notify's per-rank state (`InternodeNotifyState`), when the buffer has the
    /// notify's area (`options_need_notify_area`).
    _internode_state: Option<CudaSlice<u64>>,
    /// A low-latency send phase whose receive (the hook) has not run yet: one call in flight.
    pub(crate) ll_receive_pending: Mutex<Option<PendingReceive>>,
    /// Which mode used the shared rdma region last (src/mode_sharing/): a low-latency call
    /// after a normal one across nodes needs `clean_low_latency_buffer` between them.
    pub(crate) rdma_user: Mutex<RdmaUser>,
    /// Whether the typed calls (typed.rs) poison the outputs they allocate.
    pub(crate) poison_outputs: bool,
    /// The last dispatch or combine launched (names a ring failure's channel).
    last_ring_call: Mutex<LastRingCall>,
    /// The low-latency barriers this rank entered (`ll_barrier`'s target).
    pub(crate) ll_barriers: AtomicU64,
}
// ANCHOR_END: buffer

impl<W: Deref<Target = World>> NvshmemBuffer<W> {
    /// Collective: every PE makes its buffer with the same options, at the same point.
    pub fn new(world: W, options: BufferOptions) -> Result<Self, BufferError> {
        let node_pes = node_pes_from_env(&world)?;
        options.check_nodes(world.n_pes(), node_pes)?;
        let notify_area = options_need_notify_area(&options, world.n_pes(), node_pes)
            .then(|| NotifyArea::new(world.n_pes() / node_pes, node_pes));
        let regions = Regions {
            num_nvl_bytes: options.num_nvl_bytes,
            num_rdma_bytes: options.num_rdma_bytes,
            notify_area_bytes: notify_area.map_or(0, |area| area.bytes()),
        };
        // The internode notify's module only where it can run: a buffer on one node loads what
        // it always did.
        let mut modules = MODULES.to_vec();
        if notify_area.is_some() {
            modules.extend(INTERNODE_MODULES);
        }
        let kernels = Kernels::load(&world, &modules)?;
        let num_sms = kernels.num_sms();
        if options.low_latency_mode && num_sms as usize > MAX_LL_BLOCKS {
            return Err(BufferError::invalid(
                "Buffer",
                format!(
                    "this GPU has {num_sms} SMs, and low-latency mode keeps one call count per SM \
                     for at most {MAX_LL_BLOCKS}: raise MAX_LL_BLOCKS in kernels/contract/defs.rs"
                ),
            ));
        }
        let stream = world.stream().clone();
        let progress = stream
            .alloc_zeros::<u64>(PROGRESS_WORDS)
            .map_err(BufferError::cuda("allocating ring state"))?;
        let input_claim = stream
            .alloc_zeros::<u64>(1)
            .map_err(BufferError::cuda("allocating the input-error claim"))?;
        let ll_state = stream
            .alloc_zeros::<u64>(LL_STATE_WORDS)
            .map_err(BufferError::cuda("allocating the low-latency state"))?;
        let internode_state = match notify_area {
            Some(_) => Some(
                stream
                    .alloc_zeros::<u64>(INTERNODE_STATE_WORDS)
                    .map_err(BufferError::cuda("allocating the internode notify's state"))?,
            ),
            None => None,
        };
        let started = world
            .context()
            .new_event(None)
            .map_err(BufferError::cuda("creating the notify step's event"))?;
        let input_error = HostMapped::new(kernels::contract::INPUT_ERROR_WORDS)?;
        let config = CollectivesConfig {
            timeout_ms: options.timeout_ms,
            extra_bytes: regions.total(),
            ..CollectivesConfig::default()
        };
        // The communicator spans this rank's node: its offsets are the only peer pointers the
        // buffer holds (nvshmem_ptr is asked about nobody else), so no kernel can store to a
        // rank of another node, even on virtual nodes where one would work.
        let (my_pe, n_pes) = (world.my_pe(), world.n_pes());
        let comm = Communicator::with_members(world, node_members(my_pe, node_pes), config)?;
        let (base, _) = comm.extra_region();
        let spec = BufferSpec {
            my_pe,
            n_pes,
            node_pes,
            options,
            num_sms,
            base,
            progress: progress.device_ptr(&stream).0,
            ll_state: ll_state.device_ptr(&stream).0,
            internode_state: internode_state
                .as_ref()
                .map_or(0, |state| state.device_ptr(&stream).0),
            input_error: InputError {
                claim: input_claim.device_ptr(&stream).0,
                words: input_error.device_ptr(),
            },
        };
        Ok(Self {
            comm,
            kernels,
            spec,
            _progress: progress,
            counts: HostMapped::new(COUNT_WORDS)?,
            started,
            input_error,
            input_claim,
            _ll_state: ll_state,
            _internode_state: internode_state,
            ll_receive_pending: Default::default(),
            rdma_user: Default::default(),
            poison_outputs: false,
            last_ring_call: Default::default(),
            ll_barriers: AtomicU64::new(0),
        })
    }

    pub fn world(&self) -> &World {
        self.comm.world()
    }
    pub fn options(&self) -> &BufferOptions {
        &self.spec.options
    }
    /// What the plans know of this buffer (`plan_dispatch` and the rest take it).
    pub fn spec(&self) -> &BufferSpec {
        &self.spec
    }
    /// The chapter-4 communicator the buffer is built on (its notify step uses all-gather).
    pub fn communicator(&self) -> &Communicator<W> {
        &self.comm
    }

    /// This PE's normal-mode region (`rdma = false`) or low-latency region: (address, bytes).
    /// What DeepEP's `get_local_buffer_tensor` views.
    pub fn local_region(&self, rdma: bool) -> (u64, usize) {
        self.spec.local_region(rdma)
    }

    /// `Err` if a kernel of this buffer failed (the buffer is unusable then), or if one found
    /// bad input (raised once; the buffer stays usable). Cheap: reads host-mapped memory, never
    /// waits for the GPU, so it sees what finished kernels recorded: synchronise the call's
    /// stream first to see that call's.
    pub fn check(&self) -> Result<(), BufferError> {
        let last = *self
            .last_ring_call
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let node_pes = self.spec.node_pes;
        self.comm.check().map_err(|e| describe(e, last, node_pes))?;
        let words: [u64; 4] = self.input_error.snapshot();
        if words[0] == 0 {
            return Ok(());
        }
        // Clear after the report: the claim word first (device), then the record.
        self.clear_input_error()?;
        Err(BufferError::from_input_record(words))
    }

    fn clear_input_error(&self) -> Result<(), BufferError> {
        let stream = self.world().stream();
        let (claim, _) = self.input_claim.device_ptr(stream);
        // SAFETY: one u64 of device memory; the stream orders it before the next kernel.
        unsafe {
            self.memset_zero(
                claim,
                8,
                stream.cu_stream(),
                "clearing the input-error claim",
            )
        }?;
        stream
            .synchronize()
            .map_err(BufferError::cuda("synchronising"))?;
        for i in 0..4 {
            self.input_error.write(i, 0);
        }
        Ok(())
    }

    /// Zeroes `bytes` of device memory at `ptr` on `stream`.
    ///
    /// # Safety
    /// `ptr..ptr + bytes` must be device memory of this context, `stream` one of its streams.
    pub(crate) unsafe fn memset_zero(
        &self,
        ptr: u64,
        bytes: usize,
        stream: sys::CUstream,
        what: &'static str,
    ) -> Result<(), BufferError> {
        // SAFETY: forwarded to the caller.
        unsafe { cudarc::driver::result::memset_d8_async(ptr, 0, bytes, stream) }
            .map_err(BufferError::cuda(what))
    }

    /// Records the notify step's start marker on `stream`.
    ///
    /// # Safety
    /// `stream` must be a live stream of this buffer's context.
    pub(crate) unsafe fn mark_started(&self, stream: sys::CUstream) -> Result<(), BufferError> {
        // SAFETY: our event; the caller vouches for the stream.
        unsafe { cudarc::driver::result::event::record(self.started.cu_event(), stream) }
            .map_err(BufferError::cuda("recording the notify step's event"))
    }

    /// Whether the work before the last `mark_started` has run.
    pub(crate) fn has_started(&self) -> Result<bool, BufferError> {
        self.started
            .try_is_complete()
            .map_err(BufferError::cuda("querying the notify step's event"))
    }

    pub(crate) fn workspace(&self) -> Workspace {
        self.comm.workspace()
    }

    /// Launches a buffer kernel, its residency checked first or not as `blocks` says.
    ///
    /// # Safety
    /// `args` must be the kernel's parameters, in order, pointing at live values; every
    /// device address in them must be checked (a plan) and `stream` a live stream of this
    /// buffer's context. With `Blocks::Independent` the kernel's blocks must never wait for
    /// each other or for a peer.
    pub(crate) unsafe fn launch(
        &self,
        spec: LaunchSpec,
        blocks: Blocks,
        stream: sys::CUstream,
        args: &mut [*mut c_void],
    ) -> Result<(), BufferError> {
        self.bind()?;
        // SAFETY: forwarded to the caller.
        Ok(unsafe {
            match blocks {
                Blocks::MayWait => self.kernels.launch(&spec, stream, args),
                Blocks::Independent => self.kernels.launch_independent(&spec, stream, args),
            }
        }?)
    }

    /// A kernel whose parameters are the communicator's workspace and one argument struct, and
    /// whose blocks wait for each other or for peers (so all must be resident).
    ///
    /// # Safety
    /// As `launch`: `args` is the kernel's checked argument struct.
    pub(crate) unsafe fn launch_resident<A>(
        &self,
        spec: LaunchSpec,
        args: &A,
        stream: sys::CUstream,
    ) -> Result<(), BufferError> {
        let ws = self.workspace();
        // SAFETY: forwarded to the caller.
        unsafe { self.launch(spec, Blocks::MayWait, stream, &mut [arg(&ws), arg(args)]) }
    }

    /// Makes the buffer's context current on this thread (a launch needs it).
    fn bind(&self) -> Result<(), BufferError> {
        self.world()
            .context()
            .bind_to_thread()
            .map_err(BufferError::cuda("binding the context"))
    }

    /// A dispatch or combine kernel: two blocks per channel (a sender and a receiver), the
    /// communicator's workspace and the kernel's argument struct.
    ///
    /// # Safety
    /// As `launch`: `args` is the kernel's checked argument struct.
    pub(crate) unsafe fn launch_channels<A>(
        &self,
        kernel: &'static str,
        channels: usize,
        args: &A,
        stream: sys::CUstream,
    ) -> Result<(), BufferError> {
        let num_blocks = 2 * channels as u32;
        let spec = LaunchSpec {
            kernel,
            num_blocks,
            threads_per_block: self.channel_threads(kernel, num_blocks)?,
            shared_mem_bytes: 0,
        };
        let ws = self.workspace();
        let op = if kernel == "moe_scatter" {
            "dispatch"
        } else {
            "combine"
        };
        *self
            .last_ring_call
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = LastRingCall {
            op,
            num_channels: channels,
        };
        // SAFETY: forwarded to the caller.
        unsafe { self.launch(spec, Blocks::MayWait, stream, &mut [arg(&ws), arg(args)]) }
    }

    /// Threads per block of a dispatch or combine grid of `num_blocks`: `CHANNEL_THREADS`,
    /// or half as many (down to one warp per PE, which the kernels need) while this PE's SMs
    /// cannot hold the grid. Only a PE with a small share of a GPU that several PEs share
    /// gets fewer: its blocks then fit two or four to an SM.
    fn channel_threads(&self, kernel: &'static str, num_blocks: u32) -> Result<u32, BufferError> {
        let min_threads = 32 * self.world().n_pes() as u32;
        let mut threads = CHANNEL_THREADS;
        while threads / 2 >= min_threads
            && self.kernels.max_co_resident(kernel, threads, 0)? < num_blocks
        {
            threads /= 2;
        }
        Ok(threads)
    }

    /// The largest `Config::num_sms` whose dispatch and combine grids this PE can launch (an
    /// even number): the GPU's SMs with one PE per GPU, far fewer for a PE that shares its GPU
    /// with others.
    pub fn max_num_sms(&self) -> Result<u32, BufferError> {
        let mut max = 2 * MAX_CHANNELS as u32;
        for kernel in ["moe_scatter", "moe_gather"] {
            let threads = self.channel_threads(kernel, max)?;
            max = max.min(self.kernels.max_co_resident(kernel, threads, 0)?);
        }
        Ok(max & !1)
    }
}

/// A kernel argument: a pointer to the value, as cuLaunchKernel takes them.
pub(crate) fn arg<T>(value: &T) -> *mut c_void {
    value as *const T as *mut c_void
}
