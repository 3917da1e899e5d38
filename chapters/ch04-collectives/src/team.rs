//! NVSHMEM's own collectives: team-based, enqueued on a stream by the host. They are the way to
//! run a collective when it need not be fused into a kernel of yours, and the third peer this
//! chapter's kernels are measured against, beside NCCL and torch (`ch04-coll-bench --nvshmem`).
//!
//! A *team* is an ordered set of PEs; `NVSHMEM_TEAM_WORLD` holds every PE of the job, and
//! `nvshmem_team_split_strided` makes smaller ones (chapter 5's node and rail teams). Every
//! member calls a team collective with the same arguments; source and destination are
//! symmetric.
//!
//! Two things decide what such a call measures, with NVSHMEM 3.4.5:
//! - With NVLink multicast off (as everywhere in this book), NVSHMEM hands its on-stream reduce,
//!   fcollect, broadcast, alltoall and reducescatter to NCCL whenever it can load libnccl. Set
//!   `NVSHMEM_DISABLE_NCCL=1` to run NVSHMEM's own implementation; otherwise the row is NCCL
//!   timed twice. [`nccl_disabled`] checks the variable.
//! - With several PEs on one GPU and no CUDA MPS ("limited MPG"), NVSHMEM refuses on-stream
//!   collectives and team splits; under MPS they work (`scripts/fold_pes.sh`).

use ch01_bootstrap::World;
use ch02_symmetric_memory::SymmetricBuffer;
use std::ops::Deref;

use crate::algorithm::Collective;
use crate::error::CollError;

/// One on-stream team collective: the NVSHMEM function, the count it takes and the bytes it
/// touches on each PE, for a call of `size` bytes as nccl-tests counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TeamCall {
    pub collective: Collective,
    /// The C function, for messages and the benchmark's CSV.
    pub function: &'static str,
    /// What the function's count argument gets: bf16 elements for the reductions, bytes per
    /// PE for the `mem` forms.
    pub count: usize,
    /// Bytes read from `source` and written to `dest` on each PE.
    pub in_bytes: usize,
    pub out_bytes: usize,
}

// ANCHOR: team_call
/// The NVSHMEM call for `collective` at `size` bytes over `n_pes` PEs. Sizes follow nccl-tests,
/// as in the rest of this chapter: all-reduce and broadcast count the buffer, all-gather its
/// output, reduce-scatter its input, all-to-all one PE's input. Reductions are bf16 sums.
pub fn team_call(collective: Collective, size: usize, n_pes: usize) -> Result<TeamCall, CollError> {
    let bad = |what: String| CollError::InvalidArgument {
        collective: collective.name(),
        what,
    };
    let per_pe = size / n_pes.max(1);
    let (function, count, in_bytes, out_bytes) = match collective {
        Collective::AllReduce => (
            "nvshmemx_bfloat16_sum_reduce_on_stream",
            size / 2,
            size,
            size,
        ),
        Collective::ReduceScatter => (
            "nvshmemx_bfloat16_sum_reducescatter_on_stream",
            per_pe / 2,
            size,
            per_pe,
        ),
        Collective::AllGather => ("nvshmemx_fcollectmem_on_stream", per_pe, per_pe, size),
        Collective::AllToAll => ("nvshmemx_alltoallmem_on_stream", per_pe, size, size),
        Collective::Broadcast => ("nvshmemx_broadcastmem_on_stream", size, size, size),
        other => {
            return Err(bad(format!(
                "NVSHMEM has no on-stream team call for {}",
                other.name()
            )));
        }
    };
    // The counts must come out whole: bf16 elements, and equal shares per PE.
    let divisor = match collective {
        Collective::AllReduce => 2,
        Collective::ReduceScatter => 2 * n_pes.max(1),
        Collective::Broadcast => 1,
        _ => n_pes.max(1),
    };
    if size == 0 || !size.is_multiple_of(divisor) {
        return Err(bad(format!(
            "{size} bytes is not a positive multiple of {divisor} at {n_pes} PEs"
        )));
    }
    Ok(TeamCall {
        collective,
        function,
        count,
        in_bytes,
        out_bytes,
    })
}
// ANCHOR_END: team_call

