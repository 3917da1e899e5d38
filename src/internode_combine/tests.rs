//! The internode combine's CPU tests: its plan at every layout with its rings inside their
//! regions and on the dispatch's ring words, DeepEP's combine configs, every refusal, the route
//! rules of its kernel and how its failures are named.

use super::*;
use crate::combine::{CombineInputs, CombineOutputs};
use crate::config::{Config, combine_config};
use crate::dispatch::DispatchInputs;
use crate::internode_dispatch::{InternodeDispatchOutputs, plan_internode_dispatch};
use crate::internode_notify::NotifyArea;
use crate::low_latency::regions::CONTROL_BYTES;
use crate::regions::combine_slot_bytes;
use crate::spec::{BufferOptions, BufferSpec};
use crate::test_views::{assert_mentions, assert_route_rules, internode_handle, matrix};
use crate::view::ElemType;
use kernels::contract::{COMBINE_NVL_WINDOW, MAX_CHANNELS, MAX_DISPATCH_BLOCKS, MAX_NORMAL_RANKS};

const HIDDEN: usize = 7168;

fn config() -> Config {
    Config::new(24, 8, 256, 16, 128).unwrap()
}

/// A normal-mode buffer of `n` ranks in nodes of `g`, as rank `me` sees it, sized by the hints.
fn spec_for(config: &Config, n: usize, g: usize, me: usize) -> BufferSpec {
    let (nvl, rdma) = config
        .get_buffer_size_hints_for_nodes(2 * HIDDEN, n, g)
        .unwrap();
    let options = BufferOptions {
        num_rdma_bytes: rdma,
        ..BufferOptions::normal(nvl)
    };
    let mut spec = BufferSpec::for_tests(n, options);
    spec.node_pes = g;
    spec.my_pe = me;
    spec
}

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

