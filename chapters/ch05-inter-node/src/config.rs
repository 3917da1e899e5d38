//! Tunables and limits of chapter 5, in one place.

/// Most PEs of one node: the node's chapter-4 communicator spans at most this many.
pub use kernels::contract::MAX_PES as MAX_NODE_PES;
/// The limits the RMA kernels share with the host (kernels/contract/defs.rs): `MAX_GROUP`
/// members per RMA group (nodes of a rail, or PEs of a flat call), `MAX_RMA_BLOCKS` blocks
/// per RMA launch, `RMA_THREADS` threads per block.
pub use kernels::contract::{MAX_GROUP, MAX_RMA_BLOCKS, RMA_STEPS, RMA_THREADS};

/// Environment variable that makes nodes smaller than the real ones: `NVSHMEM_TUTORIAL_NODE_PES=2`
/// cuts every node into virtual nodes of 2 PEs, so that one host runs the code paths of several
/// nodes. It must divide the node size (torchrun's LOCAL_WORLD_SIZE, or NVSHMEM's node team).
pub const NODE_PES_VAR: &str = "NVSHMEM_TUTORIAL_NODE_PES";

/// Default bound on every in-kernel wait. Across nodes a peer may be slower to arrive than
/// over NVLink, but one that never comes must not hang the job.
pub const DEFAULT_TIMEOUT_MS: u64 = 10_000;
/// Default bytes of each of the two staging buffers the hierarchical algorithms keep (stage A
/// and stage B): the largest all-gather they take is this many bytes of output per PE.
pub const DEFAULT_STAGE_BYTES: usize = 64 << 20;
/// Default landing space of an RMA group (reduce-scatter parts, all-to-all-v slots).
pub const DEFAULT_SCRATCH_BYTES: usize = 64 << 20;

/// How a topology is sized and bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InterNodeConfig {
    /// Bound on every in-kernel wait, in milliseconds (node and rail alike).
    pub timeout_ms: u64,
    /// Bytes of each staging buffer of the hierarchical algorithms.
    pub stage_bytes: usize,
    /// Landing space of the rail group (hierarchical reduce-scatter, all-reduce, all-to-all-v).
    pub rail_scratch_bytes: usize,
    /// Landing space of the world group (the flat reduce-scatter and all-reduce).
    pub world_scratch_bytes: usize,
    /// Largest per-peer payload of the node communicator's LL algorithms (chapter 4).
    pub ll_max_bytes: usize,
}

impl Default for InterNodeConfig {
    fn default() -> Self {
        Self {
            timeout_ms: DEFAULT_TIMEOUT_MS,
            stage_bytes: DEFAULT_STAGE_BYTES,
            rail_scratch_bytes: DEFAULT_SCRATCH_BYTES,
            world_scratch_bytes: DEFAULT_SCRATCH_BYTES,
            ll_max_bytes: ch04_collectives::config::DEFAULT_LL_MAX_BYTES,
        }
    }
}
