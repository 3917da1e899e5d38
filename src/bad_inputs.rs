//! Every argument check of the buffer, reached from the CPU: each plan is called with good
//! arguments (which must pass) and then with one thing wrong, and the error must name it.
//! The table is what the book's table of bad inputs lists.

use crate::config::Config;
use crate::error::BufferError;
use crate::spec::{BufferOptions, BufferSpec};
use crate::test_views::{matrix, vector};
use crate::view::{ElemType, View};
use crate::*;

// Ranks, tokens per rank, hidden, top-k, experts, rows received.
const N: usize = 4;
const TOKENS: usize = 100;
const HIDDEN: usize = 256;
const TOPK: usize = 8;
const EXPERTS: usize = 32;
const ROWS: usize = 150;

fn normal_spec() -> BufferSpec {
    let config = config();
    BufferSpec::for_tests(
        N,
        BufferOptions::normal(config.get_nvl_buffer_size_hint(HIDDEN * 2, N)),
    )
}
fn config() -> Config {
    Config::new(24, 8, 256, 6, 128).unwrap()
}

struct Normal {
    topk_idx: View,
    layout: LayoutOutputs,
    notify_in: NotifyInputs,
    notify_out: NotifyOutputs,
    dispatch_in: DispatchInputs,
    handle: Handle,
    dispatch_out: DispatchOutputs,
    combine_in: CombineInputs,
    combine_out: CombineOutputs,
}

fn normal() -> Normal {
    let c = config().num_channels();
    let layout = LayoutOutputs {
        num_tokens_per_rank: vector(1, N, ElemType::I32),
        num_tokens_per_rdma_rank: None,
        num_tokens_per_expert: vector(2, EXPERTS, ElemType::I32),
        is_token_in_rank: matrix(3, TOKENS, N, ElemType::Bool),
    };
    let notify_out = NotifyOutputs {
        rank_prefix_matrix: matrix(4, N, N, ElemType::I32),
        channel_prefix_matrix: matrix(5, N, c, ElemType::I32),
        recv_channel_prefix_matrix: matrix(6, N, c, ElemType::I32),
    };
    let topk_idx = matrix(7, TOKENS, TOPK, ElemType::I64);
    let handle = Handle {
        rank_prefix_matrix: notify_out.rank_prefix_matrix,
        channel_prefix_matrix: notify_out.channel_prefix_matrix,
        recv_channel_prefix_matrix: notify_out.recv_channel_prefix_matrix,
        recv_src_idx: vector(8, ROWS, ElemType::I32),
        is_token_in_rank: layout.is_token_in_rank,
        send_head: matrix(9, TOKENS, N, ElemType::I32),
    };
    let dispatch_out = DispatchOutputs {
        recv_x: matrix(10, ROWS, HIDDEN, ElemType::Bf16),
        recv_x_scales: None,
        recv_topk_idx: Some(matrix(11, ROWS, TOPK, ElemType::I64)),
        recv_topk_weights: Some(matrix(12, ROWS, TOPK, ElemType::F32)),
    };
    Normal {
        topk_idx,
        layout,
        notify_in: NotifyInputs {
            num_tokens_per_rank: layout.num_tokens_per_rank,
            num_tokens_per_expert: layout.num_tokens_per_expert,
            is_token_in_rank: layout.is_token_in_rank,
            expert_alignment: 1,
        },
        notify_out,
        dispatch_in: DispatchInputs {
            x: matrix(13, TOKENS, HIDDEN, ElemType::Bf16),
            x_scales: None,
            topk_idx: Some(topk_idx),
            topk_weights: Some(matrix(14, TOKENS, TOPK, ElemType::F32)),
            num_experts: EXPERTS,
        },
        handle,
        combine_in: CombineInputs {
            x: dispatch_out.recv_x,
            topk_weights: dispatch_out.recv_topk_weights,
            bias: [Some(matrix(15, TOKENS, HIDDEN, ElemType::Bf16)), None],
        },
        dispatch_out,
        combine_out: CombineOutputs {
            combined_x: matrix(16, TOKENS, HIDDEN, ElemType::Bf16),
            combined_topk_weights: Some(matrix(17, TOKENS, TOPK, ElemType::F32)),
        },
    }
}

