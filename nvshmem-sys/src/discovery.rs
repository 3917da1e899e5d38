//! Where `libnvshmem_host.so.3` is looked for, in order:
//!
//! 1. `$NVSHMEM_HOME/lib` (an explicit choice always wins);
//! 2. the active virtualenv (`$VIRTUAL_ENV`) and this project's `.venv`, where
//!    `scripts/setup.sh` installs the pinned `nvidia-nvshmem-cu13` wheel;
//! 3. the `nvidia/nvshmem/lib` folder of whatever `python3` is on the PATH (PyTorch images
//!    ship the wheel there);
//! 4. the system loader path (`LD_LIBRARY_PATH`, `ldconfig`).
//!
//! Each miss is recorded so the final error can list every place that was tried.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::LoadError;

pub const HOST_LIBRARY: &str = "libnvshmem_host.so.3";
/// Asking Python where its wheel lives must not hang a program that never needed Python.
const PYTHON_PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// One place that was tried, for the error message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchedPlace {
    /// Why this place is on the list (`NVSHMEM_HOME`, `project .venv`, ...).
    pub source: String,
    /// The file that was looked for, or `None` when the source itself was absent.
    pub path: Option<PathBuf>,
    pub outcome: String,
}

impl std::fmt::Display for SearchedPlace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.path {
            Some(path) => write!(f, "{}: {} ({})", self.source, path.display(), self.outcome),
            None => write!(f, "{}: {}", self.source, self.outcome),
        }
    }
}

/// A candidate directory and why it is a candidate.
#[derive(Debug, Clone)]
pub(crate) struct Candidate {
    pub source: String,
    pub dir: Option<PathBuf>,
    pub note_if_absent: String,
}

/// The candidate directories in search order (without touching the file system beyond
/// globbing site-packages and asking Python).
pub(crate) fn candidates() -> Vec<Candidate> {
    let mut out = Vec::new();
    let home = std::env::var_os("NVSHMEM_HOME").map(PathBuf::from);
    out.push(Candidate {
        source: "NVSHMEM_HOME".into(),
        dir: home.map(|h| h.join("lib")),
        note_if_absent: "not set".into(),
    });
    let active_venv = std::env::var_os("VIRTUAL_ENV").map(PathBuf::from);
    out.push(Candidate {
        source: "active virtualenv ($VIRTUAL_ENV)".into(),
        dir: active_venv.and_then(|v| site_packages_nvshmem(&v)),
        note_if_absent: "not set, or it has no nvidia/nvshmem/lib".into(),
    });
    // The project root, fixed at compile time: binaries run from the checkout find the
    // wheel scripts/setup.sh installed without any environment variable.
    let project_venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv");
    out.push(Candidate {
        source: format!("project virtualenv ({})", project_venv.display()),
        dir: site_packages_nvshmem(&project_venv),
        note_if_absent: "absent, or it has no nvidia/nvshmem/lib".into(),
    });
    out.push(Candidate {
        source: "python3 on PATH (import nvidia.nvshmem)".into(),
        dir: python_nvshmem_lib(),
        note_if_absent: "python3 missing or the nvidia-nvshmem-cu13 wheel is not installed".into(),
    });
    out
}

/// `<venv>/lib/python3.*/site-packages/nvidia/nvshmem/lib`, whichever Python minor it holds.
fn site_packages_nvshmem(venv: &Path) -> Option<PathBuf> {
    let lib = venv.join("lib");
    let mut pythons: Vec<PathBuf> = std::fs::read_dir(&lib)
        .ok()?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("python3"))
        })
        .collect();
    pythons.sort();
    pythons
        .into_iter()
        .map(|p| p.join("site-packages/nvidia/nvshmem/lib"))
        .find(|p| p.is_dir())
}

