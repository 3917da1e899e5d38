//! The collectives of a `Topology`, three ways: the hierarchical plans on our kernels, the same
//! plans on NVSHMEM's team collectives over the node and rail teams, and the flat algorithms
//! (one RMA group of every PE). Every call takes device addresses and a stream (the raw layer,
//! as chapter 4's `*_raw` calls); every check is made before anything is launched.

use std::ffi::c_void;
use std::ops::Deref;

use ch01_bootstrap::World;
use ch02_symmetric_memory::{check_sizes_agree, size_checks_enabled};
use ch03_put_get::check_symmetric_range;
use ch04_collectives::config::COLL_THREADS;
use ch04_collectives::team::{enqueue_on_team, team_call};
use ch04_collectives::{Collective, DType, LaunchSpec};
use cudarc::driver::{DevicePtr, sys};

use crate::config::{MAX_GROUP, RMA_THREADS};
use crate::error::InterNodeError;
use crate::plan::{self, Buf, Plan, Scope, Step, first_part_bytes, round16};
use crate::rma::{RmaGroup, rma_blocks};
use crate::topology::Topology;

/// How a call moves its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// The hierarchical plan (plan.rs) on this chapter's kernels: chapter 4's inside the node,
    /// NVSHMEM RMA across nodes.
    Hierarchical,
    /// The same plan on NVSHMEM's on-stream team collectives over the node and rail teams
    /// (bf16 reductions; no all-to-all). The baseline.
    NvshmemTeams,
    /// Every PE with every PE through NVSHMEM RMA, as if there were no nodes.
    Flat,
}

impl Method {
    pub const ALL: [Method; 3] = [Method::Hierarchical, Method::NvshmemTeams, Method::Flat];
    /// The method called `name` (as [`Method::name`] spells it).
    pub fn from_name(name: &str) -> Option<Method> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }
    pub fn name(self) -> &'static str {
        match self {
            Method::Hierarchical => "hierarchical",
            Method::NvshmemTeams => "nvshmem_teams",
            Method::Flat => "flat",
        }
    }
}

/// What every call checks before anything is enqueued, without NVSHMEM (Python's binding makes
/// the same call before it touches the GPU): that `method` can run the collective, and that
/// the output does not overlap the input (peers write the output while this PE may still read
/// its input; all-reduce may be exactly in place). `out` and `input` are (address, bytes).
pub fn check_call(
    collective: &'static str,
    method: Method,
    dtype: Option<DType>,
    out: (u64, usize),
    input: (u64, usize),
) -> Result<(), InterNodeError> {
    if method == Method::NvshmemTeams && collective.starts_with("all_to_all") {
        let what = "method \"nvshmem_teams\" has no all-to-all (NVSHMEM has no team \
                    all-to-all-v): use \"hierarchical\" or \"flat\"";
        return Err(InterNodeError::invalid(collective, what));
    }
    if method == Method::NvshmemTeams && dtype == Some(DType::F32) {
        let what = "method \"nvshmem_teams\" reduces bf16 only (NVSHMEM's team reductions, as \
                    chapter 4's baseline): use \"hierarchical\" or \"flat\" for float32";
        return Err(InterNodeError::invalid(collective, what));
    }
    let (may_be_in_place, ((o, o_len), (i, i_len))) = (collective == "all_reduce", (out, input));
    let (o_end, i_end) = (
        o.saturating_add(o_len as u64),
        i.saturating_add(i_len as u64),
    );
    let disjoint = o_len == 0 || i_len == 0 || o_end <= i || i_end <= o;
    if disjoint || (may_be_in_place && out == input) {
        return Ok(());
    }
    let allowed = match may_be_in_place {
        true => " (the output may be the input itself, not a part of it)",
        false => "",
    };
    Err(InterNodeError::invalid(
        collective,
        format!(
            "output (bytes {o:#x}..{o_end:#x}) and input (bytes {i:#x}..{i_end:#x}) overlap; \
             pass distinct buffers{allowed}"
        ),
    ))
}

