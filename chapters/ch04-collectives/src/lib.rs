//! Chapter 4: collectives inside one node, from nothing but chapters 2 and 3: symmetric
//! buffers, peer pointers, stores and signal words.
//!
//! - [`Communicator`] owns a small symmetric workspace (flags and scratch) and numbers its
//!   calls on the device, so the same flags serve call after call with no reset, no host
//!   synchronisation, and CUDA-graph replay (coll_common.cuh tells the protocol).
//! - Each collective has a latency algorithm and a bandwidth algorithm (all-gather also a
//!   ring); [`algorithm::SIZE_TABLE`] picks by size from this chapter's measurements.
//! - [`communicator`] holds the raw calls (device addresses and a stream, for Python),
//!   [`typed`] the same calls on `SymmetricBuffer`s, [`reference`] the host references the
//!   example checks against.
//! - [`team`] is NVSHMEM's own collectives (team-based, on a stream): what to use when a
//!   collective need not live inside your kernel, and the peer the benchmark compares with.

pub mod algorithm;
pub mod communicator;
pub mod config;
pub mod error;
pub mod launch;
pub mod reference;
pub mod team;
pub mod typed;
pub mod workspace;

pub use algorithm::{Algorithm, Collective, DType, Plan, SIZE_TABLE, choose};
pub use communicator::{Communicator, Reducible};
pub use config::CollectivesConfig;
pub use error::{CollError, DeviceFailure, DeviceFailureKind};
pub use launch::{Kernels, LaunchSpec};
pub use workspace::{HostMapped, Workspace};
