//! Device code for every chapter, compiled at build time and embedded in this crate.
//!
//! `build.rs` turns each `cuda/<module>.cu` into one cubin per architecture in
//! `KERNEL_ARCHS`; [`CUBINS`] lists them. [`NvshmemModule::load`] picks the cubin that matches
//! the GPU, loads it into a CUDA context and runs `nvshmemx_cumodule_init` on it: without that
//! call the module's copy of NVSHMEM's device state stays empty and every device-side
//! NVSHMEM call in it fails.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, DriverError, sys};
use nvshmem_sys::Nvshmem;

/// One embedded cubin.
#[derive(Debug, Clone, Copy)]
pub struct Cubin {
    /// File stem of the source: `cuda/<module>.cu`.
    pub module: &'static str,
    /// Target architecture, e.g. `sm_90`.
    pub arch: &'static str,
    /// `extern "C" __global__` kernels defined in the source, in order.
    pub kernels: &'static [&'static str],
    pub bytes: &'static [u8],
}

include!(concat!(env!("OUT_DIR"), "/cubins.rs"));

/// Why a module could not be loaded or a kernel found.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("no kernel module `{0}` is embedded (modules: {1})")]
    UnknownModule(String, String),
    #[error(
        "module `{module}` was built for {built:?} but this GPU is {device}; rebuild with \
         KERNEL_ARCHS={device} cargo build --release"
    )]
    NoCubinForArch {
        module: String,
        device: String,
        built: Vec<&'static str>,
    },
    #[error("CUDA driver error while {what}: {source}")]
    Driver {
        what: String,
        #[source]
        source: DriverError,
    },
    #[error(
        "nvshmemx_cumodule_init failed with status {0} for module `{1}` (is NVSHMEM initialised \
         on this context, and does the host library match the device library {NVSHMEM_DEVICE_VERSION}?)"
    )]
    CumoduleInit(i32, String),
}

impl KernelError {
    fn driver(what: impl Into<String>) -> impl FnOnce(DriverError) -> Self {
        let what = what.into();
        move |source| Self::Driver { what, source }
    }
}

/// Host mirror of `pattern_word` in `cuda/common.cuh`: word `index` sent by `source_pe` in a
/// run seeded with `seed`. Test data made of these shows where it came from.
pub fn pattern_word(source_pe: usize, index: u64, seed: u32) -> u32 {
    let mut x = (index as u32).wrapping_mul(0x9E37_79B1)
        ^ (source_pe as u32).wrapping_add(1).wrapping_mul(0x85EB_CA77);
    x ^= seed;
    x ^= x >> 15;
    x.wrapping_mul(0x2C1B_3C6D)
}

/// The cubin of `module` for `arch`, if it was built.
pub fn cubin(module: &str, arch: &str) -> Result<&'static [u8], KernelError> {
    let candidates: Vec<&Cubin> = CUBINS.iter().filter(|c| c.module == module).collect();
    if candidates.is_empty() {
        let mut names: Vec<&str> = CUBINS.iter().map(|c| c.module).collect();
        names.dedup();
        return Err(KernelError::UnknownModule(module.into(), names.join(", ")));
    }
    candidates
        .iter()
        .find(|c| c.arch == arch)
        .map(|c| c.bytes)
        .ok_or_else(|| KernelError::NoCubinForArch {
            module: module.into(),
            device: arch.into(),
            built: candidates.iter().map(|c| c.arch).collect(),
        })
}

/// `sm_<major><minor>` of the context's device.
pub fn device_arch(ctx: &CudaContext) -> Result<String, KernelError> {
    let (major, minor) = ctx
        .compute_capability()
        .map_err(KernelError::driver("reading the compute capability"))?;
    Ok(format!("sm_{major}{minor}"))
}

// ANCHOR: module
/// A loaded module whose NVSHMEM device state is initialised. Finalises that state on drop.
pub struct NvshmemModule {
    name: &'static str,
    module: Arc<CudaModule>,
    cu_module: sys::CUmodule,
    nvshmem: &'static Nvshmem,
}

impl NvshmemModule {
    /// Loads `cuda/<name>.cu`'s cubin for the context's GPU and registers it with NVSHMEM.
    /// NVSHMEM must already be initialised on `ctx` (chapter 1's `World`).
    pub fn load(
        ctx: &Arc<CudaContext>,
        nvshmem: &'static Nvshmem,
        name: &'static str,
    ) -> Result<Self, KernelError> {
        let bytes = cubin(name, &device_arch(ctx)?)?;
        let module = ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(bytes.to_vec()))
            .map_err(KernelError::driver(format!("loading module `{name}`")))?;
        // cudarc keeps the CUmodule private; any function of the module leads back to it.
        let cu_module = module_handle(&module, name)?;
        // SAFETY: `cu_module` is a live module of the current context.
        let status = unsafe { (nvshmem.cumodule_init)(cu_module as _) };
        if status != 0 {
            return Err(KernelError::CumoduleInit(status, name.into()));
        }
        Ok(Self {
            name,
            module,
            cu_module,
            nvshmem,
        })
    }

    /// A kernel of this module by its `extern "C"` name.
    pub fn function(&self, kernel: &str) -> Result<CudaFunction, KernelError> {
        self.module
            .load_function(kernel)
            .map_err(KernelError::driver(format!(
                "looking up kernel `{kernel}` in module `{}`",
                self.name
            )))
    }

    pub fn name(&self) -> &'static str {
        self.name
    }
}
// ANCHOR_END: module

impl Drop for NvshmemModule {
    fn drop(&mut self) {
        // SAFETY: the module was registered in `load` and is still loaded (we hold the Arc).
        unsafe { (self.nvshmem.cumodule_finalize)(self.cu_module as _) };
    }
}

/// cudarc keeps the `CUmodule` private; `cuFuncGetModule` on any kernel of the module leads
/// back to it (build.rs records each module's kernel names).
fn module_handle(module: &Arc<CudaModule>, name: &str) -> Result<sys::CUmodule, KernelError> {
    let kernel = CUBINS
        .iter()
        .find(|c| c.module == name)
        .and_then(|c| c.kernels.first())
        .ok_or_else(|| KernelError::UnknownModule(name.into(), "(module has no kernels)".into()))?;
    let function = module
        .load_function(kernel)
        .map_err(KernelError::driver(format!("looking up kernel `{kernel}`")))?;
    let mut cu_module: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: `function` is a live function of a loaded module.
    unsafe { sys::cuFuncGetModule(&mut cu_module, function.cu_function()) }
        .result()
        .map_err(KernelError::driver("cuFuncGetModule"))?;
    Ok(cu_module)
}
