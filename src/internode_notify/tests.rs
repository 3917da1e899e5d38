//! The internode notify's CPU tests: its area, its plan's refusals, the route rules of its kernel source.

use super::*;
use crate::buffer::heap_bytes;
use crate::checks;
use crate::error::BufferError;
use crate::internode::rail_row_words;
use crate::regions::MAX_EXPERTS;
use crate::regions::Regions;
use crate::spec::BufferOptions;
use crate::spec::BufferSpec;
use crate::test_views::{assert_mentions, assert_route_rules, internode_handle, matrix, vector};
use crate::view::ElemType;
use kernels::contract::MAX_LL_RANKS;

const NUM_RDMA_BYTES: usize = 1 << 20;

/// A normal-mode buffer of `n` ranks in nodes of `g`, as rank `me` sees it.
fn spec(n: usize, g: usize, me: usize) -> BufferSpec {
    let options = BufferOptions {
        num_rdma_bytes: NUM_RDMA_BYTES,
        ..BufferOptions::normal(1 << 20)
    };
    let mut spec = BufferSpec::for_tests(n, options);
    spec.node_pes = g;
    spec.my_pe = me;
    spec
}

fn config() -> Config {
    Config::new(24, 8, 256, 6, 128).unwrap()
}

/// Views of the right shapes for `n` ranks, N nodes, C channels, T tokens, E experts.
fn views(
    n: usize,
    nodes: usize,
    c: usize,
    t: usize,
    e: usize,
) -> (InternodeNotifyInputs, InternodeHandle) {
    let inputs = InternodeNotifyInputs {
        num_tokens_per_rank: vector(1, n, ElemType::I32),
        num_tokens_per_rdma_rank: vector(2, nodes, ElemType::I32),
        num_tokens_per_expert: vector(3, e, ElemType::I32),
        is_token_in_rank: matrix(4, t, n, ElemType::Bool),
        expert_alignment: 1,
    };
    (inputs, internode_handle(n, nodes, c))
}

fn plan(
    spec: &BufferSpec,
    inputs: InternodeNotifyInputs,
    handle: &InternodeHandle,
) -> Result<InternodeNotifyPlan, BufferError> {
    plan_internode_notify(spec, &config(), &InternodeNotifyCall::Full(inputs), handle)
}

fn error_of(result: Result<InternodeNotifyPlan, BufferError>) -> String {
    result.expect_err("a bad call was planned").to_string()
}

#[test]
fn every_layout_plans_with_its_area_inside_the_allocation() {
    for (n, g) in [
        (4, 2),
        (8, 4),
        (8, 2),
        (8, 1),
        (16, 8),
        (16, 4),
        (64, 8),
        (64, 1),
    ] {
        let nodes = n / g;
        for me in [0, g - 1, n - 1] {
            let spec = spec(n, g, me);
            let (inputs, handle) = views(n, nodes, 12, 100, 4 * n);
            let p = plan(&spec, inputs, &handle).unwrap();
            let a = p.args;
            assert_eq!((p.num_blocks, p.num_local_experts), (1 + nodes as u32, 4));
            assert_eq!(
                (a.cached, a.num_channels, a.num_experts),
                (0, 12, 4 * n as i32)
            );
            assert_eq!(a.topo.node_start as usize, me / g * g);
            let area = spec.notify_area().unwrap();
            assert_eq!(area, NotifyArea::new(nodes, g));
            // Signals, tickets, rows, staging: in order, 256-aligned, inside the buffer's
            // part of the allocation, after every other region.
            let regions = Regions {
                num_nvl_bytes: spec.options.num_nvl_bytes,
                num_rdma_bytes: NUM_RDMA_BYTES,
                notify_area_bytes: area.bytes(),
            };
            let base = spec.base + regions.notify_area() as u64;
            assert!(regions.notify_area() >= regions.rdma() + NUM_RDMA_BYTES);
            assert_eq!(a.signals, base);
            assert_eq!(a.tickets, base + (3 * MAX_NODES * 8) as u64);
            assert!(a.rows >= a.tickets + (MAX_PES * 8) as u64);
            assert_eq!(
                a.staging - a.rows,
                (2 * nodes * area.row_stride() * 4).next_multiple_of(256) as u64
            );
            assert!(
                a.staging + (2 * nodes * area.row_stride() * 4) as u64
                    <= spec.base + regions.total() as u64
            );
            for at in [a.signals, a.rows, a.staging] {
                assert_eq!(at % 256, 0);
            }
            assert_eq!(area.row_stride() % 4, 0);
            // The heap's reservation covers this node size.
            assert!(area.bytes() <= NotifyArea::most_bytes(n));
            let one_node = heap_bytes(n, 1 << 20, 0);
            assert!(
                heap_bytes(n, 1 << 20, NUM_RDMA_BYTES) >= one_node + NUM_RDMA_BYTES + area.bytes()
            );
        }
    }
}

