//! What chapters 7 and 8's programs share (`#[path]`-included by both): the random routing
//! every rank can rebuild ([`routing`]), the soak options ([`soak`]), and the error their
//! `run` returns.

pub(crate) mod routing;
pub(crate) mod soak;

pub(crate) type AnyError = Box<dyn std::error::Error>;
