//! What one put or get is, checked once on the host before anything is enqueued.
//!
//! A [`Put`] writes local bytes into a symmetric buffer as it is on another PE; a [`Get`]
//! reads a peer's symmetric buffer into local memory. Building one checks every argument
//! with chapter 2's checks (the PE exists, the remote range lies inside its symmetric
//! allocation) and this module's (the local side holds enough elements, a raw pointer's whole
//! range is symmetric). Every way of issuing the transfer, from the host ([`crate::host`]) or
//! from a kernel ([`crate::device`], [`crate::signal`]), takes the checked value, so the
//! checks are written once and nothing unchecked reaches the GPU. A transfer borrows its
//! buffers: it cannot outlive them.

use std::ops::Deref;

use ch01_bootstrap::World;
use ch02_symmetric_memory::{SymmetricBuffer, check_pe, check_symmetric};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DeviceRepr};

use crate::PutGetError;

// ANCHOR: local_buffer
/// Device memory of this PE that a transfer reads from (put) or writes into (get): a plain
/// CUDA allocation or this PE's copy of a symmetric buffer. Over NVLink the local side needs
/// no registration; only the remote side must be symmetric.
pub trait LocalBuffer<T> {
    /// Number of `T` elements.
    fn num_elements(&self) -> usize;
    /// Device pointer [num_elements] T on this PE.
    fn device_address(&self, stream: &CudaStream) -> u64;
}

impl<T> LocalBuffer<T> for CudaSlice<T> {
    fn num_elements(&self) -> usize {
        cudarc::driver::DeviceSlice::len(self)
    }
    fn device_address(&self, stream: &CudaStream) -> u64 {
        // The guard records cudarc's read event when dropped; all of our work is on `stream`.
        let (ptr, _record) = self.device_ptr(stream);
        ptr
    }
}

impl<W: Deref<Target = World>, T: DeviceRepr> LocalBuffer<T> for SymmetricBuffer<W, T> {
    fn num_elements(&self) -> usize {
        self.len()
    }
    fn device_address(&self, _stream: &CudaStream) -> u64 {
        self.device_ptr()
    }
}
// ANCHOR_END: local_buffer

/// When a call returns, and what completes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Completion {
    /// Returns once the source may be reused (put) or the data is here (get).
    Blocking,
    /// `_nbi`: returns at once; `quiet` completes it.
    NonBlockingQuiet,
}

impl Completion {
    pub const ALL: [Completion; 2] = [Completion::Blocking, Completion::NonBlockingQuiet];
    pub fn name(self) -> &'static str {
        match self {
            Completion::Blocking => "blocking",
            Completion::NonBlockingQuiet => "nbi+quiet",
        }
    }
}

/// Which way the bytes go, seen from the PE that issues the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Local bytes into a symmetric buffer on `pe`.
    Put,
    /// A symmetric buffer on `pe` into local memory.
    Get,
}

/// The checked core every put and get reduces to. Only [`Put`] and [`Get`] make one.
#[derive(Clone, Copy)]
pub struct Transfer<'a> {
    world: &'a World,
    direction: Direction,
    /// Device pointer [num_bytes] u8 that is written: symmetric, as named on `pe`, for a put;
    /// local for a get.
    dest: u64,
    /// Device pointer [num_bytes] u8 that is read: local for a put; symmetric, as named on
    /// `pe`, for a get.
    source: u64,
    num_bytes: usize,
    pe: usize,
}

impl<'a> Transfer<'a> {
    pub fn world(&self) -> &'a World {
        self.world
    }
    pub fn direction(&self) -> Direction {
        self.direction
    }
    /// Device pointer [num_bytes] u8 written (see the field's comment for where it lives).
    pub fn dest(&self) -> u64 {
        self.dest
    }
    /// Device pointer [num_bytes] u8 read.
    pub fn source(&self) -> u64 {
        self.source
    }
    pub fn num_bytes(&self) -> usize {
        self.num_bytes
    }
    /// The remote PE.
    pub fn pe(&self) -> usize {
        self.pe
    }

    /// Checks the two sides every transfer has, `count` elements from element `offset` of
    /// the symmetric `remote` as named on `pe` and the first `count` of `local`, and puts them
    /// in place for `direction`.
    fn checked<W: Deref<Target = World>, T: DeviceRepr>(
        direction: Direction,
        (remote, offset): (&'a SymmetricBuffer<W, T>, usize),
        local: &'a impl LocalBuffer<T>,
        (count, pe): (usize, usize),
    ) -> Result<Self, PutGetError> {
        let world = remote.world();
        let remote_ptr = remote_range(remote, offset, count, pe)?;
        let side = match direction {
            Direction::Put => "source",
            Direction::Get => "destination",
        };
        local_range(side, local.num_elements(), 0, count, size_of::<T>())?;
        let local_ptr = local.device_address(world.stream());
        let (dest, source) = match direction {
            Direction::Put => (remote_ptr, local_ptr),
            Direction::Get => (local_ptr, remote_ptr),
        };
        Ok(Self {
            world,
            direction,
            dest,
            source,
            num_bytes: count * size_of::<T>(),
            pe,
        })
    }
}

/// A checked put: see the module's documentation.
#[derive(Clone, Copy)]
pub struct Put<'a>(Transfer<'a>);

