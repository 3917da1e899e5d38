//! Mode sharing's CPU tests: a low-latency buffer across nodes plans normal calls (and refuses
//! what it cannot run, naming it) at 4-64 ranks in nodes of 1-8 with every part inside the
//! allocation; neither mode's lasting words (counters, signals, barriers) lie in bytes the
//! other mode writes; the switch rules. No GPU: the kernels' own tests run on one
//! (benchmarks/notes/buffer_internode_normal.md 2.9 says what a GPU run must check).

use super::*;
use crate::combine::{CombineInputs, CombineOutputs};
use crate::config::Config;
use crate::internode_combine::{
    InternodeCombineCall, InternodeCombineHandle, plan_internode_combine,
};
use crate::internode_dispatch::tests::{HIDDEN, call as dispatch_call, plan_of};
use crate::internode_notify::{
    InternodeNotifyCall, InternodeNotifyInputs, NotifyArea, plan_internode_notify,
};
use crate::low_latency::ll_shape;
use crate::low_latency::phases::PendingReceive;
use crate::low_latency::regions::{CONTROL_BYTES, LlShape, get_low_latency_rdma_size_hint};
use crate::regions::Regions;
use crate::spec::{BufferOptions, DEFAULT_TIMEOUT_MS};
use crate::test_views::{internode_handle, matrix, vector};
use crate::view::ElemType;
use kernels::contract::{MAX_LL_EXPERTS, MAX_LL_RANKS};

/// Bytes [start, end) of one PE's allocation, by device address.
type Span = (u64, u64);

fn span(start: u64, bytes: usize) -> Span {
    (start, start + bytes as u64)
}

fn overlaps(a: Span, b: Span) -> bool {
    a.0 < b.1 && b.0 < a.1
}

fn inside(a: Span, b: Span) -> bool {
    b.0 <= a.0 && a.1 <= b.1
}

/// A low-latency call's shape: (T, H, E, K). DeepEP's `--test-ll-compatibility` uses the
/// first (tests/test_internode.py:320); the second is a decoding layer's.
const LL_SHAPES: [(usize, usize, usize, usize); 2] = [(16, 5120, 256, 9), (128, 7168, 256, 8)];

/// Every layout of 4-64 ranks in nodes of 1-8 that spans nodes.
fn layouts() -> Vec<(usize, usize)> {
    let mut all = Vec::new();
    for n in [4usize, 8, 16, 32, 64] {
        for g in [1, 2, 4, 8] {
            if g < n && n.is_multiple_of(g) {
                all.push((n, g));
            }
        }
    }
    all
}

/// DeepEP's test config (24 SMs, RDMA chunks of 16 in rings of 128) with NVL rings long
/// enough for the combine's sub-rings at `nodes` nodes (more than a chunk each).
fn config_for(nodes: usize) -> Config {
    Config::new(24, 8, (32 * nodes).max(256) as u32, 16, 128).unwrap()
}

/// A low-latency buffer of `n` ranks in nodes of `g`, as rank `me` sees it, sized for both
/// modes: normal mode's hints at `config_for` and the low-latency hint of `(t, h, e)`.
fn both_modes(
    n: usize,
    g: usize,
    me: usize,
    (t, h, e, _): (usize, usize, usize, usize),
) -> BufferSpec {
    let (nvl, normal_rdma) = config_for(n / g)
        .get_buffer_size_hints_for_nodes(2 * HIDDEN, n, g)
        .unwrap();
    let ll_rdma = get_low_latency_rdma_size_hint(t, h, n, e);
    let options = BufferOptions {
        num_nvl_bytes: nvl,
        num_rdma_bytes: rdma_size_hint_for_both_modes(normal_rdma, ll_rdma),
        low_latency_mode: true,
        timeout_ms: DEFAULT_TIMEOUT_MS,
    };
    options.check_nodes(n, g).unwrap();
    let mut spec = BufferSpec::for_tests(n, options);
    (spec.node_pes, spec.my_pe) = (g, me);
    spec
}

