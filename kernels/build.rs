//! Compiles every `cuda/**/*.cu` into one cubin per target architecture and embeds them.
//!
//! NVSHMEM device calls live in a static device library, so each file goes through the
//! relocatable-device-code path:
//!
//! ```text
//! nvcc -arch=sm_90 -rdc=true -c k.cu -o k.o                          (compile)
//! nvcc -arch=sm_90 -dlink -cubin k.o -lnvshmem_device -o k.cubin     (device link)
//! ```
//!
//! Modules and kernels (`build_support/names.rs` has the rules): a module is one `.cu` file
//! anywhere under `cuda/`, named by its path without `.cu` (`cuda/buffer/dispatch.cu` is
//! `buffer/dispatch`); a `.cu` file anywhere else in the crate, or one whose path is no
//! module name, stops the build. Every source compiles with `-I cuda`, so a file in a
//! subfolder includes the shared header as `"common.cuh"` or as `"../common.cuh"`. Each
//! module's kernels are read from its cubin's symbol table: `extern "C"` kernels under their
//! source name, C++ kernels (in a namespace, templates) under their mangled name.
//!
//! The target list comes from one variable, `KERNEL_ARCHS` (default `sm_90`, e.g.
//! `KERNEL_ARCHS=sm_80,sm_90,sm_100`).
//!
//! nvcc and NVSHMEM are searched in this order (the first hit wins; the error lists them all):
//!
//! 1. the explicit variables: `$NVCC`, then `$CUDA_HOME/bin/nvcc`; `$NVSHMEM_HOME`;
//! 2. the environment of the Python that drives the build, when one does: maturin names it in
//!    `PYO3_PYTHON` (`pip install ./python`, `maturin build`), and its `sys.path` (which under
//!    pip's isolated build holds the wheels `python/pyproject.toml` requires, the pinned CUDA
//!    13.0 compiler and NVSHMEM 3.4.5) is searched for `nvidia/cu13/bin/nvcc` and
//!    `nvidia/nvshmem`. It comes before the system because those pins are what the package
//!    asked for; a system toolkit of another release must not replace them;
//! 3. the system: nvcc on `PATH`, `/usr/local/cuda/bin/nvcc`; `/usr/local/nvshmem`,
//!    `/opt/nvidia/nvshmem`;
//! 4. the project `.venv` that `scripts/setup.sh` fills with the same pinned wheels.
//!
//! An NVSHMEM whose headers are not the pinned release is passed over (and named in the error):
//! the device library in the cubins must match the host library exactly.

#[path = "build_support/names.rs"]
mod names;

// The host/device contract (kernels/contract): the build script needs only its C++ text.
macro_rules! device_repr {
    ($name:ident) => {};
}
include!("contract/macros.rs");
#[allow(dead_code)]
mod contract {
    include!("contract/defs.rs");
}

use std::path::{Path, PathBuf};
use std::process::Command;

use names::ModuleSource;

const DEFAULT_ARCHS: &str = "sm_90";
const SETUP_HINT: &str = "run scripts/setup.sh (installs the pinned CUDA 13.0 compiler and \
                          nvidia-nvshmem-cu13==3.4.5 wheels into .venv), or build the Python \
                          package with `pip install ./python` (its build requirements bring them)";

fn main() {
    if let Err(message) = build() {
        // A panic in build.rs prints a backtrace hint; an explicit message reads better.
        eprintln!("\nerror: kernels build failed:\n{message}\n");
        std::process::exit(1);
    }
}

