//! Device code for every chapter, compiled at build time and embedded in this crate.
//!
//! `build.rs` turns each `cuda/<module>.cu` (subfolders included: `cuda/buffer/dispatch.cu` is
//! module `buffer/dispatch`) into one cubin per architecture in `KERNEL_ARCHS`; [`CUBINS`]
//! lists them with the kernels each defines. [`NvshmemModule::load`] picks the cubin that matches
//! the GPU, loads it into a CUDA context and runs `nvshmemx_cumodule_init` on it: without that
//! call the module's copy of NVSHMEM's device state stays empty and every device-side
//! NVSHMEM call in it fails.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, DriverError, sys};
use nvshmem_sys::Nvshmem;

/// One embedded cubin.
#[derive(Debug, Clone, Copy)]
pub struct Cubin {
    /// The source's path under `cuda/` without `.cu`: `ring`, `buffer/dispatch`.
    pub module: &'static str,
    /// Target architecture, e.g. `sm_90`.
    pub arch: &'static str,
    /// The kernels the cubin defines, by the symbol the driver looks them up by: `extern "C"`
    /// kernels by their source name, C++ kernels by their mangled name ([`kernel_symbol`]
    /// finds one from its `namespace::name`). In the cubin's symbol-table order.
    pub kernels: &'static [&'static str],
    pub bytes: &'static [u8],
}

include!(concat!(env!("OUT_DIR"), "/cubins.rs"));

/// What the host and the kernels share, defined once (`kernels/contract/defs.rs`): limits,
/// the failure kinds, and the argument structs the kernels take by value. The kernels see the
/// same declarations as `contract.cuh`, which the build generates with a `static_assert` on
/// every struct's size and field offsets.
pub mod contract {
    macro_rules! device_repr {
        ($name:ident) => {
            // SAFETY: a `#[repr(C)]` struct of plain numbers, laid out as its C++ twin (the
            // generated header asserts every offset).
            unsafe impl cudarc::driver::DeviceRepr for $name {}
        };
    }
    include!("../contract/macros.rs");
    include!("../contract/defs.rs");
}

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
    #[error(
        "module `{module}` has no kernel named `{name}` (its kernels: {kernels}); C++ kernels \
         are named with their namespace, e.g. `nvshmem_tutorial::dispatch`"
    )]
    UnknownKernel {
        module: String,
        name: String,
        kernels: String,
    },
    #[error(
        "`{name}` names {} kernels of module `{module}` (template instantiations or \
         overloads): {}; pass the mangled name of the one you mean", .matches.len(), .matches.join(", ")
    )]
    AmbiguousKernel {
        module: String,
        name: String,
        matches: Vec<&'static str>,
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
        return Err(KernelError::UnknownModule(module.into(), module_names()));
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

/// The symbol of `module`'s kernel `name`, to pass to [`NvshmemModule::function`].
///
/// `name` is what the source calls the kernel: an `extern "C"` name as it is, a C++ kernel
/// with its namespaces (`nvshmem_tutorial::dispatch`), or an exact mangled name. C++ names
/// are matched against the mangled (Itanium ABI) symbols in the cubin, where
/// `nvshmem_tutorial::dispatch` starts `_ZN16nvshmem_tutorial8dispatch` and a template's
/// arguments and the parameter types follow. Several matches (instantiations, overloads) are
/// an error that lists them.
pub fn kernel_symbol(module: &str, name: &str) -> Result<&'static str, KernelError> {
    let kernels = CUBINS
        .iter()
        .find(|c| c.module == module)
        .map(|c| c.kernels)
        .ok_or_else(|| KernelError::UnknownModule(module.into(), module_names()))?;
    let matches = matching_symbols(kernels, name);
    match matches.as_slice() {
        [symbol] => Ok(symbol),
        [] => Err(KernelError::UnknownKernel {
            module: module.into(),
            name: name.into(),
            kernels: kernels.join(", "),
        }),
        _ => Err(KernelError::AmbiguousKernel {
            module: module.into(),
            name: name.into(),
            matches,
        }),
    }
}