fn layout(spec: &BufferSpec, a: &Normal) -> Result<(), BufferError> {
    plan_layout(spec, &a.topk_idx, EXPERTS, &a.layout).map(drop)
}
fn notify(spec: &BufferSpec, a: &Normal) -> Result<(), BufferError> {
    plan_notify(spec, &config(), &a.notify_in, &a.notify_out).map(drop)
}
fn dispatch(spec: &BufferSpec, a: &Normal) -> Result<(), BufferError> {
    plan_dispatch(spec, &config(), &a.dispatch_in, &a.handle, &a.dispatch_out).map(drop)
}
fn combine(spec: &BufferSpec, a: &Normal) -> Result<(), BufferError> {
    plan_combine(spec, &config(), &a.combine_in, &a.handle, &a.combine_out).map(drop)
}

/// (what is wrong, how to make it wrong, what the error must say).
type BadCase<A> = (&'static str, fn(&mut A, &mut BufferSpec), &'static str);
/// A plan under test, on a spec and a set of arguments.
type PlanUnderTest<A> = fn(&BufferSpec, &A) -> Result<(), BufferError>;
type Case = BadCase<Normal>;

/// (what is wrong, how to make it wrong, what the error must say), for normal mode; each
/// case runs every plan and at least one must fail with the message.
#[rustfmt::skip]
const NORMAL_CASES: &[Case] = &[
    ("int32 topk_idx", |a, _| a.topk_idx.elem = ElemType::I32, "topk_idx must be int64"),
    ("no experts", |a, _| a.notify_in.num_tokens_per_expert.shape[0] = 0, "num_tokens_per_expert's length = 0 must be a positive multiple"),
    ("experts not a multiple of the ranks", |a, _| a.dispatch_in.num_experts = 30, "positive multiple of the 4 ranks"),
    ("too many experts per token", |a, _| { a.topk_idx.shape[1] = 33; a.topk_idx.strides[0] = 33; }, "at most 32"),
    ("strided x", |a, _| a.dispatch_in.x.strides[0] = 2 * HIDDEN, "must be contiguous"),
    ("misaligned x", |a, _| a.dispatch_in.x.ptr += 2, "not a multiple of 16 bytes"),
    ("float32 x", |a, _| a.dispatch_in.x.elem = ElemType::F32, "bfloat16 or float8_e4m3fn"),
    ("fp8 x without scales", |a, _| a.dispatch_in.x.elem = ElemType::Fp8E4m3, "comes as (x, x_scales)"),
    ("scales with bf16 x", |a, _| a.dispatch_in.x_scales = Some(matrix(20, TOKENS, 2, ElemType::F32)), "only go with fp8"),
    ("int64 scales", |a, _| { a.dispatch_in.x.elem = ElemType::Fp8E4m3; a.dispatch_in.x_scales = Some(matrix(20, TOKENS, 2, ElemType::I64)); }, "x_scales must be float32 or int32"),
    ("recv scales of another dtype", |a, _| { a.dispatch_in.x.elem = ElemType::Fp8E4m3; a.dispatch_in.x_scales = Some(matrix(20, TOKENS, 2, ElemType::I32)); a.dispatch_out.recv_x.elem = ElemType::Fp8E4m3; a.dispatch_out.recv_x_scales = Some(matrix(21, ROWS, 2, ElemType::F32)); }, "recv_x_scales must be int32 [150, 2]"),
    ("rows of 8 bytes", |a, _| { a.dispatch_in.x.shape[1] = 4; a.dispatch_in.x.strides[0] = 4; }, "multiple of 16 bytes"),
    ("topk_idx without weights", |a, _| a.dispatch_in.topk_weights = None, "come together"),
    ("weights of another shape", |a, _| a.dispatch_in.topk_weights = Some(matrix(14, TOKENS, 4, ElemType::F32)), "topk_weights must be float32 [100, 8]"),
    ("recv_x of another width", |a, _| a.dispatch_out.recv_x = matrix(10, ROWS, 128, ElemType::Bf16), "recv_x must be bfloat16 [_, 256]"),
    ("recv_src_idx of another length", |a, _| a.handle.recv_src_idx.shape[0] = ROWS + 1, "recv_src_idx must be int32 [150]"),
    ("top-k outputs without top-k", |a, _| { a.dispatch_in.topk_idx = None; a.dispatch_in.topk_weights = None; a.dispatch_out.recv_topk_weights = None; }, "go with topk_idx"),
    ("handle of another config", |a, _| { a.handle.channel_prefix_matrix.shape[1] = 8; a.handle.channel_prefix_matrix.strides[0] = 8; }, "use the config the dispatch that made the handle used"),
    ("handle of another rank count", |a, _| a.handle.rank_prefix_matrix = matrix(4, 2, 2, ElemType::I32), "handle[0] (rank_prefix_matrix) must be int32 [4, 4]"),
    ("send_head of another token count", |a, _| a.handle.send_head.shape[0] = 99, "handle[5] (send_head)"),
    ("rings larger than the buffer", |_, spec| spec.options.num_nvl_bytes = 1 << 20, "Config.get_nvl_buffer_size_hint"),
    ("combine x of another row count", |a, _| a.combine_in.x.shape[0] = ROWS - 1, "x must be bfloat16 [150, _]"),
    ("float32 combine x", |a, _| a.combine_in.x.elem = ElemType::F32, "x must be bfloat16"),
    ("bias of another shape", |a, _| a.combine_in.bias[0] = Some(matrix(15, TOKENS, 128, ElemType::Bf16)), "bias[0] must be bfloat16 [100, 256]"),
    ("combined_x of another token count", |a, _| a.combine_out.combined_x.shape[0] = 7, "combined_x must be bfloat16 [100, 256]"),
    ("expert_alignment 0", |a, _| a.notify_in.expert_alignment = 0, "expert_alignment = 0 must be at least 1"),
    ("routing of another rank count", |a, _| { a.notify_in.is_token_in_rank.shape[1] = 2; a.notify_in.is_token_in_rank.strides[0] = 2; }, "is_token_in_rank must be bool [_, 4]"),
];

