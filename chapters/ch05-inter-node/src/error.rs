//! What can go wrong in chapter 5: a topology that cannot be built, a call that cannot run
//! (found on the host, nothing launched), and failures a kernel recorded on the device. A
//! failure across nodes names both PEs by node and local index.

use ch01_bootstrap::BootstrapError;
use ch02_symmetric_memory::SymmetricError;
use ch03_put_get::PutGetError;
use ch04_collectives::{CollError, DeviceFailure, DeviceFailureKind};

use crate::layout::Layout;

/// A failure an RMA group's kernel recorded (a wait across nodes that timed out, all-to-all-v
/// counts that do not add up), with the layout that names its PEs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteFailure {
    pub failure: DeviceFailure,
    pub layout: Layout,
    /// Which group: `rail` or `world`.
    pub group: &'static str,
}

// ANCHOR: remote_failure
impl std::fmt::Display for RemoteFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let d = &self.failure;
        let (me, pe) = (self.layout.name(d.me), self.layout.name(d.pe as usize));
        let at = format!("{me}: {} call {}, block {}", self.group, d.call, d.block);
        let waited = format!("{at}: timed out after {} ms waiting for {pe}", d.timeout_ms);
        let text = match d.kind {
            DeviceFailureKind::RemoteReady => format!(
                "{waited} to enter call {} (it announced {}): it never arrived, so it is dead \
                 or stalled, or the PEs make their collective calls in different orders",
                d.expected, d.seen
            ),
            DeviceFailureKind::RemoteData => format!(
                "{waited}'s data (ticket {}, saw {}): it entered the call but its puts never \
                 landed, so it is dead or stalled, or the PEs passed different sizes",
                d.expected, d.seen
            ),
            DeviceFailureKind::BadSplits => format!(
                "{at}: all_to_all_v: {pe}'s in_splits are negative or add up to more rows than \
                 its input has"
            ),
            DeviceFailureKind::OutputTooSmall => format!(
                "{at}: all_to_all_v: {pe} would receive {} rows but the output holds {}; pass a \
                 larger output",
                d.seen, d.expected
            ),
            DeviceFailureKind::SlotOverflow => format!(
                "{at}: all_to_all_v: {pe} sends one node {} rows but a landing slot holds {}; \
                 raise InterNodeConfig::rail_scratch_bytes (one slot per node)",
                d.seen, d.expected
            ),
            other => format!(
                "{at}: {} ({}; {pe}, expected {}, seen {})",
                other.meaning(),
                other.device_name(),
                d.expected,
                d.seen
            ),
        };
        f.write_str(&text)
    }
}
// ANCHOR_END: remote_failure

/// Everything that can go wrong in this chapter.
#[derive(Debug, thiserror::Error)]
pub enum InterNodeError {
    #[error(transparent)]
    Coll(#[from] CollError),
    #[error(transparent)]
    Bootstrap(#[from] BootstrapError),
    #[error(transparent)]
    Symmetric(#[from] SymmetricError),
    #[error(transparent)]
    PutGet(#[from] PutGetError),
    #[error(transparent)]
    Kernel(#[from] kernels::KernelError),
    #[error("topology: {0}")]
    Topology(String),
    #[error(
        "{function} failed ({what}). With several PEs on one GPU NVSHMEM refuses team splits \
         unless the PEs run under CUDA MPS (scripts/fold_pes.sh); a job may hold at most \
         NVSHMEM_MAX_TEAMS teams at once (default 32, 6 of them NVSHMEM's own); \
         NVSHMEM_DEBUG=INFO tells NVSHMEM's side"
    )]
    Team {
        function: &'static str,
        what: String,
    },
    #[error(
        "{collective}: needs {need} bytes of {what} but InterNodeConfig::{field} is {have}: \
         raise it (every PE must pass the same config)"
    )]
    TooLarge {
        collective: &'static str,
        what: &'static str,
        field: &'static str,
        need: usize,
        have: usize,
    },
    #[error(
        "{0}. The topology is unusable from here on (its PEs no longer agree on the call \
         count): drop it and make a new one on every PE"
    )]
    Remote(RemoteFailure),
}

/// A failed driver call and a refused argument are chapter 4's errors, whatever the chapter.
impl InterNodeError {
    pub fn cuda(what: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> Self {
        move |source| CollError::Cuda { what, source }.into()
    }
    pub(crate) fn invalid(collective: &'static str, what: impl Into<String>) -> Self {
        let what = what.into();
        CollError::InvalidArgument { collective, what }.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(kind: DeviceFailureKind, me: usize, pe: u64) -> RemoteFailure {
        RemoteFailure {
            failure: DeviceFailure {
                me,
                kind,
                pe,
                expected: 3,
                seen: 2,
                block: 0,
                call: 3,
                timeout_ms: 300,
            },
            layout: Layout::new(8, 4).unwrap(),
            group: "rail",
        }
    }

    #[test]
    fn a_cross_node_timeout_names_node_and_local_index_of_both_pes() {
        let text =
            InterNodeError::Remote(failure(DeviceFailureKind::RemoteReady, 1, 5)).to_string();
        assert!(
            text.starts_with(
                "pe 1 (node 0, local 1): rail call 3, block 0: timed out after 300 ms waiting \
                 for pe 5 (node 1, local 1) to enter call 3"
            ),
            "{text}"
        );
        assert!(
            text.contains("dead or stalled") && text.contains("make a new one"),
            "{text}"
        );
        let text = failure(DeviceFailureKind::RemoteData, 6, 2).to_string();
        assert!(text.contains("pe 2 (node 0, local 2)'s data"), "{text}");
    }

    #[test]
    fn count_failures_say_what_to_fix() {
        let text = failure(DeviceFailureKind::SlotOverflow, 0, 4).to_string();
        assert!(text.contains("rail_scratch_bytes") && text.contains("sends one node 2 rows"));
        let text = failure(DeviceFailureKind::OutputTooSmall, 0, 7).to_string();
        assert!(
            text.contains("pe 7 (node 1, local 3) would receive 2 rows but the output holds 3")
        );
    }
}
