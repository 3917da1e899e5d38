//! The internode dispatch's CPU tests: its plan at every layout with its rings inside their
//! regions, the size formulas against the hints, every refusal, the route rules of its kernel.
//! The combine's tests (which share the rings) use its buffers, calls and checks.

use super::*;
use crate::config::{internode_dispatch_slot_bytes, internode_slot_bytes};
use crate::internode_notify::NotifyArea;
use crate::low_latency::regions::CONTROL_BYTES;
use crate::regions::Regions;
use crate::spec::{BufferOptions, BufferSpec};
use crate::test_views::{assert_mentions, assert_route_rules, internode_handle, matrix, vector};
use crate::view::ElemType;
use kernels::contract::{
    Failure, MAX_CHANNELS, MAX_DISPATCH_BLOCKS, MAX_LL_RANKS, MAX_RDMA_CHUNKS,
};

pub(crate) const HIDDEN: usize = 7168;

pub(crate) fn config() -> Config {
    Config::new(24, 8, 256, 16, 128).unwrap()
}

/// A normal-mode buffer of `n` ranks in nodes of `g`, as rank `me` sees it, sized by the hints.
fn spec(n: usize, g: usize, me: usize) -> BufferSpec {
    spec_for(&config(), n, g, me)
}

pub(crate) fn spec_for(config: &Config, n: usize, g: usize, me: usize) -> BufferSpec {
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

/// A call's views: T tokens of bf16 [T, HIDDEN] with K top-k (0: none), M rows received, M_r
/// forwarded, n ranks in N nodes of G, C channels.
pub(crate) struct Call {
    pub(crate) inputs: DispatchInputs,
    pub(crate) is_token_in_rank: View,
    pub(crate) handle: InternodeHandle,
    pub(crate) outputs: InternodeDispatchOutputs,
}

pub(crate) fn call(n: usize, g: usize, c: usize, t: usize, k: usize) -> Call {
    let (nodes, m, m_r) = (n / g, 3 * t, 2 * t);
    let topk = |i: u64, cols: usize, elem: ElemType| (k > 0).then(|| matrix(i, cols, k, elem));
    Call {
        inputs: DispatchInputs {
            x: matrix(1, t, HIDDEN, ElemType::Bf16),
            x_scales: None,
            topk_idx: topk(2, t, ElemType::I64),
            topk_weights: topk(3, t, ElemType::F32),
            num_experts: 4 * n,
        },
        is_token_in_rank: matrix(4, t, n, ElemType::Bool),
        handle: internode_handle(n, nodes, c),
        outputs: InternodeDispatchOutputs {
            recv_x: matrix(11, m, HIDDEN, ElemType::Bf16),
            recv_x_scales: None,
            recv_topk_idx: topk(12, m, ElemType::I64),
            recv_topk_weights: topk(13, m, ElemType::F32),
            recv_src_meta: matrix(14, m, 2, ElemType::I32),
            send_rdma_head: matrix(15, t, nodes, ElemType::I32),
            send_nvl_head: matrix(16, m_r, g, ElemType::I32),
        },
    }
}

/// A change that makes a good call bad.
type Spoil = fn(&mut Call);

pub(crate) fn plan_of(
    spec: &BufferSpec,
    config: &Config,
    x: &Call,
) -> Result<InternodeDispatchPlan, BufferError> {
    plan_internode_dispatch(
        spec,
        config,
        &x.inputs,
        x.is_token_in_rank,
        &x.handle,
        &x.outputs,
    )
}

fn error_of(spec: &BufferSpec, config: &Config, x: &Call) -> String {
    plan_of(spec, config, x)
        .expect_err("a bad call was planned")
        .to_string()
}

#[test]
fn every_layout_plans_with_its_rings_inside_their_regions() {
    for (n, g) in [(4, 2), (8, 4), (8, 1), (16, 8), (16, 2), (64, 8), (64, 1)] {
        let nodes = n / g;
        for me in [0, g - 1, n - 1] {
            let spec = spec(n, g, me);
            for k in [0, 8] {
                let x = call(n, g, 12, 100, k);
                let p = plan_of(&spec, &config(), &x).unwrap();
                let a = p.args;
                assert_eq!(
                    (p.num_channels, a.num_channels, a.num_tokens),
                    (12, 12, 100)
                );
                // The design's slot (section 3): 14,416 B at K = 8, within the hint's slot.
                let slot = a.slot.bytes as usize;
                assert_eq!(slot, if k == 8 { 14_416 } else { 14_352 });
                assert!(slot <= internode_slot_bytes(HIDDEN, 2 * HIDDEN, 32, HIDDEN / 128));
                assert_eq!(
                    (a.rings.ring_tokens, a.rings.chunk_tokens, a.nvl_ring_tokens),
                    (128, 16, 256)
                );
                assert_eq!((a.num_recv_rows, a.num_forwarded_rows), (300, 200));
                // RDMA rings after the low-latency control words, inside num_rdma_bytes.
                let (rdma, rdma_bytes) = spec.local_region(true);
                assert_eq!(a.rings.base, rdma + CONTROL_BYTES as u64);
                assert!(CONTROL_BYTES + 2 * 12 * nodes * 128 * slot <= rdma_bytes);
                assert!(12 * g * 256 * slot <= spec.options.num_nvl_bytes);
                assert_eq!(a.nvl, spec.nvl());
                // The ring words: after the notify's staging, in order, inside the area.
                let area = NotifyArea::new(nodes, g);
                let base = spec.notify_area_base().unwrap();
                let words = [
                    a.rings.chunk_words,
                    a.rings.heads,
                    a.rings.sent,
                    a.rings.received,
                    a.calls,
                ];
                assert_eq!(words[0], base + area.chunk_words() as u64);
                assert!(words.windows(2).all(|w| w[0] < w[1]) && words.iter().all(|w| w % 8 == 0));
                let per = (MAX_CHANNELS * nodes * 8) as u64;
                assert_eq!(words[1] - words[0], per * MAX_RDMA_CHUNKS as u64);
                assert!(words[4] + (MAX_DISPATCH_BLOCKS * 8) as u64 <= base + area.bytes() as u64);
                let regions = Regions {
                    num_nvl_bytes: spec.options.num_nvl_bytes,
                    num_rdma_bytes: rdma_bytes,
                    notify_area_bytes: area.bytes(),
                };
                assert_eq!(
                    base + area.bytes() as u64,
                    spec.base + regions.total() as u64
                );
                assert_eq!(a.topo.node_start as usize, me / g * g);
            }
        }
    }
}

#[test]
fn rings_the_protocol_cannot_run_are_refused_naming_why() {
    let (n, g) = (8, 4);
    let spec = spec(n, g, 0);
    let x = call(n, g, 12, 64, 0);
    // A chunk past a window, a ring below a window and a chunk, too many chunks, and (the
    // fields set past Config::new, which rounds the ring) a ring not a whole number of chunks
    // or a chunk of 0.
    for (chunk, ring) in [(40, 128), (16, 32), (2, 128), (12, 128), (0, 128)] {
        let mut config = Config::new(24, 8, 256, 4, 128).unwrap();
        config.num_max_rdma_chunked_send_tokens = chunk;
        config.num_max_rdma_chunked_recv_tokens = ring;
        let error = error_of(&spec, &config, &x);
        assert_mentions(
            &error,
            &[
                "internode_dispatch",
                "num_max_rdma_chunked_send_tokens",
                "MAX_RDMA_CHUNKS",
            ],
        );
    }
    assert_small_regions_name_the_hint(&spec, |small| error_of(small, &config(), &x));
}

/// Regions smaller than a call (`spec`'s with each region cut to a sliver in turn): the
/// refusal (`error_of`) names the region and the hint.
pub(crate) fn assert_small_regions_name_the_hint(
    spec: &BufferSpec,
    error_of: impl Fn(&BufferSpec) -> String,
) {
    for region in ["num_rdma_bytes", "num_nvl_bytes"] {
        let mut small = *spec;
        if region == "num_rdma_bytes" {
            small.options.num_rdma_bytes = CONTROL_BYTES + 1000;
        } else {
            small.options.num_nvl_bytes = 1000;
        }
        assert_mentions(
            &error_of(&small),
            &[region, "get_buffer_size_hints_for_nodes"],
        );
    }
}

#[test]
fn every_bad_input_and_output_is_refused_naming_it() {
    let (n, g) = (8, 2);
    let spec = spec(n, g, 3);
    let good = call(n, g, 12, 64, 8);
    assert!(plan_of(&spec, &config(), &good).is_ok());
    let cases: [(&str, Spoil); 9] = [
        ("x_scales", |x| {
            x.inputs.x = matrix(1, 64, HIDDEN, ElemType::Fp8E4m3)
        }),
        ("recv_x", |x| {
            x.outputs.recv_x = matrix(11, 192, 4096, ElemType::Bf16)
        }),
        ("recv_src_meta", |x| {
            x.outputs.recv_src_meta = matrix(14, 192, 8, ElemType::I32)
        }),
        ("send_rdma_head", |x| {
            x.outputs.send_rdma_head = matrix(15, 64, 8, ElemType::I32)
        }),
        ("send_nvl_head", |x| {
            x.outputs.send_nvl_head = matrix(16, 128, 8, ElemType::I32)
        }),
        ("recv_topk_idx", |x| x.outputs.recv_topk_idx = None),
        ("topk_weights", |x| x.inputs.topk_weights = None),
        ("is_token_in_rank", |x| {
            x.is_token_in_rank = matrix(4, 64, 4, ElemType::Bool)
        }),
        ("recv_gbl_rank_prefix_sum", |x| {
            x.handle.recv_gbl_rank_prefix_sum = vector(10, 2, ElemType::I32)
        }),
    ];
    for (name, spoil) in cases {
        let mut x = call(n, g, 12, 64, 8);
        spoil(&mut x);
        let error = error_of(&spec, &config(), &x);
        assert_mentions(&error, &["internode_dispatch", name]);
    }
    // A buffer on one node: chapter 7's calls.
    let one_node = spec_one_node();
    let error = error_of(&one_node, &config(), &call(4, 4, 12, 64, 0));
    assert_mentions(&error, &["one node", "dispatch_raw"]);
}

/// `x` made fp8 with scales [T, HIDDEN / 128] f32 of `strides` (DeepEP's test passes
/// column-major ones), and its outputs to match.
fn fp8(x: &mut Call, strides: [usize; 2]) {
    let (t, m, s) = (x.inputs.x.rows(), x.outputs.recv_x.rows(), HIDDEN / 128);
    x.inputs.x = matrix(1, t, HIDDEN, ElemType::Fp8E4m3);
    x.inputs.x_scales = Some(View {
        strides,
        ..matrix(17, t, s, ElemType::F32)
    });
    x.outputs.recv_x = matrix(11, m, HIDDEN, ElemType::Fp8E4m3);
    x.outputs.recv_x_scales = Some(matrix(18, m, s, ElemType::F32));
}

/// Step 6: fp8 rows travel with their scales in the slot (section 3's slot_d: 7,472 B at
/// K = 8, H = 7168), the scales read with the caller's strides and received row major.
#[test]
fn fp8_rows_carry_their_strided_scales_in_the_slot() {
    let (n, g) = (8, 2);
    let spec = spec(n, g, 3);
    for (k, slot) in [(8, 7_472), (0, 7_408)] {
        let mut x = call(n, g, 12, 64, k);
        fp8(&mut x, [1, 64]); // column-major, as DeepEP's test
        let a = plan_of(&spec, &config(), &x).unwrap().args;
        assert_eq!(a.slot.bytes as usize, slot);
        assert_eq!(slot, internode_dispatch_slot_bytes(HIDDEN, k, HIDDEN / 128));
        assert!(slot <= internode_slot_bytes(HIDDEN, 2 * HIDDEN, 32, HIDDEN / 128));
        assert_eq!(
            (a.slot.hidden_bytes, a.slot.num_scales),
            (HIDDEN as i32, 56)
        );
        assert_eq!((a.scale_token_stride, a.scale_hidden_stride), (1, 64));
        assert_eq!(a.x_scales, x.inputs.x_scales.unwrap().ptr);
        assert_eq!(a.recv_x_scales, x.outputs.recv_x_scales.unwrap().ptr);
    }
    // bf16: no scales anywhere.
    let a = plan_of(&spec, &config(), &call(n, g, 12, 64, 8))
        .unwrap()
        .args;
    assert_eq!((a.x_scales, a.recv_x_scales, a.slot.num_scales), (0, 0, 0));
    // int32 (UE8M0) scales are 4-byte words too; recv_x_scales takes their dtype.
    let mut x = call(n, g, 12, 64, 8);
    fp8(&mut x, [56, 1]);
    x.inputs.x_scales = Some(matrix(17, 64, 56, ElemType::I32));
    x.outputs.recv_x_scales = Some(matrix(18, 192, 56, ElemType::I32));
    assert!(plan_of(&spec, &config(), &x).is_ok());
}

#[test]
fn fp8_without_its_scales_or_outputs_is_refused_naming_them() {
    let (n, g) = (8, 2);
    let spec = spec(n, g, 3);
    let cases: [(&[&str], Spoil); 6] = [
        (&["fp8 x comes as (x, x_scales)"], |x| {
            x.inputs.x_scales = None
        }),
        (&["x_scales only go with fp8 x"], |x| {
            x.inputs.x = matrix(1, 64, HIDDEN, ElemType::Bf16)
        }),
        (&["recv_x_scales", "fp8 x needs"], |x| {
            x.outputs.recv_x_scales = None
        }),
        (&["recv_x must be float8_e4m3fn"], |x| {
            x.outputs.recv_x = matrix(11, 192, HIDDEN, ElemType::Bf16)
        }),
        (&["recv_x_scales must be float32 [192, 56]"], |x| {
            x.outputs.recv_x_scales = Some(matrix(18, 192, 56, ElemType::I32))
        }),
        (&["x_scales must be float32 or int32 [64, S]"], |x| {
            x.inputs.x_scales = Some(matrix(17, 64, 56, ElemType::Bf16))
        }),
    ];
    for (parts, spoil) in cases {
        let mut x = call(n, g, 12, 64, 8);
        fp8(&mut x, [1, 64]);
        spoil(&mut x);
        let error = error_of(&spec, &config(), &x);
        assert_mentions(&error, &[&["internode_dispatch"], parts].concat());
    }
    // Scales with bf16 outputs: recv_x_scales is refused.
    let mut x = call(n, g, 12, 64, 8);
    x.outputs.recv_x_scales = Some(matrix(18, 192, 56, ElemType::F32));
    assert_mentions(
        &error_of(&spec, &config(), &x),
        &["recv_x_scales goes with fp8 x"],
    );
}

pub(crate) fn spec_one_node() -> BufferSpec {
    let options = BufferOptions {
        num_rdma_bytes: 1 << 20,
        ..BufferOptions::normal(1 << 20)
    };
    BufferSpec::for_tests(4, options)
}

/// The route rule read off the kernel's source (`internode_code`), and every wait bounded
/// with a kind that names what it waited for.
#[test]
fn the_kernel_reaches_other_nodes_by_signals_only_and_bounds_every_wait() {
    let code = internode_code(
        "internode_dispatch",
        include_str!("../../kernels/cuda/buffer/internode_dispatch.cu"),
    );
    // Waits: the sender's RDMA space, the forwarder's NVL space, the receiver's NVL data;
    // the forwarder's poll of N rings records its own timeout (WAIT_RDMA_DATA).
    let kinds = ["WAIT_RDMA_SPACE", "WAIT_RING_SPACE", "WAIT_RING_DATA"];
    let waits = waits(&code);
    assert_eq!(waits.len(), kinds.len(), "three bounded waits");
    for (wait, kind) in waits.iter().zip(kinds) {
        assert!(wait.contains(kind), "a wait records {kind}: {wait}");
    }
    let poll = body(&code, "int pick_chunk");
    assert!(poll.contains("timeout_cycles") && poll.contains("WAIT_RDMA_DATA"));
}

/// An internode kernel's source with the RDMA rings' header (internode.cuh), under the route
/// rule (DESIGN.md, across nodes): ranks become addresses only through node_peer, other nodes
/// are reached by put-with-signal and signal ops only (no nvshmem_ptr, fence, quiet, barrier
/// or trap). Returns the code without comments.
/// The kernel is one `__global__` function, named `kernel` (the profiler's row, 2.5).
pub(crate) fn internode_code(kernel: &str, source: &str) -> String {
    let header = include_str!("../../kernels/cuda/buffer/internode.cuh");
    let code = assert_route_rules(
        &format!("{kernel}.cu + internode.cuh"),
        &[source, header].concat(),
        &["nvshmemx_putmem_signal_nbi_warp", "nvshmemx_signal_op"],
    );
    let peer = code.matches("peer(").count();
    let through = code.matches("node_peer(").count();
    assert_eq!(
        peer, through,
        "{kernel}: every peer pointer through node_peer"
    );
    assert_eq!(
        code.matches("__global__").count(),
        1,
        "{kernel}: one kernel"
    );
    assert!(code.contains(&format!(" {kernel}(")), "{kernel}: its name");
    code
}

/// The arguments of every bounded wait (`wait_at_least`) in `code`, in order.
pub(crate) fn waits(code: &str) -> Vec<&str> {
    let calls = code.split("wait_at_least(").skip(1);
    calls
        .map(|call| call.split(';').next().unwrap_or(call))
        .collect()
}

/// The body of the device function `signature` (its return type and name) in `code`.
pub(crate) fn body<'a>(code: &'a str, signature: &str) -> &'a str {
    let from = format!("__device__ __forceinline__ {signature}(");
    let after = code
        .split(&from)
        .nth(1)
        .unwrap_or_else(|| panic!("no {signature}"));
    after.split("\n}").next().unwrap_or(after)
}

/// How the host tells a timed-out internode wait of `kind` that named rank `pe` (past
/// MAX_LL_RANKS: another node's), seen by rank 1 in block 7 (channel 3) of call 4, in nodes of 2.
pub(crate) fn described(kind: Failure, pe: usize) -> String {
    use crate::error::{LastRingCall, describe};
    use ch04_collectives::{CollError, DeviceFailure};
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
    describe(CollError::Device(failure), LastRingCall::default(), 2).to_string()
}

/// A timed-out sender or forwarder names the rail peer, its node, the channel and the side.
#[test]
fn failures_name_the_rail_peer_its_node_and_the_channel() {
    for (kind, side) in [
        (Failure::RdmaSpace, "sender"),
        (Failure::RdmaData, "forwarder"),
    ] {
        let text = described(kind, MAX_LL_RANKS + 5);
        let channel = format!("channel 3, {side}");
        let parts = [
            "rank 1: internode dispatch (call 4",
            &channel,
            "rank 5 (node 2)",
            "33 expected, 16 seen",
        ];
        assert_mentions(&text, &parts);
        assert!(kind.device_name().starts_with("WAIT_RDMA_"));
    }
}
