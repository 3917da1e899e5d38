//! Chapter 3: put and get.
//!
//! Chapter 2 gave every PE the same buffer at the same offset. Now the PEs move data between
//! those buffers. Read the modules in this order:
//!
//! 1. [`transfer`]: what one **put** (local bytes into a symmetric buffer on another PE) or
//!    **get** (a peer's symmetric buffer into local memory) is, and every check made on the
//!    host before one is enqueued: [`Put`], [`Get`], [`LocalBuffer`], [`Completion`]
//!    (**blocking**, or **non-blocking** `_nbi` completed by `quiet`). Errors: [`error`].
//! 2. [`host`]: the host enqueues a transfer on a CUDA stream (**host-initiated**):
//!    [`put_on_stream`], [`get_on_stream`], [`quiet_on_stream`].
//! 3. [`device`]: a kernel issues it (**device-initiated**), at thread, warp or block
//!    [`Scope`]: [`DeviceOps::put`], [`DeviceOps::get`]; or writes through the peer pointer
//!    without NVSHMEM ([`DeviceOps::store`]) or Hopper's bulk-copy unit
//!    ([`DeviceOps::put_bulk`]).
//! 4. [`signal`]: `putmem_signal` delivers the bytes *and then* updates a word on the
//!    receiver, the producer/consumer handshake every later chapter is built on; how a
//!    signal word is reused; why a kernel that waits for its peer's blocks needs all of its
//!    own resident at once.
//!
//! [`config`] holds the tunables; [`bench`] the GPU-free parts of the p2p benchmark and
//! [`nccl`] its NCCL baseline.

pub mod bench;
pub mod config;
pub mod device;
pub mod error;
pub mod host;
pub mod nccl;
pub mod signal;
pub mod transfer;

pub use device::{DeviceOps, LaunchShape, Scope, check_hopper, slice_bounds};
pub use error::PutGetError;
pub use host::{get_on_stream, put_on_stream, quiet_on_stream};
pub use signal::{SignalOp, SignalWord, Wait, check_co_resident, put_signal_on_stream};
pub use transfer::{
    Completion, Direction, Get, LocalBuffer, Put, Transfer, check_symmetric_range, local_range,
    remote_range,
};