/// The stride bounds every call's row: the most experts and channels there can be.
#[test]
fn the_longest_rows_fit_their_stride() {
    for (n, g) in [(4, 2), (16, 8), (64, 8), (64, 1), (16, 1)] {
        let area = NotifyArea::new(n / g, g);
        let most = rail_row_words(g, MAX_EXPERTS / n, MAX_CHANNELS);
        assert!(
            most <= area.row_stride(),
            "n {n}, g {g}: {most} > {}",
            area.row_stride()
        );
        let spec = spec(n, g, 0);
        let config = Config::new(2 * MAX_CHANNELS as u32, 8, 256, 6, 128).unwrap();
        let (inputs, handle) = views(n, n / g, MAX_CHANNELS, 10, MAX_EXPERTS);
        let call = InternodeNotifyCall::Full(inputs);
        assert!(plan_internode_notify(&spec, &config, &call, &handle).is_ok());
    }
    // Under 2 MB, the bound for a buffer's heap (the dispatch's chunk words are 1 MiB of it at
    // 64 nodes).
    assert!(
        NotifyArea::most_bytes(64) < 2 << 20,
        "{}",
        NotifyArea::most_bytes(64)
    );
    assert_eq!(NotifyArea::most_bytes(1), 0);
}

#[test]
fn the_cached_notify_needs_the_routing_and_positions_one_to_six_only() {
    let (n, g) = (8, 2);
    let spec = spec(n, g, 3);
    let (inputs, handle) = views(n, n / g, 12, 100, 4 * n);
    let call = InternodeNotifyCall::Cached {
        is_token_in_rank: inputs.is_token_in_rank,
    };
    let p = plan_internode_notify(&spec, &config(), &call, &handle).unwrap();
    assert!(p.cached());
    let a = p.args;
    assert_eq!(
        (
            a.num_tokens_per_rank,
            a.num_tokens_per_rdma_rank,
            a.num_tokens_per_expert
        ),
        (0, 0, 0)
    );
    assert_eq!(
        a.rdma_channel_prefix_matrix,
        handle.rdma_channel_prefix_matrix.ptr
    );
    // Its handle is checked as the full notify's outputs are.
    let wrong = InternodeHandle {
        gbl_channel_prefix_matrix: matrix(6, n, 11, ElemType::I32),
        ..handle
    };
    let error = error_of(plan_internode_notify(&spec, &config(), &call, &wrong));
    assert!(error.contains("gbl_channel_prefix_matrix"), "{error}");
}

/// Every refusal of the buffer names its mode and the fix: one node, a low-latency
/// buffer, one not made for the internode notify.
#[test]
fn a_buffer_without_the_notify_is_refused_naming_it() {
    let (n, g) = (8, 4);
    let good = spec(n, g, 5);
    let (inputs, handle) = views(n, n / g, 12, 100, 4 * n);
    assert!(plan(&good, inputs, &handle).is_ok());
    let one_node = spec(4, 4, 1);
    let (one_inputs, one_handle) = views(4, 1, 12, 100, 16);
    let error = error_of(plan(&one_node, one_inputs, &one_handle));
    assert!(
        error.contains("one node") && error.contains("notify_raw"),
        "{error}"
    );
    // A low-latency buffer across nodes plans normal calls too (src/mode_sharing/), up to
    // MAX_NORMAL_RANKS ranks.
    let mut ll = good;
    ll.options.low_latency_mode = true;
    assert!(plan(&ll, inputs, &handle).is_ok());
    let mut ll_wide = spec(128, 8, 5);
    ll_wide.options.low_latency_mode = true;
    let (wide_inputs, wide_handle) = views(128, 16, 12, 100, 4 * 128);
    let error = error_of(plan(&ll_wide, wide_inputs, &wide_handle));
    assert!(
        error.contains("MAX_NORMAL_RANKS = 64") && error.contains("low-latency calls only"),
        "{error}"
    );
    let mut no_state = good;
    no_state.internode_state = 0;
    let error = error_of(plan(&no_state, inputs, &handle));
    assert!(
        error.contains("no internode notify area or state"),
        "{error}"
    );
}

