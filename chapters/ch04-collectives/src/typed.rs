//! The collectives on chapter 2's `SymmetricBuffer`s, on the world's stream: element counts
//! instead of bytes, lengths checked against the buffers.

use std::ops::Deref;

use ch01_bootstrap::World;
use ch02_symmetric_memory::SymmetricBuffer;
use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr};

use crate::algorithm::Algorithm;
use crate::communicator::{Communicator, Reducible};
use crate::error::CollError;

type Buffer<V, T> = SymmetricBuffer<V, T>;

impl<W: Deref<Target = World>> Communicator<W> {
    fn stream(&self) -> cudarc::driver::sys::CUstream {
        self.world().stream().cu_stream()
    }

    /// The signal barrier on the world's stream.
    pub fn sync_all(&self) -> Result<(), CollError> {
        self.sync_all_raw(self.stream())
    }

    /// Elements 0..count of `input` on `root` into elements 0..count of every PE's `out`.
    pub fn broadcast<A, B, T>(
        &self,
        out: &Buffer<A, T>,
        input: &Buffer<B, T>,
        count: usize,
        root: usize,
        algorithm: Option<Algorithm>,
    ) -> Result<(), CollError>
    where
        A: Deref<Target = World>,
        B: Deref<Target = World>,
        T: DeviceRepr,
    {
        let (out, input) = (out.element_ptr(0, count)?, input.element_ptr(0, count)?);
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
    pub fn all_gather<A, B, T>(
        &self,
        out: &Buffer<A, T>,
        input: &Buffer<B, T>,
        count: usize,
        algorithm: Option<Algorithm>,
    ) -> Result<(), CollError>
    where
        A: Deref<Target = World>,
        B: Deref<Target = World>,
        T: DeviceRepr,
    {
        let n = self.world().n_pes();
        let (out, input) = (out.element_ptr(0, n * count)?, input.element_ptr(0, count)?);
        self.all_gather_raw(out, input, count * size_of::<T>(), algorithm, self.stream())
    }

    /// input[q * count..(q + 1) * count] of every PE p to out[p * count..] of PE q.
    pub fn all_to_all<A, B, T>(
        &self,
        out: &Buffer<A, T>,
        input: &Buffer<B, T>,
        count: usize,
        algorithm: Option<Algorithm>,
    ) -> Result<(), CollError>
    where
        A: Deref<Target = World>,
        B: Deref<Target = World>,
        T: DeviceRepr,
    {
        let n = self.world().n_pes();
        let (out, input) = (
            out.element_ptr(0, n * count)?,
            input.element_ptr(0, n * count)?,
        );
        self.all_to_all_raw(out, input, count * size_of::<T>(), algorithm, self.stream())
    }

    /// out[i] = sum over PEs of input[i], i < count (in place allowed: pass one buffer twice).
    pub fn all_reduce<A, B, T>(
        &self,
        out: &Buffer<A, T>,
        input: &Buffer<B, T>,
        count: usize,
        algorithm: Option<Algorithm>,
    ) -> Result<(), CollError>
    where
        A: Deref<Target = World>,
        B: Deref<Target = World>,
        T: Reducible,
    {
        let (out, input) = (out.element_ptr(0, count)?, input.element_ptr(0, count)?);
        self.all_reduce_raw(out, input, count, T::DTYPE, algorithm, self.stream())
    }

    /// out[i] = sum over PEs of input[my_pe * count + i], i < count.
    pub fn reduce_scatter<A, B, T>(
        &self,
        out: &Buffer<A, T>,
        input: &Buffer<B, T>,
        count: usize,
        algorithm: Option<Algorithm>,
    ) -> Result<(), CollError>
    where
        A: Deref<Target = World>,
        B: Deref<Target = World>,
        T: Reducible,
    {
        let n = self.world().n_pes();
        let (out, input) = (out.element_ptr(0, count)?, input.element_ptr(0, n * count)?);
        self.reduce_scatter_raw(out, input, count, T::DTYPE, algorithm, self.stream())
    }

    /// all-to-all-v over rows of `row_len` elements; see [`Communicator::all_to_all_v_raw`].
    /// in_splits: [n_pes] row counts; out_splits_offsets: [2 * n_pes], written.
    pub fn all_to_all_v<A, B, T>(
        &self,
        out: &Buffer<A, T>,
        input: &Buffer<B, T>,
        row_len: usize,
        in_splits: &CudaSlice<i64>,
        out_splits_offsets: &mut CudaSlice<i64>,
    ) -> Result<(), CollError>
    where
        A: Deref<Target = World>,
        B: Deref<Target = World>,
        T: DeviceRepr,
    {
        let n = self.world().n_pes();
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
        let row_bytes = row_len * size_of::<T>();
        // SAFETY: both count arrays are device slices of the lengths checked above.
        unsafe {
            self.all_to_all_v_raw(
                out.device_ptr(),
                out.len() / row_len,
                input.device_ptr(),
                input.len() / row_len,
                row_bytes,
                splits,
                outputs,
                stream.cu_stream(),
            )
        }
    }
}
