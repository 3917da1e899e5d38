//! A plan's node and rail steps on NVSHMEM's own on-stream team collectives (the method
//! `nvshmem_teams`, chapter 5's peer), each checked before the first is enqueued.

use std::ops::Deref;

use ch01_bootstrap::World;
use ch04_collectives::team::{
    TeamCall, check_reduce_scratch, enqueue_on_team, process_reduce_scratch_bytes, team_call,
};
use ch04_collectives::{Collective, DType};
use cudarc::driver::sys;

use crate::error::InterNodeError;
use crate::plan::{Buf, Plan, Scope, Step};
use crate::topology::Topology;

use super::Call;

impl<W: Deref<Target = World> + Clone> Topology<W> {
    // ANCHOR: team_step
    /// A node or rail step on NVSHMEM's own on-stream team collectives (bf16 reductions).
    pub(crate) fn team_step(
        &self,
        collective: &'static str,
        step: &Step,
        call: &Call,
        stream: sys::CUstream,
    ) -> Result<(), InterNodeError> {
        let (team, team_call, out, input, root) = self.team_call_of(collective, step)?;
        // ANCHOR: team_enqueue
        debug_assert_ne!(call.dtype, Some(DType::F32), "check_call refuses f32 teams");
        let (out, input) = (self.address(out, call), self.address(input, call));
        // SAFETY: symmetric addresses checked by `prepare` (or the topology's stages) holding
        // the bytes the plan's extents say; a team of this PE; the caller's stream.
        Ok(unsafe { enqueue_on_team(self.world(), team, &team_call, out, input, root, stream) }?)
        // ANCHOR_END: team_enqueue
    }
    // ANCHOR_END: team_step

    /// The team and NVSHMEM call of a node or rail step, with its buffers and root.
    fn team_call_of(
        &self,
        collective: &'static str,
        step: &Step,
    ) -> Result<(nvshmem_sys::Team, TeamCall, Buf, Buf, usize), InterNodeError> {
        let (team, team_pes) = match step.scope() {
            Scope::Node => (self.teams.node, self.layout.node_pes),
            _ => (self.teams.rail, self.layout.num_nodes()),
        };
        let bf16 = DType::Bf16.size(); // check_call refuses other sums on NVSHMEM's teams
        let (c, size, out, input, root) = match *step {
            Step::NodeReduceScatter { out, input, count }
            | Step::RailReduceScatter { out, input, count } => (
                Collective::ReduceScatter,
                team_pes * count * bf16,
                out,
                input,
                0,
            ),
            Step::NodeAllReduce { out, input, count }
            | Step::RailAllReduce { out, input, count } => {
                (Collective::AllReduce, count * bf16, out, input, 0)
            }
            Step::NodeAllGather {
                out,
                input,
                num_bytes,
            }
            | Step::RailAllGather {
                out,
                input,
                num_bytes,
            } => (Collective::AllGather, team_pes * num_bytes, out, input, 0),
            Step::NodeBroadcast {
                out,
                input,
                num_bytes,
                root,
            }
            | Step::RailBroadcast {
                out,
                input,
                num_bytes,
                root,
            } => (Collective::Broadcast, num_bytes, out, input, root),
            // check_call refuses what NVSHMEM's teams cannot do before any step runs.
            _ => {
                let what = "NVSHMEM has no team all-to-all-v";
                return Err(InterNodeError::invalid(collective, what));
            }
        };
        Ok((team, team_call(c, size, team_pes)?, out, input, root))
    }

    /// Every team step of `plan`, checked before the first is enqueued: a call NVSHMEM cannot
    /// take (its reduce-scatter past the team's scratch) stops every PE before any step runs,
    /// so the PEs' call counts stay in step.
    pub(super) fn check_team_steps(&self, plan: &Plan) -> Result<(), InterNodeError> {
        let scratch = process_reduce_scratch_bytes()?;
        for step in plan.steps.iter().filter(|s| s.scope() != Scope::Local) {
            let (_, call, ..) = self.team_call_of(plan.collective, step)?;
            check_reduce_scratch(&call, scratch)?;
        }
        Ok(())
    }
}