/// The symbols among `kernels` that `name` names (see [`kernel_symbol`]): an exact match
/// alone, else every mangled symbol of the C++ name.
fn matching_symbols(kernels: &[&'static str], name: &str) -> Vec<&'static str> {
    if let Some(exact) = kernels.iter().find(|k| **k == name) {
        return vec![exact];
    }
    let parts: Vec<&str> = name.split("::").collect();
    let encoded: String = parts.iter().map(|p| format!("{}{p}", p.len())).collect();
    kernels
        .iter()
        .copied()
        .filter(|symbol| match parts.len() {
            // `_Z3foo` + parameters: the length prefix already ends the name.
            1 => symbol.starts_with(&format!("_Z{encoded}")),
            // `_ZN2ns3foo` + `E` (end of the nested name) or `I` (template arguments); a digit
            // would start another nested part (`ns::foo::bar`), which is another name.
            _ => symbol
                .strip_prefix(&format!("_ZN{encoded}"))
                .is_some_and(|rest| rest.starts_with(['E', 'I'])),
        })
        .collect()
}

/// The embedded module names, for errors.
fn module_names() -> String {
    let mut names: Vec<&str> = CUBINS.iter().map(|c| c.module).collect();
    names.dedup();
    names.join(", ")
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
    /// Loads `cuda/<name>.cu`'s cubin (`name` may hold folders: `buffer/dispatch`) for the
    /// context's GPU and registers it with NVSHMEM.
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

    /// A kernel of this module by its symbol: the `extern "C"` name, or the mangled name of a
    /// C++ kernel ([`kernel_symbol`] finds it from `namespace::name`).
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

// SAFETY: a loaded module's handle is valid from any thread of the process (the driver's
// module API is thread-safe); the handle is only read after `load`.
unsafe impl Send for NvshmemModule {}
unsafe impl Sync for NvshmemModule {}

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

/// The contract's header, compiled by nvcc as it is and with deliberate mistakes.
#[cfg(test)]
mod contract_tests;

/// The build's own naming rules (`build_support/names.rs`), checked here because build
/// scripts have no tests of their own.
#[cfg(test)]
#[path = "../build_support/names.rs"]
mod build_names;

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::build_names::{cubin_kernels, find_sources, module_name};
    use super::*;

    /// A fresh, empty folder for one test.
    fn scratch(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("kernels-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn touch(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, "// test\n").unwrap();
    }

    #[test]
    fn module_names_are_paths_under_cuda_without_the_extension() {
        assert_eq!(module_name(Path::new("ring.cu")).unwrap(), "ring");
        assert_eq!(
            module_name(Path::new("buffer/dispatch.cu")).unwrap(),
            "buffer/dispatch"
        );
        assert_eq!(module_name(Path::new("a_1/_b/c2.cu")).unwrap(), "a_1/_b/c2");
        for bad in [
            "low-latency.cu",
            "buffer/2nd.cu",
            "my folder/x.cu",
            "x.y.cu",
            "../x.cu",
        ] {
            let why = module_name(Path::new(bad)).unwrap_err();
            assert!(!why.is_empty(), "{bad}");
        }
        let why = module_name(Path::new("buffer/low-latency.cu")).unwrap_err();
        assert!(why.contains("`low-latency`"), "{why}");
    }

    #[test]
    fn sources_in_subfolders_are_modules_and_their_headers_are_watched() {
        let crate_dir = scratch("sources");
        for file in ["cuda/ring.cu", "cuda/common.cuh", "cuda/buffer/dispatch.cu"] {
            touch(&crate_dir.join(file));
        }
        touch(&crate_dir.join("cuda/buffer/layout.cuh"));
        touch(&crate_dir.join("src/lib.rs"));
        let sources = find_sources(&crate_dir).unwrap();
        let modules: Vec<&str> = sources.modules.iter().map(|m| m.module.as_str()).collect();
        assert_eq!(modules, ["buffer/dispatch", "ring"]);
        for watched in [
            "cuda",
            "cuda/buffer",
            "cuda/common.cuh",
            "cuda/buffer/layout.cuh",
            "cuda/buffer/dispatch.cu",
        ] {
            assert!(
                sources.watch.contains(&crate_dir.join(watched)),
                "{watched} is not watched: {:?}",
                sources.watch
            );
        }
        assert!(!sources.watch.contains(&crate_dir.join("src/lib.rs")));
        std::fs::remove_dir_all(crate_dir).unwrap();
    }

    #[test]
    fn a_cu_file_the_build_would_skip_is_an_error_naming_it() {
        let misplaced = scratch("misplaced");
        touch(&misplaced.join("cuda/ring.cu"));
        touch(&misplaced.join("src/stray.cu"));
        let error = find_sources(&misplaced).unwrap_err();
        assert!(error.contains("src/stray.cu"), "{error}");
        assert!(error.contains("Move them under kernels/cuda"), "{error}");

        let badly_named = scratch("badly-named");
        touch(&badly_named.join("cuda/buffer/low-latency.cu"));
        let error = find_sources(&badly_named).unwrap_err();
        assert!(error.contains("low-latency.cu"), "{error}");
        assert!(error.contains("rename"), "{error}");
        std::fs::remove_dir_all(misplaced).unwrap();
        std::fs::remove_dir_all(badly_named).unwrap();
    }

    /// `extern "C" __global__ void <name>(` in a source: a reading of the source that does
    /// not go through the cubin, to check the cubin reading against.
    fn extern_c_kernels_in(source: &str) -> Vec<String> {
        source
            .split("extern \"C\" __global__ void ")
            .skip(1)
            .map(|rest| {
                // `__launch_bounds__(512) name(` names the kernel after the bounds.
                let rest = match rest.strip_prefix("__launch_bounds__") {
                    Some(bounds) => bounds[bounds.find(')').map_or(0, |i| i + 1)..].trim_start(),
                    None => rest,
                };
                rest.chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect::<Vec<_>>()
            })
            .map(String::from_iter)
            .collect()
    }

    #[test]
    fn every_cubin_lists_the_extern_c_kernels_its_source_defines() {
        let cuda = Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda");
        let mut checked = 0;
        for cubin in CUBINS {
            let source = std::fs::read_to_string(cuda.join(format!("{}.cu", cubin.module)));
            // A module of C++ kernels only has none: build.rs still requires one kernel.
            let expected = extern_c_kernels_in(&source.unwrap());
            assert!(!cubin.kernels.is_empty(), "{}: no kernel", cubin.module);
            checked += expected.len();
            for kernel in &expected {
                assert!(
                    cubin.kernels.contains(&kernel.as_str()),
                    "{} {}: `{kernel}` missing from {:?}",
                    cubin.module,
                    cubin.arch,
                    cubin.kernels
                );
            }
            // The embedded table is what the cubin itself says, nothing more.
            assert_eq!(cubin_kernels(cubin.bytes).unwrap(), cubin.kernels);
        }
        assert!(checked > 0, "no extern \"C\" kernel found in any source");
    }

    #[test]
    fn a_file_that_is_not_a_cubin_is_refused_with_the_reason() {
        assert!(
            cubin_kernels(b"not an ELF file")
                .unwrap_err()
                .contains("not an ELF")
        );
        // A real cubin cut short: its section table lies past the end.
        let cubin = CUBINS[0].bytes;
        let error = cubin_kernels(&cubin[..cubin.len() / 2]).unwrap_err();
        assert!(error.contains("truncated"), "{error}");
    }

    /// cuda/selftest/naming.cu: a module in a subfolder with extern "C" and C++ kernels.
    #[test]
    fn cxx_kernels_in_a_subfolder_module_are_found_by_their_qualified_name() {
        let module = "selftest/naming";
        for arch in BUILT_ARCHS {
            assert!(cubin(module, arch).is_ok(), "{module} not built for {arch}");
        }
        assert_eq!(
            kernel_symbol(module, "naming_plain").unwrap(),
            "naming_plain"
        );
        assert_eq!(
            kernel_symbol(module, "nvshmem_tutorial::naming_scoped").unwrap(),
            "_ZN16nvshmem_tutorial13naming_scopedEPji"
        );
        let exact = "_ZN16nvshmem_tutorial15naming_templateILi4EEEvPj";
        assert_eq!(kernel_symbol(module, exact).unwrap(), exact);
        let error = kernel_symbol(module, "nvshmem_tutorial::naming_template").unwrap_err();
        assert!(
            matches!(error, KernelError::AmbiguousKernel { ref matches, .. } if matches.len() == 2)
        );
        let error = kernel_symbol(module, "naming_scoped").unwrap_err();
        assert!(
            error.to_string().contains("nvshmem_tutorial::dispatch"),
            "{error}"
        );
        assert!(matches!(
            kernel_symbol("selftest/missing", "x"),
            Err(KernelError::UnknownModule(..))
        ));
    }

    #[test]
    fn mangled_names_match_only_their_own_qualified_name() {
        let kernels: &[&'static str] = &[
            "_ZN2ns8dispatchEPfi",
            "_ZN2ns8dispatch5innerEv",
            "_ZN2ns15dispatch_helperEv",
            "_ZN3ns28dispatchEv",
            "_Z8dispatchPf",
            "dispatch_c",
        ];
        assert_eq!(
            matching_symbols(kernels, "ns::dispatch"),
            ["_ZN2ns8dispatchEPfi"]
        );
        assert_eq!(
            matching_symbols(kernels, "ns::dispatch::inner"),
            ["_ZN2ns8dispatch5innerEv"]
        );
        assert_eq!(matching_symbols(kernels, "dispatch"), ["_Z8dispatchPf"]);
        assert_eq!(matching_symbols(kernels, "dispatch_c"), ["dispatch_c"]);
        assert!(matching_symbols(kernels, "ns::combine").is_empty());
    }
}
