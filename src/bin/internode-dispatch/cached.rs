//! The cached dispatch of internode-dispatch's loop (issue 32, step 7): with the handle a full
//! dispatch left, new rows (bf16, or fp8 with column-major scales, whatever the full one sent)
//! go the same way again: the cached notify, then the dispatch, no count recomputed. recv_x
//! (and the scales) against the reference, and the handle's outputs (positions 7-9) unchanged.

use ch01_bootstrap::World;
use ch01_bootstrap::checks::Tally;
use nvshmem_tutorial::{
    BufferError, Config, DispatchInputs, InternodeCachedDispatchCall, InternodeCachedHandle,
    NvshmemBuffer,
};

use crate::dispatch::{Dispatched, Format, Rows, check_rows};
use crate::internode_case::Case;
use crate::reference::received;
use crate::shared::AnyError;

/// The cached dispatch of `case`'s routing with the handle `d` left, under `config`, rows of
/// `hidden` columns (fp8 when `fp8` says how the scales lie); every output checked. Whether
/// all held.
pub(crate) fn cached_and_check(
    buffer: &NvshmemBuffer<&World>,
    case: &Case,
    d: &Dispatched,
    config: &Config,
    (hidden, fp8): (usize, Option<bool>),
    tally: &mut Tally,
) -> Result<bool, AnyError> {
    let world = buffer.world();
    let (me, stream) = (world.my_pe(), world.stream());
    let job = &case.job;
    let handle_before = handle_outputs(d, stream)?;
    let format = Format {
        hidden,
        num_topk: None,
        fp8,
    };
    let t_count = job.routing[me].len();
    let rows = Rows::new(stream, me, t_count, &format, d.num_rows)?;
    let (x, x_scales) = rows.x();
    let (recv_x, recv_x_scales) = rows.recv_x();
    let call = InternodeCachedDispatchCall {
        inputs: DispatchInputs {
            x,
            x_scales,
            topk_idx: None,
            topk_weights: None,
            num_experts: job.num_experts,
        },
        handle: InternodeCachedHandle {
            is_token_in_rank: d.layout.is_token_in_rank.view(),
            prefixes: d.handle.handle(),
            recv_src_meta: d.arrays.recv_src_meta.view(),
        },
        recv_x,
        recv_x_scales,
    };
    // SAFETY: every view is a live array of this GPU, kept alive until the stream is
    // synchronised below; the handle is the full dispatch's, finished on this stream.
    unsafe { buffer.internode_cached_dispatch_raw(&call, config, stream.cu_stream()) }?;
    stream
        .synchronize()
        .map_err(BufferError::cuda("synchronising after the cached dispatch"))?;
    let before = tally.failed;
    let record = buffer.check();
    tally.check(me, record.is_ok(), || {
        format!(
            "{}: the cached dispatch's failure record: {record:?}",
            case.describe()
        )
    });
    check_rows(&received(job, me), me, &rows, stream, tally)?;
    let unchanged = handle_outputs(d, stream)? == handle_before;
    tally.check(me, unchanged, || {
        "the cached dispatch rewrote recv_src_meta, send_rdma_head or send_nvl_head".into()
    });
    Ok(tally.failed == before)
}

/// Handle positions 7-9 as the full dispatch left them (the cached one must not write them).
fn handle_outputs(
    d: &Dispatched,
    stream: &std::sync::Arc<cudarc::driver::CudaStream>,
) -> Result<[Vec<i32>; 3], BufferError> {
    Ok([
        d.arrays.recv_src_meta.to_host(stream)?,
        d.arrays.send_rdma_head.to_host(stream)?,
        d.arrays.send_nvl_head.to_host(stream)?,
    ])
}