/// The variable that sizes NVSHMEM's reduction scratch, one area per team, read once by
/// `nvshmem_init`, and its default in NVSHMEM 3.4.5 (`env_defs.h`).
pub const REDUCE_SCRATCH_VAR: &str = "NVSHMEM_REDUCE_SCRATCH_SIZE";
pub const DEFAULT_REDUCE_SCRATCH_BYTES: usize = 512 << 10;

/// The bytes `NVSHMEM_REDUCE_SCRATCH_SIZE` (its value, if set) gives each team's reduction
/// scratch: a count with an optional k, m, g or t (any case), as NVSHMEM reads sizes.
pub fn reduce_scratch_bytes(value: Option<&str>) -> Result<usize, CollError> {
    let Some(text) = value.map(str::trim) else {
        return Ok(DEFAULT_REDUCE_SCRATCH_BYTES);
    };
    let bad = || CollError::InvalidArgument {
        collective: "reduce_scatter",
        what: format!(
            "{REDUCE_SCRATCH_VAR}={text:?} is not a size (a count, e.g. 16M or 16777216)"
        ),
    };
    let (digits, shift) = match text.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_lowercase() {
                'k' => 10,
                'm' => 20,
                'g' => 30,
                't' => 40,
                _ => return Err(bad()),
            };
            (&text[..i], shift)
        }
        _ => (text, 0),
    };
    let count: usize = digits.parse().map_err(|_| bad())?;
    count.checked_mul(1 << shift).ok_or_else(bad)
}

// ANCHOR: reduce_scratch
/// NVSHMEM 3.4.5's reduce-scatter (its own, NCCL off or unloadable, which is every folded run)
/// copies every peer's share into the team's scratch, half of `scratch_bytes`, and then
/// reduces there. It does not split a larger call, and its bound check is an `assert` compiled
/// out of the shipped library: a call past it overwrites the next team's barrier flags, and
/// another team's collective then returns wrong bytes or never ends. So it is refused here.
pub fn check_reduce_scratch(call: &TeamCall, scratch_bytes: usize) -> Result<(), CollError> {
    let room = scratch_bytes / 2;
    if call.collective != Collective::ReduceScatter || call.in_bytes <= room {
        return Ok(());
    }
    Err(CollError::InvalidArgument {
        collective: call.collective.name(),
        what: format!(
            "NVSHMEM's reduce-scatter stages its whole input ({} bytes per PE) in half of the \
             team's reduction scratch ({room} of {scratch_bytes} bytes) and does not split larger \
             calls: set {REDUCE_SCRATCH_VAR} to at least {} before NVSHMEM starts (e.g. 16M), or \
             call with less",
            call.in_bytes,
            2 * call.in_bytes
        ),
    })
}
// ANCHOR_END: reduce_scratch

/// The scratch this process's NVSHMEM was given. NVSHMEM reads the variable once, at
/// `nvshmem_init`, and so does this (on first use, after `default_reduce_scratch`): every
/// team call asks, and the environment is not read again on that path.
pub fn process_reduce_scratch_bytes() -> Result<usize, CollError> {
    static VALUE: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    reduce_scratch_bytes(
        VALUE
            .get_or_init(|| std::env::var(REDUCE_SCRATCH_VAR).ok())
            .as_deref(),
    )
}

/// The scratch the benchmarks that call NVSHMEM's team reduce-scatter ask for (their largest
/// calls stage 8 MiB; each team slot costs this much symmetric memory, about 0.5 GiB per PE
/// over NVSHMEM's 32 team slots). Chapter 5's test asks for what its size needs
/// ([`default_reduce_scratch_for`]).
pub const PROGRAM_REDUCE_SCRATCH: &str = "16M";

