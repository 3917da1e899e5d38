//! What a buffer is made with (`BufferOptions`) and what a plan knows of a made buffer
//! (`BufferSpec`): its options, its PE, and where its parts live on this PE, as plain numbers.
//! The plans (`plan_layout`, `plan_notify`, `plan_dispatch`, `plan_combine`,
//! `plan_ll_dispatch`, `plan_ll_combine`) take a spec instead of a live buffer, so every check
//! they make is reached by CPU tests (src/bad_inputs.rs) with a spec of made-up addresses.

use ch04_collectives::config::MAX_PES;
use kernels::contract::{InputError, LlRegion, LlTopology, MAX_CHANNELS, MAX_LL_RANKS};

use crate::config::MAX_NORMAL_RANKS;
use crate::error::BufferError;
use crate::internode_notify::NotifyArea;
use crate::low_latency::regions::LlRegions;
use crate::regions::Regions;

/// Default bound on every wait, on the device and on the host, in milliseconds: long enough
/// for a rank that pauses (a checkpoint save, a compilation) to catch up, as DeepEP's 100 s.
pub const DEFAULT_TIMEOUT_MS: u64 = 100_000;

/// How a buffer is made (DeepEP's constructor arguments that matter inside one node).
///
/// A buffer made with `low_latency_mode` across nodes (up to `MAX_NORMAL_RANKS` ranks) serves
/// both modes, as DeepEP's: its normal calls across nodes (`internode_notify_raw` and the rest)
/// and its low-latency calls share `num_rdma_bytes` (src/mode_sharing/): size it with
/// `mode_sharing::rdma_size_hint_for_both_modes`, the larger of the two modes' hints, and call
/// `clean_low_latency_buffer` between a normal call and the next low-latency one (refused
/// without it). Low latency to normal needs nothing: a normal call's notify is a barrier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferOptions {
    /// Bytes of the rings of normal mode (a multiple of 128).
    pub num_nvl_bytes: usize,
    /// Bytes of the rdma region: normal mode's staging and landing rings across nodes, the
    /// low-latency region, or both in the same bytes for a low-latency buffer across nodes
    /// (src/mode_sharing/).
    pub num_rdma_bytes: usize,
    pub low_latency_mode: bool,
    /// Bound on every wait, device and host, in milliseconds.
    pub timeout_ms: u64,
}

impl BufferOptions {
    /// A normal-mode buffer with rings of `num_nvl_bytes`.
    pub fn normal(num_nvl_bytes: usize) -> Self {
        Self {
            num_nvl_bytes,
            num_rdma_bytes: 0,
            low_latency_mode: false,
            timeout_ms: DEFAULT_TIMEOUT_MS,
        }
    }

    /// A low-latency buffer with a region of `num_rdma_bytes`
    /// (`get_low_latency_rdma_size_hint`).
    pub fn low_latency(num_rdma_bytes: usize) -> Self {
        Self {
            num_nvl_bytes: 0,
            num_rdma_bytes,
            low_latency_mode: true,
            timeout_ms: DEFAULT_TIMEOUT_MS,
        }
    }

    /// `check_nodes` for a job of one node.
    pub fn check(&self, n_pes: usize) -> Result<(), BufferError> {
        self.check_nodes(n_pes, n_pes)
    }