/// The full notify's plan for `n` ranks in `nodes` nodes, C = 12, T = 100.
fn notify_plan(spec: &BufferSpec, n: usize, nodes: usize) -> Result<(), BufferError> {
    let inputs = InternodeNotifyInputs {
        num_tokens_per_rank: vector(1, n, ElemType::I32),
        num_tokens_per_rdma_rank: vector(2, nodes, ElemType::I32),
        num_tokens_per_expert: vector(3, 4 * n, ElemType::I32),
        is_token_in_rank: matrix(4, 100, n, ElemType::Bool),
        expert_alignment: 1,
    };
    let handle = internode_handle(n, nodes, 12);
    let config = config_for(nodes);
    plan_internode_notify(spec, &config, &InternodeNotifyCall::Full(inputs), &handle).map(drop)
}

/// A combine of T = 100 tokens, K = 8, M = 300 rows received and M_r = 200 forwarded.
fn combine_call(n: usize, g: usize) -> InternodeCombineCall {
    let (nodes, t, m) = (n / g, 100, 300);
    InternodeCombineCall {
        inputs: CombineInputs {
            x: matrix(1, m, HIDDEN, ElemType::Bf16),
            topk_weights: Some(matrix(2, m, 8, ElemType::F32)),
            bias: [None, None],
        },
        handle: InternodeCombineHandle {
            is_token_in_rank: matrix(11, t, n, ElemType::Bool),
            prefixes: internode_handle(n, nodes, 12),
            send_rdma_head: matrix(12, t, nodes, ElemType::I32),
            send_nvl_head: matrix(13, 200, g, ElemType::I32),
        },
        outputs: CombineOutputs {
            combined_x: matrix(14, t, HIDDEN, ElemType::Bf16),
            combined_topk_weights: Some(matrix(15, t, 8, ElemType::F32)),
        },
    }
}

/// What each mode writes during a call, and what it keeps between calls, on `spec`'s PE.
struct Footprint {
    normal_writes: Vec<Span>,
    normal_lasting: Vec<Span>,
    ll_writes: Vec<Span>,
    ll_lasting: Vec<Span>,
}

/// Both modes' byte ranges, from the plans and the spec's own addresses (what the kernels get).
fn footprint(spec: &BufferSpec, (t, h, e, _): (usize, usize, usize, usize)) -> Footprint {
    let (n, g) = (spec.n_pes, spec.node_pes);
    let (nodes, config) = (n / g, config_for(n / g));
    let dispatch = plan_of(spec, &config, &dispatch_call(n, g, 12, 100, 8))
        .unwrap()
        .args;
    let combine = plan_internode_combine(spec, &config, &combine_call(n, g))
        .unwrap()
        .args;
    let rdma_ring = |slot: i32, base: u64| {
        span(
            base,
            2 * 12 * nodes * dispatch.rings.ring_tokens as usize * slot as usize,
        )
    };
    let nvl_ring = span(
        dispatch.nvl,
        12 * g * dispatch.nvl_ring_tokens as usize * dispatch.slot.bytes as usize,
    );
    let area = span(
        spec.notify_area_base().unwrap(),
        NotifyArea::new(nodes, g).bytes(),
    );
    let ll = spec.ll_region();
    let counts = span(ll.counts[0], 2 * MAX_LL_EXPERTS * 8);
    let barrier = span(spec.ll_barrier_words(), MAX_LL_RANKS * 8);
    let halves = ll.data.map(|half| span(half, n * ll.area_bytes as usize));
    Footprint {
        normal_writes: vec![
            rdma_ring(dispatch.slot.bytes, dispatch.rings.base),
            rdma_ring(combine.slot_bytes, combine.rings.base),
            nvl_ring,
            area,
        ],
        normal_lasting: vec![area],
        ll_writes: vec![
            counts,
            barrier,
            halves[0],
            halves[1],
            span(spec.ll_staging(), e * t * h * 2),
        ],
        ll_lasting: vec![counts, barrier],
    }
}

