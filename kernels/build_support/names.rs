//! Names, for `build.rs`: which `.cu` files are kernel modules and what each module is called,
//! and which kernels a compiled cubin defines.
//!
//! Shared by `build.rs` (`#[path]`) and the crate's unit tests (`src/lib.rs`), which check it
//! on a CPU machine against made-up trees and the cubins the build embedded.
//!
//! # Module names
//! A module is one `.cu` file anywhere under `kernels/cuda/`; its name is the path relative
//! to `kernels/cuda` without `.cu`, with `/` between folders: `cuda/ring.cu` is `ring`,
//! `cuda/buffer/dispatch.cu` is `buffer/dispatch`. That name is what `kernels::cubin` and
//! `NvshmemModule::load` take. Every part of it must be an identifier (ASCII letters, digits,
//! `_`, not starting with a digit), so names stay plain strings with no quoting or mapping.
//! A `.cu` file elsewhere in the crate, or one whose path cannot become such a name, stops the
//! build: silently skipping device code would surface much later as "no such module".
//!
//! # Kernel names
//! Read from the cubin, not from the source: a kernel is a function symbol that CUDA marks as
//! an entry point. `extern "C"` kernels appear under their source name; C++ kernels (in a
//! namespace, templates) under their mangled name, which is also the name the driver looks
//! them up by (`kernels::kernel_symbol` finds one from `namespace::name`).

use std::path::{Component, Path, PathBuf};

/// One kernel module: a `.cu` file under `kernels/cuda` and its module name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleSource {
    pub module: String,
    pub path: PathBuf,
}

/// What `build.rs` compiles and watches.
#[derive(Debug, Default)]
pub struct Sources {
    /// Every module, sorted by name.
    pub modules: Vec<ModuleSource>,
    /// Folders and `.cu`/`.cuh` files under `kernels/cuda`: a change to any of them reruns
    /// the build script (a new file changes its folder).
    pub watch: Vec<PathBuf>,
}

/// Scans `crate_dir` (the kernels crate) for `.cu` files: those under `crate_dir/cuda` become
/// modules; one anywhere else, or one whose path is no module name, is an error naming the file
/// and the fix.
pub fn find_sources(crate_dir: &Path) -> Result<Sources, String> {
    let cuda_dir = crate_dir.join("cuda");
    let mut sources = Sources::default();
    let mut misplaced = Vec::new();
    let mut pending = vec![crate_dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let in_cuda = dir.starts_with(&cuda_dir);
        if in_cuda {
            sources.watch.push(dir.clone());
        }
        let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for entry in entries {
            let path = entry.map_err(|e| format!("{}: {e}", dir.display()))?.path();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            let extension = path.extension().and_then(|e| e.to_str());
            if in_cuda && extension == Some("cuh") {
                sources.watch.push(path);
            } else if extension == Some("cu") {
                if !in_cuda {
                    misplaced.push(path);
                    continue;
                }
                let relative = path.strip_prefix(&cuda_dir).expect("under cuda_dir");
                let module = module_name(relative).map_err(|why| {
                    format!(
                        "{}: {why}. Module names are the file's path under kernels/cuda without \
                         `.cu` (e.g. `buffer/dispatch`); rename the file or folder",
                        path.display()
                    )
                })?;
                sources.watch.push(path.clone());
                sources.modules.push(ModuleSource { module, path });
            }
        }
    }
    if !misplaced.is_empty() {
        let list: Vec<String> = misplaced
            .iter()
            .map(|p| format!("  - {}", p.display()))
            .collect();
        return Err(format!(
            "CUDA sources outside {} would not be compiled:\n{}\nMove them under kernels/cuda \
             (subfolders are fine: kernels/cuda/<folder>/<name>.cu is module <folder>/<name>)",
            cuda_dir.display(),
            list.join("\n")
        ));
    }
    sources.modules.sort_by(|a, b| a.module.cmp(&b.module));
    sources.watch.sort();
    Ok(sources)
}

/// The module name of `relative` (a `.cu` path relative to `kernels/cuda`), or why it has none.
pub fn module_name(relative: &Path) -> Result<String, String> {
    let stem = relative.with_extension("");
    let mut parts = Vec::new();
    for component in stem.components() {
        let Component::Normal(part) = component else {
            return Err(format!(
                "`{}` is not a plain relative path",
                relative.display()
            ));
        };
        let part = part.to_str().ok_or("the path is not valid UTF-8")?;
        if !is_identifier(part) {
            return Err(format!(
                "`{part}` cannot be part of a module name (use ASCII letters, digits and `_`, \
                 not starting with a digit)"
            ));
        }
        parts.push(part);
    }
    if parts.is_empty() {
        return Err("empty file name".into());
    }
    Ok(parts.join("/"))
}