/// Every bad input is refused naming the argument, one at a time.
#[test]
fn every_bad_input_is_refused_naming_it() {
    let (n, g) = (8, 4);
    let good = spec(n, g, 5);
    let (inputs, handle) = views(n, n / g, 12, 100, 4 * n);
    let cases: Vec<(&str, InternodeNotifyInputs)> = vec![
        (
            "num_tokens_per_rank",
            InternodeNotifyInputs {
                num_tokens_per_rank: vector(1, n - 1, ElemType::I32),
                ..inputs
            },
        ),
        (
            "num_tokens_per_rank",
            InternodeNotifyInputs {
                num_tokens_per_rank: vector(1, n, ElemType::I64),
                ..inputs
            },
        ),
        (
            "num_tokens_per_rdma_rank",
            InternodeNotifyInputs {
                num_tokens_per_rdma_rank: vector(2, n, ElemType::I32),
                ..inputs
            },
        ),
        (
            "num_tokens_per_expert's length",
            InternodeNotifyInputs {
                num_tokens_per_expert: vector(3, 4 * n + 1, ElemType::I32),
                ..inputs
            },
        ),
        (
            "num_tokens_per_expert's length",
            InternodeNotifyInputs {
                num_tokens_per_expert: vector(3, MAX_EXPERTS + n, ElemType::I32),
                ..inputs
            },
        ),
        (
            "is_token_in_rank",
            InternodeNotifyInputs {
                is_token_in_rank: matrix(4, 100, n, ElemType::I32),
                ..inputs
            },
        ),
        (
            "is_token_in_rank",
            InternodeNotifyInputs {
                is_token_in_rank: matrix(4, 100, g, ElemType::Bool),
                ..inputs
            },
        ),
        (
            "expert_alignment",
            InternodeNotifyInputs {
                expert_alignment: 0,
                ..inputs
            },
        ),
    ];
    for (name, bad) in cases {
        let error = error_of(plan(&good, bad, &handle));
        assert!(
            error.contains(name) && error.starts_with("internode_notify"),
            "{name}: {error}"
        );
    }
}

/// Every bad handle position (N rows where n are due, the wrong channel count, a dtype)
/// and a bad config are refused naming them.
#[test]
fn every_bad_handle_and_config_is_refused_naming_it() {
    let (n, g) = (8, 4);
    let nodes = n / g;
    let good = spec(n, g, 5);
    let (inputs, handle) = views(n, nodes, 12, 100, 4 * n);
    let handles = [
        (
            "rdma_channel_prefix_matrix",
            InternodeHandle {
                rdma_channel_prefix_matrix: matrix(5, n, 12, ElemType::I32),
                ..handle
            },
        ),
        (
            "recv_rdma_channel_prefix_matrix",
            InternodeHandle {
                recv_rdma_channel_prefix_matrix: matrix(7, nodes, 13, ElemType::I32),
                ..handle
            },
        ),
        (
            "recv_rdma_rank_prefix_sum",
            InternodeHandle {
                recv_rdma_rank_prefix_sum: vector(8, n, ElemType::I32),
                ..handle
            },
        ),
        (
            "recv_gbl_channel_prefix_matrix",
            InternodeHandle {
                recv_gbl_channel_prefix_matrix: matrix(9, nodes, 12, ElemType::I32),
                ..handle
            },
        ),
        (
            "recv_gbl_rank_prefix_sum",
            InternodeHandle {
                recv_gbl_rank_prefix_sum: vector(10, n, ElemType::I64),
                ..handle
            },
        ),
    ];
    for (name, bad) in handles {
        let error = error_of(plan(&good, inputs, &bad));
        assert!(error.contains(name), "{name}: {error}");
    }

    // The config: chapter 7's checks, for the node's G peers.
    let odd = Config {
        num_sms: 23,
        ..config()
    };
    let call = InternodeNotifyCall::Full(inputs);
    let error = error_of(plan_internode_notify(&good, &odd, &call, &handle));
    assert!(error.contains("must be even"), "{error}");
}

