//! `nvshmem-tutorial`: the buffer the tutorial builds, composed from its chapters.
//!
//! # Layout
//!
//! ```text
//! nvshmem-sys/                    raw FFI: libnvshmem_host.so.3 opened at run time, ABI types,
//!                                 library discovery and the version pin (3.4.5)
//! kernels/                        kernels/cuda/*.cu -> one cubin per arch, embedded;
//!                                 NvshmemModule (load + nvshmemx_cumodule_init)
//! chapters/ch01-bootstrap         LaunchEnv (torchrun), unique-id rendezvous (TCP, bounded),
//!                                 World (init/finalize), checks (the harness every example uses)
//! chapters/ch02-symmetric-memory  SymmetricBuffer<W, T>: typed RAII symmetric allocation,
//!                                 peer views, collective size check, heap size
//! chapters/ch03-put-get           device put/get (thread/warp/block, nbi+quiet), putmem_signal
//!                                 handshake, peer stores, bulk-copy put, host on-stream ops;
//!                                 the p2p benchmark
//! python/                         nvshmem_tutorial: PyO3 module + torch glue
//! src/lib.rs                      this map; NvshmemBuffer (dispatch/combine) lands here in
//!                                 chapter 7
//! ```
//!
//! Each chapter crate depends only on earlier chapters, `nvshmem-sys` and `kernels`; this
//! crate re-exports them so that an application needs one dependency.

pub use ch01_bootstrap as bootstrap;
pub use ch02_symmetric_memory as symmetric_memory;
pub use ch03_put_get as put_get;
pub use kernels;
pub use nvshmem_sys;
