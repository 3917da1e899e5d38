//! The shapes of a tensor-parallel layer over N PEs, checked before anything runs, and the
//! arithmetic of what overlap can win. One plan serves both layers of the chapter:
//!
//! - all-gather + GEMM (sequence-parallel input, column-parallel weight): each PE holds `rows`
//!   rows of the input, [rows, K] bf16, and its weight slice [K, cols]; it computes
//!   `all_gather(x) @ w`, [N x rows, cols].
//! - GEMM + reduce-scatter (row-parallel weight): each PE holds every token's slice of the
//!   input, [N x rows, K], and its weight slice [K, cols]; the layer's output is the sum over
//!   PEs of `x @ w`, and PE q keeps rows q x rows .. (q + 1) x rows of it, [rows, cols].
//!
//! Either way a PE's rows travel in `chunks` pieces of `rows / chunks` rows, each with its own
//! signal, so that the work waiting on a piece can start as soon as that piece has landed.

use crate::OverlapError;

/// Rows of a GEMM piece are a multiple of this (cuBLAS's bf16 tensor-core tiles like it; a
/// piece is also a whole number of 16-byte vectors per row when K is).
pub const ROW_GRAIN: usize = 8;

// ANCHOR: plan
/// A tensor-parallel layer's shapes, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TpPlan {
    pub n_pes: usize,
    /// Rows each PE contributes (all-gather) or keeps (reduce-scatter).
    pub rows: usize,
    /// The inner dimension K of this PE's GEMM.
    pub k: usize,
    /// Columns of this PE's weight slice (the layer's output width / N).
    pub cols: usize,
    /// Pieces a shard travels in, each with its own signal.
    pub chunks: usize,
}
// ANCHOR_END: plan

impl TpPlan {
    pub fn new(
        n_pes: usize,
        rows: usize,
        k: usize,
        cols: usize,
        chunks: usize,
    ) -> Result<Self, OverlapError> {
        let bad = |why: String| Err(OverlapError::invalid("TpPlan", why));
        if n_pes == 0 || rows == 0 || k == 0 || cols == 0 || chunks == 0 {
            return bad(format!(
                "every size must be positive (n_pes {n_pes}, rows {rows}, k {k}, cols {cols}, \
                 chunks {chunks})"
            ));
        }
        if !rows.is_multiple_of(chunks) || !(rows / chunks).is_multiple_of(ROW_GRAIN) {
            return bad(format!(
                "rows ({rows}) must split into {chunks} chunks of a multiple of {ROW_GRAIN} rows: \
                 pick chunks that divide rows / {ROW_GRAIN}"
            ));
        }
        if !k.is_multiple_of(ROW_GRAIN) || !cols.is_multiple_of(ROW_GRAIN) {
            return bad(format!(
                "k ({k}) and cols ({cols}) must be multiples of {ROW_GRAIN} (16-byte bf16 rows)"
            ));
        }
        let max = i32::MAX as usize;
        if n_pes * rows > max || k > max || cols > max {
            return bad(format!(
                "cuBLAS takes 32-bit sizes: {} rows, k {k}, cols {cols} must each be <= {max}",
                n_pes * rows
            ));
        }
        Ok(Self {
            n_pes,
            rows,
            k,
            cols,
            chunks,
        })
    }

    /// `Err` unless the plan is for a job of `n_pes` PEs.
    pub fn check_job(&self, call: &'static str, n_pes: usize) -> Result<(), OverlapError> {
        match self.n_pes == n_pes {
            true => Ok(()),
            false => Err(OverlapError::invalid(
                call,
                format!("the plan is for {} PEs, the job has {n_pes}", self.n_pes),
            )),
        }
    }

    /// Rows of one chunk.
    pub fn chunk_rows(&self) -> usize {
        self.rows / self.chunks
    }
    /// Bytes of the gathered input, [N x rows, K] bf16: the symmetric buffer the puts land in.
    pub fn gathered_bytes(&self) -> usize {
        self.n_pes * self.rows * self.k * 2
    }
    /// Signal words: one per (source PE, chunk).
    pub fn num_signals(&self) -> usize {
        self.n_pes * self.chunks
    }
    /// Floating-point operations of this PE's GEMM (2 per multiply-add).
    pub fn flops(&self) -> f64 {
        2.0 * (self.n_pes * self.rows) as f64 * self.k as f64 * self.cols as f64
    }
    /// Bytes this PE receives from its peers in an all-gather + GEMM.
    pub fn received_bytes(&self) -> usize {
        (self.n_pes - 1) * self.rows * self.k * 2
    }
    /// Bytes of a GEMM + reduce-scatter's landing area, one [rows, cols] bf16 partial result
    /// per PE.
    pub fn landing_bytes(&self) -> usize {
        self.n_pes * self.rows * self.cols * 2
    }
}

// ANCHOR: bound
/// The best serial / overlapped ratio: communication and compute fully hidden behind each
/// other, (comm + compute) / max(comm, compute).
pub fn overlap_bound(comm_us: f64, compute_us: f64) -> f64 {
    (comm_us + compute_us) / comm_us.max(compute_us)
}

/// How much of the hideable time overlap hid: (serial - overlapped) / min(comm, compute). 1
/// is a perfect overlap, 0 none; below 0 the overlapped version is slower than serial.
pub fn overlap_efficiency(
    serial_us: f64,
    overlapped_us: f64,
    comm_us: f64,
    compute_us: f64,
) -> f64 {
    (serial_us - overlapped_us) / comm_us.min(compute_us)
}
// ANCHOR_END: bound

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_70b_projection_splits_into_chunks() {
        // 8192 tokens over 2 PEs, K = 8192, N = 28672 / 2.
        let p = TpPlan::new(2, 4096, 8192, 14336, 4).unwrap();
        assert_eq!(p.chunk_rows(), 1024);
        assert_eq!(p.gathered_bytes(), 2 * 4096 * 8192 * 2);
        assert_eq!(p.num_signals(), 8);
        assert_eq!(p.received_bytes(), 4096 * 8192 * 2);
        assert_eq!(p.landing_bytes(), 2 * 4096 * 14336 * 2);
        assert_eq!(p.flops(), 2.0 * 8192.0 * 8192.0 * 14336.0);
    }

    #[test]
    fn bad_shapes_say_what_to_change() {
        let e = TpPlan::new(2, 100, 64, 64, 3).unwrap_err().to_string();
        assert!(e.contains("rows (100) must split into 3 chunks"), "{e}");
        let e = TpPlan::new(2, 64, 60, 64, 1).unwrap_err().to_string();
        assert!(
            e.contains("k (60) and cols (64) must be multiples of 8"),
            "{e}"
        );
        let e = TpPlan::new(0, 64, 64, 64, 1).unwrap_err().to_string();
        assert!(e.contains("every size must be positive"), "{e}");
        let e = TpPlan::new(2, 64, 64, 64, 16).unwrap_err().to_string();
        assert!(e.contains("multiple of 8 rows"), "{e}");
    }

    #[test]
    fn bound_and_efficiency() {
        assert!((overlap_bound(100.0, 100.0) - 2.0).abs() < 1e-12);
        assert!((overlap_bound(10.0, 100.0) - 1.1).abs() < 1e-12);
        // Serial 110, overlapped 101 of a 10 / 100 split: 9 of the 10 hideable us hidden.
        assert!((overlap_efficiency(110.0, 101.0, 10.0, 100.0) - 0.9).abs() < 1e-12);
        assert!(overlap_efficiency(110.0, 120.0, 10.0, 100.0) < 0.0);
    }
}