/// Gives NVSHMEM `PROGRAM_REDUCE_SCRATCH` of reduction scratch unless the user chose a size.
///
/// # Safety
/// Call it first in `main`, before NVSHMEM starts and before any other thread exists: it writes
/// the environment.
pub unsafe fn default_reduce_scratch() {
    // SAFETY: the caller's.
    unsafe { default_reduce_scratch_of(PROGRAM_REDUCE_SCRATCH) }
}

/// Gives NVSHMEM enough reduction scratch for a reduce-scatter of `in_bytes` per PE (twice
/// that, `check_reduce_scratch`'s rule, in whole MiB) unless the user chose a size. NVSHMEM
/// keeps one scratch per team slot (32), so asking for no more than the largest call needs
/// saves symmetric memory, and time where the pool is filled slowly (under compute-sanitizer
/// memcheck, 16 MiB a slot takes two minutes at start).
///
/// # Safety
/// As [`default_reduce_scratch`].
pub unsafe fn default_reduce_scratch_for(in_bytes: usize) {
    // SAFETY: the caller's.
    unsafe { default_reduce_scratch_of(&reduce_scratch_for(in_bytes)) }
}

/// The `NVSHMEM_REDUCE_SCRATCH_SIZE` value whose scratch takes a reduce-scatter of `in_bytes`
/// per PE: twice that, in whole MiB (at least 1).
pub fn reduce_scratch_for(in_bytes: usize) -> String {
    format!("{}M", (2 * in_bytes).div_ceil(1 << 20).max(1))
}

/// # Safety
/// As [`default_reduce_scratch`].
unsafe fn default_reduce_scratch_of(size: &str) {
    if std::env::var_os(REDUCE_SCRATCH_VAR).is_none() {
        // SAFETY: the caller's: no other thread reads or writes the environment.
        unsafe { std::env::set_var(REDUCE_SCRATCH_VAR, size) };
    }
}

/// Whether `NVSHMEM_DISABLE_NCCL` (its value, if set) makes NVSHMEM run its own collectives.
/// NVSHMEM reads it as a boolean at initialisation: 1, y, yes, t, true (any case).
pub fn nccl_disabled(value: Option<&str>) -> bool {
    value.is_some_and(|v| {
        ["1", "y", "yes", "t", "true"].contains(&v.trim().to_ascii_lowercase().as_str())
    })
}

/// Enqueues NVSHMEM's `collective` over `NVSHMEM_TEAM_WORLD` on `stream` (a stream of this
/// PE's context): `input` and `out` are symmetric, as NVSHMEM requires, and big enough
/// for the call; broadcast copies PE `root`'s input. Every PE must make the same call.
pub fn enqueue_team<W: Deref<Target = World>>(
    world: &World,
    collective: Collective,
    out: &SymmetricBuffer<W, u8>,
    input: &SymmetricBuffer<W, u8>,
    size: usize,
    root: usize,
    stream: &cudarc::driver::CudaStream,
) -> Result<TeamCall, CollError> {
    let call = team_call(collective, size, world.n_pes())?;
    input.check_range(0, call.in_bytes)?;
    out.check_range(0, call.out_bytes)?;
    ch02_symmetric_memory::check_pe(world, root)?;
    let team = nvshmem_sys::TEAM_WORLD;
    // SAFETY: both buffers are symmetric allocations holding the bytes the call touches
    // (checked above); the stream is of this context.
    unsafe {
        enqueue_on_team(
            world,
            team,
            &call,
            out.device_ptr(),
            input.device_ptr(),
            root,
            stream.cu_stream(),
        )
    }?;
    Ok(call)
}

