//! Chapter 1: bootstrap.
//!
//! Two things happen before any GPU can talk to another:
//!
//! 1. **Bootstrapping**: the processes find each other and agree on one secret, NVSHMEM's
//!    128-byte unique id. Rank 0 creates it; [`rendezvous`] carries it to every other rank
//!    over TCP, using the address torchrun already gives every process ([`launch_env`]).
//! 2. **Initialisation**: each process calls `nvshmemx_hostlib_init_attr` with the id on its
//!    own GPU. NVSHMEM then connects the PEs itself, maps every GPU's symmetric heap into
//!    the others' address space where NVLink allows, and returns. [`World`] owns that state
//!    and finalises it on drop.

pub mod checks;
pub mod launch_env;
pub mod placement;
pub mod rendezvous;
pub mod world;

pub use launch_env::{EnvError, LaunchEnv};
pub use placement::{NvshmemPlace, Placement, check_placement};
pub use rendezvous::{RendezvousConfig, RendezvousError};
pub use world::{
    InitSpec, World, create_unique_id, load_library, probe_driver, share_unique_id, sm_share,
};

/// Everything that can stop a process from joining the job.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error(transparent)]
    Env(#[from] EnvError),
    #[error("unique-id rendezvous failed: {0}")]
    Rendezvous(#[from] RendezvousError),
    #[error("received a {len}-byte unique id; NVSHMEM's is exactly 128 bytes (mixed builds?)")]
    BadUniqueId { len: usize },
    #[error(transparent)]
    Library(#[from] nvshmem_sys::LoadError),
    #[error(transparent)]
    Kernel(#[from] kernels::KernelError),
    #[error(
        "no NVIDIA driver: libcuda.so.1 could not be opened ({0}). This step needs a GPU \
         machine with a driver for CUDA 13.0"
    )]
    NoDriver(String),
    #[error(
        "GPU {ordinal} requested (LOCAL_RANK) but only {count} visible; check \
         CUDA_VISIBLE_DEVICES and --nproc_per_node"
    )]
    NoSuchGpu { ordinal: usize, count: usize },
    #[error("CUDA driver error while {what}: {source}")]
    Cuda {
        what: &'static str,
        #[source]
        source: cudarc::driver::DriverError,
    },
    #[error("NVSHMEM: {0}")]
    Nvshmem(String),
    #[error("NVSHMEM is already initialised in this process; keep one World and share it")]
    AlreadyInitialized,
}

impl BootstrapError {
    /// Wraps a driver error with what we were doing.
    pub fn cuda(what: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> Self {
        move |source| Self::Cuda { what, source }
    }
}