#[test]
fn good_arguments_pass_every_plan() {
    let (spec, a) = (normal_spec(), normal());
    layout(&spec, &a).unwrap();
    notify(&spec, &a).unwrap();
    dispatch(&spec, &a).unwrap();
    combine(&spec, &a).unwrap();
    let (spec, a) = (ll_spec(), low_latency());
    ll_dispatch(&spec, &a).unwrap();
    ll_combine(&spec, &a).unwrap();
}

/// The guards only the GPU can make (a `num_worst_tokens` below what arrives, counts that
/// disagree with the routing) need the buffer's input-error record and the rows the outputs
/// hold: the plans hand both to the kernels.
#[test]
fn the_kernels_get_the_input_error_record_and_the_rows_the_outputs_hold() {
    let (spec, a) = (normal_spec(), normal());
    let layout = plan_layout(&spec, &a.topk_idx, EXPERTS, &a.layout).unwrap();
    assert_eq!(layout.args.bad_input, spec.input_error);
    let notify = plan_notify(&spec, &config(), &a.notify_in, &a.notify_out).unwrap();
    assert_eq!(notify.prepare.bad_input, spec.input_error);
    let d = plan_dispatch(&spec, &config(), &a.dispatch_in, &a.handle, &a.dispatch_out).unwrap();
    assert_eq!(d.args.bad_input, spec.input_error);
    assert_eq!(d.args.num_recv_rows, ROWS as i32);
    let c = plan_combine(&spec, &config(), &a.combine_in, &a.handle, &a.combine_out).unwrap();
    assert_eq!(c.args.bad_input, spec.input_error);
    assert_eq!(c.args.num_recv_rows, ROWS as i32);
}

/// Runs every case: spoil good arguments, call every plan, expect the case's message.
fn assert_refused<A>(
    cases: &[BadCase<A>],
    good: fn() -> (BufferSpec, A),
    plans: &[PlanUnderTest<A>],
) {
    for (name, spoil, message) in cases {
        let (mut spec, mut a) = good();
        spoil(&mut a, &mut spec);
        let errors: Vec<String> = plans
            .iter()
            .filter_map(|plan| plan(&spec, &a).err().map(|e| e.to_string()))
            .collect();
        assert!(
            errors.iter().any(|e| e.contains(message)),
            "{name}: expected an error containing {message:?}, got {errors:?}"
        );
    }
}

