//! The self-check every example ends with: each PE counts its checks, PE 0 prints the job's
//! total as `N passed, M failed` (the line scripts/gpu_test.sh looks for).

use crate::{BootstrapError, World};

/// Checks counted on this PE.
#[derive(Debug, Default)]
pub struct Tally {
    pub passed: u32,
    pub failed: u32,
}

impl Tally {
    /// Counts one check; a failure is printed with this PE's number and `what()`.
    pub fn check(&mut self, pe: usize, ok: bool, what: impl FnOnce() -> String) {
        if ok {
            self.passed += 1;
        } else {
            self.failed += 1;
            eprintln!("pe {pe}: FAILED: {}", what());
        }
    }

    // ANCHOR: finish
    /// Collective. Every PE puts its (passed, failed) into slot `my_pe` of a symmetric table
    /// on PE 0; after a barrier PE 0 prints the sum. Returns whether this process's view is
    /// all-pass (on PE 0: the whole job's).
    pub fn finish(&self, world: &World) -> Result<bool, BootstrapError> {
        let nvshmem = world.nvshmem();
        let stream = world.stream();
        let n = world.n_pes();
        let bytes = n * 8;
        // SAFETY: initialised; collective with the same size on every PE.
        let table = unsafe { (nvshmem.malloc)(bytes) } as u64;
        if table == 0 {
            return Err(BootstrapError::Nvshmem(
                "nvshmem_malloc for the tally failed".into(),
            ));
        }
        let mut all = vec![0u32; 2 * n];
        let result = (|| {
            // Zero PE 0's copy before anyone writes into it.
            // SAFETY: `table` holds `bytes` bytes.
            unsafe { cudarc::driver::result::memset_d8_async(table, 0, bytes, stream.cu_stream()) }
                .map_err(BootstrapError::cuda("zeroing the tallies"))?;
            world.barrier_all()?;
            let mine = stream
                .clone_htod(&[self.passed, self.failed])
                .map_err(BootstrapError::cuda("uploading the tally"))?;
            let (mine_ptr, _sync) = cudarc::driver::DevicePtr::device_ptr(&mine, stream);
            // SAFETY: slot `my_pe` of the symmetric table on PE 0; 8 bytes from a live buffer.
            unsafe {
                (nvshmem.putmem_on_stream)(
                    (table + 8 * world.my_pe() as u64) as *mut _,
                    mine_ptr as *const _,
                    8,
                    0,
                    stream.cu_stream() as _,
                );
                (nvshmem.barrier_all_on_stream)(stream.cu_stream() as _);
                cudarc::driver::result::memcpy_dtoh_async(&mut all, table, stream.cu_stream())
            }
            .map_err(BootstrapError::cuda("reading the tallies"))?;
            stream
                .synchronize()
                .map_err(BootstrapError::cuda("synchronising"))
        })();
        // SAFETY: collective free; every PE gets here.
        unsafe { (nvshmem.free)(table as *mut _) };
        result?;
        println!(
            "pe {}: {} passed, {} failed",
            world.my_pe(),
            self.passed,
            self.failed
        );
        if world.my_pe() != 0 {
            return Ok(self.failed == 0);
        }
        let passed: u32 = all.iter().step_by(2).sum();
        let failed: u32 = all.iter().skip(1).step_by(2).sum();
        // A PE whose put never arrived left 0/0: count it as a failure, not as silence.
        let silent = all.chunks(2).filter(|c| c[0] + c[1] == 0).count() as u32;
        println!("{passed} passed, {} failed", failed + silent);
        Ok(failed + silent == 0)
    }
    // ANCHOR_END: finish
}

/// `main` of every example: run, map the outcome to an exit code (0 all passed, 1 a check
/// failed, 2 an error stopped the run), print errors with the program's name.
pub fn exit_code(
    program: &str,
    outcome: Result<bool, Box<dyn std::error::Error>>,
) -> std::process::ExitCode {
    match outcome {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(error) => {
            eprintln!("{program}: error: {error}");
            std::process::ExitCode::from(2)
        }
    }
}
