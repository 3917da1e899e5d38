//! `NvshmemBuffer`: one symmetric allocation (a chapter-4 communicator plus the buffer's
//! regions, src/layout.rs), the kernels of kernels/cuda/buffer, and the small local state the
//! rings need. Dispatch and combine are in their own modules; this one makes and checks.

use std::ffi::c_void;
use std::ops::Deref;

use ch01_bootstrap::World;
use ch04_collectives::{
    CollectivesConfig, Communicator, HostMapped, Kernels, LaunchSpec, Workspace,
};
use cudarc::driver::{CudaSlice, DevicePtr, sys};

use crate::config::{DEFAULT_TIMEOUT_MS, MAX_CHANNELS};
use crate::error::{BufferError, describe};
use crate::layout::Regions;
use ch04_collectives::config::MAX_PES;
use kernels::contract::{Failure, InputError};

const MODULES: [&str; 5] = [
    "buffer/layout",
    "buffer/notify",
    "buffer/intranode",
    "buffer/ll_dispatch",
    "buffer/ll_combine",
];
/// Words of the notify step's host-mapped counts: [0] tokens to receive (i32), then one i32
/// per local expert.
const COUNT_WORDS: usize = 1 + crate::config::MAX_EXPERTS / 2;

/// How a buffer is made (DeepEP's constructor arguments that matter inside one node).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferOptions {
    /// Bytes of the rings of normal mode (a multiple of 128).
    pub num_nvl_bytes: usize,
    /// Bytes of the low-latency region (low-latency mode only).
    pub num_rdma_bytes: usize,
    pub low_latency_mode: bool,
    /// Bound on every wait, device and host, in milliseconds.
    pub timeout_ms: u64,
}

impl BufferOptions {
    pub fn normal(num_nvl_bytes: usize) -> Self {
        Self {
            num_nvl_bytes,
            num_rdma_bytes: 0,
            low_latency_mode: false,
            timeout_ms: DEFAULT_TIMEOUT_MS,
        }
    }

    /// DeepEP's checks on the sizes, and ours on the mode.
    pub fn check(&self, n_pes: usize) -> Result<(), BufferError> {
        let invalid = |m: String| Err(BufferError::invalid("Buffer", m));
        if !self.num_nvl_bytes.is_multiple_of(128) || !self.num_rdma_bytes.is_multiple_of(128) {
            return invalid(format!(
                "num_nvl_bytes ({}) and num_rdma_bytes ({}) must be multiples of 128",
                self.num_nvl_bytes, self.num_rdma_bytes
            ));
        }
        if self.num_rdma_bytes > 0 && !self.low_latency_mode {
            return invalid(
                "num_rdma_bytes > 0 outside low-latency mode asks for inter-node normal mode, \
                 which this buffer does not have: pass num_rdma_bytes=0, or low_latency_mode=True"
                    .into(),
            );
        }
        if n_pes > MAX_PES {
            return invalid(format!(
                "{n_pes} ranks: this buffer runs up to {MAX_PES} ranks of one node"
            ));
        }
        Ok(())
    }
}

/// Symmetric heap bytes one buffer takes on `n_pes` PEs: the communicator's own, then the
/// buffer's regions (src/layout.rs).
pub fn heap_bytes(n_pes: usize, num_nvl_bytes: usize, num_rdma_bytes: usize) -> usize {
    let regions = Regions {
        num_nvl_bytes,
        num_rdma_bytes,
    };
    ch04_collectives::workspace::symmetric_bytes(n_pes, CollectivesConfig::default().ll_max_bytes)
        + regions.total()
}

/// The ring counters each PE keeps to itself (moe.cuh NOTES): tokens pushed and consumed per
/// (channel, peer), for dispatch and for combine.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Progress {
    DispatchSent = 0,
    DispatchReceived = 1,
    CombineSent = 2,
    CombineReceived = 3,
}

// ANCHOR: buffer
pub struct NvshmemBuffer<W: Deref<Target = World>> {
    pub(crate) comm: Communicator<W>,
    pub(crate) kernels: Kernels,
    pub(crate) options: BufferOptions,
    /// Device address of the buffer's regions (after the communicator's own).
    pub(crate) base: u64,
    /// Local device [4][MAX_CHANNELS][MAX_PES] u64, indexed by `Progress`.
    progress: CudaSlice<u64>,
    /// The notify step's counts (host-mapped i32, see COUNT_WORDS).
    pub(crate) counts: HostMapped,
    /// Bad input found on the device: [kind, token, value, limit] (host-mapped) and its claim.
    pub(crate) input_error: HostMapped,
    input_claim: CudaSlice<u64>,
    /// Low-latency mode's per-rank state (call count, finish counters, slot counters; see
    /// `LlState` in kernels/cuda/buffer/low_latency.cuh).
    pub(crate) ll_state: CudaSlice<u64>,
    /// A low-latency send phase whose receive (the hook) has not run yet: one call in flight.
    pub(crate) ll_receive_pending: std::sync::Mutex<Option<crate::low_latency::PendingReceive>>,
}
// ANCHOR_END: buffer

