//! `nvshmem_tutorial._native`: the Rust side of the Python package.
//!
//! The chapters do the work: chapter 1's [`World`] initialises NVSHMEM, chapter 2's
//! `SymmetricBuffer` owns each allocation and checks ranges, PEs and heap membership. This
//! module adds only what Python needs on top:
//!
//! - one process-wide `Arc<World>` ([`state`]), because Python has no lifetimes to borrow with;
//! - allocations handed to torch zero-copy as DLPack capsules ([`dlpack`]) whose storage
//!   keeps the allocation alive exactly as long as any tensor over it lives;
//! - the deferred, collective free those objects need ([`state`] explains the rule);
//! - put/get/barrier/quiet, and the pairwise signal handshake (put_signal, signal_op,
//!   wait_signal), enqueued on a stream the caller names (torch's current stream), validated
//!   before anything is enqueued.
//!
//! One module per concern, like the Python package beside it: [`bootstrap`] (library, init,
//! finalize), [`allocation`] (symmetric tensors and their checks), [`transfers`] (put/get,
//! barrier, quiet), [`signals`] (the pairwise handshake), [`collectives`] (chapter 4),
//! [`inter_node`] (chapter 5: the same collectives over nodes, three ways);
//! [`state`], [`errors`] and [`dlpack`] hold what they share. Chapters 7-8, the buffer:
//! [`buffer`] (`BufferCore`: every DeepEP call, one crossing each), [`normal`], [`internode`]
//! (normal mode across nodes) and [`low_latency`] (each mode's arguments and outputs), [`torch`] (tensors in, outputs out),
//! [`events`] and [`streams`] (DeepEP's stream rules, natively), [`shared`] (what a buffer's
//! events and hooks share with it), [`config`] (`Config`, size hints, the timeout).
//!
//! Pointers cross the boundary as integers (`tensor.data_ptr()`, `stream.cuda_stream`): torch
//! and cudarc both use the GPU's primary context, so the addresses mean the same to both. The
//! buffer's calls take torch tensors themselves and read them once (torch.rs). Every entry
//! point that touches the state or blocks in NVSHMEM releases the GIL.

mod allocation;
mod bootstrap;
mod buffer;
mod collectives;
mod config;
mod dlpack;
mod errors;
mod events;
mod inter_node;
mod internode;
mod low_latency;
mod normal;
mod shared;
mod signals;
mod state;
mod streams;
mod torch;
mod transfers;

/// The module Python imports as `nvshmem_tutorial._native`: every function and exception of
/// the modules above, under its own name.
#[pyo3::pymodule]
mod _native {
    use pyo3::prelude::*;
    use pyo3::types::PyTuple;

    #[pymodule_export]
    use crate::allocation::{
        alloc, free_released, heap_usage, locate, mark_consumed, peer_ptr, released_ids, to_dlpack,
    };
    #[pymodule_export]
    use crate::bootstrap::{
        finalize, init, is_initialized, library_info, pinned_nvshmem_version, probe_driver,
        topology, unique_id,
    };
    #[pymodule_export]
    use crate::buffer::BufferCore;
    #[pymodule_export]
    use crate::collectives::{
        all_gather, all_reduce, all_to_all, all_to_all_v, broadcast, check_collectives,
        reduce_scatter, sync_all,
    };
    #[pymodule_export]
    use crate::config::{
        PyConfig, buffer_heap_bytes, buffer_timeout_ms, combine_config, dispatch_config,
        low_latency_rdma_size_hint,
    };
    #[pymodule_export]
    use crate::errors::{
        InvalidArgumentError, LibraryError, NoDeviceError, NotInitializedError, NotSymmetricError,
        NvshmemError, OutOfBoundsError, PeOutOfRangeError,
    };
    #[pymodule_export]
    use crate::events::{Event, capture};
    #[pymodule_export]
    use crate::inter_node::{
        check_inter_node, inter_node_all_gather, inter_node_all_reduce, inter_node_all_to_all,
        inter_node_all_to_all_v, inter_node_broadcast, inter_node_layout,
        inter_node_reduce_scatter, resolve_node_pes,
    };
    #[pymodule_export]
    use crate::low_latency::ReceiveHook;
    #[pymodule_export]
    use crate::signals::{put_signal, signal_cmp_code, signal_op, signal_op_code, wait_signal};
    #[pymodule_export]
    use crate::torch::describe_view;
    #[pymodule_export]
    use crate::transfers::{barrier, get, put, quiet};

    #[pymodule_export]
    const UNIQUE_ID_BYTES: usize = nvshmem_sys::UNIQUE_ID_BYTES;
    /// The variable that sets the default timeout of a `Buffer`'s waits.
    #[pymodule_export]
    const BUFFER_TIMEOUT_VAR: &str = crate::config::BUFFER_TIMEOUT_VAR;
    /// The variable that cuts chapter 5's nodes smaller (virtual nodes).
    #[pymodule_export]
    const NODE_PES_VAR: &str = ch05_inter_node::NODE_PES_VAR;

    /// The attributes that are not items: the version, the names put_signal/signal_op take
    /// as `op` and wait_signal as `cmp`, and the inter-node calls as `method`, in table order.
    #[pymodule_init]
    fn add_attributes(m: &Bound<'_, PyModule>) -> PyResult<()> {
        let py = m.py();
        m.add("__version__", env!("CARGO_PKG_VERSION"))?;
        let op_names = crate::signals::SIGNAL_OPS.map(|(name, _)| name);
        m.add("SIGNAL_OPS", PyTuple::new(py, op_names)?)?;
        let cmp_names = crate::signals::SIGNAL_CMPS.map(|(name, _)| name);
        m.add("SIGNAL_CMPS", PyTuple::new(py, cmp_names)?)?;
        let method_names = ch05_inter_node::Method::ALL.map(|m| m.name());
        m.add("INTER_NODE_METHODS", PyTuple::new(py, method_names)?)?;
        Ok(())
    }
}
