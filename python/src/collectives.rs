//! Chapter 4's collectives for Python: one communicator per process (made by the first
//! collective call), each call validated here against the live allocations, then handed to
//! the chapter's checked raw API on the caller's stream.

use ch04_collectives::{Algorithm, CollError, CollectivesConfig, Communicator, DType};
use pyo3::prelude::*;

use crate::errors::Error;
use crate::state::{self, State};
use crate::transfers::stream_handle;

impl From<CollError> for Error {
    fn from(e: CollError) -> Self {
        match e {
            CollError::Symmetric(e) => Error::Symmetric(e),
            CollError::Bootstrap(e) => Error::Bootstrap(e),
            CollError::InvalidArgument { .. } | CollError::AlgorithmNotApplicable { .. } => {
                Error::Invalid(e.to_string())
            }
            other => Error::Failed(other.to_string()),
        }
    }
}

fn parse_algorithm(name: Option<&str>) -> Result<Option<Algorithm>, Error> {
    name.map(|name| {
        Algorithm::from_name(name).ok_or_else(|| {
            Error::Invalid(format!(
                "unknown algorithm {name:?}: use one of one_shot, two_shot, direct, ring, \
                 scatter_gather, pull (which apply depends on the collective), or None"
            ))
        })
    })
    .transpose()
}

/// The element type of a reduction (`what`), from torch's dtype name.
pub(crate) fn parse_dtype(what: &str, name: &str) -> Result<DType, Error> {
    match name {
        "bfloat16" => Ok(DType::Bf16),
        "float32" => Ok(DType::F32),
        other => Err(Error::Invalid(format!(
            "{what} takes torch.bfloat16 or torch.float32 tensors (summed in fp32), not {other}"
        ))),
    }
}

/// Runs `call` with the process's communicator, making it first if this is the first call.
fn with_communicator(
    py: Python<'_>,
    what: &'static str,
    ranges: &[(u64, usize)],
    call: impl FnOnce(&Communicator<std::sync::Arc<ch01_bootstrap::World>>) -> Result<(), CollError>
    + Send,
) -> PyResult<()> {
    let ranges = ranges.to_vec();
    state::with_located(
        py,
        what,
        move |_| Ok(ranges),
        move |s: &mut State| {
            if s.collectives.is_none() {
                s.collectives = Some(Communicator::new(
                    s.world.clone(),
                    CollectivesConfig::default(),
                )?);
            }
            Ok(call(s.collectives.as_ref().expect("made above"))?)
        },
    )
}

/// Collective, on `stream`: every PE's stream reaches this point before any goes on. Does not
/// complete puts in flight (barrier does).
#[pyfunction]
pub fn sync_all(py: Python<'_>, stream: u64) -> PyResult<()> {
    with_communicator(py, "sync_all", &[], move |c| {
        c.sync_all_raw(stream_handle(stream) as _)
    })
}

/// out[i] = sum over PEs of input[i] (fp32 sums, PE order), `count` elements of `dtype`.
/// out_ptr, in_ptr: symmetric device pointers [count]; may be equal (in place).
#[pyfunction]
#[pyo3(signature = (out_ptr, in_ptr, count, dtype, algorithm, stream))]
pub fn all_reduce(
    py: Python<'_>,
    out_ptr: u64,
    in_ptr: u64,
    count: usize,
    dtype: &str,
    algorithm: Option<&str>,
    stream: u64,
) -> PyResult<()> {
    let (dtype, algorithm) = (
        parse_dtype("all_reduce", dtype)?,
        parse_algorithm(algorithm)?,
    );
    let bytes = count * dtype.size();
    with_communicator(
        py,
        "all_reduce",
        &[(out_ptr, bytes), (in_ptr, bytes)],
        move |c| {
            c.all_reduce_raw(
                out_ptr,
                in_ptr,
                count,
                dtype,
                algorithm,
                stream_handle(stream) as _,
            )
        },
    )
}

/// out[i] = sum over PEs of input[my_pe * count + i]. out_ptr: symmetric [count];
/// in_ptr: symmetric [n_pes * count].
#[pyfunction]
#[pyo3(signature = (out_ptr, in_ptr, count, dtype, algorithm, stream))]
pub fn reduce_scatter(
    py: Python<'_>,
    out_ptr: u64,
    in_ptr: u64,
    count: usize,
    dtype: &str,
    algorithm: Option<&str>,
    stream: u64,
) -> PyResult<()> {
    let (dtype, algorithm) = (
        parse_dtype("reduce_scatter", dtype)?,
        parse_algorithm(algorithm)?,
    );
    let bytes = count * dtype.size();
    with_communicator(py, "reduce_scatter", &[(out_ptr, bytes)], move |c| {
        c.reduce_scatter_raw(
            out_ptr,
            in_ptr,
            count,
            dtype,
            algorithm,
            stream_handle(stream) as _,
        )
    })
}