fn build() -> Result<(), String> {
    let manifest_dir = PathBuf::from(env("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(env("OUT_DIR").unwrap());
    let project_venv = manifest_dir.join("../.venv");
    // PYO3_PYTHON is deliberately not here: whichever environment supplied the pinned tools,
    // the cubins are the same, and maturin's and cargo's builds should share them.
    for var in [
        "NVCC",
        "CUDA_HOME",
        "NVSHMEM_HOME",
        "KERNEL_ARCHS",
        "NVCC_FLAGS",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }

    let sources = names::find_sources(&manifest_dir)?;
    for path in &sources.watch {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    let cuda_dir = manifest_dir.join("cuda");
    // contract.cuh, generated from the Rust declaration, on every source's include path.
    for file in [
        "contract/macros.rs",
        "contract/defs.rs",
        "contract/collectives.rs",
        "contract/buffer.rs",
        "contract/low_latency.rs",
        "contract/internode.rs",
    ] {
        println!(
            "cargo:rerun-if-changed={}",
            manifest_dir.join(file).display()
        );
    }
    let generated_include = out_dir.join("include");
    std::fs::create_dir_all(&generated_include).map_err(|e| e.to_string())?;
    write_if_changed(
        &generated_include.join("contract.cuh"),
        &contract::c_header(),
    )?;

    let archs = archs()?;

    let python_paths = build_python_paths();
    let nvcc = find_nvcc(&python_paths, &project_venv)?;
    let nvshmem = find_nvshmem(&python_paths, &project_venv)?;
    // The contract's tests compile headers with the same nvcc.
    println!("cargo:rustc-env=KERNELS_NVCC={}", nvcc.display());
    let cccl = nvcc
        .parent()
        .and_then(Path::parent)
        .map(|cuda| cuda.join("include/cccl"))
        .filter(|p| p.is_dir());

    let extra_flags: Vec<String> = env("NVCC_FLAGS")
        .map(|f| f.split_whitespace().map(String::from).collect())
        .unwrap_or_default();

    let jobs: Vec<(&ModuleSource, &str)> = sources
        .modules
        .iter()
        .flat_map(|s| archs.iter().map(move |a| (s, a.as_str())))
        .collect();
    let toolchain = Toolchain {
        nvcc: &nvcc,
        nvshmem: &nvshmem,
        cccl: cccl.as_deref(),
        include: &cuda_dir,
        generated_include: &generated_include,
        out_dir: &out_dir,
        extra_flags: &extra_flags,
    };
    let results = compile_all(&jobs, &toolchain);
    let table = cubin_table(&jobs, results)?;
    let version = nvshmem.version;
    let generated = format!(
        "/// Every embedded cubin: one per (module, arch).\n\
         pub static CUBINS: &[Cubin] = &[\n{table}];\n\
         /// NVSHMEM release of the device library linked into the cubins.\n\
         pub const NVSHMEM_DEVICE_VERSION: nvshmem_sys::Version = nvshmem_sys::Version {{ major: {}, minor: {}, patch: {} }};\n\
         /// Architectures the cubins were built for (`KERNEL_ARCHS`).\n\
         pub const BUILT_ARCHS: &[&str] = &{:?};\n",
        version.major, version.minor, version.patch, archs
    );
    std::fs::write(out_dir.join("cubins.rs"), generated).map_err(|e| e.to_string())?;
    Ok(())
}

/// `KERNEL_ARCHS` (comma-separated, default DEFAULT_ARCHS), each of the form sm_90.
fn archs() -> Result<Vec<String>, String> {
    let archs: Vec<String> = env("KERNEL_ARCHS")
        .unwrap_or_else(|| DEFAULT_ARCHS.into())
        .split(',')
        .map(|a| a.trim().to_string())
        .filter(|a| !a.is_empty())
        .collect();
    for arch in &archs {
        if !arch.starts_with("sm_") || arch[3..].is_empty() {
            return Err(format!(
                "KERNEL_ARCHS entry `{arch}` is not of the form sm_90"
            ));
        }
    }
    Ok(archs)
}

/// Compiles every (module, arch) job in parallel (nvcc is single-threaded per file), at most
/// cargo's job count at once (NUM_JOBS, else the cores): each nvcc holds about 0.6 GB, and
/// every pair at once (72 for two archs) outgrows a small machine's memory. Results in `jobs`'
/// order.
fn compile_all(
    jobs: &[(&ModuleSource, &str)],
    toolchain: &Toolchain,
) -> Vec<Result<PathBuf, String>> {
    let width = std::env::var("NUM_JOBS")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
        .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
        .unwrap_or(1)
        .clamp(1, jobs.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut done: Vec<(usize, Result<PathBuf, String>)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..width)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(&(source, arch)) = jobs.get(i) else {
                            break;
                        };
                        mine.push((i, toolchain.compile(source, arch)));
                    }
                    mine
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, r)| r).collect()
}

