//! Row-major bf16 GEMMs through cuBLAS (cudarc's `cublas` feature), on raw device addresses:
//! the chapter's operands live in symmetric memory, which cudarc's typed slices do not own.

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
    /// so it computes y^T = w^T x^T, with w as the first operand.
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
        let (alpha, beta) = (1.0f32, 0.0f32);
        let bf16 = sys::cudaDataType::CUDA_R_16BF;
        // SAFETY: the caller's; sizes were checked by the plan (each fits in i32).
        unsafe {
            result::gemm_ex(
                *self.blas.handle(),
                sys::cublasOperation_t::CUBLAS_OP_N,
                sys::cublasOperation_t::CUBLAS_OP_N,
                n as i32,
                m as i32,
                k as i32,
                (&alpha as *const f32).cast(),
                w as *const _,
                bf16,
                n as i32,
                x as *const _,
                bf16,
                k as i32,
                (&beta as *const f32).cast(),
                y as *mut _,
                bf16,
                ldy as i32,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(OverlapError::cublas("bf16 GEMM"))
    }
    // ANCHOR_END: gemm
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
}