/// The buffer's options: normal mode across nodes needs an rdma region, and stops at
/// MAX_NORMAL_RANKS; on one node an rdma region still asks for what one node cannot be.
#[test]
fn normal_mode_across_nodes_is_made_with_an_rdma_region() {
    let across = BufferOptions {
        num_rdma_bytes: NUM_RDMA_BYTES,
        ..BufferOptions::normal(1 << 20)
    };
    for (n, g) in [(4, 2), (8, 1), (16, 8), (64, 8)] {
        assert!(across.check_nodes(n, g).is_ok(), "{n} in nodes of {g}");
    }
    let error = across.check_nodes(128, 8).unwrap_err().to_string();
    assert!(
        error.contains("MAX_NORMAL_RANKS = 64") && error.contains("low_latency_mode=True"),
        "{error}"
    );
    let error = across.check_nodes(8, 8).unwrap_err().to_string();
    assert!(
        error.contains("inter-node") && error.contains("num_rdma_bytes=0"),
        "{error}"
    );
    let error = BufferOptions::normal(1 << 20)
        .check_nodes(8, 4)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("needs num_rdma_bytes > 0")
            && error.contains("normal mode runs inside one node"),
        "{error}"
    );
    // Low-latency mode across nodes has the area too (it serves normal calls,
    // src/mode_sharing/), up to MAX_NORMAL_RANKS; on one node, or beyond, none.
    let ll = BufferOptions::low_latency(NUM_RDMA_BYTES);
    assert!(ll.check_nodes(MAX_LL_RANKS, 8).is_ok());
    let mut spec = BufferSpec::for_tests(8, ll);
    spec.node_pes = 4;
    assert_eq!(spec.notify_area(), Some(NotifyArea::new(2, 4)));
    spec.node_pes = 8;
    assert_eq!(spec.notify_area(), None);
    let mut wide = BufferSpec::for_tests(128, ll);
    wide.node_pes = 8;
    assert_eq!(wide.notify_area(), None);
    assert_eq!(
        BufferSpec::for_tests(8, BufferOptions::normal(1 << 20)).notify_area(),
        None
    );
}

/// The route rules of the design (2.1), on the kernel's source: a rank is turned into an
/// address only by node_peer (which refuses another node's rank), other nodes are reached
/// by put-with-signal and signal ops only (no nvshmem_ptr, no fence or quiet, no trap), and
/// every wait is chapter 4's bounded one, recording a kind that names what it waited for.
#[test]
fn the_kernel_reaches_other_nodes_by_signals_only_and_bounds_every_wait() {
    let code = assert_route_rules(
        "internode_notify.cu",
        include_str!("../../kernels/cuda/buffer/internode_notify.cu"),
        &["nvshmemx_putmem_signal_nbi_block", "nvshmemx_signal_op"],
    );
    assert_eq!(
        code.matches("node_peer(").count(),
        2,
        "node_peer's two uses"
    );
    let waits: Vec<&str> = code.split("wait_at_least(").skip(1).collect();
    assert_eq!(waits.len(), 2, "two waits: the rows and the tickets");
    for (wait, kind) in waits.iter().zip(["WAIT_NOTIFY_ROWS", "WAIT_READY"]) {
        let args = wait.split(';').next().unwrap();
        assert!(args.contains(kind), "a wait records {kind}: {args}");
    }
    // One kernel, named for the profiler's `notify` row (design 2.5), and no other word.
    assert!(
        code.contains(
            "__global__ void __launch_bounds__(INTERNODE_NOTIFY_THREADS) internode_notify("
        )
    );
    assert_eq!(code.matches("__global__").count(), 1);
    assert!(!code.contains("dispatch") && !code.contains("combine"));
}

/// A rail row that never came names the rank waited for and its node (a rank of another
/// node is recorded past MAX_LL_RANKS, as chapter 8's failures); the input errors name the
/// node or handle entry and both numbers.
#[test]
fn failures_name_the_rank_and_node_waited_for() {
    use crate::error::{LastRingCall, describe};
    use ch04_collectives::{CollError, DeviceFailure};
    use kernels::contract::Failure;
    let failure = DeviceFailure {
        me: 1,
        kind: Failure::NotifyRows,
        pe: (MAX_LL_RANKS + 5) as u64,
        expected: 7,
        seen: 6,
        block: 0,
        call: 7,
        timeout_ms: 300,
    };
    let text = describe(CollError::Device(failure), LastRingCall::default(), 2).to_string();
    assert_mentions(
        &text,
        &[
            "rank 1: internode notify (call 7",
            "rail row of rank 5 (node 2)",
            "reached 6 of 7",
            "300 ms",
        ],
    );
    assert!(
        Failure::NotifyRows.device_name().starts_with("WAIT_"),
        "a wait: the job is broken"
    );
}

/// Chapter 7's notify, dispatch and combine refuse a buffer across nodes, naming this step.
#[test]
fn chapter_sevens_calls_refuse_a_buffer_across_nodes() {
    let spec = spec(8, 4, 0);
    let error = checks::one_node("dispatch", &spec).unwrap_err().to_string();
    assert!(
        error.contains("span 2 nodes of 4") && error.contains("internode_notify_raw"),
        "{error}"
    );
    assert!(
        checks::one_node(
            "dispatch",
            &BufferSpec::for_tests(8, BufferOptions::normal(1 << 20))
        )
        .is_ok()
    );
}