/// A checked get: see the module's documentation.
#[derive(Clone, Copy)]
pub struct Get<'a>(Transfer<'a>);

impl<'a> Deref for Put<'a> {
    type Target = Transfer<'a>;
    fn deref(&self) -> &Transfer<'a> {
        &self.0
    }
}

impl<'a> Deref for Get<'a> {
    type Target = Transfer<'a>;
    fn deref(&self) -> &Transfer<'a> {
        &self.0
    }
}

impl<'a> Put<'a> {
    // ANCHOR: put
    /// Elements `0..count` of the local `src` are to go to elements
    /// `dst_offset..dst_offset + count` of `dst` as it is on PE `pe`.
    pub fn new<W: Deref<Target = World>, T: DeviceRepr>(
        dst: &'a SymmetricBuffer<W, T>,
        dst_offset: usize,
        src: &'a impl LocalBuffer<T>,
        count: usize,
        pe: usize,
    ) -> Result<Self, PutGetError> {
        Transfer::checked(Direction::Put, (dst, dst_offset), src, (count, pe)).map(Self)
    }
    // ANCHOR_END: put

    // ANCHOR: put_raw
    /// The untyped put, for pointers that did not come from a [`SymmetricBuffer`] (another
    /// library's allocation, an offset computed by hand): `dst` must be a symmetric device
    /// address whose whole range lies in the heap; `src` is a local device pointer of
    /// `num_bytes` bytes that the caller vouches for.
    ///
    /// # Safety
    /// `src` must point to `num_bytes` readable device bytes on this PE for as long as the
    /// put is used.
    pub unsafe fn raw(
        world: &'a World,
        dst: u64,
        src: u64,
        num_bytes: usize,
        pe: usize,
    ) -> Result<Self, PutGetError> {
        check_pe(world, pe)?;
        check_symmetric_range(world, dst, num_bytes as u64)?;
        Ok(Self(Transfer {
            world,
            direction: Direction::Put,
            dest: dst,
            source: src,
            num_bytes,
            pe,
        }))
    }
    // ANCHOR_END: put_raw
}

impl<'a> Get<'a> {
    /// Elements `src_offset..src_offset + count` of `src` as it is on PE `pe` are to land in
    /// elements `0..count` of the local `dst`.
    pub fn new<W: Deref<Target = World>, T: DeviceRepr>(
        dst: &'a impl LocalBuffer<T>,
        src: &'a SymmetricBuffer<W, T>,
        src_offset: usize,
        count: usize,
        pe: usize,
    ) -> Result<Self, PutGetError> {
        Transfer::checked(Direction::Get, (src, src_offset), dst, (count, pe)).map(Self)
    }
}

// ANCHOR: checks
/// Byte offset of elements `offset..offset + count` of a local buffer of `len` elements of
/// `element_bytes` each, or why they do not fit. Pure: the host-side half of every check.
pub fn local_range(
    side: &'static str,
    len: usize,
    offset: usize,
    count: usize,
    element_bytes: usize,
) -> Result<u64, PutGetError> {
    match offset.checked_add(count) {
        Some(end) if end <= len => Ok((offset * element_bytes) as u64),
        _ => Err(PutGetError::LocalOutOfBounds {
            side,
            offset,
            count,
            len,
        }),
    }
}

/// Device pointer to elements `offset..offset + count` of `buffer` as named on `pe`: chapter
/// 2's checks that `pe` exists and that the range lies inside the allocation.
pub fn remote_range<W: Deref<Target = World>, T: DeviceRepr>(
    buffer: &SymmetricBuffer<W, T>,
    offset: usize,
    count: usize,
    pe: usize,
) -> Result<u64, PutGetError> {
    buffer.check_pe(pe)?;
    Ok(buffer.element_ptr(offset, count)?)
}

/// `Err` unless every byte of `ptr..ptr + num_bytes` is symmetric: both ends are tested,
/// so a range that starts in the heap and runs off its end is caught too.
pub fn check_symmetric_range(world: &World, ptr: u64, num_bytes: u64) -> Result<(), PutGetError> {
    check_symmetric(world, ptr)?;
    if num_bytes > 1 && check_symmetric(world, ptr + num_bytes - 1).is_err() {
        return Err(PutGetError::RangeNotSymmetric { ptr, num_bytes });
    }
    Ok(())
}
// ANCHOR_END: checks

/// Device pointer [num_bytes] u8 of the local `buffer`, after checking that it holds
/// `num_bytes` bytes (in whole elements).
pub(crate) fn local_bytes<T>(
    side: &'static str,
    buffer: &impl LocalBuffer<T>,
    num_bytes: usize,
    stream: &CudaStream,
) -> Result<u64, PutGetError> {
    let count = num_bytes.div_ceil(size_of::<T>().max(1));
    local_range(side, buffer.num_elements(), 0, count, size_of::<T>())?;
    Ok(buffer.device_address(stream))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_ranges_are_checked() {
        assert_eq!(local_range("source", 10, 0, 10, 4).unwrap(), 0);
        assert_eq!(local_range("source", 10, 3, 7, 4).unwrap(), 12);
        let err = local_range("source", 10, 0, 11, 4).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("local source holds 10 elements") && msg.contains("0..11"),
            "{msg}"
        );
        // An overflowing end is an error, not a wrap-around.
        assert!(local_range("destination", 10, usize::MAX, 2, 4).is_err());
    }
}
