//! The checking harness every chapter's example uses, kept apart from the lessons:
//!
//! - test data that shows where it came from: [`fresh_words`], random per job and per case,
//!   that any PE can regenerate for any other PE without a message;
//! - outputs poisoned before a run ([`poison`]), so a slot nothing wrote cannot pass;
//! - comparison with a host reference that also checks the poison around the written range
//!   ([`count_wrong`]);
//! - the tally: each PE counts its checks ([`Tally::check`], [`Tally::expect_error`]), PE 0
//!   prints the job's total as `N passed, M failed` ([`Tally::finish`]), the line
//!   scripts/gpu_test.sh looks for, and [`exit_code`] maps the outcome to the exit status.

use cudarc::driver::CudaStream;
use rand::{Rng, SeedableRng, rngs::StdRng};

use crate::{BootstrapError, World};

/// The byte every output is filled with before a run. A slot that nothing wrote keeps it, and
/// the tests' data never fills a whole range with it.
pub const POISON_BYTE: u8 = 0xFF;
/// [`POISON_BYTE`] as a u32 word.
pub const POISON_WORD: u32 = u32::from_ne_bytes([POISON_BYTE; 4]);

/// Fills `num_bytes` bytes at `ptr` with [`POISON_BYTE`], in order on `stream`.
///
/// # Safety
/// `ptr` must be a device pointer [num_bytes] u8, writable, in the stream's context (a local
/// allocation or this PE's copy of a symmetric buffer).
pub unsafe fn poison(
    ptr: u64,
    num_bytes: usize,
    stream: &CudaStream,
) -> Result<(), BootstrapError> {
    // SAFETY: the caller vouches for `ptr..ptr + num_bytes`.
    unsafe {
        cudarc::driver::result::memset_d8_async(ptr, POISON_BYTE, num_bytes, stream.cu_stream())
    }
    .map_err(BootstrapError::cuda("poisoning an output"))
}

/// The `len` words PE `pe` sends in case `case_idx` of a job seeded with `job_seed`
/// ([`World::job_seed`]): random, different in every job and case, and reproducible by any PE
/// without communication, so a receiver can check what it got against what was sent.
pub fn fresh_words(job_seed: u64, pe: usize, case_idx: u64, len: usize) -> Vec<u32> {
    let seed = job_seed ^ case_idx.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ ((pe as u64) << 48);
    let mut rng = StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.random::<u32>()).collect()
}

/// How many elements of `got` differ from what a correct run leaves: `poison` before
/// `offset`, `expected` from `offset`, `poison` after it. A write past either end counts as
/// much as a missing one.
pub fn count_wrong<T: PartialEq + Copy>(
    got: &[T],
    offset: usize,
    expected: &[T],
    poison: T,
) -> usize {
    got.iter()
        .enumerate()
        .filter(|&(i, &element)| {
            let want = match i.checked_sub(offset) {
                Some(j) if j < expected.len() => expected[j],
                _ => poison,
            };
            element != want
        })
        .count()
}

/// Cases counted per key (say "all_reduce  two_shot  f32"), for PE 0 to print one line per
/// key at the end: the collectives' examples check hundreds of cases, and a line each would
/// bury the failures (which `Tally::check` prints as they happen).
#[derive(Debug, Default)]
pub struct CaseSummary(std::collections::BTreeMap<String, (u32, u32)>);

impl CaseSummary {
    /// Counts one case of `key`.
    pub fn record(&mut self, key: &str, ok: bool) {
        let entry = self.0.entry(key.to_owned()).or_default();
        if ok {
            entry.0 += 1;
        } else {
            entry.1 += 1;
        }
    }

    /// On PE 0: one line per key, its cases that passed and those that failed.
    pub fn print(&self, me: usize) {
        if me != 0 {
            return;
        }
        for (key, (passed, failed)) in &self.0 {
            let failed = match failed {
                0 => String::new(),
                n => format!(", {n} FAILED"),
            };
            println!("pe 0: {key:<42} {passed:>3} ok{failed}");
        }
    }
}

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

    /// Counts an attempt that must be refused: it passes when `result` is an error whose
    /// message contains `expected`. Returns the message (or `NOT REJECTED`) for printing.
    pub fn expect_error<T, E: std::fmt::Display>(
        &mut self,
        pe: usize,
        what: &str,
        result: Result<T, E>,
        expected: &str,
    ) -> String {
        let message = result.err().map(|e| e.to_string());
        let ok = message.as_deref().is_some_and(|m| m.contains(expected));
        self.check(pe, ok, || {
            format!("{what}: expected an error containing {expected:?}, got {message:?}")
        });
        message.unwrap_or_else(|| "NOT REJECTED".into())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrong_elements_include_poison_overwritten_around_the_range() {
        let p = POISON_WORD;
        assert_eq!(count_wrong(&[p, 7, 8, p], 1, &[7, 8], p), 0);
        // A missing element, a write before the range and one after it.
        assert_eq!(count_wrong(&[p, p, 8, p], 1, &[7, 8], p), 1);
        assert_eq!(count_wrong(&[1, 7, 8, p], 1, &[7, 8], p), 1);
        assert_eq!(count_wrong(&[p, 7, 8, 2], 1, &[7, 8], p), 1);
        // An offset applied twice shifts everything.
        assert_eq!(count_wrong(&[p, p, 7, 8], 1, &[7, 8], p), 3);
    }

    #[test]
    fn fresh_words_differ_by_pe_case_and_job_but_repeat_for_the_same_ones() {
        let words = fresh_words(42, 1, 3, 64);
        assert_eq!(words, fresh_words(42, 1, 3, 64));
        assert_ne!(words, fresh_words(42, 0, 3, 64));
        assert_ne!(words, fresh_words(42, 1, 4, 64));
        assert_ne!(words, fresh_words(43, 1, 3, 64));
        assert!(words.iter().any(|&w| w != 0) && words.iter().any(|&w| w != POISON_WORD));
    }

    #[test]
    fn an_attempt_passes_only_when_refused_with_the_expected_message() {
        let mut tally = Tally::default();
        let refused: Result<(), String> = Err("PE 4 is out of range".into());
        let message = tally.expect_error(0, "put to pe 4", refused, "out of range");
        assert_eq!(message, "PE 4 is out of range");
        let wrong_reason: Result<(), String> = Err("something else".into());
        tally.expect_error(0, "put to pe 4", wrong_reason, "out of range");
        let accepted: Result<(), String> = Ok(());
        let message = tally.expect_error(0, "put to pe 4", accepted, "out of range");
        assert_eq!(message, "NOT REJECTED");
        assert_eq!((tally.passed, tally.failed), (1, 2));
    }
}
