//! Row-major bf16 GEMMs through cuBLAS (cudarc's `cublas` feature), on raw device addresses:
//! the chapter's operands live in symmetric memory, which cudarc's typed slices do not own.
//! The MoE layer (src/bin/moe-layer) runs its experts through the same handle, one
//! strided-batched GEMM for all of a rank's experts.

use std::sync::Arc;

use cudarc::cublas::{CudaBlas, result, sys};
use cudarc::driver::CudaStream;

use crate::OverlapError;

// ANCHOR: probe
/// Checks that cuBLAS can be loaded, the way cudarc will load it. cudarc panics on a missing
/// library at its first call; this turns that into an error naming every file searched.
pub fn probe_cublas() -> Result<(), OverlapError> {
    // SAFETY: loads the library (running its initialisers) and nothing else.
    if unsafe { sys::is_culib_present() } {
        return Ok(());
    }
    Err(OverlapError::NoCublas {
        searched: cudarc::get_lib_name_candidates("cublas").join(", "),
    })
}
// ANCHOR_END: probe

// ANCHOR: column_major
/// cuBLAS's arguments for `batch` row-major products `y[b] = x[b] @ w[b]`, x [m, k], w [k, n],
/// y [m, n] with row stride `ldy` (n for a whole matrix, wider when y is a block of a larger
/// one), each operand's matrices back to back.
///
/// cuBLAS is column-major: the bytes of a row-major [r, c] matrix are its column-major
/// [c, r] transpose with leading dimension c. So cuBLAS computes y^T = w^T x^T: its "m" is
/// our n, its "n" our m, its first operand our w (leading dimension n), its second our x
/// (leading dimension k), its result y^T (leading dimension ldy). No transposes are asked for
/// (both CUBLAS_OP_N): the transposes are only how cuBLAS reads our bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ColumnMajor {
    m: i32,
    n: i32,
    k: i32,
    /// The first operand (w): leading dimension and elements between batches.
    lda: i32,
    stride_a: i64,
    /// The second operand (x).
    ldb: i32,
    stride_b: i64,
    /// The result (y).
    ldc: i32,
    stride_c: i64,
    batch: i32,
}

impl ColumnMajor {
    fn row_major(
        batch: usize,
        (m, n, k): (usize, usize, usize),
        ldy: usize,
    ) -> Result<Self, OverlapError> {
        let invalid = |why: String| {
            let shape = format!("{batch} x [{m}, {k}] @ [{k}, {n}]");
            OverlapError::invalid("Gemm", format!("{shape}: {why}"))
        };
        if ldy < n {
            return Err(invalid(format!(
                "y's row stride {ldy} is under its {n} columns"
            )));
        }
        let int = |v: usize| {
            i32::try_from(v).map_err(|_| invalid(format!("{v} does not fit cuBLAS's i32")))
        };
        let stride = |a: usize, b: usize| {
            a.checked_mul(b)
                .and_then(|s| i64::try_from(s).ok())
                .ok_or_else(|| invalid(format!("{a} x {b} elements do not fit an i64 stride")))
        };
        // ANCHOR: mapping
        Ok(Self {
            m: int(n)?,
            n: int(m)?,
            k: int(k)?,
            lda: int(n)?,
            stride_a: stride(k, n)?,
            ldb: int(k)?,
            stride_b: stride(m, k)?,
            ldc: int(ldy)?,
            stride_c: stride(m, ldy)?,
            batch: int(batch)?,
        })
        // ANCHOR_END: mapping
    }
}
// ANCHOR_END: column_major

const BF16: sys::cudaDataType = sys::cudaDataType::CUDA_R_16BF;
const OP_N: sys::cublasOperation_t = sys::cublasOperation_t::CUBLAS_OP_N;
const COMPUTE_32F: sys::cublasComputeType_t = sys::cublasComputeType_t::CUBLAS_COMPUTE_32F;
const GEMM_DEFAULT: sys::cublasGemmAlgo_t = sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT;

/// A cuBLAS handle bound to one stream: every GEMM it runs is ordered on that stream.
pub struct Gemm {
    blas: CudaBlas,
}