#[test]
fn every_bad_normal_input_is_refused_with_its_message() {
    let good = || (normal_spec(), normal());
    assert_refused(NORMAL_CASES, good, &[layout, notify, dispatch, combine]);
}

#[test]
fn the_config_is_checked_before_launch() {
    let spec = normal_spec();
    let a = normal();
    for (config, message) in [
        (Config::new(23, 8, 256, 6, 128).unwrap(), "must be even"),
        (Config::new(24, 8, 16, 6, 128).unwrap(), "below 32"),
        (Config::new(200, 8, 256, 6, 128).unwrap(), "channels"),
    ] {
        let error = plan_dispatch(&spec, &config, &a.dispatch_in, &a.handle, &a.dispatch_out)
            .unwrap_err()
            .to_string();
        assert!(error.contains(message), "{error}");
    }
}

// ---- low-latency mode ----------------------------------------------------------------------

const T: usize = 64;
const LL_HIDDEN: usize = 1024;
const LL_EXPERTS: usize = 16;

fn ll_spec() -> BufferSpec {
    let bytes = get_low_latency_rdma_size_hint(T, LL_HIDDEN, N, LL_EXPERTS);
    BufferSpec::for_tests(N, BufferOptions::low_latency(bytes))
}

struct LowLatency {
    dispatch_in: LlDispatchInputs,
    dispatch_out: LlDispatchOutputs,
    options: LlDispatchOptions,
    combine_in: LlCombineInputs,
    handle: LlHandle,
    out: View,
    phases: Phases,
    pending: Option<PendingReceive>,
}

use crate::low_latency::PendingReceive;

fn low_latency() -> LowLatency {
    let l = LL_EXPERTS / N;
    let topk_idx = matrix(1, 50, TOPK, ElemType::I64);
    let dispatch_out = LlDispatchOutputs {
        recv_x: matrix(2, l * N * T, LL_HIDDEN, ElemType::Fp8E4m3),
        recv_x_scales: Some(matrix(3, l * LL_HIDDEN / 128, N * T, ElemType::F32)),
        recv_src_info: matrix(4, l, N * T, ElemType::I32),
        recv_layout_range: matrix(5, l, N, ElemType::I64),
        recv_count: vector(6, l, ElemType::I32),
    };
    LowLatency {
        dispatch_in: LlDispatchInputs {
            x: matrix(7, 50, LL_HIDDEN, ElemType::Bf16),
            topk_idx,
            cumulative_local_expert_recv_stats: None,
            dispatch_wait_recv_cost_stats: None,
        },
        options: LlDispatchOptions {
            num_max_dispatch_tokens_per_rank: T,
            num_experts: LL_EXPERTS,
            use_fp8: true,
            round_scale: false,
            use_ue8m0: false,
        },
        combine_in: LlCombineInputs {
            x: Some(matrix(8, l * N * T, LL_HIDDEN, ElemType::Bf16)),
            topk_idx,
            topk_weights: matrix(9, 50, TOPK, ElemType::F32),
            combine_wait_recv_cost_stats: None,
        },
        handle: LlHandle {
            src_info: dispatch_out.recv_src_info,
            layout_range: dispatch_out.recv_layout_range,
            num_max_dispatch_tokens_per_rank: T,
            hidden: LL_HIDDEN,
            num_experts: LL_EXPERTS,
        },
        dispatch_out,
        out: matrix(10, 50, LL_HIDDEN, ElemType::Bf16),
        phases: Phases::SendAndReceive,
        pending: None,
    }
}

fn ll_dispatch(spec: &BufferSpec, a: &LowLatency) -> Result<(), BufferError> {
    plan_ll_dispatch(
        spec,
        &a.dispatch_in,
        &a.dispatch_out,
        &a.options,
        a.phases,
        a.pending,
    )
    .map(drop)
}
fn ll_combine(spec: &BufferSpec, a: &LowLatency) -> Result<(), BufferError> {
    let (inputs, handle) = (&a.combine_in, &a.handle);
    plan_ll_combine(spec, inputs, handle, &a.out, a.phases, a.pending).map(drop)
}

