//! Python exceptions, and how every Rust error of the earlier chapters maps onto them.
//!
//! Two families, so that callers can catch by kind with Python's own classes:
//! - `InvalidArgumentError(ValueError)`: the caller passed something wrong (a tensor that is
//!   not symmetric, a range past the end, a PE that does not exist). Raised before anything
//!   is enqueued, so the stream and the peers are untouched.
//! - `NvshmemError(RuntimeError)`: the environment or the library failed (no GPU, library
//!   missing, NVSHMEM not initialised, heap exhausted, a CUDA error).

use ch01_bootstrap::BootstrapError;
use ch02_symmetric_memory::SymmetricError;
use nvshmem_tutorial::BufferError;
use pyo3::PyErr;
use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyValueError};

/// Declares the exception classes, one line each so the hierarchy reads at a glance:
/// `Name(PythonBase): "docstring";`. All live in `nvshmem_tutorial._native`.
macro_rules! exceptions {
    ($($name:ident($base:ty): $doc:literal;)*) => {
        $(create_exception!(_native, $name, $base, $doc);)*
    };
}

exceptions! {
    NvshmemError(PyRuntimeError): "NVSHMEM or CUDA failed, or was used in the wrong state.";
    NotInitializedError(NvshmemError): "A call that needs NVSHMEM came before nvshmem_tutorial.init() (or after finalize()).";
    NoDeviceError(NvshmemError): "No CUDA driver or no such GPU on this machine.";
    LibraryError(NvshmemError): "libnvshmem_host.so.3 is missing, unloadable or the wrong release.";
    InvalidArgumentError(PyValueError): "An argument is wrong; nothing was enqueued.";
    NotSymmetricError(InvalidArgumentError): "A tensor that must live in NVSHMEM's symmetric heap does not.";
    OutOfBoundsError(InvalidArgumentError): "A byte range reaches past the end of its symmetric allocation.";
    PeOutOfRangeError(InvalidArgumentError): "A PE number outside 0..n_pes().";
}

/// Every failure of the extension, before it becomes a Python exception.
#[derive(Debug)]
pub enum Error {
    /// `what` needs NVSHMEM, which is not initialised.
    NotInitialized(&'static str),
    Bootstrap(BootstrapError),
    Symmetric(SymmetricError),
    /// A bad argument the chapters have no variant for (message says what and the fix).
    Invalid(String),
    /// A PE number below zero (the chapters take `usize`, so they never see one).
    NegativePe {
        pe: i64,
        n_pes: usize,
    },
    /// Bytes `offset..offset + num_bytes` of an allocation of `len` bytes.
    OutOfBounds {
        offset: usize,
        num_bytes: usize,
        len: usize,
    },
    Cuda {
        what: &'static str,
        source: cudarc::driver::DriverError,
    },
    /// Something failed on the device or in a chapter's runtime (the message says what).
    Failed(String),
    /// An exception raised by Python code the extension called (torch), passed on as it is.
    Python(PyErr),
}

impl From<PyErr> for Error {
    fn from(e: PyErr) -> Self {
        Self::Python(e)
    }
}

impl From<BootstrapError> for Error {
    fn from(e: BootstrapError) -> Self {
        Self::Bootstrap(e)
    }
}

impl From<SymmetricError> for Error {
    fn from(e: SymmetricError) -> Self {
        Self::Symmetric(e)
    }
}

/// The buffer's errors: wrong input (found by a plan, or by a kernel that recorded it and left
/// the buffer usable) is an `InvalidArgumentError`; a failed kernel, a timeout or a destroyed
/// buffer an `NvshmemError`.
impl From<BufferError> for Error {
    fn from(e: BufferError) -> Self {
        match e {
            e if e.is_invalid_input() => Error::Invalid(e.to_string()),
            BufferError::Coll(e) => e.into(),
            other => Error::Failed(other.to_string()),
        }
    }
}

impl Error {
    pub fn cuda(what: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> Self {
        move |source| Self::Cuda { what, source }
    }
}

impl From<Error> for PyErr {
    fn from(error: Error) -> PyErr {
        match error {
            Error::NotInitialized(what) => NotInitializedError::new_err(format!(
                "{what} needs NVSHMEM, which is not initialised in this process. Call \
                 nvshmem_tutorial.init() first, on every rank, after \
                 torch.distributed.init_process_group()"
            )),
            Error::Bootstrap(e) => {
                let message = e.to_string();
                match e {
                    BootstrapError::NoDriver(_) | BootstrapError::NoSuchGpu { .. } => {
                        NoDeviceError::new_err(message)
                    }
                    BootstrapError::Library(_) => LibraryError::new_err(message),
                    BootstrapError::BadUniqueId { .. } => InvalidArgumentError::new_err(message),
                    BootstrapError::Env(_) => InvalidArgumentError::new_err(message),
                    _ => NvshmemError::new_err(message),
                }
            }
            Error::Symmetric(e) => {
                let message = e.to_string();
                match e {
                    // ch02's text names the Rust type; say what a Python caller should use.
                    SymmetricError::NotSymmetric { ptr } => NotSymmetricError::new_err(format!(
                        "device address {ptr:#x} is not inside NVSHMEM's symmetric heap: the \
                         remote side of put/get and the argument of peer_view must be a \
                         tensor from nvshmem_tutorial.empty() (or a view of one)"
                    )),
                    SymmetricError::PeOutOfRange { .. } => PeOutOfRangeError::new_err(message),
                    SymmetricError::OutOfBounds { .. } => OutOfBoundsError::new_err(message),
                    SymmetricError::SizeMismatch { .. }
                    | SymmetricError::LengthMismatch { .. }
                    | SymmetricError::LargerThanGpu { .. }
                    | SymmetricError::Empty => InvalidArgumentError::new_err(message),
                    SymmetricError::HeapExhausted { .. } | SymmetricError::Cuda { .. } => {
                        NvshmemError::new_err(message)
                    }
                }
            }
            Error::Invalid(message) => InvalidArgumentError::new_err(message),
            Error::NegativePe { pe, n_pes } => PeOutOfRangeError::new_err(format!(
                "PE {pe} is out of range: this job has PEs 0..{n_pes}"
            )),
            Error::OutOfBounds {
                offset,
                num_bytes,
                len,
            } => OutOfBoundsError::new_err(format!(
                "bytes {offset}..{} are past the end of a symmetric allocation of {len} bytes: \
                 the tensor (or the requested size) reaches beyond the buffer \
                 nvshmem_tutorial.empty() returned",
                offset + num_bytes
            )),
            Error::Cuda { what, source } => {
                NvshmemError::new_err(format!("CUDA driver error while {what}: {source}"))
            }
            Error::Failed(message) => NvshmemError::new_err(message),
            Error::Python(error) => error,
        }
    }
}