impl Gemm {
    pub fn new(stream: Arc<CudaStream>) -> Result<Self, OverlapError> {
        probe_cublas()?;
        let blas = CudaBlas::new(stream).map_err(OverlapError::cublas("creating a handle"))?;
        Ok(Self { blas })
    }

    /// Sizes every later GEMM's grid for `sms` SMs (0: every SM), leaving the rest to kernels
    /// of other streams. cuBLAS's Hopper kernels are persistent: at full size, a put kernel
    /// launched beside one may find no SM free until the GEMM ends.
    pub fn set_sm_target(&self, sms: usize) -> Result<(), OverlapError> {
        let sms = i32::try_from(sms).map_err(|_| {
            OverlapError::invalid(
                "Gemm::set_sm_target",
                format!("{sms} SMs do not fit an i32"),
            )
        })?;
        // SAFETY: a live handle; the call only sets one of its attributes.
        unsafe { sys::cublasSetSmCountTarget(*self.blas.handle(), sms) }
            .result()
            .map_err(OverlapError::cublas("setting the SM count target"))
    }

    // ANCHOR: gemm
    /// `y[m, n] = x[m, k] @ w[k, n]`, all row-major bf16, fp32 accumulation; `ldy` is y's row
    /// stride in elements (n for a whole matrix, wider when y is a block of a larger one).
    ///
    /// cuBLAS is column-major: a row-major [r, c] matrix is its column-major [c, r] transpose,
    /// so it computes y^T = w^T x^T, with w as the first operand: its m is our n, its n our m
    /// (`ColumnMajor` maps every argument).
    ///
    /// # Safety
    /// `x`, `w` and `y` must be device memory of this context holding the stated shapes, and
    /// nothing else may write them until the GEMM is done on the handle's stream.
    pub unsafe fn bf16(
        &self,
        (m, n, k): (usize, usize, usize),
        x: u64,
        w: u64,
        y: u64,
        ldy: usize,
    ) -> Result<(), OverlapError> {
        let c = ColumnMajor::row_major(1, (m, n, k), ldy)?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the caller's; the sizes fit cuBLAS's integers (ColumnMajor checked them).
        unsafe {
            result::gemm_ex(
                *self.blas.handle(),
                OP_N,
                OP_N,
                c.m,
                c.n,
                c.k,
                (&alpha as *const f32).cast(),
                w as *const _,
                BF16,
                c.lda,
                x as *const _,
                BF16,
                c.ldb,
                (&beta as *const f32).cast(),
                y as *mut _,
                BF16,
                c.ldc,
                COMPUTE_32F,
                GEMM_DEFAULT,
            )
        }
        .map_err(OverlapError::cublas("bf16 GEMM"))
    }
    // ANCHOR_END: gemm

    // ANCHOR: gemm_batched
    /// `y[b] = x[b] @ w[b]` for b in 0..batch: x [batch, m, k], w [batch, k, n] and y
    /// [batch, m, n], row-major bf16 back to back, fp32 accumulation (as torch.bmm): one
    /// strided-batched call, with `bf16`'s mapping (`ColumnMajor`) and a stride per operand.
    ///
    /// # Safety
    /// As `bf16`: device memory of this context holding those shapes, written by nothing else
    /// until the GEMM is done on the handle's stream.
    pub unsafe fn bf16_batched(
        &self,
        batch: usize,
        (m, n, k): (usize, usize, usize),
        x: u64,
        w: u64,
        y: u64,
    ) -> Result<(), OverlapError> {
        let c = ColumnMajor::row_major(batch, (m, n, k), n)?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the caller's; the sizes fit cuBLAS's integers (ColumnMajor checked them).
        unsafe {
            result::gemm_strided_batched_ex(
                *self.blas.handle(),
                OP_N,
                OP_N,
                c.m,
                c.n,
                c.k,
                (&alpha as *const f32).cast(),
                w as *const _,
                BF16,
                c.lda,
                c.stride_a,
                x as *const _,
                BF16,
                c.ldb,
                c.stride_b,
                (&beta as *const f32).cast(),
                y as *mut _,
                BF16,
                c.ldc,
                c.stride_c,
                c.batch,
                COMPUTE_32F,
                GEMM_DEFAULT,
            )
        }
        .map_err(OverlapError::cublas("strided-batched bf16 GEMM"))
    }
    // ANCHOR_END: gemm_batched
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_cublas_is_an_error_that_names_what_was_searched() {
        // On a machine with cuBLAS this finds it; without, it must not panic.
        if let Err(e) = probe_cublas() {
            let message = e.to_string();
            assert!(message.contains("libcublas.so.13"), "{message}");
            assert!(message.contains("LD_LIBRARY_PATH"), "{message}");
        }
    }