impl<W: Deref<Target = World>> NvshmemBuffer<W> {
    /// Collective: every PE makes its buffer with the same options, at the same point.
    pub fn new(world: W, options: BufferOptions) -> Result<Self, BufferError> {
        options.check(world.n_pes())?;
        let regions = Regions {
            num_nvl_bytes: options.num_nvl_bytes,
            num_rdma_bytes: options.num_rdma_bytes,
        };
        let kernels = Kernels::load(&world, &MODULES)?;
        let num_sms = kernels.num_sms() as usize;
        if options.low_latency_mode && num_sms > kernels::contract::MAX_LL_BLOCKS {
            return Err(BufferError::invalid(
                "Buffer",
                format!(
                    "this GPU has {num_sms} SMs, and low-latency mode keeps one call count per SM \
                     for at most {}: raise MAX_LL_BLOCKS in kernels/contract/defs.rs \
                     (kernels/cuda/buffer/low_latency.cuh) together",
                    kernels::contract::MAX_LL_BLOCKS
                ),
            ));
        }
        let stream = world.stream().clone();
        let cuda = |what| {
            move |e| BufferError::from(ch04_collectives::CollError::Cuda { what, source: e })
        };
        let progress = stream
            .alloc_zeros::<u64>(4 * MAX_CHANNELS * MAX_PES)
            .map_err(cuda("allocating ring state"))?;
        let input_claim = stream
            .alloc_zeros::<u64>(1)
            .map_err(cuda("allocating the input-error claim"))?;
        let ll_state = stream
            .alloc_zeros::<u64>(crate::low_latency::STATE_WORDS)
            .map_err(cuda("allocating the low-latency state"))?;
        let config = CollectivesConfig {
            timeout_ms: options.timeout_ms,
            extra_bytes: regions.total(),
            ..CollectivesConfig::default()
        };
        let comm = Communicator::new(world, config)?;
        let (base, _) = comm.extra_region();
        Ok(Self {
            comm,
            kernels,
            options,
            base,
            progress,
            counts: HostMapped::new(COUNT_WORDS)?,
            input_error: HostMapped::new(4)?,
            input_claim,
            ll_state,
            ll_receive_pending: Default::default(),
        })
    }

    pub fn world(&self) -> &World {
        self.comm.world()
    }
    pub fn options(&self) -> &BufferOptions {
        &self.options
    }
    /// The chapter-4 communicator the buffer is built on (its notify step uses all-gather).
    pub fn communicator(&self) -> &Communicator<W> {
        &self.comm
    }

    /// This PE's normal-mode region (`rdma = false`) or low-latency region: (address, bytes).
    /// What DeepEP's `get_local_buffer_tensor` views.
    pub fn local_region(&self, rdma: bool) -> (u64, usize) {
        let regions = Regions {
            num_nvl_bytes: self.options.num_nvl_bytes,
            num_rdma_bytes: self.options.num_rdma_bytes,
        };
        if rdma {
            (
                self.base + regions.rdma() as u64,
                self.options.num_rdma_bytes,
            )
        } else {
            (
                self.base + Regions::nvl() as u64,
                self.options.num_nvl_bytes,
            )
        }
    }

    /// `Err` if a kernel of this buffer failed (the buffer is unusable then), or if one found
    /// bad input (raised once; the buffer stays usable). Cheap: reads host-mapped memory.
    pub fn check(&self) -> Result<(), BufferError> {
        self.comm.check().map_err(describe)?;
        let [kind, token, value, limit]: [u64; 4] = self.input_error.snapshot();
        if kind == 0 {
            return Ok(());
        }
        // Clear after the report: the claim word first (device), then the record.
        self.clear_input_error()?;
        Err(match Failure::from_code(kind) {
            Ok(Failure::BadHandle) => BufferError::BadHandle {
                row: token,
                token: value as i32 as i64,
                max_tokens: limit,
            },
            Ok(Failure::SlotsFull) => BufferError::SlotsFull {
                token,
                expert: value,
                max_tokens: limit,
            },
            Ok(Failure::BadExpert) => BufferError::BadExpert {
                token,
                value: value as i64,
                num_experts: limit,
            },
            Ok(other) => BufferError::invalid(
                "input",
                format!(
                    "the kernels recorded {} ({}) as bad input",
                    other.meaning(),
                    other.device_name()
                ),
            ),
            Err(code) => BufferError::invalid(
                "input",
                format!(
                    "the input-error record holds kind {code}, which this build does not know: \
                     were the kernels built from another kernels/contract/defs.rs?"
                ),
            ),
        })
    }