fn is_identifier(part: &str) -> bool {
    let mut chars = part.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

// ELF constants for the parts of a cubin that name its kernels.
const ELF_MAGIC: &[u8; 4] = b"\x7fELF";
const ELFCLASS64: u8 = 2;
const ELFDATA2LSB: u8 = 1;
const SHT_SYMTAB: u32 = 2;
const STT_FUNC: u8 = 2;
const STB_GLOBAL: u8 = 1;
const STB_WEAK: u8 = 2;
/// `st_other` flag nvcc sets on kernels (`__global__` functions), not on device functions.
const STO_CUDA_ENTRY: u8 = 0x10;
const SECTION_HEADER_BYTES: usize = 64;
const SYMBOL_BYTES: usize = 24;

/// Names of the kernels (CUDA entry points) a cubin defines, in symbol-table order.
///
/// A cubin is a little-endian ELF64 file; in its `.symtab` a kernel is a defined function
/// symbol (`STT_FUNC`, global or weak binding) with `STO_CUDA_ENTRY` in `st_other`. Device
/// functions, NVSHMEM's included, are functions without that flag.
pub fn cubin_kernels(elf: &[u8]) -> Result<Vec<String>, String> {
    if elf.len() < 64 || &elf[..4] != ELF_MAGIC {
        return Err("not an ELF file".into());
    }
    if elf[4] != ELFCLASS64 || elf[5] != ELFDATA2LSB {
        return Err("not a little-endian ELF64 file (cubins are)".into());
    }
    let section_table = read_u64(elf, 0x28)? as usize;
    let section_count = read_u16(elf, 0x3C)? as usize;
    let section = |index: usize| -> Result<Section, String> {
        let at = section_table + index * SECTION_HEADER_BYTES;
        Ok(Section {
            kind: read_u32(elf, at + 4)?,
            offset: read_u64(elf, at + 24)? as usize,
            size: read_u64(elf, at + 32)? as usize,
            link: read_u32(elf, at + 40)? as usize,
        })
    };
    let mut kernels = Vec::new();
    for index in 0..section_count {
        let symbols = section(index)?;
        if symbols.kind != SHT_SYMTAB {
            continue;
        }
        let names = section(symbols.link)?;
        for at in (symbols.offset..symbols.offset + symbols.size).step_by(SYMBOL_BYTES) {
            let info = *elf
                .get(at + 4)
                .ok_or("symbol table past the end of the file")?;
            let other = *elf
                .get(at + 5)
                .ok_or("symbol table past the end of the file")?;
            let defined = read_u16(elf, at + 6)? != 0;
            let binding = info >> 4;
            let is_kernel = info & 0xF == STT_FUNC
                && (binding == STB_GLOBAL || binding == STB_WEAK)
                && other & STO_CUDA_ENTRY != 0
                && defined;
            if is_kernel {
                let name_at = names.offset + read_u32(elf, at)? as usize;
                kernels.push(read_c_string(elf, name_at, names.offset + names.size)?);
            }
        }
    }
    Ok(kernels)
}

struct Section {
    kind: u32,
    offset: usize,
    size: usize,
    link: usize,
}

fn read_bytes<const N: usize>(elf: &[u8], at: usize) -> Result<[u8; N], String> {
    elf.get(at..at + N)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| format!("truncated ELF file: {N} bytes at offset {at} are missing"))
}

fn read_u16(elf: &[u8], at: usize) -> Result<u16, String> {
    read_bytes(elf, at).map(u16::from_le_bytes)
}

fn read_u32(elf: &[u8], at: usize) -> Result<u32, String> {
    read_bytes(elf, at).map(u32::from_le_bytes)
}

fn read_u64(elf: &[u8], at: usize) -> Result<u64, String> {
    read_bytes(elf, at).map(u64::from_le_bytes)
}

/// The NUL-terminated string at `at`, which must end before `end` (its table's end).
fn read_c_string(elf: &[u8], at: usize, end: usize) -> Result<String, String> {
    let table = elf
        .get(at..end.min(elf.len()))
        .ok_or("symbol name outside its string table")?;
    let length = table
        .iter()
        .position(|&b| b == 0)
        .ok_or("unterminated symbol name")?;
    String::from_utf8(table[..length].to_vec()).map_err(|_| "symbol name is not UTF-8".into())
}
