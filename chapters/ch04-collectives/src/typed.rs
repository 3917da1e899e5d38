//! The collectives on chapter 2's `SymmetricBuffer`s, on the world's stream: element counts
//! instead of bytes, every count checked against the buffers it addresses.

use std::ops::Deref;

use ch01_bootstrap::World;
use ch02_symmetric_memory::SymmetricBuffer;
use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr};

use crate::algorithm::Algorithm;
use crate::communicator::{Communicator, Reducible};
use crate::error::CollError;

/// A symmetric buffer of `T` as the collectives read it: the address of its first `count`
/// elements, once they are known to fit.
pub trait Elements<T> {
    fn first(&self, count: usize) -> Result<u64, CollError>;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<W: Deref<Target = World>, T: DeviceRepr> Elements<T> for SymmetricBuffer<W, T> {
    fn first(&self, count: usize) -> Result<u64, CollError> {
        Ok(self.element_ptr(0, count)?)
    }
    fn len(&self) -> usize {
        SymmetricBuffer::len(self)
    }
}

impl<W: Deref<Target = World>> Communicator<W> {
    fn stream(&self) -> cudarc::driver::sys::CUstream {
        self.world().stream().cu_stream()
    }

    /// The signal barrier on the world's stream.
    pub fn sync_all(&self) -> Result<(), CollError> {
        self.sync_all_raw(self.stream())
    }

    /// Elements 0..count of `input` on `root` into elements 0..count of every PE's `out`.
    pub fn broadcast<T: DeviceRepr>(
        &self,
        out: &impl Elements<T>,
        input: &impl Elements<T>,
        count: usize,
        root: usize,
        algorithm: Option<Algorithm>,
    ) -> Result<(), CollError> {
        let (out, input) = (out.first(count)?, input.first(count)?);
        self.broadcast_raw(
            out,
            input,
            count * size_of::<T>(),
            root,
            algorithm,
            self.stream(),
        )
    }

    /// Every PE's elements 0..count into out[p * count..] of every PE.
    pub fn all_gather<T: DeviceRepr>(
        &self,
        out: &impl Elements<T>,
        input: &impl Elements<T>,
        count: usize,
        algorithm: Option<Algorithm>,
    ) -> Result<(), CollError> {
        let n = self.n_pes();
        let (out, input) = (out.first(n * count)?, input.first(count)?);
        self.all_gather_raw(out, input, count * size_of::<T>(), algorithm, self.stream())
    }

    /// input[q * count..(q + 1) * count] of every PE p to out[p * count..] of PE q.
    pub fn all_to_all<T: DeviceRepr>(
        &self,
        out: &impl Elements<T>,
        input: &impl Elements<T>,
        count: usize,
        algorithm: Option<Algorithm>,
    ) -> Result<(), CollError> {
        let n = self.n_pes();
        let (out, input) = (out.first(n * count)?, input.first(n * count)?);
        self.all_to_all_raw(out, input, count * size_of::<T>(), algorithm, self.stream())
    }

    /// out[i] = sum over PEs of input[i], i < count (in place allowed: pass one buffer twice).
    pub fn all_reduce<T: Reducible>(
        &self,
        out: &impl Elements<T>,
        input: &impl Elements<T>,
        count: usize,
        algorithm: Option<Algorithm>,
    ) -> Result<(), CollError> {
        let (out, input) = (out.first(count)?, input.first(count)?);
        self.all_reduce_raw(out, input, count, T::DTYPE, algorithm, self.stream())
    }

    /// out[i] = sum over PEs of input[my_pe * count + i], i < count.
    pub fn reduce_scatter<T: Reducible>(
        &self,
        out: &impl Elements<T>,
        input: &impl Elements<T>,
        count: usize,
        algorithm: Option<Algorithm>,
    ) -> Result<(), CollError> {
        let n = self.n_pes();
        let (out, input) = (out.first(count)?, input.first(n * count)?);
        self.reduce_scatter_raw(out, input, count, T::DTYPE, algorithm, self.stream())
    }

    /// all-to-all-v over rows of `row_len` elements; see [`Communicator::all_to_all_v_raw`].
    /// in_splits: [n_pes] row counts; out_splits_offsets: [2 * n_pes], written.
    pub fn all_to_all_v<T: DeviceRepr>(
        &self,
        out: &impl Elements<T>,
        input: &impl Elements<T>,
        row_len: usize,
        in_splits: &CudaSlice<i64>,
        out_splits_offsets: &mut CudaSlice<i64>,
    ) -> Result<(), CollError> {
        let n = self.n_pes();
        if row_len == 0 || in_splits.len() < n || out_splits_offsets.len() < 2 * n {
            return Err(CollError::invalid(
                "all_to_all_v",
                format!(
                    "rows of {row_len} elements, {} splits and {} outputs given; rows need at \
                     least one element, in_splits {n} entries and out_splits_offsets {}",
                    in_splits.len(),
                    out_splits_offsets.len(),
                    2 * n
                ),
            ));
        }
        let stream = self.world().stream();
        let (splits, _) = in_splits.device_ptr(stream);
        let (outputs, _) = out_splits_offsets.device_ptr(stream);
        let (out_rows, in_rows) = (out.len() / row_len, input.len() / row_len);
        let (out, input) = (
            out.first(out_rows * row_len)?,
            input.first(in_rows * row_len)?,
        );
        // SAFETY: both count arrays are device slices of the lengths checked above.
        unsafe {
            let row_bytes = row_len * size_of::<T>();
            self.all_to_all_v_raw(
                out,
                out_rows,
                input,
                in_rows,
                row_bytes,
                splits,
                outputs,
                stream.cu_stream(),
            )
        }
    }
}
