//! Chapter 8: low-latency mode. Dispatch and combine for decoding: fixed slots instead of a
//! count exchange, device-side call numbers instead of host state, so one dispatch and one
//! combine can be captured in a CUDA graph and replayed with new data
//! (kernels/cuda/buffer/low_latency.cuh has the protocol and its NOTES; ll_dispatch.cu and
//! ll_combine.cu the kernels).
//!
//! - `regions.rs`: the region's parts as size formulas, and the shape checks every call shares;
//! - `phases.rs`: the one-call-in-flight rule;
//! - `dispatch.rs`, `combine.rs`: each call's plan (checks and argument struct) and launch;
//! - `launch.rs`: the kernels, the launch, and DeepEP's two helpers on the region.

pub mod combine;
pub mod dispatch;
pub mod launch;
pub mod phases;
pub mod regions;

pub use combine::{LlCombineInputs, LlCombinePlan, LlHandle, plan_ll_combine};
pub use dispatch::{
    LlDispatchInputs, LlDispatchOptions, LlDispatchOutputs, LlDispatchPlan, plan_ll_dispatch,
};
pub use launch::{LlPlan, ll_shape};
pub use phases::{PendingReceive, Phases, check_phases};
pub use regions::{CONTROL_BYTES, LlRegions, LlShape, get_low_latency_rdma_size_hint};

#[cfg(test)]
mod topology_tests;
