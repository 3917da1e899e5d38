//! Chapter 5: collectives across nodes, from chapter 4's kernels inside a node and NVSHMEM's
//! RMA calls between nodes.
//!
//! - [`layout`]: nodes of G consecutive PEs, rails (one PE per node), and which pairs may use a
//!   peer pointer; [`layout::resolve_node_pes`] takes G from torchrun or NVSHMEM, smaller from
//!   `NVSHMEM_TUTORIAL_NODE_PES` (virtual nodes: one host shows the paths of several nodes).
//! - [`teams`]: NVSHMEM's node and rail teams (`nvshmem_team_split_2d`), checked with
//!   `nvshmem_team_translate_pe`, destroyed on drop.
//! - [`routes`]: who gets a peer pointer (a node's PEs, no one else), and the tests that prove
//!   no cross-node path is handed one.
//! - [`rma`]: an RMA group (this PE's rail, or every PE): symmetric flags and landing space for
//!   the kernels of `kernels/cuda/rma_*.cu`, which cross nodes with put-with-signal only.
//! - [`plan`]: the hierarchical algorithms as plans of node, rail and local steps, pure
//!   functions that the CPU tests run on a host model (`model.rs`).
//! - [`topology`]: `Topology`, which owns all of the above; [`calls`]: its collectives, each
//!   three ways ([`method`]): hierarchical, the same plan on NVSHMEM's team collectives, flat;
//!   [`exec`]: how a plan's steps run.
//! - [`reference`]: the host references, with the hierarchical order of sums.

pub mod calls;
pub mod config;
pub mod error;
pub mod exec;
pub mod layout;
pub mod method;
pub mod plan;
pub mod reference;
pub mod rma;
pub mod routes;
pub mod teams;
pub mod topology;

#[cfg(test)]
mod model;

pub use config::{InterNodeConfig, NODE_PES_VAR};
pub use error::{InterNodeError, RemoteFailure};
pub use layout::{Layout, Route, Strided, resolve_node_pes};
pub use method::{Method, check_call};
pub use plan::{Buf, Plan, Scope, Step};
pub use topology::Topology;
