//! NVSHMEM's teams for the node and the rail: made by one `nvshmem_team_split_2d`, checked
//! member by member with `nvshmem_team_translate_pe`, destroyed on drop. The hierarchical
//! algorithms run on our own kernels and need no team; NVSHMEM's on-stream team collectives
//! over these two teams are the baseline they are measured against (`Method::NvshmemTeams`).
//!
//! Limits of NVSHMEM 3.4.5 to mind:
//! - A job holds at most `NVSHMEM_MAX_TEAMS` teams at once (default 32, of which NVSHMEM's
//!   own six: world, shared, node, same-PE-on-node, same-GPU, GPU leaders). A split takes a
//!   slot on every PE of the new team; a topology holds two. A team whose PEs are neither all
//!   on one host nor all on different hosts (a rail of virtual nodes on a cluster of real
//!   ones) makes two more teams inside NVSHMEM.
//! - With several PEs on one GPU, NVSHMEM refuses splits unless the PEs run under CUDA MPS.
//! - A split is collective over the parent: every PE of the world calls it, with the same
//!   arguments, and NVSHMEM walks the rows and columns of the grid one split at a time.

use ch01_bootstrap::World;
use nvshmem_sys::{Nvshmem, TEAM_INVALID, TEAM_SHARED, TEAM_WORLD, Team};

use crate::error::InterNodeError;
use crate::layout::{Layout, Strided};

// ANCHOR: check_team
/// `Err` unless NVSHMEM's `team` is `expected` with this PE at `my_index`: its size and this
/// PE's place as NVSHMEM reports them, and every member's world PE through
/// `translate(i)` (`nvshmem_team_translate_pe(team, i, NVSHMEM_TEAM_WORLD)`).
pub fn check_team(
    name: &str,
    expected: Strided,
    my_index: usize,
    (n_pes, my_pe): (i32, i32),
    translate: impl Fn(usize) -> i32,
) -> Result<(), InterNodeError> {
    let wrong = |what: String| Err(InterNodeError::Topology(format!("the {name} team {what}")));
    if n_pes != expected.size as i32 || my_pe != my_index as i32 {
        return wrong(format!(
            "has {n_pes} PEs with this PE at {my_pe}; the layout says {} with this PE at {my_index}",
            expected.size
        ));
    }
    for (i, pe) in expected.members().into_iter().enumerate() {
        let world_pe = translate(i);
        if world_pe != pe as i32 {
            return wrong(format!(
                "member {i} is world pe {world_pe}, expected pe {pe}"
            ));
        }
    }
    Ok(())
}
// ANCHOR_END: check_team

/// This PE's node team and rail team, destroyed on drop.
pub struct Teams {
    nvshmem: &'static Nvshmem,
    pub node: Team,
    pub rail: Team,
}

impl Teams {
    // ANCHOR: split
    /// Collective over the world: a 2-D split of the world into rows of G PEs (the x-axis
    /// teams: nodes) and columns (the y-axis teams: rails), then every member checked.
    pub fn split(world: &World, layout: &Layout) -> Result<Self, InterNodeError> {
        let nv = world.nvshmem();
        let (mut node, mut rail) = (TEAM_INVALID, TEAM_INVALID);
        let (none, xrange) = (std::ptr::null(), layout.node_pes as i32);
        // SAFETY: initialised; collective over the world with the same arguments everywhere.
        let status = unsafe {
            (nv.team_split_2d)(TEAM_WORLD, xrange, none, 0, &mut node, none, 0, &mut rail)
        };
        let teams = Self {
            nvshmem: nv,
            node,
            rail,
        };
        if status != 0 || node == TEAM_INVALID || rail == TEAM_INVALID {
            let what = format!("status {status}, node team {node}, rail team {rail}");
            return Err(InterNodeError::Team {
                function: "nvshmem_team_split_2d",
                what,
            });
        }
        let me = world.my_pe();
        let (k, l) = (layout.node_of(me), layout.local_of(me));
        teams.check(layout.node_team(k), node, l, "node")?;
        teams.check(layout.rail_team(l), rail, k, "rail")?;
        // A node's PEs must reach each other by loads and stores: NVSHMEM_TEAM_SHARED.
        for i in 0..layout.node_pes {
            // SAFETY: initialised; `node` is a live team of this PE.
            if unsafe { (nv.team_translate_pe)(node, i as i32, TEAM_SHARED) } < 0 {
                return Err(InterNodeError::Topology(format!(
                    "pe {} of this node cannot be reached by loads and stores (it is not in \
                     NVSHMEM_TEAM_SHARED): a node must lie inside one NVLink domain",
                    layout.pe(k, i)
                )));
            }
        }
        Ok(teams)
    }
    // ANCHOR_END: split

    fn check(
        &self,
        expected: Strided,
        team: Team,
        index: usize,
        name: &str,
    ) -> Result<(), InterNodeError> {
        let nv = self.nvshmem;
        // SAFETY: initialised; `team` is a live team of this PE.
        let reported = unsafe { ((nv.team_n_pes)(team), (nv.team_my_pe)(team)) };
        // SAFETY: as above; translation reads NVSHMEM's host-side team table.
        let translate = |i: usize| unsafe { (nv.team_translate_pe)(team, i as i32, TEAM_WORLD) };
        check_team(name, expected, index, reported, translate)
    }
}

impl Drop for Teams {
    fn drop(&mut self) {
        // Destroying is collective over each team (NVSHMEM may hold an NCCL communicator per
        // team); a job whose peer died skips it, as it skips every collective teardown.
        if ch01_bootstrap::world::is_broken() {
            return;
        }
        for team in [self.rail, self.node] {
            if team != TEAM_INVALID {
                // SAFETY: a team this PE made and has not destroyed.
                unsafe { (self.nvshmem.team_destroy)(team) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn teams_are_checked_member_by_member() {
        let layout = Layout::new(8, 4).unwrap();
        let rail = layout.rail_team(1); // PEs 1 and 5
        assert!(check_team("rail", rail, 1, (2, 1), |i| [1, 5][i]).is_ok());
        let err = check_team("rail", rail, 1, (2, 1), |i| [1, 6][i])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("member 1 is world pe 6, expected pe 5"),
            "{err}"
        );
        let err = check_team("node", layout.node_team(0), 2, (4, 3), |i| i as i32).unwrap_err();
        assert!(err.to_string().contains("this PE at 3"), "{err}");
    }
}
