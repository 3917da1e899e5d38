//! Chapter 6: overlapping compute and communication.
//!
//! A tensor-parallel layer gathers its input from every PE, then multiplies it by its weight
//! slice. Done one after the other, the GPU's SMs idle during the all-gather and the links
//! idle during the GEMM. Here each PE puts its shard in chunks, each with a signal
//! (`nvshmemx_putmem_signal_nbi_on_stream`, chapter 3's put with signal, on a stream of its
//! own), and the compute stream runs the GEMM of a chunk after a stream wait on that chunk's
//! signal (`nvshmemx_signal_wait_until_on_stream`): the two streams overlap, and the order
//! between them is carried by the signals, not by events. The second layer, GEMM +
//! reduce-scatter (`GemmRs`), turns it around: the GEMM of each peer's rows runs first, and
//! its result goes out with a signal while the next piece is computed.

mod ag_gemm;
mod error;
mod gemm;
mod gemm_rs;
mod plan;
mod signals;

pub use ag_gemm::AgGemm;
pub use error::OverlapError;
pub use gemm::{Gemm, probe_cublas};
pub use gemm_rs::GemmRs;
pub use plan::{ROW_GRAIN, TpPlan, overlap_bound, overlap_efficiency};
pub use signals::Signals;
