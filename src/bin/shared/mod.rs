//! What the buffer's test programs share (`#[path]`-included by each): the random routing
//! every rank can rebuild ([`routing`]), the soak options ([`soak`]), and the error their
//! `run` returns. `heap.rs` beside them is included on its own by the programs that size the
//! heap.

pub(crate) mod routing;
pub(crate) mod soak;

pub(crate) type AnyError = Box<dyn std::error::Error>;
