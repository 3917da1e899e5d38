//! `nvshmem-tutorial`: the buffer the tutorial builds, composed from its chapters.
//!
//! # Layout
//!
//! ```text
//! nvshmem-sys/            raw FFI: libnvshmem_host.so.3 opened at run time, ABI types
//! kernels/                kernels/cuda/*.cu -> cubins embedded in the crate; module loading
//! chapters/ch01-bootstrap World (NVSHMEM init/finalize) and the unique-id rendezvous
//! src/lib.rs              this map; NvshmemBuffer (dispatch/combine) lands here in chapter 7
//! ```
//!
//! Each chapter crate depends only on earlier chapters, `nvshmem-sys` and `kernels`; this
//! crate re-exports the chapters so that an application needs one dependency.

pub use nvshmem_sys;
