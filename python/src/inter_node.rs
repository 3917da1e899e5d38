//! Chapter 5's collectives for Python: one `Topology` per process (made by the first call,
//! from the environment as the Rust chapter makes it), each call validated here against the
//! live allocations, then handed to the chapter's checked raw API on the caller's stream with
//! the `Method` the caller named.

use std::sync::Arc;

use ch01_bootstrap::World;
use ch04_collectives::DType;
use ch05_inter_node::{InterNodeConfig, InterNodeError, Layout, Method, Topology};
use nvshmem_tutorial::put_get::PutGetError;
use pyo3::prelude::*;

use crate::collectives::{collective_fn, parse_dtype};
use crate::errors::Error;
use crate::state::{self, State};
use crate::transfers::stream_handle;

/// Bad input (a call that cannot run, a topology the environment cannot make) is an
/// `InvalidArgumentError`; a team split, a kernel or the device failing is an `NvshmemError`.
impl From<InterNodeError> for Error {
    fn from(e: InterNodeError) -> Self {
        match e {
            InterNodeError::Coll(e) => e.into(),
            InterNodeError::Bootstrap(e) => Error::Bootstrap(e),
            InterNodeError::Symmetric(e) | InterNodeError::PutGet(PutGetError::Symmetric(e)) => {
                Error::Symmetric(e)
            }
            e @ (InterNodeError::TooLarge { .. }
            | InterNodeError::Topology(_)
            | InterNodeError::PutGet(PutGetError::RangeNotSymmetric { .. })) => {
                Error::Invalid(e.to_string())
            }
            other => Error::Failed(other.to_string()),
        }
    }
}

fn parse_method(name: &str) -> Result<Method, Error> {
    Method::from_name(name).ok_or_else(|| {
        let names: Vec<String> = Method::ALL
            .iter()
            .map(|m| format!("{:?}", m.name()))
            .collect();
        Error::Invalid(format!(
            "unknown method {name:?}: use one of {}",
            names.join(", ")
        ))
    })
}

/// The layout the topology has, or (none made yet) the one it would be made with now: G from
/// the environment, as `Topology::from_env` reads it.
fn current_layout(s: &State) -> Result<Layout, Error> {
    match &s.inter_node {
        Some(topology) => Ok(*topology.layout()),
        None => Ok(Layout::from_env(&s.world)?),
    }
}

/// Runs `what` (`inter_node_` and the collective's name) with the process's topology, making
/// it first if this is the first call. `ranges` gives the call's (output, input) byte ranges
/// for a job of `n_pes` PEs. Chapter 5's own checks of the call (what `method` can run, output
/// and input disjoint) see them twice: for no PEs before anything else, where a range that
/// grows with the job is empty, so what the method can run and every overlap known without
/// the job's size are refused before the state is even asked; then for the job's PEs, before
/// the ranges are checked against the live allocations and anything is made or enqueued.
fn run(
    py: Python<'_>,
    what: &'static str,
    (method, dtype): (Method, Option<DType>),
    ranges: impl Fn(usize) -> [(u64, usize); 2] + Send,
    call: impl FnOnce(&Topology<Arc<World>>, &State) -> Result<(), Error> + Send,
) -> PyResult<()> {
    let collective = collective(what);
    let checked = move |n_pes| -> Result<_, Error> {
        let [out, input] = ranges(n_pes);
        ch05_inter_node::check_call(collective, method, dtype, out, input)?;
        Ok(vec![out, input])
    };
    checked(0)?;
    state::with_located(py, what, checked, move |s: &mut State| {
        if s.inter_node.is_none() {
            s.inter_node = Some(Topology::from_env(
                s.world.clone(),
                InterNodeConfig::default(),
            )?);
        }
        let topology = s.inter_node.as_ref().expect("made above");
        call(topology, s)
    })
}