    /// What cuBLAS does with `ColumnMajor`'s arguments (op N, N, column-major, strided
    /// batches), element by element, on f32.
    fn cublas_on_host(c: &ColumnMajor, a: &[f32], b: &[f32], out: &mut [f32]) {
        let [m, n, k, lda, ldb, ldc] = [c.m, c.n, c.k, c.lda, c.ldb, c.ldc].map(|v| v as usize);
        let [sa, sb, sc] = [c.stride_a, c.stride_b, c.stride_c].map(|v| v as usize);
        for p in 0..c.batch as usize {
            for i in 0..m {
                for j in 0..n {
                    let sum: f32 = (0..k)
                        .map(|l| a[p * sa + i + l * lda] * b[p * sb + l + j * ldb])
                        .sum();
                    out[p * sc + i + j * ldc] = sum;
                }
            }
        }
    }

    /// `batch` row-major products y[b] = x[b] @ w[b], x [m, k], w [k, n], y [m, n] with row
    /// stride `ldy` (its other columns NaN), through `ColumnMajor`'s arguments; checked against
    /// the row-major product.
    fn replay(batch: usize, (m, n, k): (usize, usize, usize), ldy: usize) {
        let x: Vec<f32> = (0..batch * m * k).map(|i| (i % 7) as f32 - 3.0).collect();
        let w: Vec<f32> = (0..batch * k * n)
            .map(|i| (i % 5) as f32 * 0.5 - 1.0)
            .collect();
        let c = ColumnMajor::row_major(batch, (m, n, k), ldy).unwrap();
        let mut y = vec![f32::NAN; batch * m * ldy];
        // cuBLAS's first operand is w, its second x (see ColumnMajor).
        cublas_on_host(&c, &w, &x, &mut y);
        for (b, y) in y.chunks(m * ldy).enumerate() {
            for (row, y_row) in y.chunks(ldy).enumerate() {
                for (col, &got) in y_row.iter().enumerate() {
                    if col >= n {
                        assert!(got.is_nan(), "batch {b}: y[{row}, {col}] is past n = {n}");
                        continue;
                    }
                    let want: f32 = (0..k)
                        .map(|l| x[(b * m + row) * k + l] * w[(b * k + l) * n + col])
                        .sum();
                    assert_eq!(got, want, "batch {b}: y[{row}, {col}]");
                }
            }
        }
    }

    #[test]
    fn column_major_arguments_give_the_row_major_product_of_every_batch() {
        replay(3, (5, 4, 6), 4);
    }

    #[test]
    fn a_wider_row_stride_writes_a_block_of_y_and_nothing_beside_it() {
        replay(1, (5, 4, 6), 9);
    }

    #[test]
    fn sizes_past_cublas_integers_are_errors() {
        let e = ColumnMajor::row_major(1, (1 << 31, 8, 8), 8).unwrap_err();
        assert!(e.to_string().contains("does not fit cuBLAS's i32"), "{e}");
        assert!(ColumnMajor::row_major(usize::MAX, (1, 1, 1), 1).is_err());
        assert!(ColumnMajor::row_major(1, (usize::MAX, usize::MAX, 1), usize::MAX).is_err());
        let e = ColumnMajor::row_major(1, (4, 8, 8), 7).unwrap_err();
        assert!(e.to_string().contains("row stride 7"), "{e}");
    }
}
