//! Host-initiated transfers, enqueued on the world's stream: they run in stream order, after
//! the kernel that produced the data and before the one that consumes it, without a kernel of
//! yours. Blocking (`nvshmemx_putmem_on_stream`) means later work on the stream may reuse the
//! source; `_nbi` returns at once and [`quiet_on_stream`] completes it. Either way the
//! *receiver* learns nothing: delivery on the peer is established by a quiet followed by a
//! barrier, or by a signal ([`crate::signal::put_signal_on_stream`]).

use ch01_bootstrap::World;

use crate::{Completion, Direction, Get, Put, Transfer};

// ANCHOR: put_on_stream
/// Enqueues `put` on the world's stream (`nvshmemx_putmem_on_stream`, or its `_nbi` form).
pub fn put_on_stream(completion: Completion, put: &Put) {
    enqueue_on_stream(completion, put);
}
// ANCHOR_END: put_on_stream

/// Enqueues `get` on the world's stream (`nvshmemx_getmem_on_stream`, or its `_nbi` form):
/// later work on the stream sees the data (after [`quiet_on_stream`] for `_nbi`).
pub fn get_on_stream(completion: Completion, get: &Get) {
    enqueue_on_stream(completion, get);
}

/// Completes, in stream order, every put and get this PE issued on the world's stream.
pub fn quiet_on_stream(world: &World) {
    // SAFETY: initialised; only orders work on our stream.
    unsafe { (world.nvshmem().quiet_on_stream)(world.stream().cu_stream() as _) };
}

fn enqueue_on_stream(completion: Completion, transfer: &Transfer) {
    let world = transfer.world();
    let nvshmem = world.nvshmem();
    let call = match (transfer.direction(), completion) {
        (Direction::Put, Completion::Blocking) => nvshmem.putmem_on_stream,
        (Direction::Put, Completion::NonBlockingQuiet) => nvshmem.putmem_nbi_on_stream,
        (Direction::Get, Completion::Blocking) => nvshmem.getmem_on_stream,
        (Direction::Get, Completion::NonBlockingQuiet) => nvshmem.getmem_nbi_on_stream,
    };
    // SAFETY: `transfer` was checked when it was made: its symmetric side lies inside one
    // allocation on an existing PE, its local side holds `num_bytes`, and it borrows both
    // buffers, so they are alive; the stream belongs to this context.
    unsafe {
        call(
            transfer.dest() as *mut _,
            transfer.source() as *const _,
            transfer.num_bytes(),
            transfer.pe() as i32,
            world.stream().cu_stream() as _,
        )
    };
}