/// The dispatch's plan for the same buffer and config (its ring words are the combine's).
fn dispatch_words(spec: &BufferSpec, config: &Config, n: usize, g: usize) -> [u64; 4] {
    let x = call(n, g, config.num_channels(), 64, 0);
    let inputs = DispatchInputs {
        x: matrix(1, 64, HIDDEN, ElemType::Bf16),
        x_scales: None,
        topk_idx: None,
        topk_weights: None,
        num_experts: 4 * n,
    };
    let outputs = InternodeDispatchOutputs {
        recv_x: matrix(21, 192, HIDDEN, ElemType::Bf16),
        recv_topk_idx: None,
        recv_topk_weights: None,
        recv_src_meta: matrix(22, 192, 2, ElemType::I32),
        send_rdma_head: x.handle.send_rdma_head,
        send_nvl_head: x.handle.send_nvl_head,
    };
    let d = plan_internode_dispatch(
        spec,
        config,
        &inputs,
        x.handle.is_token_in_rank,
        &x.handle.prefixes,
        &outputs,
    )
    .unwrap()
    .args;
    [d.chunk_words, d.rdma_heads, d.rdma_sent, d.rdma_received]
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
                assert_eq!((a.rdma_ring_tokens, a.rdma_chunk_tokens), (128, 16));
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
                assert_eq!(a.rdma, rdma + CONTROL_BYTES as u64);
                assert!(CONTROL_BYTES + 2 * 12 * nodes * 128 * slot <= rdma_bytes);
                assert!(12 * g * nodes * sub * slot <= spec.options.num_nvl_bytes);
                assert_eq!(a.nvl, spec.nvl());
                // The dispatch's ring words, so positions run on across the ops.
                let words = [a.chunk_words, a.rdma_heads, a.rdma_sent, a.rdma_received];
                assert_eq!(words, dispatch_words(&spec, &config(), n, g));
                // The combine's own words: after the dispatch's, in order, inside the area.
                let area = NotifyArea::new(nodes, g);
                let base = spec.notify_area_base().unwrap();
                let own = [
                    a.calls,
                    a.nvl_tails,
                    a.nvl_heads,
                    a.nvl_sent,
                    a.nvl_received,
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

/// DeepEP's combine configs (16-64 ranks in nodes of 8) all give rings the kernel takes.
#[test]
fn deepeps_combine_configs_give_rings_the_kernel_takes() {
    for n in [16, 24, 32, 48, 64] {
        let config = combine_config(n, 24).unwrap();
        let x = call(n, 8, config.num_channels(), 64, 8);
        plan_of(&spec_for(&config, n, 8, 0), &config, &x)
            .unwrap_or_else(|e| panic!("{n} ranks: {e}"));
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
    // Regions smaller than the call: each names the hint.
    for (rdma, region) in [(true, "num_rdma_bytes"), (false, "num_nvl_bytes")] {
        let mut small = spec;
        if rdma {
            small.options.num_rdma_bytes = CONTROL_BYTES + 1000;
        } else {
            small.options.num_nvl_bytes = 1000;
        }
        let error = error_of(&small, &config(), &x);
        assert_mentions(
            &error,
            &[
                "internode_combine",
                region,
                "get_buffer_size_hints_for_nodes",
            ],
        );
    }
}

/// A change that makes a good call bad, and the word its refusal must name.
type Spoil = (&'static str, fn(&mut Call));

#[test]
fn every_bad_input_handle_and_output_is_refused_naming_it() {
    let (n, g) = (8, 2);
    let spec = spec_for(&config(), n, g, 3);
    assert!(plan_of(&spec, &config(), &call(n, g, 12, 64, 8)).is_ok());
    let cases: [Spoil; 14] = [
        ("x", |x| x.inputs.x = matrix(1, 192, HIDDEN, ElemType::F32)),
        ("multiple of 16 bytes", |x| {
            x.inputs.x = matrix(1, 192, 100, ElemType::Bf16)
        }),
        ("topk_weights", |x| {
            x.inputs.topk_weights = Some(matrix(2, 100, 8, ElemType::F32))
        }),
        ("at most 32", |x| {
            x.inputs.topk_weights = Some(matrix(2, 192, 40, ElemType::F32))
        }),
        ("bias[0]", |x| {
            x.inputs.bias[0] = Some(matrix(3, 64, 4096, ElemType::Bf16))
        }),
        ("bias[1]", |x| {
            x.inputs.bias[1] = Some(matrix(4, 63, HIDDEN, ElemType::Bf16))
        }),
        ("combined_x", |x| {
            x.outputs.combined_x = matrix(14, 64, 4096, ElemType::Bf16)
        }),
        (
            "combined_topk_weights comes exactly with topk_weights",
            |x| x.outputs.combined_topk_weights = None,
        ),
        ("combined_topk_weights", |x| {
            x.outputs.combined_topk_weights = Some(matrix(15, 64, 4, ElemType::F32))
        }),
        ("send_rdma_head", |x| {
            x.handle.send_rdma_head = matrix(12, 64, 8, ElemType::I32)
        }),
        ("send_nvl_head", |x| {
            x.handle.send_nvl_head = matrix(13, 128, 8, ElemType::I32)
        }),
        ("is_token_in_rank", |x| {
            x.handle.is_token_in_rank = matrix(11, 64, 4, ElemType::Bool)
        }),
        ("recv_gbl_channel_prefix_matrix", |x| {
            x.handle.prefixes.recv_gbl_channel_prefix_matrix = matrix(9, 8, 4, ElemType::I32)
        }),
        ("rdma_channel_prefix_matrix", |x| {
            x.handle.prefixes.rdma_channel_prefix_matrix = matrix(5, 4, 12, ElemType::I64)
        }),
    ];
    for (name, spoil) in cases {
        let mut x = call(n, g, 12, 64, 8);
        spoil(&mut x);
        let error = error_of(&spec, &config(), &x);
        assert_mentions(&error, &["internode_combine", name]);
    }
    // A buffer on one node: chapter 7's calls.
    let options = BufferOptions {
        num_rdma_bytes: 1 << 20,
        ..BufferOptions::normal(1 << 20)
    };
    let one_node = BufferSpec::for_tests(4, options);
    let error = error_of(&one_node, &config(), &call(4, 4, 12, 64, 0));
    assert_mentions(&error, &["one node", "dispatch_raw"]);
}

/// The route rule (DESIGN.md, across nodes) read off the kernel's source and the RDMA rings'
/// header it shares with the dispatch: ranks become addresses only through node_peer, other
/// nodes are reached by put-with-signal and signal ops only (no nvshmem_ptr, fence, quiet,
/// barrier or trap), and every wait is bounded with a kind that names what it waited for.
#[test]
fn the_kernel_reaches_other_nodes_by_signals_only_and_bounds_every_wait() {
    let source = [
        include_str!("../../kernels/cuda/buffer/internode_combine.cu"),
        include_str!("../../kernels/cuda/buffer/internode.cuh"),
    ]
    .concat();
    let code = assert_route_rules(
        "internode_combine.cu + internode.cuh",
        &source,
        &["nvshmemx_putmem_signal_nbi_warp", "nvshmemx_signal_op"],
    );
    assert_eq!(
        code.matches("peer(").count(),
        code.matches("node_peer(").count(),
        "every peer pointer through node_peer"
    );
    // One blocking wait (a home receiver's chunk, WAIT_COMBINE_RDMA_DATA); the two polls, the
    // senders' over their streams and the forwarder's over its nodes, record their own
    // timeouts with what they waited for.
    let waits: Vec<&str> = code.split("wait_at_least(").skip(1).collect();
    assert_eq!(waits.len(), 1, "one bounded wait");
    assert!(
        waits[0]
            .split(';')
            .next()
            .unwrap()
            .contains("WAIT_COMBINE_RDMA_DATA")
    );
    let body = |name: &str| {
        let after = code
            .split(name)
            .nth(1)
            .unwrap_or_else(|| panic!("no {name}"));
        after.split("\n}").next().unwrap().to_string()
    };
    let senders = body("__device__ __forceinline__ int pick_stream");
    assert!(senders.contains("timeout_cycles") && senders.contains("WAIT_COMBINE_NVL_SPACE"));
    let forwarder = body("__device__ __forceinline__ int pick_node");
    assert!(forwarder.contains("timeout_cycles") && forwarder.contains("record_failure"));
    let ready = body("__device__ __forceinline__ bool chunk_ready");
    assert!(ready.contains("WAIT_COMBINE_RDMA_SPACE") && ready.contains("WAIT_COMBINE_NVL_DATA"));
    // One kernel, under its profiler name; sums from 0 in fp32, one rounding per row.
    assert_eq!(code.matches("__global__").count(), 1);
    assert!(code.contains("internode_combine("));
    assert_eq!(code.matches("__float2bfloat16_rn(").count(), 1);
}

/// A timed-out combine role names the rank it waited for, its node, the channel and the role.
#[test]
fn failures_name_the_rank_its_node_the_channel_and_the_role() {
    use crate::error::{LastRingCall, describe};
    use ch04_collectives::{CollError, DeviceFailure};
    use kernels::contract::{Failure, MAX_LL_RANKS};
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
        let failure = DeviceFailure {
            me: 1,
            kind,
            pe: pe as u64,
            expected: 33,
            seen: 16,
            block: 7,
            call: 4,
            timeout_ms: 300,
        };
        let text = describe(CollError::Device(failure), LastRingCall::default(), 2).to_string();
        assert_mentions(
            &text,
            &[
                "rank 1: internode combine (call 4",
                &format!("channel 3, {side}"),
                rank,
                "33 expected, 16 seen",
            ],
        );
        assert!(kind.device_name().starts_with("WAIT_COMBINE_"));
    }
}
