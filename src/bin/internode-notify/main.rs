//! Issue 32, step 3's GPU test: the notify step across nodes (`internode_notify`) against its
//! host reference, on virtual nodes of G ranks:
//!
//! ```text
//! NVSHMEM_TUTORIAL_NODE_PES=G torchrun --standalone --nproc_per_node=N --no-python \
//!     target/release/internode-notify [--pairs CALLS] [--timeout-ms MS] [--create-destroy K]
//! ```
//!
//! Every rank rebuilds every rank's routing from the job's seed (random token counts, a rank
//! with none, experts drawn from part of the range so that some nodes get nothing), uploads its
//! own layout (is_token_in_rank and the counts, computed on the host), runs the full notify
//! and compares handle positions 1-6 and the host counts with `internode::flat`, DeepEP's
//! definitions computed from the global routing; channels, experts per rank and
//! expert_alignment change from call to call (`--pairs`, default 24 calls). Every third call
//! is followed by a cached notify with the handle just made, which must pass its check and
//! leave the handle alone. Then the mistakes: counts per node that disagree with the routing
//! (NODE_COUNTS_MISMATCH), a cached notify with an altered handle (HANDLE_MISMATCH), a handle of
//! the wrong width and chapter 7's notify (refused on the host), and one more good call after
//! them. On one node (no NVSHMEM_TUTORIAL_NODE_PES) it checks that the buffer is refused.
//! Ends `N passed, M failed`.

use std::process::ExitCode;

use ch01_bootstrap::World;
use ch01_bootstrap::checks::Tally;
use nvshmem_tutorial::internode::{Notified, flat};
use nvshmem_tutorial::{
    DeviceArray, InternodeHandle, InternodeNotifyCall, InternodeRecvCounts, NotifyInputs,
    NotifyOutputs, NvshmemBuffer,
};

#[path = "../shared/heap.rs"]
mod heap;
#[path = "../shared/internode.rs"]
mod internode_case;
#[allow(dead_code)] // routing's weights are for the dispatch programs
#[path = "../shared/mod.rs"]
mod shared;

#[cfg(test)]
use internode_case::HostLayout;
use internode_case::{Case, HandleArrays, LayoutArrays, POISON, Program, host_layout, notify};
use shared::AnyError;

/// The notify uses no ring: small regions (num_rdma_bytes > 0 is what makes a normal-mode
/// buffer span nodes).
const NUM_NVL_BYTES: usize = 1 << 20;
const NUM_RDMA_BYTES: usize = 1 << 20;
const NUM_CALLS: usize = 24;

fn main() -> ExitCode {
    internode_case::main("internode-notify", region_bytes, checks)
}

/// The notify uses no ring: the same small regions on any number of ranks.
fn region_bytes(_: usize) -> (usize, usize) {
    (NUM_NVL_BYTES, NUM_RDMA_BYTES)
}

/// The notifies, a cached one after every third, then the mistakes and one more good call.
fn checks(program: &Program, tally: &mut Tally) -> Result<(), AnyError> {
    program.announce(
        "rail rows by NVSHMEM put-with-signal across nodes, the node's rows through peer pointers",
    );
    let (buffer, g) = (&program.buffer, program.node_pes);
    let (me, n, seed) = (program.me, program.n, program.seed);
    let num_calls = program.calls.unwrap_or(NUM_CALLS);
    let mut calls = Tally::default();
    for i in 0..num_calls {
        let case = Case::new(
            seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            n,
            g,
            i,
        );
        let cached = i % 3 == 2;
        let ok = full_then_cached(buffer, &case, cached, &mut calls)?;
        if !ok {
            eprintln!(
                "pe {me}: call {i} ({}) differed from the reference",
                case.describe()
            );
        }
    }
    println!(
        "pe {me}: {num_calls} notifies (a cached one after every third): {} checks passed, {} \
         failed",
        calls.passed, calls.failed
    );
    tally.passed += calls.passed;
    tally.failed += calls.failed;

    mistakes(buffer, seed, tally)?;
    let after = Case::new(seed ^ 0xA11CE, n, g, 1);
    let ok = full_then_cached(buffer, &after, true, tally)?;
    tally.check(me, ok, || {
        "the notify after the refused calls differed".into()
    });
    Ok(())
}

