//! NVSHMEM sizes its symmetric heap once, at initialisation, from NVSHMEM_SYMMETRIC_SIZE: a
//! program sets it for its buffers before the World exists, unless the user chose a size.
//! `#[path]`-included by the programs that size it (chapter 7's uses NVSHMEM's default).

use ch01_bootstrap::LaunchEnv;
use nvshmem_tutorial::symmetric_memory::SYMMETRIC_SIZE_VAR;

type AnyError = Box<dyn std::error::Error>;

/// Sets NVSHMEM_SYMMETRIC_SIZE to `num_bytes(world_size)` plus a margin (as the Python
/// package's: NVSHMEM's own allocations and the tally's), unless it is set. Call it first in
/// `main`, before any thread or library starts.
pub(crate) fn size_the_heap(num_bytes: impl FnOnce(usize) -> usize) -> Result<(), AnyError> {
    if std::env::var_os(SYMMETRIC_SIZE_VAR).is_some() {
        return Ok(());
    }
    let num_bytes = num_bytes(LaunchEnv::from_env()?.world_size);
    // SAFETY: nothing else runs yet: main has started no thread and loaded no library.
    unsafe { std::env::set_var(SYMMETRIC_SIZE_VAR, format!("{}G", (num_bytes >> 30) + 2)) };
    Ok(())
}