type LlCase = (
    &'static str,
    fn(&mut LowLatency, &mut BufferSpec),
    &'static str,
);

#[rustfmt::skip]
const LL_CASES: &[LlCase] = &[
    ("a normal-mode buffer", |_, spec| *spec = normal_spec(), "made without low_latency_mode"),
    ("more tokens than T", |a, _| { a.dispatch_in.x.shape[0] = T + 1; a.dispatch_in.topk_idx.shape[0] = T + 1; a.combine_in.topk_idx.shape[0] = T + 1; a.combine_in.topk_weights.shape[0] = T + 1; a.out.shape[0] = T + 1; }, "more than num_max_dispatch_tokens_per_rank"),
    ("T of 0", |a, _| a.options.num_max_dispatch_tokens_per_rank = 0, "must be positive"),
    ("hidden not a multiple of 128", |a, _| { a.dispatch_in.x.shape[1] = 1000; a.dispatch_in.x.strides[0] = 1000; }, "hidden = 1000 is not supported"),
    ("experts not a multiple of the ranks", |a, _| a.options.num_experts = 18, "positive multiple of the 4 ranks"),
    ("more than 32 experts per token", |a, _| { a.dispatch_in.topk_idx.shape[1] = 40; a.dispatch_in.topk_idx.strides[0] = 40; }, "at most 32"),
    ("a region too small", |_, spec| spec.options.num_rdma_bytes = 1 << 20, "get_low_latency_rdma_size_hint(64, 1024, 4, 16)"),
    ("ue8m0 without round_scale", |a, _| a.options.use_ue8m0 = true, "use_ue8m0 needs use_fp8=True and round_scale=True"),
    ("fp8 without scales", |a, _| a.dispatch_out.recv_x_scales = None, "use_fp8 needs recv_x_scales"),
    ("bf16 recv_x for fp8", |a, _| a.dispatch_out.recv_x.elem = ElemType::Bf16, "recv_x must be float8_e4m3fn"),
    ("a receive with no send", |a, _| a.phases = Phases::Receive, "no send phase is waiting"),
    ("a send while a receive is pending", |a, _| { a.pending = Some(PendingReceive { op: "low_latency_dispatch", shape: LlShape { max_tokens: T, hidden: LL_HIDDEN, num_ranks: N, num_experts: LL_EXPERTS, }, }); }, "has not been called"),
    ("a handle of another shape", |a, _| a.handle.num_max_dispatch_tokens_per_rank = 56, "the handle does not match its own shape"),
    ("combine x of another shape", |a, _| a.combine_in.x = Some(matrix(8, 7, LL_HIDDEN, ElemType::Bf16)), "x must be [num_local_experts, num_ranks x T, hidden]"),
    ("weights of another shape", |a, _| a.combine_in.topk_weights.shape[1] = 4, "topk_weights must be float32 [50, 8]"),
    ("out of another width", |a, _| a.out.shape[1] = 512, "out must be bfloat16 [50, 1024]"),
    ("stats of another length", |a, _| { a.dispatch_in.cumulative_local_expert_recv_stats = Some(vector(11, 3, ElemType::I32)) }, "cumulative_local_expert_recv_stats must be int32 [4]"),
];

#[test]
fn every_bad_low_latency_input_is_refused_with_its_message() {
    assert_refused(
        LL_CASES,
        || (ll_spec(), low_latency()),
        &[ll_dispatch, ll_combine],
    );
}

#[test]
fn a_send_leaves_its_receive_pending() {
    let (spec, a) = (ll_spec(), low_latency());
    let dispatch = |phases, pending| {
        let (inputs, outputs) = (&a.dispatch_in, &a.dispatch_out);
        plan_ll_dispatch(&spec, inputs, outputs, &a.options, phases, pending).unwrap()
    };
    let pending = dispatch(Phases::Send, None).pending_after;
    let pending = pending.expect("a send leaves its receive pending");
    let p = dispatch(Phases::Receive, Some(pending));
    assert_eq!(p.pending_after, None);
    // The combine's receive does not match a dispatch's send.
    let error = plan_ll_combine(
        &spec,
        &a.combine_in,
        &a.handle,
        &a.out,
        Phases::Receive,
        Some(pending),
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("does not match the pending send"), "{error}");
}
