//! `nvshmem-tutorial`: the buffer the tutorial builds, composed from its chapters.
//!
//! # Layout
//!
//! ```text
//! nvshmem-sys/                    raw FFI: libnvshmem_host.so.3 opened at run time, ABI types,
//!                                 library discovery and the version pin (3.4.5)
//! kernels/                        kernels/cuda/**/*.cu -> one cubin per arch, embedded;
//!                                 NvshmemModule (load + nvshmemx_cumodule_init)
//! chapters/ch01-bootstrap         LaunchEnv (torchrun), unique-id rendezvous (TCP, bounded),
//!                                 World (init/finalize), checks (the harness every example uses)
//! chapters/ch02-symmetric-memory  SymmetricBuffer<W, T>: typed RAII symmetric allocation,
//!                                 peer views, collective size check, heap size
//! chapters/ch03-put-get           device put/get (thread/warp/block, nbi+quiet), putmem_signal
//!                                 handshake, peer stores, bulk-copy put, host on-stream ops;
//!                                 the p2p benchmark
//! chapters/ch04-collectives       Communicator: barrier, broadcast, all-gather, reduce-scatter,
//!                                 all-reduce, all-to-all(-v) from peer stores and signals
//! python/                         nvshmem_tutorial: PyO3 module + torch glue (Buffer: DeepEP's API)
//! src/                            chapters 7-8, NvshmemBuffer (this crate):
//!   config.rs                       DeepEP's Config, defaults per rank count, size hints
//!   regions.rs                      the buffer's memory regions and ring slots, as size formulas
//!   spec.rs                         BufferOptions; BufferSpec, what the plans know of a buffer
//!   buffer.rs                       NvshmemBuffer: one allocation, its kernels, check(), launch
//!   layout.rs                       the layout step (get_dispatch_layout): plan_layout
//!   notify.rs                       the notify step (chapter 4's all-gather): plan_notify
//!   dispatch.rs, combine.rs         the two halves of MoE communication: plan_*, *_raw
//!   checks.rs, bad_inputs.rs        checks shared by the plans; every bad input, CPU-tested
//!   handle.rs, view.rs, error.rs    what the raw layer takes and returns
//!   typed.rs                        the safe layer: typed device arrays, &mut self calls
//!   low_latency/                    chapter 8: fixed slots (regions, phases, plans, launch)
//!   mode_sharing/                   one low-latency buffer for both modes across nodes: who
//!                                   keeps what in num_rdma_bytes, what a switch needs
//!   internode.rs                    normal mode across nodes (issue 32): the notify step's
//!                                   two-level arithmetic on the host, against DeepEP's definitions
//!   internode_notify/               its kernel's area and launch (mod.rs), plan (plan.rs), tests
//!   internode_dispatch/             the two-level dispatch (steps 4, 6-8): launch, plan, cached
//!   internode_combine/              the two-level combine (step 5): launch, plan, tests
//!   internode_pair/                 a dispatch and combine pair for CUDA graphs (step 8)
//!   bin/                            ch07-buffer, ch08-low-latency (self-checking, typed layer);
//!                                   internode-notify, internode-dispatch (issue 32's GPU tests,
//!                                   raw layer; the latter runs dispatch and combine pairs)
//! kernels/cuda/buffer/            moe.cuh (ring protocol NOTES), layout.cu, notify.cu,
//!                                 dispatch.cu (moe_scatter), combine.cu (moe_gather),
//!                                 low_latency.cuh, ll_dispatch.cu, ll_combine.cu,
//!                                 internode_notify.cu, internode.cuh (the RDMA rings),
//!                                 internode_dispatch.cu, internode_combine.cu;
//!                                 kernels/cuda/ptx.cuh holds every PTX wrapper
//!
//! # From a call to its kernel
//!
//! Each call is a pure plan (`plan_dispatch(spec, config, inputs, handle, outputs)` and the
//! rest): every check, then the kernel's argument struct (kernels/contract/defs.rs). The raw
//! layer (`NvshmemBuffer::dispatch_raw` and the rest, `unsafe`, over [`View`]s) checks the
//! error records, plans and launches; the typed layer (typed.rs) allocates outputs and calls
//! the raw one. Python's `Buffer.dispatch` calls the raw layer through `BufferCore`.
//! ```
//!
//! Each chapter crate depends only on earlier chapters, `nvshmem-sys` and `kernels`; this
//! crate re-exports them so that an application needs one dependency.

pub mod buffer;
mod checks;
pub mod combine;
pub mod config;
pub mod dispatch;
pub mod error;
pub mod handle;
pub mod internode;
pub mod internode_combine;
pub mod internode_dispatch;
pub mod internode_notify;
pub mod internode_pair;
pub mod layout;
pub mod low_latency;
pub mod mode_sharing;
pub mod notify;
pub mod regions;
pub mod spec;
pub mod typed;
pub mod view;

#[cfg(test)]
mod bad_inputs;
#[cfg(test)]
mod internode_combine_protocol_tests;
#[cfg(test)]
mod internode_dispatch_protocol_tests;
#[cfg(test)]
mod internode_protocol_tests;
#[cfg(test)]
mod test_views;

pub use buffer::NvshmemBuffer;
pub use ch01_bootstrap as bootstrap;
pub use ch02_symmetric_memory as symmetric_memory;
pub use ch03_put_get as put_get;
pub use ch04_collectives as collectives;
pub use combine::{CombineInputs, CombineOutputs, CombinePlan, plan_combine};
pub use config::Config;
pub use dispatch::{DispatchInputs, DispatchOutputs, DispatchPlan, plan_dispatch};
pub use error::BufferError;
pub use handle::Handle;
pub use internode_combine::{
    InternodeCombineCall, InternodeCombineHandle, InternodeCombinePlan, plan_internode_combine,
};
pub use internode_dispatch::{
    InternodeCachedDispatchCall, InternodeCachedHandle, InternodeDispatchOutputs,
    InternodeDispatchPlan, plan_internode_cached_dispatch, plan_internode_dispatch,
};
pub use internode_notify::{
    InternodeHandle, InternodeNotifyCall, InternodeNotifyInputs, InternodeNotifyPlan,
    InternodeRecvCounts, plan_internode_notify,
};
pub use internode_pair::{InternodePair, InternodePairPlan, plan_internode_pair};
pub use kernels;
pub use layout::{LayoutOutputs, LayoutPlan, plan_layout};
pub use low_latency::{
    LlCombineInputs, LlCombinePlan, LlDispatchInputs, LlDispatchOptions, LlDispatchOutputs,
    LlDispatchPlan, LlHandle, LlShape, Phases, get_low_latency_rdma_size_hint, plan_ll_combine,
    plan_ll_dispatch,
};
pub use notify::{NotifyInputs, NotifyOutputs, NotifyPlan, RecvCounts, plan_notify};
pub use nvshmem_sys;
pub use spec::{BufferOptions, BufferSpec, DEFAULT_TIMEOUT_MS};
pub use typed::{
    DeviceArray, DispatchHandle, Dispatched, Element, Fp8E4m3, Layout, LlDispatchHandle,
    LlDispatched, LlRecvTokens, LlStats, Pending, RecvTokens, StagingRows, Tokens, TopK,
};
pub use view::{ElemType, View};
