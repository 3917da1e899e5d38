//! Everything that can go wrong in chapter 3. Argument errors are found on the host before any
//! work is enqueued; a timeout is a kernel's bounded wait that gave up. Each message names the
//! problem and the fix.

use ch01_bootstrap::BootstrapError;
use ch02_symmetric_memory::SymmetricError;

use crate::config;

#[derive(Debug, thiserror::Error)]
pub enum PutGetError {
    #[error(transparent)]
    Symmetric(#[from] SymmetricError),
    #[error(
        "the local {side} holds {len} elements, too few for elements {offset}..{}; pass a \
         count that fits, or a larger buffer",
        .offset + .count
    )]
    LocalOutOfBounds {
        side: &'static str,
        offset: usize,
        count: usize,
        len: usize,
    },
    #[error(
        "bytes {ptr:#x}..{:#x} run past the end of NVSHMEM's symmetric heap: the range must lie \
         inside one symmetric allocation",
        .ptr + .num_bytes
    )]
    RangeNotSymmetric { ptr: u64, num_bytes: u64 },
    #[error(
        "launch shape {num_blocks} x {threads_per_block}: {why}. Use 1..=2147483647 blocks of a \
         multiple of 32 threads, at most {}",
        config::MAX_THREADS_PER_BLOCK
    )]
    BadLaunchShape {
        num_blocks: u32,
        threads_per_block: u32,
        why: &'static str,
    },
    #[error(
        "launch shape {num_blocks} x {threads_per_block} for `{kernel}`: its blocks wait for the \
         blocks of the peer's launch, so every block must be resident at once, and this GPU holds \
         at most {} blocks of {threads_per_block} threads of it ({blocks_per_sm} per SM x \
         {num_sms} SMs): launch at most that many blocks, or fewer threads per block",
        .blocks_per_sm * .num_sms
    )]
    NotCoResident {
        kernel: &'static str,
        num_blocks: u32,
        threads_per_block: u32,
        blocks_per_sm: u32,
        num_sms: u32,
    },
    #[error(
        "`{kernel}` uses Hopper's bulk-copy (TMA) instructions and needs sm_90 or newer, but \
         this GPU is {device_arch}; use DeviceOps::put (NVSHMEM's put), which runs on any GPU"
    )]
    NeedsHopper {
        kernel: &'static str,
        device_arch: String,
    },
    #[error(
        "pe {pe} cannot be reached with loads and stores from pe {me} (nvshmem_ptr is null: \
         another node, or no peer access); use put/get instead"
    )]
    NotLoadStoreReachable { me: usize, pe: usize },
    #[error(
        "pe {me}: timed out after {timeout_ms} ms in `{kernel}` waiting for pe {from_pe}'s \
         signal to reach {expected} (it was {seen}). Did pe {from_pe} launch its side, with the \
         same sizes? Run with NVSHMEM_DEBUG=INFO for NVSHMEM's own account"
    )]
    Timeout {
        me: usize,
        kernel: &'static str,
        from_pe: u64,
        expected: u64,
        seen: u64,
        timeout_ms: u64,
    },
    #[error("NCCL (the benchmark's baseline): {0}")]
    Nccl(String),
    #[error(transparent)]
    Kernel(#[from] kernels::KernelError),
    #[error(transparent)]
    Bootstrap(#[from] BootstrapError),
    #[error("CUDA driver error while {what}: {source}")]
    Cuda {
        what: &'static str,
        #[source]
        source: cudarc::driver::DriverError,
    },
}

impl PutGetError {
    pub(crate) fn cuda(what: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> Self {
        move |source| Self::Cuda { what, source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_names_both_pes_and_the_signal() {
        let err = PutGetError::Timeout {
            me: 1,
            kernel: "pingpong",
            from_pe: 0,
            expected: 5,
            seen: 4,
            timeout_ms: 10_000,
        }
        .to_string();
        assert!(
            err.starts_with("pe 1: timed out after 10000 ms in `pingpong`"),
            "{err}"
        );
        assert!(err.contains("pe 0's signal to reach 5 (it was 4)"), "{err}");
    }

    #[test]
    fn range_error_says_what_to_do() {
        let err = PutGetError::RangeNotSymmetric {
            ptr: 0x1000,
            num_bytes: 0x100,
        }
        .to_string();
        assert!(
            err.contains("0x1000..0x1100") && err.contains("inside one symmetric"),
            "{err}"
        );
        let err: PutGetError = SymmetricError::PeOutOfRange { pe: 4, n_pes: 2 }.into();
        assert!(err.to_string().contains("PE 4 is out of range"), "{err}");
    }

    #[test]
    fn co_residency_error_names_the_largest_grid() {
        let err = PutGetError::NotCoResident {
            kernel: "put_signal_ring",
            num_blocks: 600,
            threads_per_block: 256,
            blocks_per_sm: 2,
            num_sms: 132,
        }
        .to_string();
        assert!(err.contains("600 x 256 for `put_signal_ring`"), "{err}");
        assert!(err.contains("at most 264 blocks of 256 threads"), "{err}");
        assert!(err.contains("(2 per SM x 132 SMs)"), "{err}");
    }

    #[test]
    fn hopper_error_names_the_gpu_and_the_alternative() {
        let err = PutGetError::NeedsHopper {
            kernel: "put_bulk",
            device_arch: "sm_80".into(),
        }
        .to_string();
        assert!(
            err.contains("needs sm_90 or newer") && err.contains("this GPU is sm_80"),
            "{err}"
        );
        assert!(err.contains("DeviceOps::put"), "{err}");
    }
}