#[test]
fn a_low_latency_buffer_across_nodes_plans_both_modes_inside_its_allocation() {
    for (n, g) in layouts() {
        for shape in LL_SHAPES {
            for me in [0, n - 1] {
                let spec = both_modes(n, g, me, shape);
                let (t, h, e, k) = shape;
                assert!(shares_rdma(&spec), "{n} in nodes of {g}");
                notify_plan(&spec, n, n / g).unwrap();
                ll_shape(&spec, "low_latency_dispatch", t, h, e, k).unwrap();
                let f = footprint(&spec, shape);
                let area = NotifyArea::new(n / g, g).bytes();
                let regions = Regions {
                    num_nvl_bytes: spec.options.num_nvl_bytes,
                    num_rdma_bytes: spec.options.num_rdma_bytes,
                    notify_area_bytes: area,
                };
                let allocation = span(spec.base, regions.total());
                let (rdma, rdma_bytes) = spec.local_region(true);
                let rdma = span(rdma, rdma_bytes);
                for s in f.normal_writes.iter().chain(&f.ll_writes) {
                    assert!(
                        inside(*s, allocation),
                        "{n}/{g}: {s:x?} outside {allocation:x?}"
                    );
                }
                // Both modes' rings and slots lie in the rdma region...
                for s in f.normal_writes[..2].iter().chain(&f.ll_writes) {
                    assert!(inside(*s, rdma), "{n}/{g}: {s:x?} outside the rdma region");
                }
                // ... and overlap there: the bytes are shared, so the switch rules matter.
                assert!(overlaps(f.normal_writes[0], f.ll_writes[2]));
                assert_eq!(f.normal_writes[0].0, rdma.0 + CONTROL_BYTES as u64);
            }
        }
    }
}

#[test]
fn neither_modes_lasting_words_lie_in_bytes_the_other_writes() {
    for (n, g) in layouts() {
        for shape in LL_SHAPES {
            let spec = both_modes(n, g, n / 2, shape);
            let f = footprint(&spec, shape);
            for (write, lasting) in f
                .normal_writes
                .iter()
                .flat_map(|w| f.ll_lasting.iter().map(move |l| (w, l)))
            {
                assert!(
                    !overlaps(*write, *lasting),
                    "{n}/{g}: a normal write {write:x?} covers low latency's words {lasting:x?}"
                );
            }
            for (write, lasting) in f
                .ll_writes
                .iter()
                .flat_map(|w| f.normal_lasting.iter().map(move |l| (w, l)))
            {
                assert!(
                    !overlaps(*write, *lasting),
                    "{n}/{g}: a low-latency write {write:x?} covers normal mode's words {lasting:x?}"
                );
            }
            // Nor does low latency write normal mode's NVL rings.
            for write in &f.ll_writes {
                assert!(!overlaps(*write, f.normal_writes[2]), "{n}/{g}: {write:x?}");
            }
        }
    }
}

#[test]
fn deepeps_compatibility_test_sizes_serve_both_modes() {
    // tests/test_internode.py:325-330 and :361-363: Buffer(group, 2e9, 1e9,
    // low_latency_mode=True), the normal checks, then the low-latency test at (16, 5120, 256).
    for (n, g) in [(16, 8), (16, 4), (32, 8), (64, 8), (16, 1)] {
        let options = BufferOptions {
            num_nvl_bytes: 2_000_000_000,
            num_rdma_bytes: 1_000_000_000,
            low_latency_mode: true,
            timeout_ms: DEFAULT_TIMEOUT_MS,
        };
        options.check_nodes(n, g).unwrap();
        let mut spec = BufferSpec::for_tests(n, options);
        spec.node_pes = g;
        notify_plan(&spec, n, n / g).unwrap();
        let config = config_for(n / g);
        plan_of(&spec, &config, &dispatch_call(n, g, 12, 100, 8)).unwrap();
        plan_internode_combine(&spec, &config, &combine_call(n, g)).unwrap();
        ll_shape(&spec, "low_latency_dispatch", 16, 5120, 256, 9).unwrap();
    }
}

