//! The internode combine's CPU tests: its plan at every layout with its rings inside their
//! regions and on the dispatch's ring words, DeepEP's combine configs, every refusal, the route
//! rules of its kernel and how its failures are named.

use super::*;
use crate::config::{combine_config, dispatch_config};
use crate::internode_dispatch::tests::{
    HIDDEN, assert_small_regions_name_the_hint, body, call as dispatch_call, config, described,
    internode_code, plan_of as dispatch_plan_of, spec_for, spec_one_node, waits,
};
use crate::internode_notify::NotifyArea;
use crate::low_latency::regions::CONTROL_BYTES;
use crate::regions::combine_slot_bytes;
use crate::spec::BufferSpec;
use crate::test_views::{assert_mentions, internode_handle, matrix};
use crate::view::{ElemType, View};
use kernels::contract::{
    COMBINE_NVL_WINDOW, Failure, MAX_CHANNELS, MAX_DISPATCH_BLOCKS, MAX_LL_RANKS, MAX_NORMAL_RANKS,
};

/// A combine's views: T tokens, M = 3T rows received, M_r = 2T forwarded, K top-k (0: no
/// weights), the two biases, n ranks in N nodes of G, C channels.
type Call = InternodeCombineCall;

fn call(n: usize, g: usize, c: usize, t: usize, k: usize) -> Call {
    let (nodes, m, m_r) = (n / g, 3 * t, 2 * t);
    let weights = |i: u64, rows: usize| (k > 0).then(|| matrix(i, rows, k, ElemType::F32));
    Call {
        inputs: CombineInputs {
            x: matrix(1, m, HIDDEN, ElemType::Bf16),
            topk_weights: weights(2, m),
            bias: [
                Some(matrix(3, t, HIDDEN, ElemType::Bf16)),
                Some(matrix(4, t, HIDDEN, ElemType::Bf16)),
            ],
        },
        handle: InternodeCombineHandle {
            is_token_in_rank: matrix(11, t, n, ElemType::Bool),
            prefixes: internode_handle(n, nodes, c),
            send_rdma_head: matrix(12, t, nodes, ElemType::I32),
            send_nvl_head: matrix(13, m_r, g, ElemType::I32),
        },
        outputs: CombineOutputs {
            combined_x: matrix(14, t, HIDDEN, ElemType::Bf16),
            combined_topk_weights: weights(15, t),
        },
    }
}

fn plan_of(
    spec: &BufferSpec,
    config: &Config,
    x: &Call,
) -> Result<InternodeCombinePlan, BufferError> {
    plan_internode_combine(spec, config, x)
}

fn error_of(spec: &BufferSpec, config: &Config, x: &Call) -> String {
    plan_of(spec, config, x)
        .expect_err("a bad call was planned")
        .to_string()
}

/// The dispatch's rings for the same buffer and config: the combine's.
fn dispatch_rings(
    spec: &BufferSpec,
    config: &Config,
    n: usize,
    g: usize,
) -> kernels::contract::RdmaRings {
    let x = dispatch_call(n, g, config.num_channels(), 64, 0);
    dispatch_plan_of(spec, config, &x).unwrap().args.rings
}

#[test]
fn every_layout_plans_on_the_dispatchs_rings_inside_their_regions() {
    for (n, g) in [(4, 2), (8, 4), (8, 1), (16, 8), (16, 2), (64, 8), (64, 1)] {
        let nodes = n / g;
        for me in [0, g - 1, n - 1] {
            let spec = spec_for(&config(), n, g, me);
            for k in [0, 8] {
                let x = call(n, g, 12, 100, k);
                let p =
                    plan_of(&spec, &config(), &x).unwrap_or_else(|e| panic!("n {n}, g {g}: {e}"));
                let a = p.args;
                assert_eq!(
                    (p.num_channels, a.num_channels, a.num_tokens),
                    (12, 12, 100)
                );
                // Section 3's combine slot: 14,368 B at K = 8, within the hint's slot.
                let slot = a.slot_bytes as usize;
                assert_eq!(slot, combine_slot_bytes(2 * HIDDEN, k));
                assert_eq!(slot, if k == 8 { 14_368 } else { 14_336 });
                assert_eq!((a.rings.ring_tokens, a.rings.chunk_tokens), (128, 16));
                // Sub-rings of floor(R_n / N); a window beside a chunk, at most COMBINE_NVL_WINDOW.
                let sub = 256 / nodes;
                assert_eq!(a.nvl_sub_ring_tokens as usize, sub);
                let window = a.nvl_window_tokens as usize;
                assert!((1..=COMBINE_NVL_WINDOW).contains(&window));
                assert!(
                    g == 1 || window + 16 <= sub,
                    "n {n}, g {g}: {window} + 16 > {sub}"
                );
                assert_eq!((a.num_recv_rows, a.num_forwarded_rows), (300, 200));
                assert_eq!(a.hidden_bytes as usize, 2 * HIDDEN);
                // RDMA rings after the low-latency control words, NVL sub-rings in the nvl region.
                let (rdma, rdma_bytes) = spec.local_region(true);
                assert_eq!(a.rings.base, rdma + CONTROL_BYTES as u64);
                assert!(CONTROL_BYTES + 2 * 12 * nodes * 128 * slot <= rdma_bytes);
                assert!(12 * g * nodes * sub * slot <= spec.options.num_nvl_bytes);
                assert_eq!(a.nvl, spec.nvl());
                // The dispatch's rings and words, so positions run on across the ops.
                assert_eq!(a.rings, dispatch_rings(&spec, &config(), n, g));
                let words = [
                    a.rings.chunk_words,
                    a.rings.heads,
                    a.rings.sent,
                    a.rings.received,
                ];
                // The combine's own words: after the dispatch's, in order, inside the area.
                let area = NotifyArea::new(nodes, g);
                let base = spec.notify_area_base().unwrap();
                let own = [
                    a.calls,
                    a.nvl_counters.tails,
                    a.nvl_counters.heads,
                    a.nvl_counters.sent,
                    a.nvl_counters.received,
                ];
                assert!(own[0] > words[3] && own[0] == base + area.combine_calls() as u64);
                assert!(own.windows(2).all(|w| w[0] < w[1]) && own.iter().all(|w| w % 8 == 0));
                assert_eq!(own[1] - own[0], (MAX_DISPATCH_BLOCKS * 8) as u64);
                let per = (MAX_CHANNELS * MAX_NORMAL_RANKS * 8) as u64;
                assert!(own[4] + per <= base + area.bytes() as u64);
                assert_eq!(a.topo.node_start as usize, me / g * g);
                assert_eq!(a.combined_topk_weights != 0, k > 0);
            }
        }
    }
}

