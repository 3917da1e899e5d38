//! C types of the NVSHMEM 3.4 host ABI, laid out exactly as the headers define them.
//!
//! The sizes are part of the ABI: NVSHMEM versions its structs by writing
//! `(1 << 16) + sizeof(struct)` into their first field, and refuses a struct whose size it
//! does not know. The `const` asserts at the bottom fail the build if a field is added or
//! moved by mistake.

use std::ffi::{c_int, c_void};

/// Bytes of opaque payload inside a unique id (`UNIQUEID_PADDING` in `nvshmem_uniqueid.h`).
pub const UNIQUEID_PADDING: usize = 124;
/// Padding at the end of `nvshmemx_init_args_t` (`INIT_ARGS_PADDING`).
pub const INIT_ARGS_PADDING: usize = 96;

/// `nvshmemx_uniqueid_t`: the 128-byte token rank 0 creates and every other rank must receive
/// before NVSHMEM can initialise. It carries rank 0's bootstrap address, so it is only
/// meaningful for one job.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId {
    pub version: c_int,
    pub internal: [u8; UNIQUEID_PADDING],
}

/// `nvshmemx_uniqueid_args_t`: (id, my rank, number of ranks) as the init call reads them.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueIdArgs {
    pub version: c_int,
    pub id: *mut UniqueId,
    pub myrank: c_int,
    pub nranks: c_int,
}

/// `nvshmemx_init_args_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct InitArgs {
    pub version: c_int,
    pub uid_args: UniqueIdArgs,
    pub content: [u8; INIT_ARGS_PADDING],
}

/// `nvshmemx_init_attr_t`: what `nvshmemx_hostlib_init_attr` takes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct InitAttr {
    pub version: c_int,
    pub mpi_comm: *mut c_void,
    pub args: InitArgs,
}

/// `nvshmem_team_config_t` (v2): opaque here; we always pass a null config with mask 0.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct TeamConfig {
    pub bytes: [u8; 64],
}

/// The version header every versioned struct carries: `(1 << 16) + sizeof(T)`.
const fn struct_version<T>() -> c_int {
    (1 << 16) + std::mem::size_of::<T>() as c_int
}

impl UniqueId {
    /// `NVSHMEMX_UNIQUEID_INITIALIZER`: a zeroed id with its version stamped.
    pub const fn new() -> Self {
        Self {
            version: struct_version::<UniqueId>(),
            internal: [0; UNIQUEID_PADDING],
        }
    }

    /// The id as the 128 bytes that travel between processes.
    pub fn to_bytes(&self) -> [u8; UNIQUE_ID_BYTES] {
        let mut out = [0u8; UNIQUE_ID_BYTES];
        out[..4].copy_from_slice(&self.version.to_ne_bytes());
        out[4..].copy_from_slice(&self.internal);
        out
    }

    /// Rebuilds an id from the 128 bytes produced by [`UniqueId::to_bytes`].
    pub fn from_bytes(bytes: &[u8; UNIQUE_ID_BYTES]) -> Self {
        let mut internal = [0u8; UNIQUEID_PADDING];
        internal.copy_from_slice(&bytes[4..]);
        Self {
            version: c_int::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
            internal,
        }
    }
}

impl Default for UniqueId {
    fn default() -> Self {
        Self::new()
    }
}

impl UniqueId {
    /// A stable 64-bit hash (FNV-1a) of the id: equal on every PE of a job, different
    /// between jobs. Short enough for a human to compare in logs.
    pub fn fingerprint(&self) -> u64 {
        self.to_bytes().iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        })
    }
}

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The payload is an address blob; the fingerprint is what a human can compare.
        write!(
            f,
            "UniqueId {{ version: {:#x}, fingerprint: {:016x} }}",
            self.version,
            self.fingerprint()
        )
    }
}

impl InitAttr {
    /// `NVSHMEMX_INIT_ATTR_INITIALIZER`: every nested struct carries its version, ids unset.
    pub const fn new() -> Self {
        Self {
            version: struct_version::<InitAttr>(),
            mpi_comm: std::ptr::null_mut(),
            args: InitArgs {
                version: struct_version::<InitArgs>(),
                uid_args: UniqueIdArgs {
                    version: struct_version::<UniqueIdArgs>(),
                    id: std::ptr::null_mut(),
                    myrank: -1,
                    nranks: -1,
                },
                content: [0; INIT_ARGS_PADDING],
            },
        }
    }
}

impl Default for InitAttr {
    fn default() -> Self {
        Self::new()
    }
}

/// Size of a serialized unique id on the wire.
pub const UNIQUE_ID_BYTES: usize = 128;

// ANCHOR: abi_asserts
const _: () = assert!(std::mem::size_of::<UniqueId>() == 128);
const _: () = assert!(std::mem::size_of::<UniqueIdArgs>() == 24);
const _: () = assert!(std::mem::size_of::<InitArgs>() == 128);
const _: () = assert!(std::mem::size_of::<InitAttr>() == 144);
const _: () = assert!(std::mem::size_of::<TeamConfig>() == 64);
// ANCHOR_END: abi_asserts

/// `nvshmem_team_t`.
pub type Team = i32;
/// `NVSHMEM_TEAM_INVALID`.
pub const TEAM_INVALID: Team = -1;
/// `NVSHMEM_TEAM_WORLD`: every PE of the job.
pub const TEAM_WORLD: Team = 0;
/// `NVSHMEM_TEAM_SHARED`: PEs whose memory this PE can address with loads and stores.
pub const TEAM_SHARED: Team = 1;
/// `NVSHMEMX_TEAM_NODE`: PEs on this host.
pub const TEAM_NODE: Team = 2;
/// `NVSHMEMI_TEAM_SAME_GPU`: PEs that share this PE's GPU (more than one when PEs are folded
/// onto fewer GPUs). NVSHMEM makes it at init beside the public teams; its handle is the
/// internal enum value of `device_host/nvshmem_common.cuh` in 3.4.5, which is why the
/// library's version is pinned and `World` checks the size it reports.
pub const TEAM_SAME_GPU: Team = 4;

/// `NVSHMEMX_INIT_WITH_UNIQUEID`.
pub const INIT_WITH_UNIQUEID: u32 = 1 << 3;

/// `nvshmemx_init_status_t`.
pub const STATUS_NOT_INITIALIZED: c_int = 0;
pub const STATUS_IS_BOOTSTRAPPED: c_int = 1;
pub const STATUS_IS_INITIALIZED: c_int = 2;

/// `nvshmemx_signal_op_t`.
pub const SIGNAL_SET: c_int = 9;
pub const SIGNAL_ADD: c_int = 10;

/// `nvshmemx_cmp_type_t`.
pub const CMP_EQ: c_int = 0;
pub const CMP_NE: c_int = 1;
pub const CMP_GT: c_int = 2;
pub const CMP_LE: c_int = 3;
pub const CMP_LT: c_int = 4;
pub const CMP_GE: c_int = 5;

/// `cudaStream_t` / `CUstream`: the runtime and driver stream handles are the same pointer.
pub type CudaStream = *mut c_void;
/// `CUmodule`.
pub type CuModule = *mut c_void;