/// The reference's positions 1-6, flattened row-major as the arrays hold them.
fn expected_positions(want: &Notified) -> [(&'static str, Vec<i32>); 6] {
    let flat2 = |m: &Vec<Vec<i32>>| m.iter().flatten().copied().collect::<Vec<i32>>();
    [
        (
            "rdma_channel_prefix_matrix",
            flat2(&want.rdma_channel_prefix_matrix),
        ),
        (
            "gbl_channel_prefix_matrix",
            flat2(&want.gbl_channel_prefix_matrix),
        ),
        (
            "recv_rdma_channel_prefix_matrix",
            flat2(&want.recv_rdma_channel_prefix_matrix),
        ),
        (
            "recv_rdma_rank_prefix_sum",
            want.recv_rdma_rank_prefix_sum.clone(),
        ),
        (
            "recv_gbl_channel_prefix_matrix",
            flat2(&want.recv_gbl_channel_prefix_matrix),
        ),
        (
            "recv_gbl_rank_prefix_sum",
            want.recv_gbl_rank_prefix_sum.clone(),
        ),
    ]
}

/// The full notify of `case`, checked against the reference; with `cached`, a cached notify
/// with the handle it made, which must pass and leave the handle as it was. Whether all held.
fn full_then_cached(
    buffer: &NvshmemBuffer<&World>,
    case: &Case,
    cached: bool,
    tally: &mut Tally,
) -> Result<bool, AnyError> {
    let world = buffer.world();
    let (me, stream) = (world.my_pe(), world.stream());
    let job = &case.job;
    let (n, nodes, c) = (job.n_pes, job.n_pes / job.node_pes, job.num_channels);
    let layout = LayoutArrays::new(stream, &host_layout(job, me), n)?;
    let arrays = HandleArrays::new(stream, n, nodes, c)?;
    let handle = arrays.handle();
    let full = InternodeNotifyCall::Full(layout.inputs(case.expert_alignment));
    let counts = notify(buffer, &full, &handle, &case.config)?
        .ok_or("the full notify returned no counts")?;
    let got = arrays.to_host(stream)?;
    let want = flat(job, me);
    let before = tally.failed;
    for ((name, expected), got) in expected_positions(&want).iter().zip(&got) {
        let first = expected.iter().zip(got).position(|(e, g)| e != g);
        tally.check(me, first.is_none() && expected.len() == got.len(), || {
            let i = first.unwrap_or(0);
            format!(
                "{} ({}): {name}[{i}] = {:?}, expected {:?}",
                case.describe(),
                if got.get(i) == Some(&POISON) {
                    "never written"
                } else {
                    "wrong"
                },
                got.get(i),
                expected.get(i)
            )
        });
    }
    let align = case.expert_alignment as i32;
    let want_counts = InternodeRecvCounts {
        num_recv_tokens: *want.recv_gbl_rank_prefix_sum.last().unwrap() as usize,
        num_rdma_recv_tokens: *want.recv_rdma_rank_prefix_sum.last().unwrap() as usize,
        per_local_expert: want
            .num_recv_tokens_per_expert
            .iter()
            .map(|&x| (x + align - 1) / align * align)
            .collect(),
    };
    tally.check(me, counts == want_counts, || {
        format!(
            "{}: host counts {counts:?}, expected {want_counts:?}",
            case.describe()
        )
    });
    if cached {
        let call = InternodeNotifyCall::Cached {
            is_token_in_rank: layout.is_token_in_rank.view(),
        };
        let outcome = notify(buffer, &call, &handle, &case.config);
        tally.check(me, matches!(outcome, Ok(None)), || {
            format!(
                "{}: the cached notify with its own handle: {outcome:?}",
                case.describe()
            )
        });
        let after = arrays.to_host(stream)?;
        tally.check(me, after == got, || {
            format!("{}: the cached notify changed the handle", case.describe())
        });
    }
    Ok(tally.failed == before)
}

/// Bad input found on the GPU (the buffer stays usable) and on the host (nothing launched).
/// Every rank makes the same mistakes, so the calls stay collective.
fn mistakes(buffer: &NvshmemBuffer<&World>, seed: u64, tally: &mut Tally) -> Result<(), AnyError> {
    let world = buffer.world();
    let (me, n, stream) = (world.my_pe(), world.n_pes(), world.stream());
    let g = buffer.spec().node_pes;
    let case = Case::new(seed ^ 0xBAD, n, g, 0);
    let (nodes, c) = (n / g, case.job.num_channels);
    let mut host = host_layout(&case.job, me);
    host.num_tokens_per_rdma_rank[nodes - 1] += 1;
    let layout = LayoutArrays::new(stream, &host, n)?;
    let arrays = HandleArrays::new(stream, n, nodes, c)?;
    let full = InternodeNotifyCall::Full(layout.inputs(1));
    let outcome = notify(buffer, &full, &arrays.handle(), &case.config);
    tally.expect_error(
        me,
        "num_tokens_per_rdma_rank off by one",
        outcome,
        "NODE_COUNTS_MISMATCH",
    );

    // The handle the last call made, one prefix raised: the cached notify finds it.
    let mut gbl = arrays.arrays[1].to_host(stream)?;
    gbl[c - 1] += 1;
    let altered = DeviceArray::from_host(stream, &gbl, n, c)?;
    let handle = InternodeHandle {
        gbl_channel_prefix_matrix: altered.view(),
        ..arrays.handle()
    };
    let cached = InternodeNotifyCall::Cached {
        is_token_in_rank: layout.is_token_in_rank.view(),
    };
    let outcome = notify(buffer, &cached, &handle, &case.config);
    tally.expect_error(
        me,
        "a cached notify with an altered handle",
        outcome,
        "HANDLE_MISMATCH",
    );

    // Refused on the host: an [N, C] matrix where the [n] vector is due, and chapter 7's notify.
    let narrow = HandleArrays::new(stream, n, nodes, c)?;
    let wrong = InternodeHandle {
        recv_gbl_rank_prefix_sum: narrow.arrays[0].view(),
        ..narrow.handle()
    };
    let outcome = notify(buffer, &full, &wrong, &case.config);
    tally.expect_error(
        me,
        "a handle of the wrong width",
        outcome,
        "recv_gbl_rank_prefix_sum",
    );
    let inputs = NotifyInputs {
        num_tokens_per_rank: layout.num_tokens_per_rank.view(),
        num_tokens_per_expert: layout.num_tokens_per_expert.view(),
        is_token_in_rank: layout.is_token_in_rank.view(),
        expert_alignment: 1,
    };
    let outputs = NotifyOutputs {
        rank_prefix_matrix: arrays.arrays[1].view(),
        channel_prefix_matrix: arrays.arrays[1].view(),
        recv_channel_prefix_matrix: arrays.arrays[1].view(),
    };
    // SAFETY: refused by its plan before anything is launched.
    let outcome =
        unsafe { buffer.notify_raw(&inputs, &outputs, &case.config, true, stream.cu_stream()) };
    tally.expect_error(
        me,
        "chapter 7's notify on a buffer across nodes",
        outcome,
        "internode_notify_raw",
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The program's own inputs agree with the reference it checks against, so a difference on
    /// the GPU is the kernel's: every case builds on every topology the script runs, and each
    /// rank's host layout is what `flat`'s send side says (tokens per rank and per node), its
    /// expert counts summing to what each expert's rank receives.
    #[test]
    fn every_case_builds_and_its_layout_agrees_with_the_reference() {
        for (n, g) in [(2, 1), (4, 2), (4, 1), (8, 4), (8, 2), (8, 1)] {
            for i in 0..NUM_CALLS {
                let case = Case::new(i as u64 * 77 + n as u64, n, g, i);
                let job = &case.job;
                assert!(job.num_channels >= 1 && job.num_channels <= 64);
                let layouts: Vec<HostLayout> = (0..n).map(|me| host_layout(job, me)).collect();
                for (me, layout) in layouts.iter().enumerate() {
                    let want = flat(job, me);
                    let last = |m: &Vec<Vec<i32>>| {
                        m.iter()
                            .map(|row| *row.last().unwrap())
                            .collect::<Vec<i32>>()
                    };
                    assert_eq!(
                        last(&want.gbl_channel_prefix_matrix),
                        layout.num_tokens_per_rank
                    );
                    assert_eq!(
                        last(&want.rdma_channel_prefix_matrix),
                        layout.num_tokens_per_rdma_rank
                    );
                    let l = job.num_experts / n;
                    for e in 0..l {
                        let sent: i32 = layouts
                            .iter()
                            .map(|x| x.num_tokens_per_expert[me * l + e])
                            .sum();
                        assert_eq!(
                            sent, want.num_recv_tokens_per_expert[e],
                            "n {n}, g {g}, case {i}"
                        );
                    }
                }
                // A rank sends nothing in every case; some nodes get nothing in some.
                assert!(layouts[i % n].num_tokens_per_rank.iter().all(|&x| x == 0));
            }
        }
    }
}
