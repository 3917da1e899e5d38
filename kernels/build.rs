//! Compiles every `cuda/*.cu` into one cubin per target architecture and embeds them.
//!
//! NVSHMEM device calls live in a static device library, so each file goes through the
//! relocatable-device-code path:
//!
//! ```text
//! nvcc -arch=sm_90 -rdc=true -c k.cu -o k.o                          (compile)
//! nvcc -arch=sm_90 -dlink -cubin k.o -lnvshmem_device -o k.cubin     (device link)
//! ```
//!
//! The target list comes from one variable, `KERNEL_ARCHS` (default `sm_90`, e.g.
//! `KERNEL_ARCHS=sm_80,sm_90,sm_100`). nvcc and NVSHMEM are searched in the order
//! `$NVCC`/`$NVSHMEM_HOME`, `$CUDA_HOME`, the system, then the project `.venv` that
//! `scripts/setup.sh` fills with the pinned CUDA 13.0 and NVSHMEM 3.4.5 wheels.

use std::path::{Path, PathBuf};
use std::process::Command;

const DEFAULT_ARCHS: &str = "sm_90";
const SETUP_HINT: &str = "run scripts/setup.sh (installs the pinned CUDA 13.0 compiler and \
                          nvidia-nvshmem-cu13==3.4.5 wheels into .venv)";

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
    for var in [
        "NVCC",
        "CUDA_HOME",
        "NVSHMEM_HOME",
        "KERNEL_ARCHS",
        "NVCC_FLAGS",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }

    let cuda_dir = manifest_dir.join("cuda");
    println!("cargo:rerun-if-changed={}", cuda_dir.display());
    let mut sources = Vec::new();
    for entry in std::fs::read_dir(&cuda_dir).map_err(|e| format!("{}: {e}", cuda_dir.display()))? {
        let path = entry.map_err(|e| e.to_string())?.path();
        match path.extension().and_then(|e| e.to_str()) {
            Some("cu") => {
                println!("cargo:rerun-if-changed={}", path.display());
                sources.push(path);
            }
            Some("cuh") => println!("cargo:rerun-if-changed={}", path.display()),
            _ => {}
        }
    }
    sources.sort();

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

    let nvcc = find_nvcc(&project_venv)?;
    let nvshmem = find_nvshmem(&project_venv)?;
    let version = read_nvshmem_version(&nvshmem.include)?;
    let cccl = nvcc
        .parent()
        .and_then(Path::parent)
        .map(|cuda| cuda.join("include/cccl"))
        .filter(|p| p.is_dir());

    let extra_flags: Vec<String> = env("NVCC_FLAGS")
        .map(|f| f.split_whitespace().map(String::from).collect())
        .unwrap_or_default();

    // Compile (module, arch) pairs in parallel: nvcc is single-threaded per file.
    let jobs: Vec<(PathBuf, String)> = sources
        .iter()
        .flat_map(|s| archs.iter().map(move |a| (s.clone(), a.clone())))
        .collect();
    let results: Vec<Result<(String, String, PathBuf), String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = jobs
            .iter()
            .map(|(source, arch)| {
                let (nvcc, nvshmem, cccl, out_dir, cuda_dir, extra_flags) =
                    (&nvcc, &nvshmem, &cccl, &out_dir, &cuda_dir, &extra_flags);
                scope.spawn(move || {
                    compile_one(
                        nvcc,
                        nvshmem,
                        cccl.as_deref(),
                        cuda_dir,
                        source,
                        arch,
                        out_dir,
                        extra_flags,
                    )
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });

    let mut table = String::new();
    for result in results {
        let (module, arch, cubin) = result?;
        let source = cuda_dir.join(format!("{module}.cu"));
        let text =
            std::fs::read_to_string(&source).map_err(|e| format!("{}: {e}", source.display()))?;
        let kernels = extern_c_kernels(&text);
        if kernels.is_empty() {
            return Err(format!(
                "{} defines no extern \"C\" __global__ kernel",
                source.display()
            ));
        }
        table.push_str(&format!(
            "    Cubin {{ module: {module:?}, arch: {arch:?}, kernels: &{kernels:?}, bytes: include_bytes!({:?}) }},\n",
            cubin.display().to_string()
        ));
    }
    let generated = format!(
        "/// Every embedded cubin: one per (module, arch).\n\
         pub static CUBINS: &[Cubin] = &[\n{table}];\n\
         /// NVSHMEM release of the device library linked into the cubins.\n\
         pub const NVSHMEM_DEVICE_VERSION: nvshmem_sys::Version = nvshmem_sys::Version {{ major: {}, minor: {}, patch: {} }};\n\
         /// Architectures the cubins were built for (`KERNEL_ARCHS`).\n\
         pub const BUILT_ARCHS: &[&str] = &{:?};\n",
        version.0, version.1, version.2, archs
    );
    std::fs::write(out_dir.join("cubins.rs"), generated).map_err(|e| e.to_string())?;
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn compile_one(
    nvcc: &Path,
    nvshmem: &Nvshmem,
    cccl: Option<&Path>,
    cuda_dir: &Path,
    source: &Path,
    arch: &str,
    out_dir: &Path,
    extra_flags: &[String],
) -> Result<(String, String, PathBuf), String> {
    let module = source.file_stem().unwrap().to_string_lossy().to_string();
    let object = out_dir.join(format!("{module}.{arch}.o"));
    let cubin = out_dir.join(format!("{module}.{arch}.cubin"));
    let mut compile = Command::new(nvcc);
    compile
        .arg(format!("-arch={arch}"))
        .args(["-rdc=true", "-O3", "-std=c++17", "-lineinfo", "-Xptxas=-v"])
        .arg("-I")
        .arg(cuda_dir)
        .arg("-I")
        .arg(&nvshmem.include);
    if let Some(cccl) = cccl {
        compile.arg("-I").arg(cccl);
    }
    compile
        .args(extra_flags)
        .arg("-c")
        .arg(source)
        .arg("-o")
        .arg(&object);
    run(&mut compile)?;
    let mut link = Command::new(nvcc);
    link.arg(format!("-arch={arch}"))
        .args(["-dlink", "-cubin"])
        .arg(&object)
        .arg("-L")
        .arg(&nvshmem.lib)
        .arg("-lnvshmem_device")
        .arg("-o")
        .arg(&cubin);
    run(&mut link)?;
    Ok((module, arch.to_string(), cubin))
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

/// Names of the `extern "C" __global__ void name(` kernels in a source file. Unmangled names
/// are the only ones the driver can look up by the name written in the source.
fn extern_c_kernels(source: &str) -> Vec<String> {
    let mut names = Vec::new();
    for (i, _) in source.match_indices("__global__") {
        let before = &source[..i];
        let line_start = before.rfind('\n').map_or(0, |p| p + 1);
        let prefix = &source[line_start..i];
        // `extern "C" __global__` on one line, or inside an `extern "C" {` block.
        let in_block = before
            .rfind("extern \"C\" {")
            .is_some_and(|b| !before[b..].contains("\n}"));
        if !prefix.contains("extern \"C\"") && !in_block {
            continue;
        }
        let rest = &source[i..];
        let Some(void_at) = rest.find("void") else {
            continue;
        };
        let mut after_void = rest[void_at + 4..].trim_start();
        if let Some(bounds) = after_void.strip_prefix("__launch_bounds__") {
            let Some(close) = bounds.find(')') else {
                continue;
            };
            after_void = bounds[close + 1..].trim_start();
        }
        let name: String = after_void
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            names.push(name);
        }
    }
    names
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
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

fn find_nvcc(project_venv: &Path) -> Result<PathBuf, String> {
    let mut searched = Vec::new();
    let mut candidates: Vec<(String, Option<PathBuf>)> = vec![
        ("$NVCC".into(), env("NVCC").map(PathBuf::from)),
        (
            "$CUDA_HOME/bin/nvcc".into(),
            env("CUDA_HOME").map(|h| PathBuf::from(h).join("bin/nvcc")),
        ),
    ];
    if let Some(path) = env("PATH") {
        for dir in std::env::split_paths(&path) {
            candidates.push(("nvcc on PATH".into(), Some(dir.join("nvcc"))));
        }
    }
    candidates.push((
        "system CUDA".into(),
        Some("/usr/local/cuda/bin/nvcc".into()),
    ));
    candidates.push((
        format!("project venv {}", project_venv.display()),
        venv_nvidia(project_venv, "cu13/bin/nvcc"),
    ));
    for (source, path) in candidates {
        match path {
            Some(p) if p.is_file() => return Ok(p),
            Some(p) => searched.push(format!("  - {source}: {} (not found)", p.display())),
            None => searched.push(format!("  - {source}: not set")),
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
}

fn find_nvshmem(project_venv: &Path) -> Result<Nvshmem, String> {
    let mut candidates: Vec<(String, Option<PathBuf>)> = vec![
        (
            "$NVSHMEM_HOME".into(),
            env("NVSHMEM_HOME").map(PathBuf::from),
        ),
        ("system".into(), Some("/usr/local/nvshmem".into())),
        ("system".into(), Some("/opt/nvidia/nvshmem".into())),
        (
            format!("project venv {}", project_venv.display()),
            venv_nvidia(project_venv, "nvshmem"),
        ),
    ];
    let mut searched = Vec::new();
    for (source, root) in candidates.drain(..) {
        match root {
            Some(root) => {
                let nvshmem = Nvshmem {
                    include: root.join("include"),
                    lib: root.join("lib"),
                };
                let header = nvshmem.include.join("nvshmem.h");
                let device_lib = nvshmem.lib.join("libnvshmem_device.a");
                if header.is_file() && device_lib.is_file() {
                    return Ok(nvshmem);
                }
                searched.push(format!(
                    "  - {source}: {} and {} (not both present)",
                    header.display(),
                    device_lib.display()
                ));
            }
            None => searched.push(format!("  - {source}: not set")),
        }
    }
    Err(format!(
        "NVSHMEM headers and device library (nvshmem.h, libnvshmem_device.a) not found. \
         Searched:\n{}\nFix: {SETUP_HINT}, or set NVSHMEM_HOME",
        searched.join("\n")
    ))
}

fn read_nvshmem_version(include: &Path) -> Result<(i32, i32, i32), String> {
    let header = include.join("non_abi/nvshmem_version.h");
    let text =
        std::fs::read_to_string(&header).map_err(|e| format!("{}: {e}", header.display()))?;
    let field = |name: &str| -> Result<i32, String> {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("#define {name} ")))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| format!("{} has no {name}", header.display()))
    };
    Ok((
        field("NVSHMEM_VENDOR_MAJOR_VERSION")?,
        field("NVSHMEM_VENDOR_MINOR_VERSION")?,
        field("NVSHMEM_VENDOR_PATCH_VERSION")?,
    ))
}
