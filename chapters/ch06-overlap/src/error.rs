//! What can go wrong in chapter 6, each with what to do about it.

use ch01_bootstrap::BootstrapError;
use ch02_symmetric_memory::SymmetricError;
use ch04_collectives::CollError;
use cudarc::driver::DriverError;

#[derive(Debug, thiserror::Error)]
pub enum OverlapError {
    /// Bad shapes or arguments, found before anything is launched.
    #[error("{call}: {why}")]
    Invalid { call: &'static str, why: String },
    /// cuBLAS could not be loaded: the GEMMs need it.
    #[error(
        "cuBLAS not found (searched {searched}): install the CUDA 13 toolkit's libcublas, or put \
         the folder that holds libcublas.so.13 on LD_LIBRARY_PATH"
    )]
    NoCublas { searched: String },
    #[error("cuBLAS: {what}: {source}")]
    Cublas {
        what: &'static str,
        source: cudarc::cublas::result::CublasError,
    },
    #[error("CUDA: {what}: {source}")]
    Cuda {
        what: &'static str,
        source: DriverError,
    },
    #[error(transparent)]
    Bootstrap(#[from] BootstrapError),
    #[error(transparent)]
    Symmetric(#[from] SymmetricError),
    #[error(transparent)]
    Coll(#[from] CollError),
}

impl OverlapError {
    pub(crate) fn invalid(call: &'static str, why: impl Into<String>) -> Self {
        Self::Invalid {
            call,
            why: why.into(),
        }
    }
    /// `map_err` helper: `.map_err(OverlapError::cuda("what failed"))`.
    pub(crate) fn cuda(what: &'static str) -> impl FnOnce(DriverError) -> Self {
        move |source| Self::Cuda { what, source }
    }
    pub(crate) fn cublas(
        what: &'static str,
    ) -> impl FnOnce(cudarc::cublas::result::CublasError) -> Self {
        move |source| Self::Cublas { what, source }
    }
}