/// The generated `CUBINS` entries, one per compiled job: its module, arch, kernel names (read
/// from the cubin; a module without a `__global__` kernel is an error) and bytes.
fn cubin_table(
    jobs: &[(&ModuleSource, &str)],
    results: Vec<Result<PathBuf, String>>,
) -> Result<String, String> {
    let mut table = String::new();
    for ((source, arch), result) in jobs.iter().zip(results) {
        let cubin = result?;
        let bytes = std::fs::read(&cubin).map_err(|e| format!("{}: {e}", cubin.display()))?;
        let kernels = names::cubin_kernels(&bytes)
            .map_err(|why| format!("reading the kernel names of {}: {why}", cubin.display()))?;
        if kernels.is_empty() {
            return Err(format!(
                "{} defines no __global__ kernel (module `{}`): a module is loaded through one \
                 of its kernels, so it needs at least one",
                source.path.display(),
                source.module
            ));
        }
        table.push_str(&format!(
            "    Cubin {{ module: {:?}, arch: {arch:?}, kernels: &{kernels:?}, bytes: include_bytes!({:?}) }},\n",
            source.module,
            cubin.display().to_string()
        ));
    }
    Ok(table)
}

/// Writes `text` to `path` unless it holds it already (an unchanged header keeps its time).
fn write_if_changed(path: &Path, text: &str) -> Result<(), String> {
    if std::fs::read_to_string(path).is_ok_and(|old| old == text) {
        return Ok(());
    }
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Everything a compile needs besides the source and the architecture.
struct Toolchain<'a> {
    nvcc: &'a Path,
    nvshmem: &'a Nvshmem,
    cccl: Option<&'a Path>,
    /// `kernels/cuda`: on the include path, so every source finds `common.cuh` by that name.
    include: &'a Path,
    /// `OUT_DIR/include`: the generated `contract.cuh`.
    generated_include: &'a Path,
    out_dir: &'a Path,
    extra_flags: &'a [String],
}

impl Toolchain<'_> {
    /// Compiles and device-links one module for one architecture; returns the cubin's path
    /// (`OUT_DIR/<module>.<arch>.cubin`, folders of the module name included).
    fn compile(&self, source: &ModuleSource, arch: &str) -> Result<PathBuf, String> {
        let object = self.out_dir.join(format!("{}.{arch}.o", source.module));
        let cubin = self.out_dir.join(format!("{}.{arch}.cubin", source.module));
        if let Some(folder) = object.parent() {
            std::fs::create_dir_all(folder).map_err(|e| format!("{}: {e}", folder.display()))?;
        }
        let mut compile = Command::new(self.nvcc);
        compile
            .arg(format!("-arch={arch}"))
            .args(["-rdc=true", "-O3", "-std=c++17", "-lineinfo", "-Xptxas=-v"])
            .arg("-I")
            .arg(self.include)
            .arg("-I")
            .arg(self.generated_include)
            .arg("-I")
            .arg(&self.nvshmem.include);
        if let Some(cccl) = self.cccl {
            compile.arg("-I").arg(cccl);
        }
        compile
            .args(self.extra_flags)
            .arg("-c")
            .arg(&source.path)
            .arg("-o")
            .arg(&object);
        run(&mut compile)?;
        let mut link = Command::new(self.nvcc);
        link.arg(format!("-arch={arch}"))
            .args(["-dlink", "-cubin"])
            .arg(&object)
            .arg("-L")
            .arg(&self.nvshmem.lib)
            .arg("-lnvshmem_device")
            .arg("-o")
            .arg(&cubin);
        run(&mut link)?;
        Ok(cubin)
    }
}