/// One call's device addresses: the caller's buffers, and the all-to-all-v count arrays.
#[derive(Debug, Clone, Copy, Default)]
struct Call {
    input: u64,
    out: u64,
    dtype: Option<DType>,
    /// device int64 [n_pes]; device int64 [2, n_pes] (all-to-all-v only)
    in_splits: u64,
    out_splits_offsets: u64,
}

fn arg<T>(value: &T) -> *mut c_void {
    value as *const T as *mut c_void
}

impl<W: Deref<Target = World> + Clone> Topology<W> {
    /// Everything before a launch: earlier failures, symmetric ranges, and (with size checks
    /// on, outside stream capture) that every PE passed the same size.
    fn prepare(
        &self,
        (collective, method, dtype): (&'static str, Method, Option<DType>),
        ranges: &[(u64, usize); 2],
        size: usize,
        stream: sys::CUstream,
    ) -> Result<(), InterNodeError> {
        check_call(collective, method, dtype, ranges[0], ranges[1])?;
        self.check()?;
        for &(ptr, num_bytes) in ranges.iter().filter(|r| r.1 > 0) {
            check_symmetric_range(self.world(), ptr, num_bytes as u64)?;
        }
        // SAFETY: a live stream of this context.
        let capturing = unsafe { cudarc::driver::result::stream::is_capturing(stream) }
            .map_err(InterNodeError::cuda("querying stream capture"))?
            != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        if size_checks_enabled() && !capturing {
            check_sizes_agree(self.world(), size as u64)?;
        }
        Ok(())
    }

    fn address(&self, buf: Buf, call: &Call) -> u64 {
        match buf {
            Buf::Input => call.input,
            Buf::Out => call.out,
            Buf::StageA => self.stages.device_ptr(),
            Buf::StageB => self.stages.device_ptr() + self.config.stage_bytes as u64,
        }
    }

    fn world_group(&self, collective: &'static str) -> Result<&RmaGroup<W>, InterNodeError> {
        self.world_group.as_ref().ok_or_else(|| {
            let n = self.layout.n_pes;
            InterNodeError::invalid(
                collective,
                format!("the flat algorithms take at most {MAX_GROUP} PEs, not {n}"),
            )
        })
    }

    // ANCHOR: run_plan
    /// Runs `plan` with `method`: each step on this PE's node, its rail, or itself.
    fn run_plan(
        &self,
        plan: &Plan,
        call: Call,
        method: Method,
        stream: sys::CUstream,
    ) -> Result<(), InterNodeError> {
        plan.check_fits(&self.config)?;
        for step in &plan.steps {
            match (step.scope(), method) {
                (Scope::Local, _) => self.local_step(step, &call, stream)?,
                (_, Method::NvshmemTeams) => {
                    self.team_step(plan.collective, step, &call, stream)?
                }
                (Scope::Node, _) => self.node_step(step, &call, stream)?,
                (Scope::Rail, _) => self.rail_step(step, &call, stream)?,
            }
        }
        Ok(())
    }
    // ANCHOR_END: run_plan

    // ANCHOR: node_step
    /// A step inside the node: chapter 4's collectives over the node's communicator.
    fn node_step(
        &self,
        step: &Step,
        call: &Call,
        stream: sys::CUstream,
    ) -> Result<(), InterNodeError> {
        let a = |buf| self.address(buf, call);
        let dtype = call.dtype.unwrap_or(DType::Bf16);
        let node = &self.node;
        match *step {
            Step::NodeReduceScatter { out, input, count } => {
                node.reduce_scatter_raw(a(out), a(input), count, dtype, None, stream)?
            }
            Step::NodeAllReduce { out, input, count } => {
                node.all_reduce_raw(a(out), a(input), count, dtype, None, stream)?
            }
            Step::NodeAllGather {
                out,
                input,
                num_bytes,
            } => node.all_gather_raw(a(out), a(input), num_bytes, None, stream)?,
            Step::NodeBroadcast {
                out,
                input,
                num_bytes,
                root,
            } => node.broadcast_raw(a(out), a(input), num_bytes, root, None, stream)?,
            Step::NodeAllToAllV {
                out,
                input,
                row_bytes,
                in_rows,
                out_rows,
            } => {
                let (splits, counts) = (call.in_splits, call.out_splits_offsets);
                // SAFETY: the caller of all_to_all_v_raw vouched for both count arrays.
                unsafe {
                    node.all_to_all_v_raw(
                        a(out),
                        out_rows,
                        a(input),
                        in_rows,
                        row_bytes,
                        splits,
                        counts,
                        stream,
                    )
                }?
            }
            Step::A2avForward {
                out,
                row_bytes,
                out_rows,
            } => self.forward(a(out), call, row_bytes, out_rows, stream)?,
            _ => unreachable!("not a node step: {step:?}"),
        }
        Ok(())
    }
    // ANCHOR_END: node_step

    /// The hierarchical all-to-all-v's second half: a call of the node's communicator (its
    /// protocol, its record) that also reads the rail group's landing slots.
    fn forward(
        &self,
        out: u64,
        call: &Call,
        row_bytes: usize,
        out_rows: usize,
        stream: sys::CUstream,
    ) -> Result<(), InterNodeError> {
        self.node.check()?;
        let (ws, rail) = (self.node.workspace(), self.rail.workspace());
        let (row_bytes, out_rows) = (row_bytes as u64, out_rows as u64);
        // Every node PE must launch the same grid (tickets are matched block by block), and
        // out_rows is each PE's own: the grid is the job's share of a GPU, whatever the call.
        let blocks = self.num_sms.max(1);
        let spec = LaunchSpec {
            kernel: "hier_a2av_forward",
            num_blocks: blocks,
            threads_per_block: COLL_THREADS,
            shared_mem_bytes: 0,
        };
        let counts = call.out_splits_offsets;
        let mut args = [
            arg(&ws),
            arg(&rail),
            arg(&out),
            arg(&counts),
            arg(&row_bytes),
            arg(&out_rows),
        ];
        // SAFETY: the arguments of hier_a2av_forward, in its order; `counts` vouched for by
        // the caller of all_to_all_v_raw.
        Ok(unsafe { self.kernels.launch(&spec, stream, &mut args) }?)
    }

    // ANCHOR: rail_step
    /// A step across nodes: an RMA kernel over this PE's rail.
    fn rail_step(
        &self,
        step: &Step,
        call: &Call,
        stream: sys::CUstream,
    ) -> Result<(), InterNodeError> {
        let a = |buf| self.address(buf, call);
        let n = self.layout.num_nodes();
        match *step {
            Step::RailReduceScatter { out, input, count } => {
                self.rma_reduce(&self.rail, false, a(out), a(input), count, call, stream)
            }
            Step::RailAllReduce { out, input, count } => {
                self.rma_reduce(&self.rail, true, a(out), a(input), count, call, stream)
            }
            Step::RailAllGather {
                out,
                input,
                num_bytes,
            } => self.rma_exchange(
                &self.rail,
                "rma_all_gather",
                a(out),
                a(input),
                num_bytes,
                None,
                stream,
            ),
            Step::RailBroadcast {
                out,
                input,
                num_bytes,
                root,
            } => self.rma_exchange(
                &self.rail,
                "rma_broadcast",
                a(out),
                a(input),
                num_bytes,
                Some(root),
                stream,
            ),
            Step::RailAllToAllV {
                out,
                input,
                row_bytes,
                in_rows,
                out_rows,
            } => self.rma_a2av(
                &self.rail,
                a(out),
                a(input),
                row_bytes,
                in_rows,
                out_rows,
                call,
                stream,
            ),
            Step::A2avSend {
                input,
                row_bytes,
                in_rows,
            } => {
                let (input, row_bytes, in_rows) = (a(input), row_bytes as u64, in_rows as u64);
                let node_pes = self.layout.node_pes as i32;
                let blocks = rma_blocks((in_rows * row_bytes) as usize / n, self.num_sms);
                let mut args = [
                    arg(&input),
                    arg(&call.in_splits),
                    arg(&row_bytes),
                    arg(&in_rows),
                    arg(&node_pes),
                ];
                // SAFETY: the arguments of hier_a2av_send after its workspace, in order.
                unsafe {
                    self.rail
                        .launch(&self.kernels, "hier_a2av_send", blocks, stream, &mut args)
                }
            }
            _ => unreachable!("not a rail step: {step:?}"),
        }
    }
    // ANCHOR_END: rail_step

    /// Reduce-scatter (`all_reduce` false) or all-reduce over `group`, in its landing space.
    #[allow(clippy::too_many_arguments)]
    fn rma_reduce(
        &self,
        group: &RmaGroup<W>,
        all_reduce: bool,
        out: u64,
        input: u64,
        count: usize,
        call: &Call,
        stream: sys::CUstream,
    ) -> Result<(), InterNodeError> {
        let (dtype, size) = (call.dtype.unwrap_or(DType::Bf16), group.team().size);
        let part = match all_reduce {
            true => first_part_bytes(count * dtype.size(), size),
            false => count * dtype.size(),
        };
        let (need, have) = (
            size * round16(part),
            group.workspace().scratch_bytes as usize,
        );
        if need > have {
            let field = if group.team().stride == 1 {
                "world_scratch_bytes"
            } else {
                "rail_scratch_bytes"
            };
            let collective = if all_reduce {
                "all_reduce"
            } else {
                "reduce_scatter"
            };
            let what = "landing space";
            return Err(InterNodeError::TooLarge {
                collective,
                what,
                field,
                need,
                have,
            });
        }
        let kernel = match (all_reduce, dtype) {
            (true, DType::F32) => "rma_all_reduce_f32",
            (true, DType::Bf16) => "rma_all_reduce_bf16",
            (false, DType::F32) => "rma_reduce_scatter_f32",
            (false, DType::Bf16) => "rma_reduce_scatter_bf16",
        };
        let count = count as u64;
        let mut args = [arg(&input), arg(&out), arg(&count)];
        // SAFETY: the arguments of the reduction kernels after the workspace, in order.
        unsafe {
            group.launch(
                &self.kernels,
                kernel,
                rma_blocks(part, self.num_sms),
                stream,
                &mut args,
            )
        }
    }

    /// All-gather (every member sends), all-to-all, or broadcast (`root`) over `group`.
    #[allow(clippy::too_many_arguments)]
    fn rma_exchange(
        &self,
        group: &RmaGroup<W>,
        kernel: &'static str,
        out: u64,
        input: u64,
        num_bytes: usize,
        root: Option<usize>,
        stream: sys::CUstream,
    ) -> Result<(), InterNodeError> {
        let blocks = rma_blocks(num_bytes, self.num_sms);
        let (num_bytes, root) = (num_bytes as u64, root.unwrap_or(0) as i32);
        let mut args = [arg(&input), arg(&out), arg(&num_bytes), arg(&root)];
        let used = if kernel == "rma_broadcast" { 4 } else { 3 };
        // SAFETY: the arguments of the exchange kernels after the workspace, in order.
        unsafe { group.launch(&self.kernels, kernel, blocks, stream, &mut args[..used]) }
    }

    /// All-to-all-v over `group` (the flat kernel: rows straight into the outputs).
    #[allow(clippy::too_many_arguments)]
    fn rma_a2av(
        &self,
        group: &RmaGroup<W>,
        out: u64,
        input: u64,
        row_bytes: usize,
        in_rows: usize,
        out_rows: usize,
        call: &Call,
        stream: sys::CUstream,
    ) -> Result<(), InterNodeError> {
        // From in_rows, which every PE passes alike (prepare checks it), never out_rows (each
        // PE's own): every member must launch the same grid.
        let blocks = rma_blocks(in_rows * row_bytes / group.team().size, self.num_sms);
        let (row_bytes, in_rows, out_rows) = (row_bytes as u64, in_rows as u64, out_rows as u64);
        let (splits, counts) = (call.in_splits, call.out_splits_offsets);
        let mut args = [
            arg(&input),
            arg(&out),
            arg(&splits),
            arg(&counts),
            arg(&row_bytes),
            arg(&in_rows),
            arg(&out_rows),
        ];
        // SAFETY: the arguments of rma_all_to_all_v after the workspace, in order.
        unsafe { group.launch(&self.kernels, "rma_all_to_all_v", blocks, stream, &mut args) }
    }

    // ANCHOR: team_step
    /// A node or rail step on NVSHMEM's own on-stream team collectives (bf16 reductions).
    fn team_step(
        &self,
        collective: &'static str,
        step: &Step,
        call: &Call,
        stream: sys::CUstream,
    ) -> Result<(), InterNodeError> {
        let (team, team_pes) = match step.scope() {
            Scope::Node => (self.teams.node, self.layout.node_pes),
            _ => (self.teams.rail, self.layout.num_nodes()),
        };
        let bf16 = DType::Bf16.size(); // check_call refuses other sums on NVSHMEM's teams
        let (c, size, out, input, root) = match *step {
            Step::NodeReduceScatter { out, input, count }
            | Step::RailReduceScatter { out, input, count } => (
                Collective::ReduceScatter,
                team_pes * count * bf16,
                out,
                input,
                0,
            ),
            Step::NodeAllReduce { out, input, count }
            | Step::RailAllReduce { out, input, count } => {
                (Collective::AllReduce, count * bf16, out, input, 0)
            }
            Step::NodeAllGather {
                out,
                input,
                num_bytes,
            }
            | Step::RailAllGather {
                out,
                input,
                num_bytes,
            } => (Collective::AllGather, team_pes * num_bytes, out, input, 0),
            Step::NodeBroadcast {
                out,
                input,
                num_bytes,
                root,
            }
            | Step::RailBroadcast {
                out,
                input,
                num_bytes,
                root,
            } => (Collective::Broadcast, num_bytes, out, input, root),
            // check_call refuses what NVSHMEM's teams cannot do before any step runs.
            _ => {
                let what = "NVSHMEM has no team all-to-all-v";
                return Err(InterNodeError::invalid(collective, what));
            }
        };
        // ANCHOR: team_enqueue
        debug_assert_ne!(call.dtype, Some(DType::F32), "check_call refuses f32 teams");
        let team_call = team_call(c, size, team_pes)?;
        let (out, input) = (self.address(out, call), self.address(input, call));
        // SAFETY: symmetric addresses checked by `prepare` (or the topology's stages) holding
        // the bytes the plan's extents say; a team of this PE; the caller's stream.
        Ok(unsafe { enqueue_on_team(self.world(), team, &team_call, out, input, root, stream) }?)
        // ANCHOR_END: team_enqueue
    }
    // ANCHOR_END: team_step

    /// A step of this PE alone: a permutation, a copy, a fill.
    fn local_step(
        &self,
        step: &Step,
        call: &Call,
        stream: sys::CUstream,
    ) -> Result<(), InterNodeError> {
        let a = |buf| self.address(buf, call);
        match *step {
            Step::Permute {
                out,
                input,
                outer,
                inner,
                block_bytes,
            } => {
                let (out, input) = (a(out), a(input));
                let (outer, inner, block) = (outer as u64, inner as u64, block_bytes as u64);
                let blocks = (outer * inner).clamp(1, u64::from(self.num_sms)) as u32;
                let spec = LaunchSpec {
                    kernel: "local_permute",
                    num_blocks: blocks,
                    threads_per_block: RMA_THREADS,
                    shared_mem_bytes: 0,
                };
                let mut args = [
                    arg(&input),
                    arg(&out),
                    arg(&outer),
                    arg(&inner),
                    arg(&block),
                ];
                // SAFETY: the arguments of local_permute, in order; both buffers hold
                // outer x inner x block bytes (the plan's extents, checked).
                unsafe { self.kernels.launch(&spec, stream, &mut args) }?
            }
            Step::Copy {
                out,
                input,
                num_bytes,
            } if a(out) != a(input) => {
                // SAFETY: both ranges hold num_bytes (the plan's extents); stream order.
                unsafe {
                    cudarc::driver::result::memcpy_dtod_async(a(out), a(input), num_bytes, stream)
                }
                .map_err(InterNodeError::cuda("copying to a stage"))?
            }
            Step::Copy { .. } => {}
            Step::Zero {
                buf,
                offset,
                num_bytes,
            } => {
                // SAFETY: the stage holds offset + num_bytes (the plan's extents, checked).
                unsafe {
                    cudarc::driver::result::memset_d8_async(
                        a(buf) + offset as u64,
                        0,
                        num_bytes,
                        stream,
                    )
                }
                .map_err(InterNodeError::cuda("zeroing a stage"))?
            }
            _ => unreachable!("not a local step: {step:?}"),
        }
        Ok(())
    }
}

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
                let in_splits = self.ones.device_ptr(self.world().stream()).0;
                let out_splits_offsets = self.received.device_ptr(self.world().stream()).0;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_method_cannot_do_and_overlaps_are_refused_before_any_launch() {
        let (a, b) = ((0x1000, 64), (0x9000, 64));
        let refused = |r: Result<(), InterNodeError>| r.unwrap_err().to_string();
        let teams = Method::NvshmemTeams;
        let f32_teams = refused(check_call("all_reduce", teams, Some(DType::F32), a, b));
        assert!(f32_teams.contains("bf16 only"), "{f32_teams}");
        // Size 0 too: the refusal does not depend on the plan having a step.
        let empty = refused(check_call(
            "reduce_scatter",
            teams,
            Some(DType::F32),
            (a.0, 0),
            b,
        ));
        assert!(empty.contains("bf16 only"), "{empty}");
        for c in ["all_to_all", "all_to_all_v"] {
            assert!(refused(check_call(c, teams, None, a, b)).contains("no team all-to-all-v"));
        }
        check_call("all_reduce", teams, Some(DType::Bf16), a, b).unwrap();
        for m in [Method::Hierarchical, Method::Flat] {
            check_call("all_reduce", m, Some(DType::F32), a, b).unwrap();
            check_call("all_to_all_v", m, None, a, b).unwrap();
        }
        // Exactly in place: all-reduce only. Partly overlapping: nothing.
        check_call("all_reduce", Method::Flat, Some(DType::F32), a, a).unwrap();
        let bcast = refused(check_call("broadcast", Method::Flat, None, a, a));
        assert!(
            bcast.contains("broadcast: output (bytes 0x1000..0x1040)"),
            "{bcast}"
        );
        let part = refused(check_call(
            "all_reduce",
            Method::Flat,
            None,
            a,
            (0x1020, 64),
        ));
        assert!(part.contains("not a part of it"), "{part}");
        check_call("all_gather", Method::Flat, None, a, (0x1040, 64)).unwrap(); // adjacent
        check_call("all_gather", Method::Flat, None, (0x1000, 0), a).unwrap(); // empty
    }

    #[test]
    fn method_names_read_back() {
        for m in Method::ALL {
            assert_eq!(Method::from_name(m.name()), Some(m));
        }
        assert_eq!(Method::from_name("hier"), None);
    }
}