/// The chapter's name of the collective a Python function (`inter_node_...`) runs.
fn collective(what: &'static str) -> &'static str {
    what.trim_start_matches("inter_node_")
}

/// (n_pes, node_pes, num_nodes, node, local): the job as nodes of node_pes PEs, and this PE's
/// node and local index in it. The live topology's, else the one the first collective call
/// would make (from LOCAL_WORLD_SIZE, NVSHMEM's node team and NVSHMEM_TUTORIAL_NODE_PES); not
/// collective.
#[pyfunction]
pub fn inter_node_layout(py: Python<'_>) -> PyResult<(usize, usize, usize, usize, usize)> {
    state::with_state_detached(py, "inter_node_layout", |s| {
        let layout = current_layout(s)?;
        let me = s.world.my_pe();
        Ok((
            layout.n_pes,
            layout.node_pes,
            layout.num_nodes(),
            layout.node_of(me),
            layout.local_of(me),
        ))
    })
}

/// G for a job of `n_pes` PEs: `local_world_size` (torchrun's node) when given, else
/// `nvshmem_node`; `env_value` (NVSHMEM_TUTORIAL_NODE_PES) must divide it. The rule
/// `Topology::from_env` applies; needs no NVSHMEM.
#[pyfunction]
#[pyo3(name = "_resolve_node_pes")]
pub fn resolve_node_pes(
    env_value: Option<&str>,
    local_world_size: Option<usize>,
    nvshmem_node: usize,
    n_pes: usize,
) -> PyResult<usize> {
    ch05_inter_node::resolve_node_pes(env_value, local_world_size, nvshmem_node, n_pes)
        .map_err(|e| Error::from(e).into())
}

/// Defines a reduction's Python function (`collective_fn!`'s, with `method`): the (output,
/// input) ranges `ranges(n_pes, out_ptr, in_ptr, bytes)` (`bytes`: one PE's `count` elements),
/// checked as `run` does, then `Topology::$raw`.
macro_rules! reduction {
    ($(#[$doc:meta])* $name:ident => $raw:ident, ranges: $ranges:expr) => {
        collective_fn! {
            $(#[$doc])*
            reduction $name(py, out_ptr, in_ptr, count, dtype, method: &str) stream {
                let what = stringify!($name);
                let method = parse_method(method)?;
                let dtype = parse_dtype(collective(what), dtype)?;
                let bytes = count * dtype.size();
                let ranges = move |n_pes| ($ranges)(n_pes, out_ptr, in_ptr, bytes);
                run(py, what, (method, Some(dtype)), ranges, move |t, _| {
                    let stream = stream_handle(stream) as _;
                    Ok(t.$raw(method, out_ptr, in_ptr, count, dtype, stream)?)
                })
            }
        }
    };
}

/// Defines an exchange's Python function (`collective_fn!`'s, with `method`; a rooted one's
/// `root` checked against the job): the (output, input) ranges `ranges(n_pes, out_ptr, in_ptr,
/// num_bytes)`, checked as `run` does, then `Topology::$raw`.
macro_rules! exchange {
    (
        $(#[$doc:meta])* $name:ident $(($root:ident))? => $raw:ident, ranges: $ranges:expr
    ) => {
        collective_fn! {
            $(#[$doc])*
            exchange $name(py, out_ptr, in_ptr, num_bytes, $([$root],)? method: &str) stream {
                let method = parse_method(method)?;
                let ranges = move |n_pes| ($ranges)(n_pes, out_ptr, in_ptr, num_bytes);
                run(py, stringify!($name), (method, None), ranges, move |t, _state| {
                    $(let $root = _state.check_pe($root)?;)?
                    let stream = stream_handle(stream) as _;
                    Ok(t.$raw(method, out_ptr, in_ptr, num_bytes, $($root,)? stream)?)
                })
            }
        }
    };
}

reduction! {
    /// out[i] = the sum over PEs of input[i], `count` elements of `dtype`. Hierarchical and
    /// nvshmem_teams sum each node (local order), then the nodes (node order); flat sums in PE
    /// order. out_ptr, in_ptr: symmetric [count]; may be equal (in place).
    inter_node_all_reduce => all_reduce_raw,
    ranges: |_, out, input, bytes| [(out, bytes), (input, bytes)]
}

reduction! {
    /// out[i] = the sum over PEs of input[my_pe * count + i] (orders as all_reduce).
    /// out_ptr: symmetric [count]; in_ptr: symmetric [n_pes * count]; distinct.
    inter_node_reduce_scatter => reduce_scatter_raw,
    ranges: |n_pes, out, input, bytes| [(out, bytes), (input, n_pes * bytes)]
}

exchange! {
    /// Every PE's `num_bytes` at in_ptr into out_ptr + p * num_bytes on every PE.
    /// out_ptr: symmetric [n_pes * num_bytes]; in_ptr: symmetric [num_bytes]; distinct.
    inter_node_all_gather => all_gather_raw,
    ranges: |n_pes, out, input, num_bytes| [(out, n_pes * num_bytes), (input, num_bytes)]
}

exchange! {
    /// `root`'s num_bytes at in_ptr into out_ptr on every PE. out_ptr, in_ptr: symmetric
    /// [num_bytes]; distinct.
    inter_node_broadcast(root) => broadcast_raw,
    ranges: |_, out, input, num_bytes| [(out, num_bytes), (input, num_bytes)]
}

exchange! {
    /// Block q of in_ptr (num_bytes each) to PE q, landing at out_ptr + p * num_bytes for
    /// sender p. out_ptr, in_ptr: symmetric [n_pes * num_bytes]; distinct.
    inter_node_all_to_all => all_to_all_raw,
    ranges: |n_pes, out, input, num_bytes| [(out, n_pes * num_bytes), (input, n_pes * num_bytes)]
}

collective_fn! {
    /// All-to-all-v over rows of row_bytes with counts only the device knows; hierarchical: each
    /// PE's rows for a node cross once and are forwarded inside it.
    /// out_ptr: symmetric [out_rows, row_bytes]; in_ptr: symmetric [in_rows, row_bytes];
    /// distinct; in_splits_ptr: device int64 [n_pes]; out_splits_offsets_ptr: device int64
    /// [2, n_pes] (both checked by the Python layer: CUDA int64 tensors of those shapes on this
    /// GPU).
    all_to_all_v inter_node_all_to_all_v(
        py, out_ptr, out_rows, in_ptr, in_rows, row_bytes, in_splits_ptr, out_splits_offsets_ptr,
        method: &str
    ) stream {
        let method = parse_method(method)?;
        let ranges = move |_| {
            [
                (out_ptr, out_rows * row_bytes),
                (in_ptr, in_rows * row_bytes),
            ]
        };
        let what = "inter_node_all_to_all_v";
        run(py, what, (method, None), ranges, move |t, _| {
            // SAFETY: the Python layer checked both count tensors (device, int64, shapes).
            Ok(unsafe {
                t.all_to_all_v_raw(
                    method, out_ptr, out_rows, in_ptr, in_rows, row_bytes, in_splits_ptr,
                    out_splits_offsets_ptr, stream_handle(stream) as _,
                )
            }?)
        })
    }
}

/// Raises what a kernel of the topology recorded on the device (a wait across nodes that
/// timed out, naming both PEs by node and local index; all-to-all-v counts that do not add
/// up), if anything. Call after synchronising.
#[pyfunction]
pub fn check_inter_node(py: Python<'_>) -> PyResult<()> {
    state::with_state_detached(py, "check_inter_node", |s| match &s.inter_node {
        Some(t) => Ok(t.check()?),
        None => Ok(()),
    })
}