#[test]
fn what_a_low_latency_buffer_cannot_run_is_refused_naming_it() {
    // More than MAX_NORMAL_RANKS ranks: its low-latency calls only.
    let shape = (16, 5120, 256, 9);
    let mut wide = both_modes(64, 8, 0, shape);
    (wide.n_pes, wide.options.num_rdma_bytes) = (128, 1 << 30);
    assert!(!shares_rdma(&wide));
    ll_shape(&wide, "low_latency_dispatch", 16, 5120, 256, 9).unwrap();
    let error = plan_of(&wide, &config_for(16), &dispatch_call(128, 8, 12, 100, 8))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("MAX_NORMAL_RANKS = 64") && error.contains("low-latency calls only"),
        "{error}"
    );
    // Too small for normal mode's rings: the plan names the hint.
    let mut small = both_modes(16, 8, 0, shape);
    small.options.num_rdma_bytes = 1 << 20;
    let error = plan_of(&small, &config_for(2), &dispatch_call(16, 8, 12, 100, 8))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("num_rdma_bytes") && error.contains("get_buffer_size_hints_for_nodes"),
        "{error}"
    );
}

#[test]
fn a_switch_from_normal_to_low_latency_needs_the_clean() {
    let shares = both_modes(16, 4, 3, LL_SHAPES[0]);
    let what = "low_latency_dispatch";
    // DeepEP's --test-ll-compatibility order: normal calls, the clean, low-latency calls.
    let user = before_normal("internode_notify", &shares, None).unwrap();
    let error = before_low_latency(what, &shares, user)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("clean_low_latency_buffer(") && error.contains("every rank"),
        "{error}"
    );
    let cleaned = RdmaUser::Clean; // what clean_low_latency_buffer leaves
    let user = before_low_latency(what, &shares, cleaned).unwrap();
    assert_eq!(user, RdmaUser::LowLatency);
    assert_eq!(
        before_low_latency(what, &shares, user).unwrap(),
        RdmaUser::LowLatency
    );
    // Low latency then normal needs nothing (the notify is a barrier), unless a receive hook
    // is pending: the peers' rows may still land.
    assert_eq!(
        before_normal("internode_notify", &shares, None).unwrap(),
        RdmaUser::Normal
    );
    let pending = PendingReceive {
        op: what,
        shape: LlShape {
            max_tokens: 16,
            hidden: 5120,
            num_ranks: 16,
            num_experts: 256,
        },
    };
    let error = before_normal("internode_notify", &shares, Some(pending))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("receive hook") && error.contains("low_latency_dispatch"),
        "{error}"
    );
    // Buffers that do not share the region refuse neither.
    let mut one_node = shares;
    one_node.node_pes = 16;
    let mut normal = both_modes(16, 4, 3, LL_SHAPES[0]);
    normal.options.low_latency_mode = false;
    for spec in [one_node, normal] {
        assert!(!shares_rdma(&spec));
        assert!(before_low_latency(what, &spec, RdmaUser::Normal).is_ok());
        assert!(before_normal("internode_notify", &spec, Some(pending)).is_ok());
    }
}

#[test]
fn the_hint_for_both_modes_covers_each() {
    let config = Config::new(24, 8, 256, 16, 128).unwrap();
    for (n, g) in layouts() {
        let normal = config
            .get_buffer_size_hints_for_nodes(2 * HIDDEN, n, g)
            .unwrap()
            .1;
        for (t, h, e, _) in LL_SHAPES {
            let ll = get_low_latency_rdma_size_hint(t, h, n, e);
            let both = rdma_size_hint_for_both_modes(normal, ll);
            assert!(both >= normal && both >= ll && both.is_multiple_of(128));
            assert_eq!(both, normal.max(ll));
        }
    }
}
