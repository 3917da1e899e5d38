//! Low-latency mode beyond one node, from the CPU: the rank limits and their errors, and the
//! plans of a call at 16, 64 and 256 ranks in nodes of 8, 4, 2 and 1 (what no GPU run here
//! reaches: the largest is 8 folded PEs), each argument struct checked against the region.

use kernels::contract::{MAX_LL_RANKS, MAX_PES};

use crate::config::MAX_NORMAL_RANKS;
use crate::low_latency::regions::{LlRegions, get_low_latency_rdma_size_hint};
use crate::spec::{BufferOptions, BufferSpec, node_members};
use crate::test_views::{assert_mentions, at, matrix};
use crate::view::{ElemType, View};
use crate::*;

const T: usize = 128;
const HIDDEN: usize = 7168;
const TOPK: usize = 8;
const TOKENS: usize = 100;

/// A low-latency buffer of `n` ranks in nodes of `g`, as rank `me` sees it, sized by the hint
/// for `num_experts`.
fn spec(n: usize, g: usize, me: usize, num_experts: usize) -> BufferSpec {
    let bytes = get_low_latency_rdma_size_hint(T, HIDDEN, n, num_experts);
    let mut spec = BufferSpec::for_tests(n, BufferOptions::low_latency(bytes));
    spec.node_pes = g;
    spec.my_pe = me;
    spec
}

/// One dispatch and one combine of DeepEP's decode shape, planned on `spec`.
fn plan_round_trip(
    spec: &BufferSpec,
    num_experts: usize,
) -> Result<(LlDispatchPlan, LlCombinePlan), BufferError> {
    let n = spec.n_pes;
    let l = num_experts / n;
    let recv_src_info = matrix(4, l, n * T, ElemType::I32);
    let recv_layout_range = matrix(5, l, n, ElemType::I64);
    let topk_idx = matrix(1, TOKENS, TOPK, ElemType::I64);
    let dispatch = plan_ll_dispatch(
        spec,
        &LlDispatchInputs {
            x: matrix(7, TOKENS, HIDDEN, ElemType::Bf16),
            topk_idx,
            cumulative_local_expert_recv_stats: Some(View::vector(at(11), l, ElemType::I32)),
            dispatch_wait_recv_cost_stats: Some(View::vector(at(12), n, ElemType::I64)),
        },
        &LlDispatchOutputs {
            recv_x: matrix(2, l * n * T, HIDDEN, ElemType::Fp8E4m3),
            recv_x_scales: Some(matrix(3, l * HIDDEN / 128, n * T, ElemType::F32)),
            recv_src_info,
            recv_layout_range,
            recv_count: View::vector(at(6), l, ElemType::I32),
        },
        &LlDispatchOptions {
            num_max_dispatch_tokens_per_rank: T,
            num_experts,
            use_fp8: true,
            round_scale: true,
            use_ue8m0: false,
        },
        Phases::SendAndReceive,
        None,
    )?;
    let combine = plan_ll_combine(
        spec,
        &LlCombineInputs {
            x: Some(matrix(8, l * n * T, HIDDEN, ElemType::Bf16)),
            topk_idx,
            topk_weights: matrix(9, TOKENS, TOPK, ElemType::F32),
            combine_wait_recv_cost_stats: Some(View::vector(at(13), n, ElemType::I64)),
        },
        &LlHandle {
            src_info: recv_src_info,
            layout_range: recv_layout_range,
            num_max_dispatch_tokens_per_rank: T,
            hidden: HIDDEN,
            num_experts,
        },
        &matrix(10, TOKENS, HIDDEN, ElemType::Bf16),
        Phases::SendAndReceive,
        None,
    )?;
    Ok((dispatch, combine))
}