// ANCHOR: enqueue_team
/// The NVSHMEM call of `call` over `team` on `stream`: `root` is a PE number of the team
/// (broadcast only). Every member of the team must make the same call.
///
/// NVSHMEM's collectives write into their peers' `out` (and read their `input`) as soon as
/// they start, and OpenSHMEM leaves it to the caller to make sure every member is ready for
/// that. Chapter 4's kernels wait for each peer to enter the call; here a team sync on the
/// stream does it, so that a PE still reading its last result, or still writing its input,
/// is not overwritten by a faster peer. A second sync after the call keeps a fast PE from
/// rewriting its `input` (chapter 5's next step, or the next call) while a slower peer may
/// still read it. (Without the first, PEs sharing a GPU got wrong bytes at 64 KiB and up on
/// 2026-11-26; with it alone, a reduce-scatter of 2 nodes of 4 still did, once.)
///
/// # Safety
/// `out` and `input` must be symmetric device addresses of at least `call.out_bytes` and
/// `call.in_bytes` bytes; `call` must come from [`team_call`] with the team's size; `stream`
/// must be a live stream of this PE's context.
pub unsafe fn enqueue_on_team(
    world: &World,
    team: nvshmem_sys::Team,
    call: &TeamCall,
    out: u64,
    input: u64,
    root: usize,
    stream: cudarc::driver::sys::CUstream,
) -> Result<(), CollError> {
    check_reduce_scratch(call, process_reduce_scratch_bytes()?)?;
    let nv = world.nvshmem();
    let (dest, source) = (out as *mut _, input as *const _);
    let stream = stream as nvshmem_sys::CudaStream;
    let count = call.count;
    team_sync(nv, team, stream)?;
    // SAFETY: NVSHMEM is initialised (a World exists); the caller vouches for the rest.
    let status = unsafe {
        match call.collective {
            Collective::AllReduce => {
                (nv.bfloat16_sum_reduce_on_stream)(team, dest, source, count, stream)
            }
            Collective::ReduceScatter => {
                (nv.bfloat16_sum_reducescatter_on_stream)(team, dest, source, count, stream)
            }
            Collective::AllGather => (nv.fcollectmem_on_stream)(team, dest, source, count, stream),
            Collective::AllToAll => (nv.alltoallmem_on_stream)(team, dest, source, count, stream),
            _ => (nv.broadcastmem_on_stream)(team, dest, source, count, root as i32, stream),
        }
    };
    if status != 0 {
        return Err(CollError::Nvshmem {
            function: call.function,
            status,
        });
    }
    team_sync(nv, team, stream)
}
// ANCHOR_END: enqueue_team

