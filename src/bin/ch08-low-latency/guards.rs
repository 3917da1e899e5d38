//! The guard only the GPU can make in low-latency mode, on a live buffer: a combine whose
//! handle does not belong to its data. The call completes on every rank, the next `check()`
//! raises the input error once, and the buffer stays usable (the round trip after it in
//! main.rs).

use super::*;
use nvshmem_tutorial::LlDispatchHandle;

/// A dispatch with a simple routing (token i to experts i, i + 1, ... modulo the experts), then
/// a combine with its handle spoiled: the first received row of local expert 0 names source
/// token T + 5, past every source's tokens. The combine leaves that row out, and the next check
/// names the packed row and the token.
pub(crate) fn check_bad_handle(
    buffer: &mut NvshmemBuffer<&World>,
    tally: &mut Tally,
) -> Result<(), AnyError> {
    let world = buffer.world();
    let (me, n, stream) = (world.my_pe(), world.n_pes(), world.stream().clone());
    let (t, hidden, num_experts) = (MAX_TOKENS, SMALL_HIDDEN, EXPERTS_PER_RANK * n);
    let x: Vec<bf16> = (0..t * hidden)
        .map(|i| bf16::from_f32((i % 17) as f32))
        .collect();
    let topk_idx: Vec<i64> = (0..t * NUM_TOPK)
        .map(|i| ((i / NUM_TOPK + i % NUM_TOPK) % num_experts) as i64)
        .collect();
    let weights = vec![1.0f32; t * NUM_TOPK];
    let x = DeviceArray::from_host(&stream, &x, t, hidden)?;
    let topk_idx = DeviceArray::from_host(&stream, &topk_idx, t, NUM_TOPK)?;
    let weights = DeviceArray::from_host(&stream, &weights, t, NUM_TOPK)?;
    let options = LlDispatchOptions {
        num_max_dispatch_tokens_per_rank: t,
        num_experts,
        use_fp8: false,
        round_scale: false,
        use_ue8m0: false,
    };
    let got = buffer.low_latency_dispatch(&x, &topk_idx, LlStats::default(), options)?;
    // The first row of local expert 0: source s's rows start at (layout_range >> 32).
    let ranges = got.handle.layout_range.to_host(&stream)?;
    let Some(begin) = ranges[..n]
        .iter()
        .find(|&&r| r & 0xFFFF_FFFF > 0)
        .map(|&r| (r >> 32) as usize)
    else {
        return Err("check_bad_handle: local expert 0 received no rows".into());
    };
    let mut src_info = got.handle.src_info.to_host(&stream)?;
    let bad_token = (t + 5) as i32;
    src_info[begin] = bad_token;
    let (l, rows_per_expert) = (num_experts / n, n * t);
    let LlDispatched {
        x: recv, handle, ..
    } = got;
    let handle = LlDispatchHandle {
        src_info: DeviceArray::from_host(&stream, &src_info, l, rows_per_expert)?,
        ..handle
    };
    let LlRecvTokens::Bf16(recv_x) = recv else {
        unreachable!("bf16 in, bf16 out")
    };
    let topk = TopK {
        idx: &topk_idx,
        weights: &weights,
    };
    buffer.low_latency_combine(Some(&recv_x), topk, None, &handle)?;
    stream.synchronize()?;
    let key = format!("packed row {begin} of the handle names source token {bad_token}");
    let message = tally.expect_error(me, "combine with a spoiled handle", buffer.check(), &key);
    println!("pe {me}: recorded on the GPU: {message}");
    tally.check(me, buffer.check().is_ok(), || {
        "the spoiled handle's error was raised twice".into()
    });
    Ok(())
}