    /// DeepEP's checks on the sizes, and ours on the mode, the rank count, the node size
    /// (`node_pes`, chapter 5's G: the ranks that reach each other by peer pointers) and the
    /// timeout.
    // ANCHOR: rank_limits
    pub fn check_nodes(&self, n_pes: usize, node_pes: usize) -> Result<(), BufferError> {
        let invalid = |m: String| Err(BufferError::invalid("Buffer", m));
        if !self.num_nvl_bytes.is_multiple_of(128) || !self.num_rdma_bytes.is_multiple_of(128) {
            return invalid(format!(
                "num_nvl_bytes ({}) and num_rdma_bytes ({}) must be multiples of 128",
                self.num_nvl_bytes, self.num_rdma_bytes
            ));
        }
        if self.num_rdma_bytes > 0 && !self.low_latency_mode && n_pes <= node_pes {
            return invalid(
                "num_rdma_bytes > 0 outside low-latency mode asks for inter-node normal mode, \
                 which needs ranks on several nodes: on one node pass num_rdma_bytes=0, or \
                 low_latency_mode=True"
                    .into(),
            );
        }
        if node_pes == 0 || node_pes > MAX_PES || !n_pes.is_multiple_of(node_pes) {
            return invalid(format!(
                "nodes of {node_pes} ranks in a job of {n_pes}: a node holds 1 to MAX_PES = \
                 {MAX_PES} ranks (one NVLink domain) and the nodes must tile the job; set \
                 NVSHMEM_TUTORIAL_NODE_PES to a divisor of the node size"
            ));
        }
        if self.low_latency_mode && n_pes > MAX_LL_RANKS {
            return invalid(format!(
                "{n_pes} ranks: low-latency mode runs up to MAX_LL_RANKS = {MAX_LL_RANKS} ranks"
            ));
        }
        // Across nodes, normal mode has its notify step, a dispatch and a combine
        // (internode_notify, internode_dispatch, internode_combine); chapter 7's plans refuse
        // such a buffer (checks::one_node).
        if !self.low_latency_mode && n_pes > node_pes && self.num_rdma_bytes == 0 {
            return invalid(format!(
                "{n_pes} ranks in {} nodes of {node_pes}: with num_rdma_bytes = 0 normal mode \
                 runs inside one node (up to MAX_PES = {MAX_PES} ranks); across nodes (up to \
                 MAX_NORMAL_RANKS = {MAX_NORMAL_RANKS}) it needs num_rdma_bytes > 0 \
                 (Config::get_buffer_size_hints_for_nodes), and has its notify step, a bf16 \
                 dispatch and combine. Use low_latency_mode=True (up to {MAX_LL_RANKS} ranks, any nodes), or run \
                 one node (unset NVSHMEM_TUTORIAL_NODE_PES, at most {MAX_PES} ranks)",
                n_pes / node_pes
            ));
        }
        if !self.low_latency_mode && n_pes > MAX_NORMAL_RANKS {
            return invalid(format!(
                "{n_pes} ranks: normal mode across nodes runs up to MAX_NORMAL_RANKS = \
                 {MAX_NORMAL_RANKS} ranks (DeepEP's EP16-EP64); use low_latency_mode=True (up to \
                 {MAX_LL_RANKS} ranks)"
            ));
        }
        check_timeout_ms(self.timeout_ms)
    }
    // ANCHOR_END: rank_limits
}

/// Whether a buffer made with `options` on `n_pes` ranks in nodes of `node_pes` has the
/// internode notify's area: an rdma region across nodes, up to MAX_NORMAL_RANKS ranks, in
/// normal mode or in low-latency mode (whose buffer then serves normal calls too, as DeepEP's:
/// src/mode_sharing/). A low-latency buffer of more ranks has its low-latency calls only.
pub fn options_need_notify_area(options: &BufferOptions, n_pes: usize, node_pes: usize) -> bool {
    n_pes > node_pes && n_pes <= MAX_NORMAL_RANKS && options.num_rdma_bytes > 0
}

/// The world ranks of `my_pe`'s node in nodes of `node_pes`: the members of the buffer's
/// communicator, the only ranks NVSHMEM is asked a peer pointer for.
pub fn node_members(my_pe: usize, node_pes: usize) -> Vec<usize> {
    let start = my_pe / node_pes * node_pes;
    (start..start + node_pes).collect()
}

/// Bounds on a wait's timeout: at least 1 ms, and at most a day (the device counts it in SM
/// clock cycles, which must not overflow).
pub fn check_timeout_ms(timeout_ms: u64) -> Result<(), BufferError> {
    const DAY_MS: u64 = 24 * 3600 * 1000;
    if timeout_ms == 0 || timeout_ms > DAY_MS {
        return Err(BufferError::invalid(
            "Buffer",
            format!(
                "timeout_ms = {timeout_ms} must be between 1 and {DAY_MS} (a day); the default \
                 is {DEFAULT_TIMEOUT_MS}"
            ),
        ));
    }
    Ok(())
}

/// The ring counters each PE keeps to itself (moe.cuh NOTES): tokens pushed and consumed per
/// (channel, peer), for dispatch and for combine.
#[derive(Debug, Clone, Copy)]
pub enum Progress {
    DispatchSent = 0,
    DispatchReceived = 1,
    CombineSent = 2,
    CombineReceived = 3,
}

/// u64 words of the local progress array: [4][MAX_CHANNELS][MAX_PES], indexed by `Progress`.
pub const PROGRESS_WORDS: usize = 4 * MAX_CHANNELS * MAX_PES;

/// A made buffer as its plans see it. Addresses are device addresses on this PE's GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferSpec {
    pub my_pe: usize,
    pub n_pes: usize,
    /// G, the ranks of one node (chapter 5's topology): ranks node_pes x k .. x (k + 1) reach
    /// each other through peer pointers, any other pair only through NVSHMEM's RMA calls.
    pub node_pes: usize,
    pub options: BufferOptions,
    /// SMs this PE's grids may fill (`Kernels::num_sms`: the GPU's, or this PE's share).
    pub num_sms: u32,
    /// The buffer's regions (regions.rs), inside its symmetric allocation.
    pub base: u64,
    /// Local [PROGRESS_WORDS] u64: the ring progress, by `Progress`.
    pub progress: u64,
    /// Local `LlState` of low-latency mode.
    pub ll_state: u64,
    /// Local `InternodeNotifyState` (normal mode across nodes; 0 otherwise).
    pub internode_state: u64,
    /// Where the kernels record bad input.
    pub input_error: InputError,
}