/// The layout step holds every rank count a buffer may have (its ranks are found among a
/// token's K experts, not kept in a mask): planned at 8 to 256 ranks in nodes of 8 to 1, with
/// the per-node counts exactly when the buffer spans several nodes, and its shared counts
/// inside a block's default 48 KiB.
#[test]
fn the_layout_step_plans_any_rank_count_with_per_node_counts_across_nodes() {
    for n in [8, 32, 64, 256] {
        for g in [8, 4, 2, 1] {
            let num_experts = 2048.max(n);
            let spec = spec(n, g, 0, num_experts);
            let num_nodes = n / g;
            let out = |per_node: Option<usize>| LayoutOutputs {
                num_tokens_per_rank: View::vector(at(1), n, ElemType::I32),
                num_tokens_per_rdma_rank: per_node
                    .map(|len| View::vector(at(5), len, ElemType::I32)),
                num_tokens_per_expert: View::vector(at(2), num_experts, ElemType::I32),
                is_token_in_rank: matrix(3, TOKENS, n, ElemType::Bool),
            };
            let topk = matrix(4, TOKENS, TOPK, ElemType::I64);
            let plan = |per_node| plan_layout(&spec, &topk, num_experts, &out(per_node));
            if num_nodes == 1 {
                let p = plan(None).unwrap_or_else(|e| panic!("n {n}, g {g}: {e}"));
                assert_eq!((p.args.num_tokens_per_rdma_rank, p.zeroed[2].1), (0, 0));
                let e = plan(Some(1)).unwrap_err().to_string();
                assert!(e.contains("one node") && e.contains("pass none"), "{e}");
                continue;
            }
            let p = plan(Some(num_nodes)).unwrap_or_else(|e| panic!("n {n}, g {g}: {e}"));
            let per_node = p.args.num_tokens_per_rdma_rank;
            assert_eq!((per_node, p.zeroed[2]), (at(5), (at(5), num_nodes * 4)));
            assert_eq!(p.args.node_pes as usize, g);
            let shared = p.launch.shared_mem_bytes as usize;
            assert_eq!(shared, (n + num_experts + num_nodes) * 4);
            assert!(shared <= 48 << 10, "n {n}: {shared} B of shared counts");
            let e = plan(None).unwrap_err().to_string();
            assert!(e.contains(&format!("{num_nodes} nodes of {g}")), "{e}");
            let e = plan(Some(num_nodes + 1)).unwrap_err().to_string();
            assert!(e.contains("num_tokens_per_rdma_rank"), "{e}");
        }
    }
}

#[test]
fn plans_hold_at_16_64_and_256_ranks_in_nodes_of_8_4_2_and_1() {
    for n in [16, 64, 256] {
        for g in [8, 4, 2, 1] {
            // 256 experts (DeepEP's decode count) and the most the kernels take.
            for num_experts in [256, 2048] {
                for me in [0, g - 1, n / 2 + 1, n - 1] {
                    let spec = spec(n, g, me, num_experts);
                    let (dispatch, combine) = plan_round_trip(&spec, num_experts)
                        .unwrap_or_else(|e| panic!("n {n}, g {g}, me {me}: {e}"));
                    for (topo, region) in [
                        (dispatch.args.topo, dispatch.args.region),
                        (combine.args.topo, combine.args.region),
                    ] {
                        assert_eq!(topo.rank as usize, me);
                        assert_eq!(topo.num_ranks as usize, n);
                        assert_eq!(topo.node_pes as usize, g);
                        assert_eq!(topo.node_start as usize, me / g * g);
                        // Every rank's area, in both halves, lies inside its half and holds
                        // the call's largest run: L runs of T bf16 messages.
                        let parts = LlRegions::new(spec.options.num_rdma_bytes);
                        let area = region.area_bytes as usize;
                        let l = num_experts / n;
                        assert!(area >= l * T * (16 + 2 * HIDDEN), "n {n} g {g}");
                        assert!(region.data[0] + (n * area) as u64 <= region.data[1]);
                        assert!(region.data[1] + (n * area) as u64 <= spec.ll_staging());
                        assert!(
                            spec.ll_staging() + parts.part_bytes as u64
                                <= spec.local_region(true).0 + spec.options.num_rdma_bytes as u64
                        );
                        // The count words (s * L + e < E) and the barrier words sit in the control.
                        assert!(region.counts[1] + (2048 * 8) as u64 <= spec.ll_barrier_words());
                    }
                }
            }
        }
    }
}

