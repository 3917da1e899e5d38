//! `Topology`: the job seen as nodes of G PEs. It owns what the collectives of this chapter
//! run on: NVSHMEM's node and rail teams, the node's chapter-4 communicator (peer pointers to
//! the node's PEs and no other), the rail's RMA group (NVSHMEM's RMA calls to one PE per
//! node), the world's RMA group (the flat algorithms), two staging buffers and the kernels.

use std::ops::Deref;

use ch01_bootstrap::World;
use ch02_symmetric_memory::{SymmetricBuffer, exchange_u64};
use ch04_collectives::{CollectivesConfig, Communicator, Kernels};
use cudarc::driver::{CudaSlice, DevicePtr};

use crate::config::{InterNodeConfig, MAX_GROUP};
use crate::error::InterNodeError;
use crate::layout::Layout;
use crate::rma::RmaGroup;
use crate::routes::{pointer_peers, rail_group, world_group};
use crate::teams::Teams;

/// The kernel modules of this chapter (kernels/cuda/).
const MODULES: [&str; 3] = ["rma_coll", "rma_a2av", "node_forward"];

// ANCHOR: topology
/// Nodes of `layout.node_pes` PEs over the whole job, and what the collectives run on.
/// Every PE must make the same calls in the same order, one after another on the stream order
/// the caller keeps (the node's and the rail's calls are numbered on the device, as in chapter
/// 4, and the staging buffers and count arrays serve one call at a time).
pub struct Topology<W: Deref<Target = World> + Clone> {
    pub(crate) layout: Layout,
    pub(crate) config: InterNodeConfig,
    /// The job's smallest share of a GPU, in SMs: the RMA grids, the same on every PE.
    pub(crate) num_sms: u32,
    pub(crate) teams: Teams,
    /// Chapter 4's communicator over this PE's node: peer pointers to its PEs only.
    pub(crate) node: Communicator<W>,
    /// This PE's rail: one PE per node, reached by NVSHMEM's RMA calls only.
    pub(crate) rail: RmaGroup<W>,
    /// Every PE as one RMA group, for the flat algorithms (jobs of up to MAX_GROUP PEs).
    pub(crate) world_group: Option<RmaGroup<W>>,
    /// Stage A at offset 0, stage B at `config.stage_bytes`: symmetric.
    pub(crate) stages: SymmetricBuffer<W, u8>,
    pub(crate) kernels: Kernels,
    /// n_pes ones (the equal-split all-to-all as an all-to-all-v of one row per PE) and its
    /// out_splits_offsets [2, n_pes]: device int64, owned here, their addresses in `splits`.
    _ones: CudaSlice<i64>,
    _received: CudaSlice<i64>,
    /// (ones, received) as raw addresses, taken once: a call may be captured into a CUDA graph,
    /// and cudarc's per-use event bookkeeping (a wait on an event recorded before the capture)
    /// would invalidate that capture.
    pub(crate) splits: (u64, u64),
}
// ANCHOR_END: topology

impl<W: Deref<Target = World> + Clone> Topology<W> {
    // ANCHOR: from_env
    /// Collective: nodes of torchrun's LOCAL_WORLD_SIZE PEs (else NVSHMEM's node team), cut
    /// smaller by NVSHMEM_TUTORIAL_NODE_PES when it is set.
    pub fn from_env(world: W, config: InterNodeConfig) -> Result<Self, InterNodeError> {
        let layout = Layout::from_env(&world)?;
        Self::new(world, layout.node_pes, config)
    }
    // ANCHOR_END: from_env

    /// Collective over the world: nodes of `node_pes` PEs.
    pub fn new(world: W, node_pes: usize, config: InterNodeConfig) -> Result<Self, InterNodeError> {
        let layout = Layout::new(world.n_pes(), node_pes)?;
        let me = world.my_pe();
        let sms = exchange_u64(&world, u64::from(world.num_sms()))?;
        let num_sms = sms.into_iter().min().unwrap_or(1) as u32;
        let teams = Teams::split(&world, &layout)?;
        let node_config = CollectivesConfig {
            ll_max_bytes: config.ll_max_bytes,
            timeout_ms: config.timeout_ms,
            extra_bytes: 0,
        };
        let node =
            Communicator::with_members(world.clone(), pointer_peers(&layout, me), node_config)?;
        let (timeout, rail_team) = (config.timeout_ms, rail_group(&layout, me));
        let rail = RmaGroup::new(
            world.clone(),
            rail_team,
            layout,
            "rail",
            config.rail_scratch_bytes,
            timeout,
        )?;
        let world_group = match layout.n_pes <= MAX_GROUP {
            true => Some(RmaGroup::new(
                world.clone(),
                world_group(&layout),
                layout,
                "world",
                config.world_scratch_bytes,
                timeout,
            )?),
            false => None,
        };
        let stages = SymmetricBuffer::<W, u8>::new(world.clone(), 2 * config.stage_bytes.max(16))?;
        let kernels = Kernels::load(&world, &MODULES)?;
        let stream = world.stream();
        let ones = stream
            .clone_htod(&vec![1i64; layout.n_pes])
            .map_err(InterNodeError::cuda("uploading the splits"))?;
        let received = stream
            .alloc_zeros::<i64>(2 * layout.n_pes)
            .map_err(InterNodeError::cuda("allocating"))?;
        let splits = (ones.device_ptr(stream).0, received.device_ptr(stream).0);
        // Calls use the addresses on any stream: the upload must be done first.
        stream
            .synchronize()
            .map_err(InterNodeError::cuda("uploading the splits"))?;
        Ok(Self {
            layout,
            config,
            num_sms,
            teams,
            node,
            rail,
            world_group,
            stages,
            kernels,
            _ones: ones,
            _received: received,
            splits,
        })
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }
    pub fn config(&self) -> &InterNodeConfig {
        &self.config
    }
    pub fn world(&self) -> &World {
        self.node.world()
    }
    /// The node's chapter-4 communicator: its calls are collectives of this node's PEs.
    pub fn node_comm(&self) -> &Communicator<W> {
        &self.node
    }
    /// NVSHMEM's node and rail teams (for NVSHMEM's own team calls).
    pub fn teams(&self) -> &Teams {
        &self.teams
    }
    /// The rail's RMA group.
    pub fn rail(&self) -> &RmaGroup<W> {
        &self.rail
    }

    /// `Err` with the device's account if a kernel of this topology failed: in the node
    /// (chapter 4's record) or across nodes (named by node and local index). Every call makes
    /// it first; call it after synchronising to learn about the last call.
    pub fn check(&self) -> Result<(), InterNodeError> {
        self.node.check()?;
        self.rail.check()?;
        match &self.world_group {
            Some(group) => group.check(),
            None => Ok(()),
        }
    }
}

impl<W: Deref<Target = World> + Clone> Drop for Topology<W> {
    fn drop(&mut self) {
        // Kernels still queued (on any stream) read the flags and stages.
        let _ = self.world().context().synchronize();
    }
}
