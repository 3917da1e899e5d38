//! Raw FFI to NVSHMEM's host library, opened at run time.
//!
//! Nothing here links against NVSHMEM or CUDA: the workspace builds, and its CPU tests run, on
//! machines that have neither. [`load`] finds `libnvshmem_host.so.3`, resolves every symbol
//! this tutorial uses into a table of function pointers ([`Nvshmem`]), and refuses a library
//! whose version differs from the device library our kernels were linked with.
//!
//! The functions are the C API unchanged (names without the `nvshmem_`/`nvshmemx_` prefix);
//! the safe layer lives in the chapters. Every pointer argument documents where it lives.

mod discovery;
mod types;

pub use discovery::SearchedPlace;
pub use types::*;

use std::ffi::{c_int, c_long, c_uint, c_void};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The NVSHMEM release this project pins: host library, device library and headers must
/// all be this one (`nvshmemx_cumodule_init` copies a state struct whose layout changes
/// between releases, so a mismatch corrupts device state instead of failing cleanly).
pub const PINNED_VERSION: Version = Version {
    major: 3,
    minor: 4,
    patch: 5,
};

/// The command that installs the pinned library, quoted in every discovery error.
pub const INSTALL_HINT: &str = "pip install nvidia-nvshmem-cu13==3.4.5 (or run scripts/setup.sh), or set NVSHMEM_HOME to \
     a directory containing lib/libnvshmem_host.so.3";

/// A (major, minor, patch) release number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: i32,
    pub minor: i32,
    pub patch: i32,
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Why the host library could not be used.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LoadError {
    #[error(
        "libnvshmem_host.so.3 not found. Searched:\n{}\nFix: {INSTALL_HINT}",
        format_searched(.searched)
    )]
    NotFound { searched: Vec<SearchedPlace> },
    #[error("{path} could not be opened: {reason}. Fix: {INSTALL_HINT}")]
    Open { path: PathBuf, reason: String },
    #[error("{path} does not export `{symbol}` (is it NVSHMEM {PINNED_VERSION}?): {reason}")]
    MissingSymbol {
        path: PathBuf,
        symbol: &'static str,
        reason: String,
    },
    #[error(
        "NVSHMEM host library {path} is version {found}, but the kernels were linked against \
         device library {expected}; they must match exactly. Fix: {INSTALL_HINT}"
    )]
    VersionMismatch {
        path: PathBuf,
        found: Version,
        expected: Version,
    },
}