#[test]
fn every_rank_limit_names_itself_and_the_fix() {
    let ll = BufferOptions::low_latency(1 << 20);
    let normal = BufferOptions::normal(1 << 20);
    assert!(ll.check_nodes(MAX_LL_RANKS, 8).is_ok());
    assert!(ll.check_nodes(MAX_LL_RANKS, 1).is_ok());
    let error = ll.check_nodes(MAX_LL_RANKS + 8, 8).unwrap_err().to_string();
    assert!(error.contains("MAX_LL_RANKS = 256"), "{error}");
    // Normal mode: one node, as before; more than one is refused naming both limits and the way out.
    assert!(normal.check_nodes(8, 8).is_ok());
    let error = normal.check_nodes(8, 4).unwrap_err().to_string();
    assert_mentions(
        &error,
        &[
            "2 nodes of 4",
            &format!("MAX_PES = {MAX_PES}"),
            &format!("MAX_NORMAL_RANKS = {MAX_NORMAL_RANKS}"),
            "low_latency_mode=True",
            "NVSHMEM_TUTORIAL_NODE_PES",
        ],
    );
    let error = normal.check_nodes(16, 8).unwrap_err().to_string();
    assert!(
        error.contains("normal mode runs inside one node"),
        "{error}"
    );
    // A node is one NVLink domain: never more than MAX_PES, and the nodes tile the job.
    for (n, g) in [(32, 16), (12, 8), (8, 0)] {
        let error = ll.check_nodes(n, g).unwrap_err().to_string();
        assert!(
            error.contains("MAX_PES = 8") && error.contains("NVSHMEM_TUTORIAL_NODE_PES"),
            "{error}"
        );
    }
    // The single-node check keeps its meaning: one node of n.
    assert!(ll.check(8).is_ok());
    assert!(ll.check(16).is_err());
}

// ANCHOR: no_cross_node_pointer
#[test]
fn the_buffer_asks_nvshmem_for_no_pointer_outside_its_node() {
    // What NvshmemBuffer::new hands chapter 4's communicator (Communicator::with_members, which
    // calls member_deltas with nvshmem_ptr): the node's ranks. Asked about any other rank, the
    // stand-in fails, at every layout up to 256 ranks.
    for n in [1, 2, 4, 8, 16, 64, 256] {
        for g in [1, 2, 4, 8].into_iter().filter(|g| n % g == 0) {
            for me in 0..n {
                let translate = |ptr: u64, pe: usize| {
                    assert_eq!(
                        pe / g,
                        me / g,
                        "rank {me} asked for rank {pe} (nodes of {g})"
                    );
                    ptr + 0x1000 * (pe as u64 + 1)
                };
                let members = node_members(me, g);
                assert!(members.contains(&me));
                ch04_collectives::workspace::member_deltas(&members, me, 1 << 40, translate)
                    .unwrap();
            }
        }
    }
}
// ANCHOR_END: no_cross_node_pointer

/// A kernel source without its comments.
fn code_of(source: &str) -> String {
    source
        .lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

// ANCHOR: kernels_reach_peers_through_node_peer
#[test]
fn the_low_latency_kernels_reach_a_peer_by_pointer_only_through_node_peer() {
    let header = code_of(include_str!("../../kernels/cuda/buffer/low_latency.cuh"));
    let kernels = [
        (
            "ll_dispatch.cu",
            include_str!("../../kernels/cuda/buffer/ll_dispatch.cu"),
        ),
        (
            "ll_combine.cu",
            include_str!("../../kernels/cuda/buffer/ll_combine.cu"),
        ),
        (
            "ll_barrier.cu",
            include_str!("../../kernels/cuda/buffer/ll_barrier.cu"),
        ),
    ];
    let bare_peer_calls =
        |code: &str| code.matches("peer(").count() - code.matches("node_peer(").count();
    for (file, source) in kernels {
        let code = code_of(source);
        for forbidden in ["nvshmem_ptr", "peer_delta", "ws.my_pe", "ws.n_pes"] {
            assert!(!code.contains(forbidden), "{file} uses `{forbidden}`");
        }
        assert_eq!(
            bare_peer_calls(&code),
            0,
            "{file} calls peer() past node_peer"
        );
    }
    // In the header, the one chapter-4 peer() call is node_peer's, behind the node test; any
    // other rank is recorded as a failure, never given an address.
    assert!(!header.contains("nvshmem_ptr") && !header.contains("peer_delta"));
    assert_eq!(
        bare_peer_calls(&header),
        1,
        "low_latency.cuh calls peer() outside node_peer"
    );
    assert!(
        header.contains("if (same_node(topo, rank)) return peer(ws, ptr, rank - topo.node_start);")
    );
    assert!(header.contains("record_failure(ws, CROSS_NODE_POINTER"));
    // Across nodes the data leaves by put-with-signal (a run) or by a signal op alone.
    assert!(header.contains("nvshmemx_putmem_signal_nbi_warp("));
    assert!(header.contains("nvshmemx_signal_op(signal, word, NVSHMEM_SIGNAL_SET, d)"));
}
// ANCHOR_END: kernels_reach_peers_through_node_peer