/// DeepEP's config tables (16-64 ranks in nodes of 8): each dispatch config and each combine
/// config gives rings its kernel takes, on a buffer sized by its hints.
#[test]
fn deepeps_config_tables_give_rings_both_kernels_take() {
    for n in [16, 24, 32, 48, 64] {
        let (dispatch, combine) = (
            dispatch_config(n, 24).unwrap(),
            combine_config(n, 24).unwrap(),
        );
        let c = dispatch.num_channels();
        dispatch_plan_of(
            &spec_for(&dispatch, n, 8, 0),
            &dispatch,
            &dispatch_call(n, 8, c, 64, 8),
        )
        .unwrap_or_else(|e| panic!("{n} ranks, dispatch: {e}"));
        plan_of(
            &spec_for(&combine, n, 8, 0),
            &combine,
            &call(n, 8, c, 64, 8),
        )
        .unwrap_or_else(|e| panic!("{n} ranks, combine: {e}"));
    }
}

#[test]
fn rings_the_protocol_cannot_run_are_refused_naming_why() {
    let (n, g) = (16, 2);
    let spec = spec_for(&config(), n, g, 0);
    let x = call(n, g, 12, 64, 0);
    // 8 nodes: sub-rings of 256 / 8 = 32 slots hold a chunk of 16; of 128 / 8 = 16 they do not.
    let small = Config::new(24, 8, 128, 16, 128).unwrap();
    let error = error_of(&spec, &small, &x);
    assert_mentions(
        &error,
        &[
            "internode_combine",
            "num_max_nvl_chunked_recv_tokens = 128",
            "sub-rings of 16",
            "at least 136",
        ],
    );
    // Nodes of one rank have no NVL stage: no sub-ring to check.
    let one = spec_for(&small, 8, 1, 0);
    assert!(plan_of(&one, &small, &call(8, 1, 12, 64, 0)).is_ok());
    // The RDMA ring's rules are the dispatch's, named for the combine.
    let mut chunky = config();
    chunky.num_max_rdma_chunked_recv_tokens = 40;
    assert_mentions(
        &error_of(&spec, &chunky, &x),
        &[
            "internode_combine",
            "num_max_rdma_chunked_send_tokens = 16",
            "MAX_RDMA_CHUNKS",
        ],
    );
    assert_small_regions_name_the_hint(&spec, |small| error_of(small, &config(), &x));
}

/// `x` with its view named `name` replaced by `view` (None: left out).
fn replace(x: &mut Call, name: &str, view: Option<View>) {
    let given = || view.expect("a view");
    match name {
        "x" => x.inputs.x = given(),
        "topk_weights" => x.inputs.topk_weights = view,
        "bias[0]" => x.inputs.bias[0] = view,
        "bias[1]" => x.inputs.bias[1] = view,
        "combined_x" => x.outputs.combined_x = given(),
        "combined_topk_weights" => x.outputs.combined_topk_weights = view,
        "send_rdma_head" => x.handle.send_rdma_head = given(),
        "send_nvl_head" => x.handle.send_nvl_head = given(),
        "is_token_in_rank" => x.handle.is_token_in_rank = given(),
        "recv_gbl_channel_prefix_matrix" => {
            x.handle.prefixes.recv_gbl_channel_prefix_matrix = given()
        }
        "rdma_channel_prefix_matrix" => x.handle.prefixes.rdma_channel_prefix_matrix = given(),
        other => panic!("no view {other}"),
    }
}

