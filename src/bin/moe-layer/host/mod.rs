//! The host half of the MoE layer, all of it CPU-tested: its shape and the checks on it (run
//! before NVSHMEM starts, so a bad shape launches nothing), the command line, the weights and
//! tokens made from seeds (every rank can make every expert, and any rank's tokens), the
//! router's top-k, and the f32 reference the GPU's output is checked against.

mod reference;
mod seeds;
mod shape;

pub(crate) use reference::*;
pub(crate) use seeds::*;
pub(crate) use shape::*;