/// Asks `python3` where `nvidia.nvshmem` is installed, bounded by a timeout.
fn python_nvshmem_lib() -> Option<PathBuf> {
    let python = std::env::var_os("PYTHON").unwrap_or_else(|| "python3".into());
    let mut child = Command::new(python)
        .args([
            "-c",
            "import nvidia.nvshmem as m; print(list(m.__path__)[0])",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let deadline = Instant::now() + PYTHON_PROBE_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => break,
            Ok(Some(_)) | Err(_) => return None,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    let output = child.wait_with_output().ok()?;
    let dir = String::from_utf8(output.stdout).ok()?;
    Some(PathBuf::from(dir.trim()).join("lib"))
}

/// Tries the candidates in order, then the system loader; returns the first library found.
pub(crate) fn find_host_library() -> Result<PathBuf, LoadError> {
    find_in(&candidates(), system_loader_has_library)
}

/// Checks each candidate for the library; `system_has` stands for the dynamic loader's own
/// search (a function so tests can replace it).
pub(crate) fn find_in(
    candidates: &[Candidate],
    system_has: impl Fn() -> Result<(), String>,
) -> Result<PathBuf, LoadError> {
    let mut searched = Vec::new();
    for candidate in candidates {
        match &candidate.dir {
            Some(dir) => {
                let path = dir.join(HOST_LIBRARY);
                if path.is_file() {
                    return Ok(path);
                }
                searched.push(SearchedPlace {
                    source: candidate.source.clone(),
                    path: Some(path),
                    outcome: "no such file".into(),
                });
            }
            None => searched.push(SearchedPlace {
                source: candidate.source.clone(),
                path: None,
                outcome: candidate.note_if_absent.clone(),
            }),
        }
    }
    match system_has() {
        Ok(()) => Ok(PathBuf::from(HOST_LIBRARY)),
        Err(reason) => {
            searched.push(SearchedPlace {
                source: "system loader (LD_LIBRARY_PATH, ldconfig)".into(),
                path: Some(PathBuf::from(HOST_LIBRARY)),
                outcome: reason,
            });
            Err(LoadError::NotFound { searched })
        }
    }
}

fn system_loader_has_library() -> Result<(), String> {
    // SAFETY: see `load`; a successful probe leaves the library mapped, which the real load
    // reuses.
    unsafe { libloading::Library::new(HOST_LIBRARY) }
        .map(drop)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(source: &str, dir: Option<&Path>) -> Candidate {
        Candidate {
            source: source.into(),
            dir: dir.map(Path::to_path_buf),
            note_if_absent: "not set".into(),
        }
    }

    #[test]
    fn missing_everywhere_lists_every_place_and_the_fix() {
        let tmp = std::env::temp_dir().join(format!("nvshmem-sys-empty-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        let err = find_in(
            &[
                candidate("NVSHMEM_HOME", Some(&tmp)),
                candidate("project virtualenv", None),
            ],
            || Err("cannot open shared object file".into()),
        )
        .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(&tmp.join(HOST_LIBRARY).display().to_string()),
            "{msg}"
        );
        assert!(msg.contains("project virtualenv: not set"), "{msg}");
        assert!(msg.contains("system loader"), "{msg}");
        assert!(
            msg.contains("pip install nvidia-nvshmem-cu13==3.4.5"),
            "{msg}"
        );
        assert!(msg.contains("NVSHMEM_HOME"), "{msg}");
    }

    #[test]
    fn first_candidate_that_has_the_file_wins() {
        let base = std::env::temp_dir().join(format!("nvshmem-sys-found-{}", std::process::id()));
        let (first, second) = (base.join("a"), base.join("b"));
        std::fs::create_dir_all(&first).unwrap();
        std::fs::create_dir_all(&second).unwrap();
        std::fs::write(second.join(HOST_LIBRARY), b"stand-in").unwrap();
        let found = find_in(
            &[
                candidate("first", Some(&first)),
                candidate("second", Some(&second)),
            ],
            || panic!("the system loader must not be asked when a candidate has the file"),
        )
        .unwrap();
        assert_eq!(found, second.join(HOST_LIBRARY));
    }
}