fn format_searched(searched: &[SearchedPlace]) -> String {
    searched
        .iter()
        .map(|place| format!("  - {place}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Declares the table of host functions once: the struct field, its C signature and the
/// symbol it is resolved from all come from one line each.
macro_rules! host_api {
    ($( $(#[$doc:meta])* fn $name:ident = $symbol:literal ($($arg:ident: $ty:ty),*) $(-> $ret:ty)?; )*) => {
        /// Function pointers into `libnvshmem_host.so.3`. Obtain it with [`load`].
        ///
        /// # Safety
        /// These are the raw C entry points: callers uphold NVSHMEM's contracts (initialised
        /// library, symmetric pointers where symmetric ones are required, a current CUDA
        /// context on the calling thread).
        pub struct Nvshmem {
            path: PathBuf,
            version: Version,
            // Keeps the mapping alive for the function pointers below (never unloaded).
            _library: libloading::Library,
            $( $(#[$doc])* pub $name: unsafe extern "C" fn($($ty),*) $(-> $ret)?, )*
        }

        impl Nvshmem {
            fn resolve(path: &Path, library: libloading::Library) -> Result<Self, LoadError> {
                $(
                    // SAFETY: the symbol's C signature is the one declared in the table.
                    let $name = unsafe {
                        *library
                            .get::<unsafe extern "C" fn($($ty),*) $(-> $ret)?>(concat!($symbol, "\0").as_bytes())
                            .map_err(|e| LoadError::MissingSymbol {
                                path: path.to_path_buf(),
                                symbol: $symbol,
                                reason: e.to_string(),
                            })?
                    };
                )*
                let mut table = Self {
                    path: path.to_path_buf(),
                    version: Version { major: 0, minor: 0, patch: 0 },
                    _library: library,
                    $($name,)*
                };
                table.version = table.query_version();
                Ok(table)
            }
        }
    };
}

// ANCHOR: host_api
host_api! {
    /// Version of the host library: (major, minor, patch) out-parameters on the host.
    fn vendor_get_version_info = "nvshmemx_vendor_get_version_info"(major: *mut c_int, minor: *mut c_int, patch: *mut c_int);
    /// Rank 0 only: fills a fresh unique id (host memory, 128 bytes).
    fn get_uniqueid = "nvshmemx_get_uniqueid"(id: *mut UniqueId) -> c_int;
    /// Writes (rank, n ranks, id) into an init attribute (both host memory).
    fn set_attr_uniqueid_args = "nvshmemx_set_attr_uniqueid_args"(myrank: c_int, nranks: c_int, id: *const UniqueId, attr: *mut InitAttr) -> c_int;
    /// Collective: initialises NVSHMEM on the calling thread's current CUDA context.
    fn hostlib_init_attr = "nvshmemx_hostlib_init_attr"(flags: c_uint, attr: *mut InitAttr) -> c_int;
    /// Collective: tears NVSHMEM down (frees the symmetric heap).
    fn hostlib_finalize = "nvshmemx_hostlib_finalize"();
    /// One of the `STATUS_*` constants.
    fn init_status = "nvshmemx_init_status"() -> c_int;
    fn my_pe = "nvshmem_my_pe"() -> c_int;
    fn n_pes = "nvshmem_n_pes"() -> c_int;
    fn team_my_pe = "nvshmem_team_my_pe"(team: Team) -> c_int;
    fn team_n_pes = "nvshmem_team_n_pes"(team: Team) -> c_int;
    /// Collective over `parent`: PEs start, start+stride, ... (size of them) form `new_team`.
    fn team_split_strided = "nvshmem_team_split_strided"(parent: Team, start: c_int, stride: c_int, size: c_int, config: *const TeamConfig, config_mask: c_long, new_team: *mut Team) -> c_int;
    /// Collective over `parent`: a 2-D grid of `xrange` columns. Each PE gets the x-axis team
    /// of its row (`xrange` consecutive PEs: a node) and the y-axis team of its column (PEs
    /// `xrange` apart: a rail). Null configs with masks 0 take the defaults.
    fn team_split_2d = "nvshmem_team_split_2d"(parent: Team, xrange: c_int, xaxis_config: *const TeamConfig, xaxis_mask: c_long, xaxis_team: *mut Team, yaxis_config: *const TeamConfig, yaxis_mask: c_long, yaxis_team: *mut Team) -> c_int;
    /// PE number `src_pe` of `src_team` as a PE number of `dest_team` (-1 if not a member).
    fn team_translate_pe = "nvshmem_team_translate_pe"(src_team: Team, src_pe: c_int, dest_team: Team) -> c_int;
    fn team_destroy = "nvshmem_team_destroy"(team: Team);
    /// Collective: device pointer into the symmetric heap (null on failure).
    fn malloc = "nvshmem_malloc"(num_bytes: usize) -> *mut c_void;
    /// Collective: like `malloc`, aligned to `alignment` bytes.
    fn align = "nvshmem_align"(alignment: usize, num_bytes: usize) -> *mut c_void;
    /// Collective: frees a pointer returned by `malloc`/`align`.
    fn free = "nvshmem_free"(ptr: *mut c_void);
    /// Load/store-able device address of symmetric `ptr` on `pe`, or null.
    fn ptr = "nvshmem_ptr"(ptr: *const c_void, pe: c_int) -> *mut c_void;
    /// Collective: host-blocking barrier across all PEs (also completes outstanding puts).
    fn barrier_all = "nvshmem_barrier_all"();
    /// Collective: barrier enqueued on a CUDA stream.
    fn barrier_all_on_stream = "nvshmemx_barrier_all_on_stream"(stream: CudaStream);
    /// Collective: sync (no completion of puts) enqueued on a stream.
    fn sync_all_on_stream = "nvshmemx_sync_all_on_stream"(stream: CudaStream);
    /// Completes every put issued by this PE on `stream` before later work on it.
    fn quiet_on_stream = "nvshmemx_quiet_on_stream"(stream: CudaStream);
    /// dest: symmetric device ptr on `pe`; source: local device ptr.
    fn putmem_on_stream = "nvshmemx_putmem_on_stream"(dest: *mut c_void, source: *const c_void, num_bytes: usize, pe: c_int, stream: CudaStream);
    fn putmem_nbi_on_stream = "nvshmemx_putmem_nbi_on_stream"(dest: *mut c_void, source: *const c_void, num_bytes: usize, pe: c_int, stream: CudaStream);
    /// dest: local device ptr; source: symmetric device ptr read on `pe`.
    fn getmem_on_stream = "nvshmemx_getmem_on_stream"(dest: *mut c_void, source: *const c_void, num_bytes: usize, pe: c_int, stream: CudaStream);
    fn getmem_nbi_on_stream = "nvshmemx_getmem_nbi_on_stream"(dest: *mut c_void, source: *const c_void, num_bytes: usize, pe: c_int, stream: CudaStream);
    /// Put, then update the symmetric u64 `signal` on `pe` with `signal_op` once the data landed.
    fn putmem_signal_on_stream = "nvshmemx_putmem_signal_on_stream"(dest: *mut c_void, source: *const c_void, num_bytes: usize, signal: *mut u64, signal_value: u64, signal_op: c_int, pe: c_int, stream: CudaStream);
    fn putmem_signal_nbi_on_stream = "nvshmemx_putmem_signal_nbi_on_stream"(dest: *mut c_void, source: *const c_void, num_bytes: usize, signal: *mut u64, signal_value: u64, signal_op: c_int, pe: c_int, stream: CudaStream);
    fn signal_op_on_stream = "nvshmemx_signal_op_on_stream"(signal: *mut u64, signal_value: u64, signal_op: c_int, pe: c_int, stream: CudaStream);
    /// Stalls `stream` until the local symmetric u64 `signal` compares true against `value`.
    fn signal_wait_until_on_stream = "nvshmemx_signal_wait_until_on_stream"(signal: *mut u64, cmp: c_int, value: u64, stream: CudaStream);
    /// Team collectives enqueued on a stream (NVSHMEM's own, beside chapter 4's kernels).
    /// Collective over `team`; `dest` and `source` are symmetric device pointers; each returns
    /// 0 on success. The reductions count elements: `dest` [num_elements] bf16 (reduce) or
    /// `dest` [num_elements] bf16 from `source` [num_elements x team size] (reducescatter).
    fn bfloat16_sum_reduce_on_stream = "nvshmemx_bfloat16_sum_reduce_on_stream"(team: Team, dest: *mut c_void, source: *const c_void, num_elements: usize, stream: CudaStream) -> c_int;
    fn bfloat16_sum_reducescatter_on_stream = "nvshmemx_bfloat16_sum_reducescatter_on_stream"(team: Team, dest: *mut c_void, source: *const c_void, num_elements: usize, stream: CudaStream) -> c_int;
    /// The `mem` forms count bytes per PE: fcollect gathers `num_bytes` from every PE into
    /// `dest` [team size x num_bytes]; alltoall sends block q of `source` [team size x
    /// num_bytes] to PE q; broadcast copies `root`'s `source` [num_bytes] into every `dest`.
    /// Collective over `team`: no member goes on until every member has arrived (no completion
    /// of puts). OpenSHMEM's collectives ask that every destination be ready before any PE
    /// calls them; this is how a caller says so.
    fn team_sync_on_stream = "nvshmemx_team_sync_on_stream"(team: Team, stream: CudaStream) -> c_int;
    fn fcollectmem_on_stream = "nvshmemx_fcollectmem_on_stream"(team: Team, dest: *mut c_void, source: *const c_void, num_bytes: usize, stream: CudaStream) -> c_int;
    fn alltoallmem_on_stream = "nvshmemx_alltoallmem_on_stream"(team: Team, dest: *mut c_void, source: *const c_void, num_bytes: usize, stream: CudaStream) -> c_int;
    fn broadcastmem_on_stream = "nvshmemx_broadcastmem_on_stream"(team: Team, dest: *mut c_void, source: *const c_void, num_bytes: usize, root: c_int, stream: CudaStream) -> c_int;
    /// Must be called on every module that uses NVSHMEM device calls, after loading it.
    fn cumodule_init = "nvshmemx_cumodule_init"(module: CuModule) -> c_int;
    fn cumodule_finalize = "nvshmemx_cumodule_finalize"(module: CuModule) -> c_int;
}
// ANCHOR_END: host_api

impl Nvshmem {
    /// Where the library was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn query_version(&self) -> Version {
        let (mut major, mut minor, mut patch) = (0, 0, 0);
        // SAFETY: returns compile-time constants; valid before initialisation.
        unsafe { (self.vendor_get_version_info)(&mut major, &mut minor, &mut patch) };
        Version {
            major,
            minor,
            patch,
        }
    }

    /// The host library's release.
    pub fn version(&self) -> Version {
        self.version
    }
}

impl std::fmt::Debug for Nvshmem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nvshmem")
            .field("path", &self.path)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

// SAFETY: the table holds plain function pointers into a library that is never unloaded;
// NVSHMEM itself serialises what needs serialising.
unsafe impl Send for Nvshmem {}
unsafe impl Sync for Nvshmem {}

static LIBRARY: OnceLock<Result<Nvshmem, LoadError>> = OnceLock::new();

// ANCHOR: load
/// Opens the host library once per process and checks it is the `expected` release (the
/// device library the kernels were linked with). Later calls return the same table.
pub fn load(expected: Version) -> Result<&'static Nvshmem, LoadError> {
    let library = LIBRARY
        .get_or_init(|| {
            let path = discovery::find_host_library()?;
            open(&path)
        })
        .as_ref()
        .map_err(Clone::clone)?;
    if library.version != expected {
        return Err(LoadError::VersionMismatch {
            path: library.path.clone(),
            found: library.version,
            expected,
        });
    }
    Ok(library)
}
// ANCHOR_END: load

/// Opens one specific file as the host library and resolves the whole table.
pub fn open(path: &Path) -> Result<Nvshmem, LoadError> {
    // SAFETY: loading runs the library's initialisers, which only set up NVSHMEM's own
    // globals; nothing else in the process depends on them.
    let library = unsafe { libloading::Library::new(path) }.map_err(|e| LoadError::Open {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    Nvshmem::resolve(path, library)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_id_round_trips_through_bytes() {
        let mut id = UniqueId::new();
        for (i, b) in id.internal.iter_mut().enumerate() {
            *b = (i * 7 + 3) as u8;
        }
        let bytes = id.to_bytes();
        assert_eq!(bytes.len(), 128);
        assert_eq!(UniqueId::from_bytes(&bytes), id);
    }

    #[test]
    fn versioned_structs_carry_their_size() {
        // NVSHMEM checks `(1 << 16) + sizeof` in each nested struct.
        let attr = InitAttr::new();
        assert_eq!(attr.version, (1 << 16) + 144);
        assert_eq!(attr.args.version, (1 << 16) + 128);
        assert_eq!(attr.args.uid_args.version, (1 << 16) + 24);
        assert_eq!(UniqueId::new().version, (1 << 16) + 128);
    }

    #[test]
    fn field_offsets_match_the_c_headers() {
        assert_eq!(std::mem::offset_of!(InitAttr, mpi_comm), 8);
        assert_eq!(std::mem::offset_of!(InitAttr, args), 16);
        assert_eq!(std::mem::offset_of!(InitArgs, uid_args), 8);
        assert_eq!(std::mem::offset_of!(InitArgs, content), 32);
        assert_eq!(std::mem::offset_of!(UniqueIdArgs, id), 8);
        assert_eq!(std::mem::offset_of!(UniqueIdArgs, myrank), 16);
    }

    #[test]
    fn a_file_that_is_not_a_library_is_an_open_error() {
        let dir = std::env::temp_dir().join(format!("nvshmem-sys-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("libnvshmem_host.so.3");
        std::fs::write(&path, b"definitely not ELF").unwrap();
        let err = open(&path).unwrap_err();
        assert!(matches!(err, LoadError::Open { .. }), "{err}");
        assert!(
            err.to_string()
                .contains("pip install nvidia-nvshmem-cu13==3.4.5"),
            "{err}"
        );
    }

    #[test]
    fn version_mismatch_names_both_versions() {
        let err = LoadError::VersionMismatch {
            path: "/x/libnvshmem_host.so.3".into(),
            found: Version {
                major: 3,
                minor: 3,
                patch: 24,
            },
            expected: PINNED_VERSION,
        };
        let msg = err.to_string();
        assert!(msg.contains("3.3.24") && msg.contains("3.4.5"), "{msg}");
    }
}
