//! The mistakes the host refuses before anything is launched.

use super::*;

/// Options of a bf16 call of `shape`.
fn bf16_options(shape: &LlShape) -> LlDispatchOptions {
    LlDispatchOptions {
        num_max_dispatch_tokens_per_rank: shape.max_tokens,
        num_experts: shape.num_experts,
        use_fp8: false,
        round_scale: false,
        use_ue8m0: false,
    }
}

// ANCHOR: mistakes
/// Each is refused on the host before anything is launched, with a message that names the
/// problem: on a live buffer, the shape mistakes a caller makes most and the one-call-in-flight
/// rule (src/bad_inputs.rs has the whole table of bad inputs, checked on the CPU). Every rank
/// makes the same mistakes, so no rank waits for another.
pub(crate) fn check_mistakes(
    buffer: &NvshmemBuffer<&World>,
    tally: &mut Tally,
) -> Result<(), AnyError> {
    let world = buffer.world();
    let (me, n) = (world.my_pe(), world.n_pes());
    let stream = world.stream();
    let cs = stream.cu_stream();
    let gpu = Gpu(stream);
    // The shape of the calls before and after: the one real call below keeps it.
    let (t, hidden) = (MAX_TOKENS, SMALL_HIDDEN);
    let layout = LlShape {
        max_tokens: t,
        hidden,
        num_ranks: n,
        num_experts: EXPERTS_PER_RANK * n,
    };
    let l = layout.num_local_experts();
    let too_many = t + 1;
    // Memory enough for every view below (poison: topk_idx all -1, no expert).
    let x = gpu.poisoned::<bf16>(too_many * hidden)?;
    let topk_idx = gpu.poisoned::<i64>(too_many * NUM_TOPK)?;
    let topk_weights = gpu.poisoned::<f32>(too_many * NUM_TOPK)?;
    let out = gpu.poisoned::<bf16>(too_many * hidden)?;
    let recv = RecvBuffers::new(&gpu, &layout, Precision::Bf16)?;
    let outputs = recv.views(&gpu, &layout, Precision::Bf16);
    let options = bf16_options(&layout);
    let inputs = |num_tokens: usize, hidden: usize| LlDispatchInputs {
        x: View::matrix(gpu.ptr(&x), num_tokens, hidden, ElemType::Bf16),
        topk_idx: View::matrix(gpu.ptr(&topk_idx), num_tokens, NUM_TOPK, ElemType::I64),
        cumulative_local_expert_recv_stats: None,
        dispatch_wait_recv_cost_stats: None,
    };
    // SAFETY (both): every view describes memory allocated above.
    let dispatch = |inputs: LlDispatchInputs, options: LlDispatchOptions, phases| unsafe {
        buffer.low_latency_dispatch_raw(&inputs, &outputs, &options, phases, cs)
    };
    let combine = |num_tokens: usize, handle: &LlHandle, phases| unsafe {
        let inputs = LlCombineInputs {
            x: None,
            topk_idx: View::matrix(gpu.ptr(&topk_idx), num_tokens, NUM_TOPK, ElemType::I64),
            topk_weights: View::matrix(gpu.ptr(&topk_weights), num_tokens, NUM_TOPK, ElemType::F32),
            combine_wait_recv_cost_stats: None,
        };
        let out = View::matrix(gpu.ptr(&out), num_tokens, hidden, ElemType::Bf16);
        buffer.low_latency_combine_raw(&inputs, handle, &out, phases, cs)
    };
    let handle = LlHandle {
        src_info: outputs.recv_src_info,
        layout_range: outputs.recv_layout_range,
        num_max_dispatch_tokens_per_rank: t,
        hidden,
        num_experts: layout.num_experts,
    };
    let one_launch = Phases::SendAndReceive;

    let mut refused = Vec::new();
    let mut expect = |what: &str, result: Result<(), BufferError>, key: &str| {
        refused.push(tally.expect_error(me, what, result, key));
    };
    expect(
        "more tokens than T",
        dispatch(inputs(too_many, hidden), options, one_launch),
        "more than num_max_dispatch_tokens_per_rank",
    );
    let half_t = LlHandle {
        src_info: View::matrix(handle.src_info.ptr, l, n * t / 2, ElemType::I32),
        ..handle
    };
    expect(
        "combine: a handle of another shape",
        combine(t, &half_t, one_launch),
        "does not match",
    );
    expect(
        "a receive hook with no send before it",
        dispatch(inputs(0, hidden), options, Phases::Receive),
        "no send phase is waiting",
    );
    // One call in flight: after a send, nothing but its receive. (A real call, of no tokens.)
    dispatch(inputs(0, hidden), options, Phases::Send)?;
    expect(
        "a dispatch while a receive hook is pending",
        dispatch(inputs(0, hidden), options, one_launch),
        "has not been called: call it first",
    );
    expect(
        "a combine while a receive hook is pending",
        combine(0, &handle, Phases::Send),
        "has not been called: call it first",
    );
    dispatch(inputs(0, hidden), options, Phases::Receive)?;
    stream.synchronize()?;
    buffer.check()?;
    for message in refused {
        println!("pe {me}: refused: {message}");
    }
    Ok(())
}
// ANCHOR_END: mistakes