/// Enqueues a sync of `team` on `stream`: no member's later work starts before every member
/// has reached it.
fn team_sync(
    nv: &nvshmem_sys::Nvshmem,
    team: nvshmem_sys::Team,
    stream: nvshmem_sys::CudaStream,
) -> Result<(), CollError> {
    // SAFETY: NVSHMEM is initialised (the caller holds a World); `team` is a team of this PE.
    let status = unsafe { (nv.team_sync_on_stream)(team, stream) };
    if status != 0 {
        return Err(CollError::Nvshmem {
            function: "nvshmemx_team_sync_on_stream",
            status,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_nccl_tests_sizes() {
        let n = 4;
        let call = |c| team_call(c, 1 << 20, n).unwrap();
        // All-reduce: the buffer, in bf16 elements.
        assert_eq!(call(Collective::AllReduce).count, 1 << 19);
        assert_eq!(call(Collective::AllReduce).out_bytes, 1 << 20);
        // Reduce-scatter: the input; each PE ends with a quarter of it.
        let rs = call(Collective::ReduceScatter);
        assert_eq!(
            (rs.count, rs.in_bytes, rs.out_bytes),
            (1 << 17, 1 << 20, 1 << 18)
        );
        // All-gather: the output; each PE contributes a quarter, in bytes.
        let ag = call(Collective::AllGather);
        assert_eq!(
            (ag.function, ag.count, ag.in_bytes, ag.out_bytes),
            ("nvshmemx_fcollectmem_on_stream", 1 << 18, 1 << 18, 1 << 20)
        );
        // All-to-all: one PE's input, block q (a quarter) to PE q.
        let a2a = call(Collective::AllToAll);
        assert_eq!(
            (a2a.count, a2a.in_bytes, a2a.out_bytes),
            (1 << 18, 1 << 20, 1 << 20)
        );
        assert_eq!(call(Collective::Broadcast).count, 1 << 20);
    }

    #[test]
    fn sizes_that_do_not_divide_are_refused_with_the_reason() {
        let err = team_call(Collective::ReduceScatter, 1002, 4)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("reduce_scatter") && err.contains("multiple of 8"),
            "{err}"
        );
        assert!(team_call(Collective::AllReduce, 3, 2).is_err());
        assert!(team_call(Collective::AllGather, 0, 2).is_err());
        assert!(team_call(Collective::Broadcast, 3, 2).is_ok());
        let err = team_call(Collective::AllToAllV, 1024, 2)
            .unwrap_err()
            .to_string();
        assert!(err.contains("no on-stream team call"), "{err}");
    }

    #[test]
    fn the_reduce_scratch_is_read_as_nvshmem_reads_sizes() {
        assert_eq!(reduce_scratch_bytes(None).unwrap(), 512 << 10);
        assert_eq!(reduce_scratch_bytes(Some("16M")).unwrap(), 16 << 20);
        assert_eq!(reduce_scratch_bytes(Some("64k")).unwrap(), 64 << 10);
        assert_eq!(reduce_scratch_bytes(Some(" 1048576 ")).unwrap(), 1 << 20);
        // Chapter 5's largest f32 reduce-scatter at N = 2 (2 x 262,147 x 4 bytes a PE) needs
        // 4 MiB + 48 bytes of scratch: 4M would refuse it, 5M takes it.
        let in_bytes = 2 * 262_147 * 4;
        let rs_call = |in_bytes| TeamCall {
            collective: Collective::ReduceScatter,
            function: "nvshmem_float_sum_reduce_scatter",
            count: in_bytes / 8,
            in_bytes,
            out_bytes: in_bytes / 2,
        };
        assert_eq!(reduce_scratch_for(in_bytes), "5M");
        let scratch = reduce_scratch_bytes(Some(&reduce_scratch_for(in_bytes))).unwrap();
        assert!(check_reduce_scratch(&rs_call(in_bytes), scratch).is_ok());
        assert!(check_reduce_scratch(&rs_call(in_bytes), 4 << 20).is_err());
        assert_eq!(reduce_scratch_for(0), "1M");
        assert_eq!(reduce_scratch_for(1 << 19), "1M");
        assert_eq!(reduce_scratch_for((1 << 19) + 1), "2M");
        for bad in ["", "M", "16x", "-1", "1.5M"] {
            let err = reduce_scratch_bytes(Some(bad)).unwrap_err().to_string();
            assert!(err.contains(REDUCE_SCRATCH_VAR), "{bad:?}: {err}");
        }
    }

    #[test]
    fn a_reduce_scatter_past_half_the_scratch_is_refused_with_the_size_to_set() {
        // Chapter 5's failing case: 2 nodes of 4, 262147 bf16 per PE on the node team.
        let call = team_call(Collective::ReduceScatter, 4 * 262147 * 2, 4).unwrap();
        let err = check_reduce_scratch(&call, DEFAULT_REDUCE_SCRATCH_BYTES)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("2097176 bytes per PE") && err.contains("at least 4194352"),
            "{err}"
        );
        assert!(check_reduce_scratch(&call, 16 << 20).is_ok());
        // Exactly half fits; other collectives do not use this scratch.
        let half = team_call(Collective::ReduceScatter, 256 << 10, 4).unwrap();
        assert!(check_reduce_scratch(&half, DEFAULT_REDUCE_SCRATCH_BYTES).is_ok());
        let ar = team_call(Collective::AllReduce, 64 << 20, 4).unwrap();
        assert!(check_reduce_scratch(&ar, DEFAULT_REDUCE_SCRATCH_BYTES).is_ok());
    }

    #[test]
    fn nccl_is_disabled_only_by_a_true_value() {
        assert!(
            nccl_disabled(Some("1")) && nccl_disabled(Some("TRUE")) && nccl_disabled(Some("y"))
        );
        assert!(!nccl_disabled(None) && !nccl_disabled(Some("0")) && !nccl_disabled(Some("")));
    }
}
