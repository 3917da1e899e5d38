//! The collectives of a `Topology`, three ways ([`Method`]): the hierarchical plans on our
//! kernels, the same plans on NVSHMEM's team collectives over the node and rail teams, and the
//! flat algorithms (one RMA group of every PE). Every call takes device addresses and a stream
//! (the raw layer, as chapter 4's `*_raw` calls); every check is made before anything is
//! launched.

use std::ops::Deref;

use ch01_bootstrap::World;
use ch04_collectives::DType;
use cudarc::driver::sys;

use crate::config::MAX_GROUP;
use crate::error::InterNodeError;
use crate::exec::Call;
use crate::method::Method;
use crate::plan;
use crate::topology::Topology;

// ---- the calls ---------------------------------------------------------------------------------

impl<W: Deref<Target = World> + Clone> Topology<W> {
    // ANCHOR: all_reduce_raw
    /// out[i] = the sum over every PE of input[i], i < count. `Hierarchical` and
    /// `NvshmemTeams` sum each node first, then the nodes (`reference::hier_sum`'s order);
    /// `Flat` sums every PE in PE order. In place (out == input) is allowed.
    /// out, input: symmetric [count] dtype.
    pub fn all_reduce_raw(
        &self,
        method: Method,
        out: u64,
        input: u64,
        count: usize,
        dtype: DType,
        stream: sys::CUstream,
    ) -> Result<(), InterNodeError> {
        self.reduce("all_reduce", method, (out, input), count, dtype, stream)
    }
    // ANCHOR_END: all_reduce_raw

    /// out[i] = the sum over every PE of input[my_pe * count + i], i < count (orders as
    /// `all_reduce_raw`). out: symmetric [count] dtype; input: symmetric [n_pes * count] dtype.
    pub fn reduce_scatter_raw(
        &self,
        method: Method,
        out: u64,
        input: u64,
        count: usize,
        dtype: DType,
        stream: sys::CUstream,
    ) -> Result<(), InterNodeError> {
        self.reduce("reduce_scatter", method, (out, input), count, dtype, stream)
    }

    /// Both reductions: checked, then the flat RMA kernel over every PE or the hierarchical
    /// plan (on our kernels or NVSHMEM's teams).
    fn reduce(
        &self,
        collective: &'static str,
        method: Method,
        (out, input): (u64, u64),
        count: usize,
        dtype: DType,
        stream: sys::CUstream,
    ) -> Result<(), InterNodeError> {
        let all_reduce = collective == "all_reduce";
        let out_bytes = count * dtype.size();
        let in_bytes = match all_reduce {
            true => out_bytes,
            false => self.layout.n_pes * out_bytes,
        };
        let ranges = [(out, out_bytes), (input, in_bytes)];
        self.prepare((collective, method, Some(dtype)), &ranges, in_bytes, stream)?;
        let call = Call {
            input,
            out,
            dtype: Some(dtype),
            ..Call::default()
        };
        let group = || self.world_group(collective);
        match method {
            Method::Flat if count == 0 => Ok(()),
            Method::Flat => self.rma_reduce(group()?, all_reduce, out, input, count, &call, stream),
            _ => {
                let plan = match all_reduce {
                    true => plan::all_reduce(&self.layout, count, dtype.size()),
                    false => plan::reduce_scatter(&self.layout, count, dtype.size()),
                };
                self.run_plan(&plan, call, method, stream)
            }
        }
    }

    /// Every PE's `num_bytes` at `input` into every PE's out, PE p's at out + p * num_bytes.
    /// out: symmetric [n_pes * num_bytes]; input: symmetric [num_bytes].
    pub fn all_gather_raw(
        &self,
        method: Method,
        out: u64,
        input: u64,
        num_bytes: usize,
        stream: sys::CUstream,
    ) -> Result<(), InterNodeError> {
        let out_bytes = self.layout.n_pes * num_bytes;
        let check = ("all_gather", method, None);
        self.prepare(
            check,
            &[(out, out_bytes), (input, num_bytes)],
            out_bytes,
            stream,
        )?;
        let call = Call {
            input,
            out,
            ..Call::default()
        };
        match method {
            Method::Flat if num_bytes == 0 => Ok(()),
            Method::Flat => {
                let group = self.world_group("all_gather")?;
                self.rma_exchange(group, "rma_all_gather", out, input, num_bytes, None, stream)
            }
            _ => self.run_plan(
                &plan::all_gather(&self.layout, num_bytes),
                call,
                method,
                stream,
            ),
        }
    }

    /// PE `root`'s `num_bytes` at `input` into every PE's `out`. out, input: symmetric
    /// [num_bytes] (distinct buffers).
    pub fn broadcast_raw(
        &self,
        method: Method,
        out: u64,
        input: u64,
        num_bytes: usize,
        root: usize,
        stream: sys::CUstream,
    ) -> Result<(), InterNodeError> {
        ch02_symmetric_memory::check_pe(self.world(), root)?;
        let check = ("broadcast", method, None);
        self.prepare(
            check,
            &[(out, num_bytes), (input, num_bytes)],
            num_bytes,
            stream,
        )?;
        let call = Call {
            input,
            out,
            ..Call::default()
        };
        let me = self.world().my_pe();
        match method {
            Method::Flat if num_bytes == 0 => Ok(()),
            Method::Flat => {
                let group = self.world_group("broadcast")?;
                self.rma_exchange(
                    group,
                    "rma_broadcast",
                    out,
                    input,
                    num_bytes,
                    Some(root),
                    stream,
                )
            }
            _ => self.run_plan(
                &plan::broadcast(&self.layout, me, num_bytes, root),
                call,
                method,
                stream,
            ),
        }
    }