    fn clear_input_error(&self) -> Result<(), BufferError> {
        let stream = self.world().stream();
        let (claim, _) = self.input_claim.device_ptr(stream);
        // SAFETY: one u64 of device memory; the stream orders it before the next kernel.
        unsafe { cudarc::driver::result::memset_d8_async(claim, 0, 8, stream.cu_stream()) }
            .map_err(|e| {
                BufferError::from(ch04_collectives::CollError::Cuda {
                    what: "clearing the input-error claim",
                    source: e,
                })
            })?;
        stream.synchronize().map_err(|e| {
            BufferError::from(ch04_collectives::CollError::Cuda {
                what: "synchronising",
                source: e,
            })
        })?;
        for i in 0..4 {
            self.input_error.write(i, 0);
        }
        Ok(())
    }

    /// Where the kernels record bad input (the contract's `InputError`).
    pub(crate) fn input_error_args(&self) -> InputError {
        let (claim, _) = self.input_claim.device_ptr(self.world().stream());
        InputError {
            claim,
            words: self.input_error.device_ptr(),
        }
    }

    /// Device address of one (channel, peer) progress array.
    pub(crate) fn progress(&self, which: Progress) -> u64 {
        let (ptr, _) = self.progress.device_ptr(self.world().stream());
        ptr + (which as usize * MAX_CHANNELS * MAX_PES * 8) as u64
    }

    /// Device address of one symmetric counter array (layout.rs: Regions::counters).
    pub(crate) fn counters(&self, which: usize) -> u64 {
        self.base + Regions::counters(which) as u64
    }

    pub(crate) fn workspace(&self) -> Workspace {
        self.comm.workspace()
    }

    /// Launches a buffer kernel. Its blocks may wait for peers: see `Kernels::launch`.
    pub(crate) fn launch(
        &self,
        spec: LaunchSpec,
        stream: sys::CUstream,
        args: &mut [*mut c_void],
    ) -> Result<(), BufferError> {
        self.world().context().bind_to_thread().map_err(|e| {
            BufferError::from(ch04_collectives::CollError::Cuda {
                what: "binding the context",
                source: e,
            })
        })?;
        // SAFETY: every caller passes the kernel's parameters in order (see each call site).
        Ok(unsafe { self.kernels.launch(&spec, stream, args) }?)
    }
}

impl<W: Deref<Target = World>> NvshmemBuffer<W> {
    /// `Err` naming the bytes to ask for unless the rings of a call fit in num_nvl_bytes:
    /// channels x ranks x ring_tokens slots of slot_bytes (layout.rs).
    pub(crate) fn check_rings_fit(
        &self,
        what: &'static str,
        channels: usize,
        ring_tokens: usize,
        slot_bytes: usize,
    ) -> Result<(), BufferError> {
        let n = self.world().n_pes();
        let needed = crate::layout::ring_bytes(channels, n, ring_tokens, slot_bytes);
        if needed > self.options.num_nvl_bytes {
            return Err(BufferError::BufferTooSmall {
                what,
                needed,
                have: self.options.num_nvl_bytes,
                rings: format!(
                    "{channels} channels x {n} ranks x {ring_tokens} slots x {slot_bytes} bytes"
                ),
            });
        }
        Ok(())
    }

    /// A dispatch or combine kernel: two blocks per channel (a sender and a receiver), the
    /// communicator's workspace and the kernel's argument struct.
    pub(crate) fn launch_channels<A>(
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
        self.launch(spec, stream, &mut [arg(&ws), arg(args)])
    }

    /// Threads per block of a dispatch or combine grid of `num_blocks`: `CHANNEL_THREADS`,
    /// or half as many (down to one warp per PE, which the kernels need) while this PE's SMs
    /// cannot hold the grid. Only a PE with a small share of a GPU that several PEs share
    /// gets fewer: its blocks then fit two or four to an SM.
    fn channel_threads(&self, kernel: &'static str, num_blocks: u32) -> Result<u32, BufferError> {
        let min_threads = 32 * self.world().n_pes() as u32;
        let mut threads = crate::config::CHANNEL_THREADS;
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
        let mut max = 2 * crate::config::MAX_CHANNELS as u32;
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