fn run(command: &mut Command) -> Result<(), String> {
    let output = command
        .output()
        .map_err(|e| format!("could not start {command:?}: {e}"))?;
    // ptxas -v reports registers, shared memory and spills per kernel; lines that are not
    // `cargo:` directives land in the build script's output file (shown with `cargo -vv`).
    for line in String::from_utf8_lossy(&output.stderr).lines() {
        println!("{line}");
    }
    if !output.status.success() {
        return Err(format!(
            "{command:?} failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(())
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Where the Python that drives the build looks for packages, and what to call it in errors.
struct PythonPaths {
    /// `build interpreter <path> (PYO3_PYTHON)`.
    label: String,
    /// Its `sys.path` entries, in order, or why there are none.
    entries: Result<Vec<PathBuf>, String>,
}

/// Asks the build interpreter (maturin's `PYO3_PYTHON`) for its `sys.path`. It inherits this
/// process's environment, so under pip's isolated build it reports the build environment's
/// folders too (pip adds them through `PYTHONPATH`).
fn build_python_paths() -> PythonPaths {
    let Some(python) = env("PYO3_PYTHON") else {
        return PythonPaths {
            label: "build interpreter".into(),
            entries: Err("PYO3_PYTHON is unset (not a maturin build)".into()),
        };
    };
    let output = Command::new(&python)
        .args([
            "-c",
            "import sys; print('\\n'.join(p for p in sys.path if p))",
        ])
        .output();
    let entries = match output {
        Ok(output) if output.status.success() => Ok(String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(PathBuf::from)
            .collect()),
        Ok(output) => Err(format!("it failed to report sys.path ({})", output.status)),
        Err(e) => Err(format!("it could not be run ({e})")),
    };
    PythonPaths {
        label: format!("build interpreter {python} (PYO3_PYTHON)"),
        entries,
    }
}

/// `<venv>/lib/python3.*/site-packages/nvidia/<rest>`, if present.
fn venv_nvidia(venv: &Path, rest: &str) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(venv.join("lib"))
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .map(|p| p.join("site-packages/nvidia").join(rest))
        .filter(|p| p.exists())
        .collect();
    found.sort();
    found.pop()
}

/// A place to look, under the name the error gives it: a path, or why there is none.
type Candidate = (String, Result<PathBuf, String>);

/// `$name` as a candidate path (with `rest` appended), or "not set".
fn env_candidate(name: &str, rest: &str) -> Candidate {
    let path = env(name)
        .map(|v| match rest {
            "" => PathBuf::from(v),
            rest => PathBuf::from(v).join(rest),
        })
        .ok_or_else(|| "not set".to_string());
    (format!("${name}"), path)
}

/// `<entry>/<rest>` for every `sys.path` entry of the build interpreter that has it; one line
/// saying why when none does.
fn python_candidates(python: &PythonPaths, rest: &str) -> Vec<Candidate> {
    let entries = match &python.entries {
        Ok(entries) => entries,
        Err(why) => return vec![(python.label.clone(), Err(why.clone()))],
    };
    let found: Vec<Candidate> = entries
        .iter()
        .map(|entry| entry.join(rest))
        .filter(|p| p.exists())
        .map(|p| (python.label.clone(), Ok(p)))
        .collect();
    if found.is_empty() {
        let why = format!("no sys.path entry has {rest}");
        return vec![(python.label.clone(), Err(why))];
    }
    found
}

/// The project `.venv`'s `nvidia/<rest>` as a candidate.
fn venv_candidate(project_venv: &Path, rest: &str) -> Candidate {
    let path = venv_nvidia(project_venv, rest).ok_or_else(|| format!("no nvidia/{rest}"));
    (format!("project venv {}", project_venv.display()), path)
}

fn find_nvcc(python: &PythonPaths, project_venv: &Path) -> Result<PathBuf, String> {
    let mut candidates: Vec<Candidate> = vec![
        env_candidate("NVCC", ""),
        env_candidate("CUDA_HOME", "bin/nvcc"),
    ];
    candidates.extend(python_candidates(python, "nvidia/cu13/bin/nvcc"));
    if let Some(path) = env("PATH") {
        for dir in std::env::split_paths(&path) {
            candidates.push(("nvcc on PATH".into(), Ok(dir.join("nvcc"))));
        }
    }
    candidates.push(("system CUDA".into(), Ok("/usr/local/cuda/bin/nvcc".into())));
    candidates.push(venv_candidate(project_venv, "cu13/bin/nvcc"));
    let mut searched = Vec::new();
    for (source, path) in candidates {
        match path {
            Ok(p) if p.is_file() => return Ok(p),
            Ok(p) => searched.push(format!("  - {source}: {} (not found)", p.display())),
            Err(why) => searched.push(format!("  - {source}: {why}")),
        }
    }
    searched.dedup();
    Err(format!(
        "nvcc (CUDA 13.0) not found. Searched:\n{}\nFix: {SETUP_HINT}, or set NVCC=/path/to/nvcc",
        searched.join("\n")
    ))
}

struct Nvshmem {
    include: PathBuf,
    lib: PathBuf,
    version: nvshmem_sys::Version,
}

fn find_nvshmem(python: &PythonPaths, project_venv: &Path) -> Result<Nvshmem, String> {
    let explicit = env("NVSHMEM_HOME").map(PathBuf::from);
    let mut candidates: Vec<Candidate> = vec![env_candidate("NVSHMEM_HOME", "")];
    candidates.extend(python_candidates(python, "nvidia/nvshmem"));
    candidates.push(("system".into(), Ok("/usr/local/nvshmem".into())));
    candidates.push(("system".into(), Ok("/opt/nvidia/nvshmem".into())));
    candidates.push(venv_candidate(project_venv, "nvshmem"));
    let pinned = nvshmem_sys::PINNED_VERSION;
    let mut searched = Vec::new();
    for (source, root) in candidates {
        let root = match root {
            Ok(root) => root,
            Err(why) => {
                searched.push(format!("  - {source}: {why}"));
                continue;
            }
        };
        let (include, lib) = (root.join("include"), root.join("lib"));
        let header = include.join("nvshmem.h");
        let device_lib = lib.join("libnvshmem_device.a");
        if !header.is_file() || !device_lib.is_file() {
            searched.push(format!(
                "  - {source}: {} and {} (not both present)",
                header.display(),
                device_lib.display()
            ));
            continue;
        }
        let version = read_nvshmem_version(&include)?;
        if version == pinned {
            return Ok(Nvshmem {
                include,
                lib,
                version,
            });
        }
        let why = format!(
            "{source}: {} is NVSHMEM {version}, not the pinned {pinned}",
            root.display()
        );
        if explicit.as_ref() == Some(&root) {
            // An explicit choice that is wrong is an error, not something to search past.
            return Err(format!(
                "{why}. The device library linked into the kernels must match the host \
                 library exactly; point NVSHMEM_HOME at NVSHMEM {pinned} or unset it"
            ));
        }
        searched.push(format!("  - {why} (passed over)"));
    }
    Err(format!(
        "NVSHMEM {pinned} headers and device library (nvshmem.h, libnvshmem_device.a) not \
         found. Searched:\n{}\nFix: {SETUP_HINT}, or set NVSHMEM_HOME",
        searched.join("\n")
    ))
}

fn read_nvshmem_version(include: &Path) -> Result<nvshmem_sys::Version, String> {
    let header = include.join("non_abi/nvshmem_version.h");
    let text =
        std::fs::read_to_string(&header).map_err(|e| format!("{}: {e}", header.display()))?;
    let field = |name: &str| -> Result<i32, String> {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("#define {name} ")))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| format!("{} has no {name}", header.display()))
    };
    Ok(nvshmem_sys::Version {
        major: field("NVSHMEM_VENDOR_MAJOR_VERSION")?,
        minor: field("NVSHMEM_VENDOR_MINOR_VERSION")?,
        patch: field("NVSHMEM_VENDOR_PATCH_VERSION")?,
    })
}