/// Every PE's `num_bytes` at in_ptr into out_ptr + p * num_bytes on every PE.
/// out_ptr: symmetric [n_pes * num_bytes]; in_ptr: symmetric [num_bytes].
#[pyfunction]
pub fn all_gather(
    py: Python<'_>,
    out_ptr: u64,
    in_ptr: u64,
    num_bytes: usize,
    algorithm: Option<&str>,
    stream: u64,
) -> PyResult<()> {
    let algorithm = parse_algorithm(algorithm)?;
    with_communicator(py, "all_gather", &[(in_ptr, num_bytes)], move |c| {
        c.all_gather_raw(
            out_ptr,
            in_ptr,
            num_bytes,
            algorithm,
            stream_handle(stream) as _,
        )
    })
}

/// Block q of in_ptr (num_bytes each) to PE q, landing at out_ptr + p * num_bytes for
/// sender p. out_ptr, in_ptr: symmetric [n_pes * num_bytes].
#[pyfunction]
pub fn all_to_all(
    py: Python<'_>,
    out_ptr: u64,
    in_ptr: u64,
    num_bytes: usize,
    algorithm: Option<&str>,
    stream: u64,
) -> PyResult<()> {
    let algorithm = parse_algorithm(algorithm)?;
    with_communicator(py, "all_to_all", &[], move |c| {
        c.all_to_all_raw(
            out_ptr,
            in_ptr,
            num_bytes,
            algorithm,
            stream_handle(stream) as _,
        )
    })
}

/// `root`'s num_bytes at in_ptr into out_ptr on every PE. out_ptr, in_ptr: symmetric
/// [num_bytes]; may be equal (in place).
#[pyfunction]
pub fn broadcast(
    py: Python<'_>,
    out_ptr: u64,
    in_ptr: u64,
    num_bytes: usize,
    root: i64,
    algorithm: Option<&str>,
    stream: u64,
) -> PyResult<()> {
    let algorithm = parse_algorithm(algorithm)?;
    with_communicator(
        py,
        "broadcast",
        &[(out_ptr, num_bytes), (in_ptr, num_bytes)],
        move |c| {
            let root = usize::try_from(root).unwrap_or(usize::MAX);
            c.broadcast_raw(
                out_ptr,
                in_ptr,
                num_bytes,
                root,
                algorithm,
                stream_handle(stream) as _,
            )
        },
    )
}

/// all-to-all-v over rows of row_bytes with counts only the device knows.
/// out_ptr: symmetric [out_rows, row_bytes]; in_ptr: symmetric [in_rows, row_bytes];
/// in_splits_ptr: device int64 [n_pes]; out_splits_offsets_ptr: device int64 [2, n_pes]
/// (both checked by the Python layer: CUDA int64 tensors of those shapes on this GPU).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn all_to_all_v(
    py: Python<'_>,
    out_ptr: u64,
    out_rows: usize,
    in_ptr: u64,
    in_rows: usize,
    row_bytes: usize,
    in_splits_ptr: u64,
    out_splits_offsets_ptr: u64,
    stream: u64,
) -> PyResult<()> {
    let ranges = [
        (out_ptr, out_rows * row_bytes),
        (in_ptr, in_rows * row_bytes),
    ];
    with_communicator(py, "all_to_all_v", &ranges, move |c| {
        // SAFETY: the Python layer checked both count tensors (device, int64, shapes).
        unsafe {
            c.all_to_all_v_raw(
                out_ptr,
                out_rows,
                in_ptr,
                in_rows,
                row_bytes,
                in_splits_ptr,
                out_splits_offsets_ptr,
                stream_handle(stream) as _,
            )
        }
    })
}

/// Raises what a collective kernel recorded on the device (a wait that timed out,
/// all-to-all-v counts that do not add up), if anything. Call after synchronising.
#[pyfunction]
pub fn check_collectives(py: Python<'_>) -> PyResult<()> {
    state::with_state_detached(py, "check_collectives", |s| match &s.collectives {
        Some(c) => Ok(c.check()?),
        None => Ok(()),
    })
}
