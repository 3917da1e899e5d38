//! What can go wrong in a collective: bad arguments (found on the host, nothing launched) and
//! failures a kernel recorded on the device (a wait that timed out, counts that do not add up).

use ch01_bootstrap::BootstrapError;
use ch02_symmetric_memory::SymmetricError;
use ch03_put_get::PutGetError;

/// What a kernel was doing when it gave up: word 4 of the failure record. One table for
/// host and device, every chapter's kinds in it: the host/device contract's `Failure`.
pub use kernels::contract::Failure as DeviceFailureKind;

/// The device's error record, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceFailure {
    pub me: usize,
    pub kind: DeviceFailureKind,
    /// The PE the kernel waited for (or whose counts were wrong).
    pub pe: u64,
    pub expected: u64,
    pub seen: u64,
    pub block: u64,
    /// The call number (epoch) that failed.
    pub call: u64,
    pub timeout_ms: u64,
}

impl std::fmt::Display for DeviceFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (me, pe, call, block) = (self.me, self.pe, self.call, self.block);
        let waited = |what: &str| {
            format!(
                "pe {me}: call {call}, block {block}: timed out after {} ms waiting for pe {pe} {what}",
                self.timeout_ms
            )
        };
        let text = match self.kind {
            DeviceFailureKind::Ready => waited(&format!(
                "to enter call {} (it announced {}): pe {pe} never arrived, so it is dead or \
                 stalled (a crash, a checkpoint save, a compilation); or the PEs make their \
                 collective calls in different orders",
                self.expected, self.seen
            )),
            DeviceFailureKind::Done => waited(&format!(
                "to finish writing (ticket {}, saw {}): pe {pe} entered the call but stopped, so \
                 it is dead or stalled; or the PEs passed different sizes",
                self.expected, self.seen
            )),
            DeviceFailureKind::Ll => waited(&format!(
                "'s data of call {} (a line still carried flag {}): pe {pe} is dead or stalled, \
                 or the PEs passed different sizes or algorithms",
                self.expected, self.seen
            )),
            DeviceFailureKind::Counts => waited(&format!(
                "'s all-to-all-v counts of call {} (saw call {})",
                self.expected, self.seen
            )),
            DeviceFailureKind::BadSplits => format!(
                "pe {me}: call {call}: all_to_all_v: pe {pe}'s in_splits are negative, too large, \
                 or add up to more rows than its input has ({} rows)",
                self.expected
            ),
            DeviceFailureKind::OutputTooSmall => format!(
                "pe {me}: call {call}: all_to_all_v: pe {pe} would receive {} rows but the output \
                 holds {}; pass a larger output",
                self.seen, self.expected
            ),
            // A later chapter's kind: it describes its own (chapter 7's buffer).
            other => format!(
                "pe {me}: call {call}, block {block}: {} ({}; pe {pe}, expected {}, seen {})",
                other.meaning(),
                other.device_name(),
                self.expected,
                self.seen
            ),
        };
        f.write_str(&text)
    }
}

/// Everything that can go wrong in this chapter.
#[derive(Debug, thiserror::Error)]
pub enum CollError {
    #[error(transparent)]
    Symmetric(#[from] SymmetricError),
    #[error(transparent)]
    PutGet(#[from] PutGetError),
    #[error(transparent)]
    Bootstrap(#[from] BootstrapError),
    #[error(transparent)]
    Kernel(#[from] kernels::KernelError),
    #[error(
        "{function} returned {status}. With several PEs on one GPU, NVSHMEM refuses on-stream \
         collectives unless the PEs run under CUDA MPS; NVSHMEM_DEBUG=INFO tells NVSHMEM's side"
    )]
    Nvshmem { function: &'static str, status: i32 },
    #[error("{collective}: {what}")]
    InvalidArgument {
        collective: &'static str,
        what: String,
    },
    #[error(
        "{collective}: algorithm `{algorithm}` cannot run this call: {why}. Pass another \
         algorithm, or none to let the size table choose"
    )]
    AlgorithmNotApplicable {
        collective: &'static str,
        algorithm: &'static str,
        why: String,
    },
    #[error(
        "this job has {n_pes} PEs; a communicator spans at most {max} (the flag arrays of \
         kernels/cuda/coll_common.cuh are sized for MAX_PES)"
    )]
    TooManyPes { n_pes: usize, max: usize },
    #[error(
        "{0}. The communicator is unusable from here on (its PEs no longer agree on the call \
         count): drop it and create a new one on every PE"
    )]
    Device(DeviceFailure),
    #[error(
        "kernel `{kernel}` needs {grid} blocks resident at once (its blocks wait for each \
         other's peers), but this PE's {num_sms} SMs hold at most {max} of them (a PE gets \
         an equal share of a GPU that several PEs share): use fewer blocks (a smaller \
         num_sms), or fewer PEs per GPU"
    )]
    NotCoResident {
        kernel: &'static str,
        grid: u32,
        max: u32,
        num_sms: u32,
    },
    #[error(
        "pe {me}: a kernel's failure record holds kind {code}, which this build does not know: \
         were the kernels built from another version of kernels/contract/defs.rs? Rebuild both"
    )]
    UnknownFailureKind { me: usize, code: u64 },
    #[error("CUDA driver error while {what}: {source}")]
    Cuda {
        what: &'static str,
        #[source]
        source: cudarc::driver::DriverError,
    },
}

impl CollError {
    pub(crate) fn cuda(what: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> Self {
        move |source| Self::Cuda { what, source }
    }
    pub(crate) fn invalid(collective: &'static str, what: impl Into<String>) -> Self {
        Self::InvalidArgument {
            collective,
            what: what.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(kind: DeviceFailureKind) -> DeviceFailure {
        DeviceFailure {
            me: 1,
            kind,
            pe: 0,
            expected: 7,
            seen: 6,
            block: 3,
            call: 7,
            timeout_ms: 10_000,
        }
    }

    #[test]
    fn timeouts_name_both_pes_the_call_and_the_block() {
        let text = CollError::Device(failure(DeviceFailureKind::Ready)).to_string();
        assert!(
            text.starts_with("pe 1: call 7, block 3: timed out after 10000 ms waiting for pe 0"),
            "{text}"
        );
        assert!(
            text.contains("pe 0 never arrived, so it is dead or stalled"),
            "{text}"
        );
        assert!(text.contains("create a new one"), "{text}");
    }

    #[test]
    fn count_errors_say_what_to_fix() {
        let text = failure(DeviceFailureKind::OutputTooSmall).to_string();
        assert!(
            text.contains("would receive 6 rows but the output holds 7"),
            "{text}"
        );
        let text = failure(DeviceFailureKind::BadSplits).to_string();
        assert!(text.contains("pe 0's in_splits"), "{text}");
        assert_eq!(DeviceFailureKind::from_code(99), Err(99));
    }
}
