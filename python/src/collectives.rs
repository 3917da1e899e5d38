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
            let names: Vec<&str> = Algorithm::ALL.iter().map(|a| a.name()).collect();
            Error::Invalid(format!(
                "unknown algorithm {name:?}: use one of {} (which apply depends on the \
                 collective), or None",
                names.join(", ")
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

/// Defines a collective's Python function in the signature chapters 4 and 5 share (chapter
/// 5's functions are chapter 4's over nodes): a reduction takes `(out_ptr, in_ptr, count,
/// dtype, <how>, stream)`, `count` elements of `dtype` per PE; an exchange `(out_ptr, in_ptr,
/// num_bytes, [root,] <how>, stream)`, blocks of `num_bytes` and, for a rooted one, the PE
/// `root`; an all-to-all-v `(out_ptr, out_rows, in_ptr, in_rows, row_bytes, in_splits_ptr,
/// out_splits_offsets_ptr, [<how>,] stream)`. `<how>` picks the implementation: chapter 4's
/// optional `algorithm` (its all-to-all-v has none), chapter 5's `method`. The parameters take
/// the names the caller's `$body` uses (names this macro made up would be hidden from it);
/// `stream`'s comes after the list, whose `<how>` type would otherwise swallow it.
macro_rules! collective_fn {
    (
        $(#[$doc:meta])* reduction $name:ident(
            $py:ident, $out:ident, $in:ident, $count:ident, $dtype:ident,
            $how:ident: $($how_ty:tt)+
        ) $stream:ident $body:block
    ) => {
        $(#[$doc])*
        #[pyfunction]
        #[pyo3(signature = ($out, $in, $count, $dtype, $how, $stream))]
        pub fn $name(
            $py: Python<'_>,
            $out: u64,
            $in: u64,
            $count: usize,
            $dtype: &str,
            $how: $($how_ty)+,
            $stream: u64,
        ) -> PyResult<()> $body
    };
    (
        $(#[$doc:meta])* exchange $name:ident(
            $py:ident, $out:ident, $in:ident, $num_bytes:ident, $([$root:ident],)?
            $how:ident: $($how_ty:tt)+
        ) $stream:ident $body:block
    ) => {
        $(#[$doc])*
        #[pyfunction]
        pub fn $name(
            $py: Python<'_>,
            $out: u64,
            $in: u64,
            $num_bytes: usize,
            $($root: i64,)?
            $how: $($how_ty)+,
            $stream: u64,
        ) -> PyResult<()> $body
    };
    (
        $(#[$doc:meta])* all_to_all_v $name:ident(
            $py:ident, $out:ident, $out_rows:ident, $in:ident, $in_rows:ident, $row_bytes:ident,
            $in_splits:ident, $out_splits_offsets:ident $(, $how:ident: $($how_ty:tt)+)?
        ) $stream:ident $body:block
    ) => {
        $(#[$doc])*
        #[pyfunction]
        #[allow(clippy::too_many_arguments)]
        pub fn $name(
            $py: Python<'_>,
            $out: u64,
            $out_rows: usize,
            $in: u64,
            $in_rows: usize,
            $row_bytes: usize,
            $in_splits: u64,
            $out_splits_offsets: u64,
            $($how: $($how_ty)+,)?
            $stream: u64,
        ) -> PyResult<()> $body
    };
}
pub(crate) use collective_fn;

/// Defines a reduction's Python function (`collective_fn!`'s, with `algorithm`): the ranges
/// `located(out_ptr, in_ptr, bytes)` returns (`bytes`: one PE's `count` elements) are found in
/// the live allocations, then `Communicator::$raw` runs.
macro_rules! reduction {
    ($(#[$doc:meta])* $name:ident => $raw:ident, located: $located:expr) => {
        collective_fn! {
            $(#[$doc])*
            reduction $name(py, out_ptr, in_ptr, count, dtype, algorithm: Option<&str>) stream {
                let what = stringify!($name);
                let (dtype, algorithm) = (parse_dtype(what, dtype)?, parse_algorithm(algorithm)?);
                let ranges = ($located)(out_ptr, in_ptr, count * dtype.size());
                with_communicator(py, what, &ranges, move |c| {
                    let stream = stream_handle(stream) as _;
                    c.$raw(out_ptr, in_ptr, count, dtype, algorithm, stream)
                })
            }
        }
    };
}

/// Defines an exchange's Python function (`collective_fn!`'s, with `algorithm`): the ranges
/// `located(out_ptr, in_ptr, num_bytes)` returns are found in the live allocations, then
/// `Communicator::$raw` runs.
macro_rules! exchange {
    (
        $(#[$doc:meta])* $name:ident $(($root:ident))? => $raw:ident, located: $located:expr
    ) => {
        collective_fn! {
            $(#[$doc])*
            exchange $name(py, out_ptr, in_ptr, num_bytes, $([$root],)? algorithm: Option<&str>)
            stream {
                let algorithm = parse_algorithm(algorithm)?;
                let ranges = ($located)(out_ptr, in_ptr, num_bytes);
                with_communicator(py, stringify!($name), &ranges, move |c| {
                    $(let $root = usize::try_from($root).unwrap_or(usize::MAX);)?
                    let stream = stream_handle(stream) as _;
                    c.$raw(out_ptr, in_ptr, num_bytes, $($root,)? algorithm, stream)
                })
            }
        }
    };
}

reduction! {
    /// out[i] = sum over PEs of input[i] (fp32 sums, PE order), `count` elements of `dtype`.
    /// out_ptr, in_ptr: symmetric device pointers [count]; may be equal (in place).
    all_reduce => all_reduce_raw,
    located: |out, input, bytes| [(out, bytes), (input, bytes)]
}

reduction! {
    /// out[i] = sum over PEs of input[my_pe * count + i]. out_ptr: symmetric [count];
    /// in_ptr: symmetric [n_pes * count].
    reduce_scatter => reduce_scatter_raw,
    located: |out, _, bytes| [(out, bytes)]
}

exchange! {
    /// Every PE's `num_bytes` at in_ptr into out_ptr + p * num_bytes on every PE.
    /// out_ptr: symmetric [n_pes * num_bytes]; in_ptr: symmetric [num_bytes].
    all_gather => all_gather_raw,
    located: |_, input, num_bytes| [(input, num_bytes)]
}

exchange! {
    /// Block q of in_ptr (num_bytes each) to PE q, landing at out_ptr + p * num_bytes for
    /// sender p. out_ptr, in_ptr: symmetric [n_pes * num_bytes].
    all_to_all => all_to_all_raw,
    located: |_, _, _| []
}

exchange! {
    /// `root`'s num_bytes at in_ptr into out_ptr on every PE. out_ptr, in_ptr: symmetric
    /// [num_bytes]; may be equal (in place).
    broadcast(root) => broadcast_raw,
    located: |out, input, num_bytes| [(out, num_bytes), (input, num_bytes)]
}

collective_fn! {
    /// all-to-all-v over rows of row_bytes with counts only the device knows.
    /// out_ptr: symmetric [out_rows, row_bytes]; in_ptr: symmetric [in_rows, row_bytes];
    /// in_splits_ptr: device int64 [n_pes]; out_splits_offsets_ptr: device int64 [2, n_pes]
    /// (both checked by the Python layer: CUDA int64 tensors of those shapes on this GPU).
    all_to_all_v all_to_all_v(
        py, out_ptr, out_rows, in_ptr, in_rows, row_bytes, in_splits_ptr, out_splits_offsets_ptr
    ) stream {
        let ranges = [
            (out_ptr, out_rows * row_bytes),
            (in_ptr, in_rows * row_bytes),
        ];
        with_communicator(py, "all_to_all_v", &ranges, move |c| {
            // SAFETY: the Python layer checked both count tensors (device, int64, shapes).
            unsafe {
                c.all_to_all_v_raw(
                    out_ptr, out_rows, in_ptr, in_rows, row_bytes, in_splits_ptr,
                    out_splits_offsets_ptr, stream_handle(stream) as _,
                )
            }
        })
    }
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