#[test]
fn every_bad_input_handle_and_output_is_refused_naming_it() {
    let (n, g) = (8, 2);
    let spec = spec_for(&config(), n, g, 3);
    assert!(plan_of(&spec, &config(), &call(n, g, 12, 64, 8)).is_ok());
    // (the view, what it becomes, what the refusal says): 192 rows received, 64 tokens, K = 8.
    let m = |i, rows, cols, elem| Some(matrix(i, rows, cols, elem));
    #[rustfmt::skip]
    let cases = [
        ("x", m(1, 192, HIDDEN, ElemType::F32), "x must be bfloat16"),
        ("x", m(1, 192, 100, ElemType::Bf16), "multiple of 16 bytes"),
        ("topk_weights", m(2, 100, 8, ElemType::F32), "topk_weights must be"),
        ("topk_weights", m(2, 192, 40, ElemType::F32), "at most 32"),
        ("bias[0]", m(3, 64, 4096, ElemType::Bf16), "bias[0] must be"),
        ("bias[1]", m(4, 63, HIDDEN, ElemType::Bf16), "bias[1] must be"),
        ("combined_x", m(14, 64, 4096, ElemType::Bf16), "combined_x must be"),
        ("combined_topk_weights", None, "comes exactly with topk_weights"),
        ("combined_topk_weights", m(15, 64, 4, ElemType::F32), "combined_topk_weights must"),
        ("send_rdma_head", m(12, 64, 8, ElemType::I32), "send_rdma_head must be"),
        ("send_nvl_head", m(13, 128, 8, ElemType::I32), "send_nvl_head must be"),
        ("is_token_in_rank", m(11, 64, 4, ElemType::Bool), "is_token_in_rank must"),
        ("recv_gbl_channel_prefix_matrix", m(9, 8, 4, ElemType::I32), "recv_gbl_channel"),
        ("rdma_channel_prefix_matrix", m(5, 4, 12, ElemType::I64), "rdma_channel_prefix"),
    ];
    for (name, view, says) in cases {
        let mut x = call(n, g, 12, 64, 8);
        replace(&mut x, name, view);
        assert_mentions(
            &error_of(&spec, &config(), &x),
            &["internode_combine", says],
        );
    }
    // A buffer on one node: chapter 7's calls.
    let error = error_of(&spec_one_node(), &config(), &call(4, 4, 12, 64, 0));
    assert_mentions(&error, &["internode_combine", "one node", "dispatch_raw"]);
}

/// The route rule read off the kernel's source (`internode_code`), and every wait bounded
/// with a kind that names what it waited for: one blocking wait (a home receiver's chunk), and
/// two polls that record their own timeouts (the senders' over their streams, the forwarder's
/// over its nodes, with what its first node still owing lacks).
#[test]
fn the_kernel_reaches_other_nodes_by_signals_only_and_bounds_every_wait() {
    let code = internode_code(
        "internode_combine",
        include_str!("../../kernels/cuda/buffer/internode_combine.cu"),
    );
    let waits = waits(&code);
    assert!(
        waits.len() == 1 && waits[0].contains("WAIT_COMBINE_RDMA_DATA"),
        "{waits:?}"
    );
    let senders = body(&code, "int pick_stream");
    assert!(senders.contains("timeout_cycles") && senders.contains("WAIT_COMBINE_NVL_SPACE"));
    let forwarder = body(&code, "int pick_node");
    assert!(forwarder.contains("timeout_cycles") && forwarder.contains("record_failure"));
    let ready = body(&code, "bool chunk_ready");
    assert!(ready.contains("WAIT_COMBINE_RDMA_SPACE") && ready.contains("WAIT_COMBINE_NVL_DATA"));
    // Sums from 0 in fp32 and one rounding per row (the forwarder's and home's are one function).
    assert_eq!(code.matches("__float2bfloat16_rn(").count(), 1);
}

/// A timed-out combine role names the rank it waited for, its node, the channel and the role.
#[test]
fn failures_name_the_rank_its_node_the_channel_and_the_role() {
    for (kind, side, pe, rank) in [
        (
            Failure::CombineRdmaSpace,
            "forwarder",
            MAX_LL_RANKS + 5,
            "rank 5 (node 2)",
        ),
        (
            Failure::CombineRdmaData,
            "home receiver",
            MAX_LL_RANKS + 5,
            "rank 5 (node 2)",
        ),
        (Failure::CombineNvlSpace, "NVL sender", 0, "rank 0 (node 0)"),
        (Failure::CombineNvlData, "forwarder", 1, "rank 1 (node 0)"),
    ] {
        let channel = format!("channel 3, {side}");
        let text = described(kind, pe);
        assert_mentions(
            &text,
            &["internode combine (call 4", &channel, rank, "33 expected"],
        );
        assert!(kind.device_name().starts_with("WAIT_COMBINE_"));
    }
}