impl BufferSpec {
    fn regions(&self) -> Regions {
        Regions {
            num_nvl_bytes: self.options.num_nvl_bytes,
            num_rdma_bytes: self.options.num_rdma_bytes,
            notify_area_bytes: self.notify_area().map_or(0, |area| area.bytes()),
        }
    }
    /// Whether this buffer's ranks span several nodes (of `node_pes`).
    pub fn spans_nodes(&self) -> bool {
        self.n_pes > self.node_pes
    }
    /// The internode notify's area: normal calls across nodes only (`options_need_notify_area`).
    pub fn notify_area(&self) -> Option<NotifyArea> {
        options_need_notify_area(&self.options, self.n_pes, self.node_pes)
            .then(|| NotifyArea::new(self.n_pes / self.node_pes, self.node_pes))
    }
    /// Where the internode notify's area starts (symmetric), when there is one.
    pub fn notify_area_base(&self) -> Option<u64> {
        self.notify_area()
            .map(|_| self.base + self.regions().notify_area() as u64)
    }
    /// The rings of normal mode.
    pub fn nvl(&self) -> u64 {
        self.base + Regions::nvl() as u64
    }
    /// Symmetric counters `which` (0 dispatch tail, 1 dispatch head, 2 combine tail, 3
    /// combine head).
    pub fn counters(&self, which: usize) -> u64 {
        self.base + Regions::counters(which) as u64
    }
    /// Local progress counters `which`.
    pub fn progress(&self, which: Progress) -> u64 {
        self.progress + (which as usize * MAX_CHANNELS * MAX_PES * 8) as u64
    }
    /// This PE's notify row and everyone's, gathered.
    pub fn notify_rows(&self) -> (u64, u64) {
        (
            self.base + Regions::my_row() as u64,
            self.base + Regions::gathered_rows() as u64,
        )
    }
    /// This PE's normal-mode region (`rdma = false`) or low-latency region: (address, bytes).
    pub fn local_region(&self, rdma: bool) -> (u64, usize) {
        if rdma {
            (
                self.base + self.regions().rdma() as u64,
                self.options.num_rdma_bytes,
            )
        } else {
            (self.nvl(), self.options.num_nvl_bytes)
        }
    }
    /// The parts of the low-latency region.
    pub fn ll_regions(&self) -> LlRegions {
        LlRegions::new(self.options.num_rdma_bytes)
    }
    /// The low-latency region as the kernels address it.
    pub fn ll_region(&self) -> LlRegion {
        let (base, _) = self.local_region(true);
        let parts = self.ll_regions();
        let at = |offset: usize| base + offset as u64;
        LlRegion {
            data: [at(parts.half(0)), at(parts.half(1))],
            counts: [at(LlRegions::counts(0)), at(LlRegions::counts(1))],
            area_bytes: parts.area_bytes(self.n_pes) as u64,
        }
    }
    /// The low-latency region's barrier words (`ll_barrier`).
    pub fn ll_barrier_words(&self) -> u64 {
        self.local_region(true).0 + LlRegions::barrier() as u64
    }
    /// Where this rank's low-latency peers live: its node by pointers, the rest by RMA.
    pub fn ll_topology(&self) -> LlTopology {
        let node_start = self.my_pe / self.node_pes * self.node_pes;
        LlTopology {
            rank: self.my_pe as i32,
            num_ranks: self.n_pes as i32,
            node_start: node_start as i32,
            node_pes: self.node_pes as i32,
        }
    }
    /// The world ranks of this rank's node (`node_members`).
    pub fn node_members(&self) -> Vec<usize> {
        node_members(self.my_pe, self.node_pes)
    }
    /// The zero-copy combine's staging rows.
    pub fn ll_staging(&self) -> u64 {
        self.local_region(true).0 + self.ll_regions().staging() as u64
    }

    /// A spec with made-up addresses, for CPU tests of the plans.
    #[cfg(test)]
    pub(crate) fn for_tests(n_pes: usize, options: BufferOptions) -> Self {
        Self {
            my_pe: 0,
            n_pes,
            node_pes: n_pes.min(MAX_PES),
            options,
            num_sms: 132,
            base: 0x7f00_0000_0000,
            progress: 0x7e00_0000_0000,
            ll_state: 0x7d00_0000_0000,
            internode_state: 0x7a00_0000_0000,
            input_error: InputError {
                claim: 0x7c00_0000_0000,
                words: 0x7b00_0000_0000,
            },
        }
    }
}
