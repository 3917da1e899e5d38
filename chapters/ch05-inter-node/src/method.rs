//! How a call of a `Topology` moves its data ([`Method`]), and what every call checks before
//! anything is enqueued ([`check_call`]): pure functions, used by Rust and Python alike.

use ch04_collectives::DType;

use crate::error::InterNodeError;

/// How a call moves its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// The hierarchical plan (plan.rs) on this chapter's kernels: chapter 4's inside the node,
    /// NVSHMEM RMA across nodes.
    Hierarchical,
    /// The same plan on NVSHMEM's on-stream team collectives over the node and rail teams
    /// (bf16 reductions; no all-to-all). The baseline.
    NvshmemTeams,
    /// Every PE with every PE through NVSHMEM RMA, as if there were no nodes.
    Flat,
}

impl Method {
    pub const ALL: [Method; 3] = [Method::Hierarchical, Method::NvshmemTeams, Method::Flat];
    /// The method called `name` (as [`Method::name`] spells it).
    pub fn from_name(name: &str) -> Option<Method> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }
    pub fn name(self) -> &'static str {
        match self {
            Method::Hierarchical => "hierarchical",
            Method::NvshmemTeams => "nvshmem_teams",
            Method::Flat => "flat",
        }
    }
}

/// What every call checks before anything is enqueued, without NVSHMEM (Python's binding makes
/// the same call before it touches the GPU): that `method` can run the collective, and that
/// the output does not overlap the input (peers write the output while this PE may still read
/// its input; all-reduce may be exactly in place). `out` and `input` are (address, bytes).
pub fn check_call(
    collective: &'static str,
    method: Method,
    dtype: Option<DType>,
    out: (u64, usize),
    input: (u64, usize),
) -> Result<(), InterNodeError> {
    if method == Method::NvshmemTeams && collective.starts_with("all_to_all") {
        let what = "method \"nvshmem_teams\" has no all-to-all (NVSHMEM has no team \
                    all-to-all-v): use \"hierarchical\" or \"flat\"";
        return Err(InterNodeError::invalid(collective, what));
    }
    if method == Method::NvshmemTeams && dtype == Some(DType::F32) {
        let what = "method \"nvshmem_teams\" reduces bf16 only (NVSHMEM's team reductions, as \
                    chapter 4's baseline): use \"hierarchical\" or \"flat\" for float32";
        return Err(InterNodeError::invalid(collective, what));
    }
    let (may_be_in_place, ((o, o_len), (i, i_len))) = (collective == "all_reduce", (out, input));
    let (o_end, i_end) = (
        o.saturating_add(o_len as u64),
        i.saturating_add(i_len as u64),
    );
    let disjoint = o_len == 0 || i_len == 0 || o_end <= i || i_end <= o;
    if disjoint || (may_be_in_place && out == input) {
        return Ok(());
    }
    let allowed = match may_be_in_place {
        true => " (the output may be the input itself, not a part of it)",
        false => "",
    };
    Err(InterNodeError::invalid(
        collective,
        format!(
            "output (bytes {o:#x}..{o_end:#x}) and input (bytes {i:#x}..{i_end:#x}) overlap; \
             pass distinct buffers{allowed}"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_method_cannot_do_and_overlaps_are_refused_before_any_launch() {
        let (a, b) = ((0x1000, 64), (0x9000, 64));
        let refused = |r: Result<(), InterNodeError>| r.unwrap_err().to_string();
        let teams = Method::NvshmemTeams;
        let f32_teams = refused(check_call("all_reduce", teams, Some(DType::F32), a, b));
        assert!(f32_teams.contains("bf16 only"), "{f32_teams}");
        // Size 0 too: the refusal does not depend on the plan having a step.
        let empty = refused(check_call(
            "reduce_scatter",
            teams,
            Some(DType::F32),
            (a.0, 0),
            b,
        ));
        assert!(empty.contains("bf16 only"), "{empty}");
        for c in ["all_to_all", "all_to_all_v"] {
            assert!(refused(check_call(c, teams, None, a, b)).contains("no team all-to-all-v"));
        }
        check_call("all_reduce", teams, Some(DType::Bf16), a, b).unwrap();
        for m in [Method::Hierarchical, Method::Flat] {
            check_call("all_reduce", m, Some(DType::F32), a, b).unwrap();
            check_call("all_to_all_v", m, None, a, b).unwrap();
        }
        // Exactly in place: all-reduce only. Partly overlapping: nothing.
        check_call("all_reduce", Method::Flat, Some(DType::F32), a, a).unwrap();
        let bcast = refused(check_call("broadcast", Method::Flat, None, a, a));
        assert!(
            bcast.contains("broadcast: output (bytes 0x1000..0x1040)"),
            "{bcast}"
        );
        let part = refused(check_call(
            "all_reduce",
            Method::Flat,
            None,
            a,
            (0x1020, 64),
        ));
        assert!(part.contains("not a part of it"), "{part}");
        check_call("all_gather", Method::Flat, None, a, (0x1040, 64)).unwrap(); // adjacent
        check_call("all_gather", Method::Flat, None, (0x1000, 0), a).unwrap(); // empty
    }

    #[test]
    fn method_names_read_back() {
        for m in Method::ALL {
            assert_eq!(Method::from_name(m.name()), Some(m));
        }
        assert_eq!(Method::from_name("hier"), None);
    }
}
