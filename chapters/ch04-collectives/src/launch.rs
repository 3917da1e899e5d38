//! Loading kernel modules and launching kernels whose blocks wait for each other's peers:
//! every block must be resident at once, or a block spinning on a flag can keep the block
//! that would raise it from ever starting. Used by this chapter's collectives and by the
//! buffer of chapter 7.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

use ch01_bootstrap::World;
use cudarc::driver::{CudaFunction, sys};

use crate::algorithm::Plan;
use crate::error::CollError;

/// One launch: a kernel by name, its grid and block, its dynamic shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchSpec {
    pub kernel: &'static str,
    pub num_blocks: u32,
    pub threads_per_block: u32,
    pub shared_mem_bytes: u32,
}

impl From<&Plan> for LaunchSpec {
    fn from(plan: &Plan) -> Self {
        Self {
            kernel: plan.kernel,
            num_blocks: plan.num_blocks,
            threads_per_block: plan.threads_per_block,
            shared_mem_bytes: 0,
        }
    }
}

struct Kernel {
    function: CudaFunction,
    /// Blocks of (threads, shared bytes) one SM holds, measured once per shape.
    per_sm: std::sync::Mutex<HashMap<(u32, u32), u32>>,
}

/// Kernel modules (`kernels/cuda/...`), loaded and registered with NVSHMEM; their kernels by
/// the name the driver knows them by.
pub struct Kernels {
    by_name: HashMap<&'static str, Kernel>,
    num_sms: u32,
    _modules: Vec<Arc<kernels::NvshmemModule>>,
}

impl Kernels {
    pub fn load(world: &World, modules: &[&'static str]) -> Result<Self, CollError> {
        let num_sms = world.num_sms();
        let mut by_name = HashMap::new();
        let mut loaded = Vec::new();
        for &name in modules {
            let module = world.load_module(name)?;
            let cubin = kernels::CUBINS
                .iter()
                .find(|c| c.module == name)
                .ok_or_else(|| kernels::KernelError::UnknownModule(name.into(), String::new()))?;
            for &kernel in cubin.kernels {
                let function = module.function(kernel)?;
                by_name.insert(
                    kernel,
                    Kernel {
                        function,
                        per_sm: Default::default(),
                    },
                );
            }
            loaded.push(module);
        }
        Ok(Self {
            by_name,
            num_sms,
            _modules: loaded,
        })
    }

    /// The SMs this PE's kernels may fill (`World::num_sms`: the GPU's, or this PE's share of
    /// it when several PEs share the GPU). Grids are sized from it.
    pub fn num_sms(&self) -> u32 {
        self.num_sms
    }

    /// The most blocks of `threads` threads and `shared_mem_bytes` of `kernel` that can be
    /// resident at once on this PE's SMs: blocks per SM (the occupancy query, measured once
    /// per shape: it costs microseconds, a launch should not) times `num_sms()`.
    pub fn max_co_resident(
        &self,
        kernel: &'static str,
        threads: u32,
        shared_mem_bytes: u32,
    ) -> Result<u32, CollError> {
        let kernel = self.kernel(kernel)?;
        let shape = (threads, shared_mem_bytes);
        let mut cache = kernel.per_sm.lock().unwrap_or_else(|p| p.into_inner());
        let per_sm = match cache.get(&shape) {
            Some(&per_sm) => per_sm,
            None => {
                let per_sm = kernel
                    .function
                    .occupancy_max_active_blocks_per_multiprocessor(
                        threads,
                        shared_mem_bytes as usize,
                        None,
                    )
                    .map_err(CollError::cuda("reading a kernel's occupancy"))?;
                *cache.entry(shape).or_insert(per_sm)
            }
        };
        Ok(per_sm * self.num_sms)
    }

    fn kernel(&self, name: &'static str) -> Result<&Kernel, CollError> {
        let names = || self.by_name.keys().copied().collect::<Vec<_>>().join(", ");
        Ok(self
            .by_name
            .get(name)
            .ok_or_else(|| kernels::KernelError::UnknownModule(name.into(), names()))?)
    }

    // ANCHOR: launch
    /// Launches `spec` on `stream`. Every block may wait for a peer's block, so all of them
    /// must be resident at once: a cooperative launch guarantees it (and fails instead of
    /// hanging when the grid is too large). Inside a stream capture, which may not take
    /// cooperative launches, the occupancy check stands in for that guarantee. The check
    /// counts this PE's share of the SMs, not the GPU's: that is what leaves room for the
    /// blocks of the other PEs on a shared GPU.
    ///
    /// # Safety
    /// `args` must match the kernel's parameters and stay alive for the call.
    pub unsafe fn launch(
        &self,
        spec: &LaunchSpec,
        stream: sys::CUstream,
        args: &mut [*mut c_void],
    ) -> Result<(), CollError> {
        let kernel = self.kernel(spec.kernel)?;
        let max =
            self.max_co_resident(spec.kernel, spec.threads_per_block, spec.shared_mem_bytes)?;
        if spec.num_blocks > max {
            return Err(CollError::NotCoResident {
                kernel: spec.kernel,
                grid: spec.num_blocks,
                max,
                num_sms: self.num_sms,
            });
        }
        let (grid, block) = ((spec.num_blocks, 1, 1), (spec.threads_per_block, 1, 1));
        let f = kernel.function.cu_function();
        if spec.shared_mem_bytes > 48 << 10 {
            kernel
                .function
                .set_attribute(
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    spec.shared_mem_bytes as i32,
                )
                .map_err(CollError::cuda("allowing a kernel more shared memory"))?;
        }
        use cudarc::driver::result::{
            launch_cooperative_kernel, launch_kernel, stream::is_capturing,
        };
        // SAFETY: a live stream of this context.
        let capturing = unsafe { is_capturing(stream) }
            .map_err(CollError::cuda("querying stream capture"))?
            != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let smem = spec.shared_mem_bytes;
        // SAFETY: the caller vouches for `args`; the grid fits the GPU (checked above).
        unsafe {
            if capturing {
                launch_kernel(f, grid, block, smem, stream, args)
            } else {
                launch_cooperative_kernel(f, grid, block, smem, stream, args)
            }
        }
        .map_err(CollError::cuda("launching a kernel"))
    }
    // ANCHOR_END: launch

    /// Launches `spec` on `stream` as an ordinary kernel: for kernels whose blocks never wait
    /// for another block (a count, a prefix sum), which need no residency check and may run
    /// a few blocks at a time on a PE's small share of a shared GPU.
    ///
    /// # Safety
    /// As [`Self::launch`]; the kernel's blocks must not wait for each other or for a peer's.
    pub unsafe fn launch_independent(
        &self,
        spec: &LaunchSpec,
        stream: sys::CUstream,
        args: &mut [*mut c_void],
    ) -> Result<(), CollError> {
        let f = self.kernel(spec.kernel)?.function.cu_function();
        let (grid, block) = ((spec.num_blocks, 1, 1), (spec.threads_per_block, 1, 1));
        let smem = spec.shared_mem_bytes;
        // SAFETY: the caller vouches for `args` and for the kernel's blocks.
        unsafe { cudarc::driver::result::launch_kernel(f, grid, block, smem, stream, args) }
            .map_err(CollError::cuda("launching a kernel"))
    }
}
