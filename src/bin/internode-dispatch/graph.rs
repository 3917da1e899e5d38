//! Step 8's calls of internode-dispatch: outputs sized by `num_worst_tokens` (no host wait for
//! the counts). A dispatch whose num_worst_tokens is below what some ranks receive or forward
//! records RECV_OVERFLOW on exactly those ranks (the rest of the rows dropped, every ring still
//! moving, so the buffer goes on); and one dispatch and combine pair is captured in a CUDA
//! graph (`internode_pair_raw`: the notify without its wait, the dispatch, the combine's
//! cached notify, the combine) and replayed twice, the outputs poisoned before the second,
//! every output checked after each.

use std::sync::Arc;

use ch01_bootstrap::World;
use ch01_bootstrap::checks::Tally;
use cudarc::driver::{CudaStream, sys};
use nvshmem_tutorial::internode::Job;
use nvshmem_tutorial::{BufferError, Config, InternodePair, NvshmemBuffer, View};

use crate::HIDDEN;
use crate::combine::{CombineArrays, check_combine};
use crate::dispatch::{Call, Dispatched, check_dispatched, launch, prepare};
use crate::internode_case::Case;
use crate::reference::{forwarded, received};
use crate::shared::AnyError;

/// Every rank's tokens of `case`: a num_worst_tokens no rank's receive or forward exceeds.
pub(crate) fn total_tokens(case: &Case) -> usize {
    case.job.routing.iter().map(Vec::len).sum::<usize>().max(1)
}

/// (rows received, rows forwarded) of rank `me`.
fn needed(job: &Job, me: usize) -> (usize, usize) {
    (received(job, me).len(), forwarded(job, me).len())
}

// ANCHOR: overflow
/// A dispatch of `case` with num_worst_tokens one below the most rows any rank receives or
/// forwards: RecvOverflow exactly on the ranks past it, naming the rows needed (received
/// first: the kernel checks them first) and the limit; no error elsewhere.
pub(crate) fn overflow(
    buffer: &NvshmemBuffer<&World>,
    case: &Case,
    tally: &mut Tally,
) -> Result<(), AnyError> {
    let (me, job) = (buffer.world().my_pe(), &case.job);
    let most = (0..job.n_pes)
        .map(|r| needed(job, r))
        .map(|(a, b)| a.max(b))
        .max()
        .unwrap_or(0);
    let worst = most.saturating_sub(1).max(1);
    let call = Call {
        hidden: HIDDEN[0],
        with_topk: true,
        fp8: None,
        worst: Some(worst),
    };
    let d = prepare(buffer, case, call)?;
    launch(buffer, case, &d)?;
    let (recv, fwd) = needed(job, me);
    let expected = [recv, fwd].into_iter().find(|&rows| rows > worst);
    let result = buffer.check();
    let ok = match (expected, &result) {
        (None, Ok(())) => true,
        (
            Some(rows),
            Err(BufferError::RecvOverflow {
                needed,
                num_worst_tokens,
                ..
            }),
        ) => *needed as usize == rows && *num_worst_tokens as usize == worst,
        _ => false,
    };
    tally.check(me, ok, || {
        format!(
            "num_worst_tokens = {worst} (received {recv}, forwarded {fwd}): expected an \
             overflow of {expected:?} rows, got {result:?}"
        )
    });
    Ok(())
}
// ANCHOR_END: overflow

// ANCHOR: capture_and_replay
/// One pair of `case` (fp8 with column-major scales, top-k, both biases, outputs of
/// num_worst_tokens) captured in a CUDA graph under the dispatch's and `combine_config`, then
/// replayed twice (the outputs poisoned before the second), every output checked each time.
pub(crate) fn capture_and_replay(
    buffer: &NvshmemBuffer<&World>,
    case: &Case,
    combine_config: &Config,
    tally: &mut Tally,
) -> Result<(), AnyError> {
    let (me, stream) = (buffer.world().my_pe(), buffer.world().stream());
    let call = Call {
        hidden: HIDDEN[1],
        with_topk: true,
        fp8: Some(true),
        worst: Some(total_tokens(case)),
    };
    let biases = [true, true];
    let d = prepare(buffer, case, call)?;
    let arrays = CombineArrays::new(stream, &case.job, me, call.hidden, &d, biases)?;
    let (dispatch, received) = d.views(case.job.num_experts);
    let pair = InternodePair {
        num_worst_tokens: call.worst.unwrap_or(0),
        layout: d.layout.inputs(case.expert_alignment),
        handle: d.handle.handle(),
        dispatch,
        received,
        combine: arrays.inputs(),
        combined: arrays.outputs(),
    };
    stream.synchronize()?; // every array is in place before the capture
    stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let configs = (&case.config, combine_config);
    // SAFETY: every view is a live array of this GPU, kept alive until the graph's last replay
    // is synchronised below; the world's stream belongs to the buffer's context.
    let captured = unsafe { buffer.internode_pair_raw(&pair, configs, stream.cu_stream()) };
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0))?;
    captured?;
    let graph = graph.ok_or("the stream capture produced no graph")?;
    for replay in 0..2 {
        if replay > 0 {
            poison(&d, &pair, stream)?;
        }
        graph.launch()?;
        stream.synchronize()?;
        let dispatch_ok = check_dispatched(buffer, case, &d, tally)?;
        let combine_ok = check_combine(buffer, case, &d, &arrays, (call.hidden, biases), tally)?;
        if !(dispatch_ok && combine_ok) {
            eprintln!(
                "pe {me}: graph replay {replay}: dispatch {dispatch_ok}, combine {combine_ok}"
            );
        }
    }
    Ok(())
}
// ANCHOR_END: capture_and_replay

/// Every output of the pair (handle positions 1-6 too) poisoned with 0x7F bytes (not -1, so
/// the -1 rows of recv_topk_idx must be written again), on the stream.
fn poison(
    d: &Dispatched,
    pair: &InternodePair,
    stream: &Arc<CudaStream>,
) -> Result<(), BufferError> {
    let r = &pair.received;
    let mut views: Vec<View> = vec![
        r.recv_x,
        r.recv_src_meta,
        r.send_rdma_head,
        r.send_nvl_head,
        pair.combined.combined_x,
    ];
    views.extend(
        [
            r.recv_x_scales,
            r.recv_topk_idx,
            r.recv_topk_weights,
            pair.combined.combined_topk_weights,
        ]
        .into_iter()
        .flatten(),
    );
    views.extend(d.handle.arrays.iter().map(|a| a.view()));
    for v in views {
        let bytes = v.shape[..v.dims].iter().product::<usize>() * v.elem.size();
        // SAFETY: the view's own bytes, of a live array of this GPU, on this stream.
        unsafe { cudarc::driver::result::memset_d8_async(v.ptr, 0x7F, bytes, stream.cu_stream()) }
            .map_err(BufferError::cuda("poisoning an output between replays"))?;
    }
    Ok(())
}