    /// Block q (num_bytes at input + q * num_bytes) of every PE to PE q, landing at
    /// out + p * num_bytes for sender p. The hierarchical one is the all-to-all-v of one row
    /// per PE. out, input: symmetric [n_pes * num_bytes].
    pub fn all_to_all_raw(
        &self,
        method: Method,
        out: u64,
        input: u64,
        num_bytes: usize,
        stream: sys::CUstream,
    ) -> Result<(), InterNodeError> {
        let n = self.layout.n_pes;
        self.prepare(
            ("all_to_all", method, None),
            &[(out, n * num_bytes), (input, n * num_bytes)],
            n * num_bytes,
            stream,
        )?;
        if num_bytes == 0 {
            return Ok(());
        }
        match method {
            Method::Flat => {
                let group = self.world_group("all_to_all")?;
                self.rma_exchange(group, "rma_all_to_all", out, input, num_bytes, None, stream)
            }
            _ => {
                let (in_splits, out_splits_offsets) = self.splits;
                let call = Call {
                    input,
                    out,
                    dtype: None,
                    in_splits,
                    out_splits_offsets,
                };
                self.all_to_all_v_plan(method, call, num_bytes, n, n, stream)
            }
        }
    }

    // ANCHOR: all_to_all_v_raw
    /// PE p sends in_splits[q] rows (in order q = 0, 1, ...) of `input` to PE q; PE q receives
    /// them after the rows of PEs 0..p-1 and learns the counts from the device:
    /// out_splits_offsets[0][p] rows came from p, starting at row out_splits_offsets[1][p].
    /// Hierarchical: each PE's rows for a node cross once, to its rail partner there, which
    /// forwards them inside the node. Counts that do not add up are found on the device by
    /// every PE and reported by the next call or `check()`.
    /// out: symmetric [out_rows, row_bytes]; input: symmetric [in_rows, row_bytes];
    /// in_splits: device int64 [n_pes]; out_splits_offsets: device int64 [2, n_pes].
    ///
    /// # Safety
    /// `in_splits` and `out_splits_offsets` must be device memory of at least n_pes and
    /// 2 x n_pes int64 on this GPU.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_to_all_v_raw(
        &self,
        method: Method,
        out: u64,
        out_rows: usize,
        input: u64,
        in_rows: usize,
        row_bytes: usize,
        in_splits: u64,
        out_splits_offsets: u64,
        stream: sys::CUstream,
    ) -> Result<(), InterNodeError> {
        if row_bytes == 0 {
            return Err(InterNodeError::invalid(
                "all_to_all_v",
                "rows must hold at least one byte",
            ));
        }
        let ranges = [(out, out_rows * row_bytes), (input, in_rows * row_bytes)];
        let check = ("all_to_all_v", method, None);
        self.prepare(check, &ranges, in_rows * row_bytes, stream)?;
        let call = Call {
            input,
            out,
            dtype: None,
            in_splits,
            out_splits_offsets,
        };
        self.all_to_all_v_plan(method, call, row_bytes, in_rows, out_rows, stream)
    }
    // ANCHOR_END: all_to_all_v_raw

    fn all_to_all_v_plan(
        &self,
        method: Method,
        call: Call,
        row_bytes: usize,
        in_rows: usize,
        out_rows: usize,
        stream: sys::CUstream,
    ) -> Result<(), InterNodeError> {
        if self.layout.n_pes > MAX_GROUP {
            let what = format!(
                "at most {MAX_GROUP} PEs (one row of counts per PE), not {}",
                self.layout.n_pes
            );
            return Err(InterNodeError::invalid("all_to_all_v", what));
        }
        let (out, input) = (call.out, call.input);
        if method == Method::Flat {
            let group = self.world_group("all_to_all_v")?;
            return self.rma_a2av(
                group, out, input, row_bytes, in_rows, out_rows, &call, stream,
            );
        }
        let slot = self.config.rail_scratch_bytes / self.layout.num_nodes() / 16 * 16;
        if row_bytes > slot {
            let (collective, what, field) = (
                "all_to_all_v",
                "landing slot per node",
                "rail_scratch_bytes",
            );
            return Err(InterNodeError::TooLarge {
                collective,
                what,
                field,
                need: row_bytes,
                have: slot,
            });
        }
        self.run_plan(
            &plan::all_to_all_v(&self.layout, row_bytes, in_rows, out_rows),
            call,
            method,
            stream,
        )
    }

    /// A barrier of this PE's rail: every rail PE entered the call (a test of the waits
    /// across nodes, and of their error messages). `stream`, as in every `*_raw` call, is a
    /// live stream of this PE's context.
    #[allow(clippy::not_unsafe_ptr_arg_deref)] // the launch reads the stream, as every call's
    pub fn rail_sync_raw(&self, stream: sys::CUstream) -> Result<(), InterNodeError> {
        self.check()?;
        // SAFETY: rma_sync takes the workspace alone.
        unsafe {
            self.rail
                .launch(&self.kernels, "rma_sync", 1, stream, &mut [])
        }
    }
}
