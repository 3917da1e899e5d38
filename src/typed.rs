//! The safe layer: the buffer's calls over typed device arrays, on the world's stream, as a
//! Rust program uses them (chapters 7 and 8's programs do).
//!
//! What the types guarantee, where the raw layer (`*_raw`, over [`View`]s) leaves it to the
//! caller:
//! - every array is device memory of this PE's GPU, of its element type and shape, alive for
//!   the call (a [`DeviceArray`] owns its allocation; cudarc frees it in stream order);
//! - calls take `&mut self`: no two calls of one buffer overlap, and a low-latency send
//!   ([`NvshmemBuffer::low_latency_dispatch_send`]) borrows the buffer until its receive has
//!   run, so "one call in flight" holds at compile time;
//! - a view into the buffer's own memory ([`StagingRows`]) borrows the buffer and cannot
//!   outlive it.
//!
//! Outputs are allocated here, and with [`NvshmemBuffer::set_poison_outputs`] filled with
//! `POISON_BYTE` first, so that a test sees any element no kernel wrote.

use std::ops::Deref;
use std::sync::Arc;

use ch01_bootstrap::World;
use ch01_bootstrap::checks::POISON_BYTE;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DeviceRepr, ValidAsZeroBits};
use half::bf16;

use crate::buffer::NvshmemBuffer;
use crate::combine::{CombineInputs, CombineOutputs};
use crate::config::Config;
use crate::dispatch::{DispatchInputs, DispatchOutputs};
use crate::error::BufferError;
use crate::handle::Handle;
use crate::layout::LayoutOutputs;
use crate::notify::{NotifyInputs, NotifyOutputs};
use crate::view::{ElemType, View};

mod low_latency;
pub use low_latency::{
    LlDispatchHandle, LlDispatched, LlRecvTokens, LlStats, Pending, StagingRows,
};

/// One fp8 e4m3 value, as its bits (the buffer moves fp8 rows; it never computes with them).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fp8E4m3(pub u8);

// SAFETY: a plain byte, valid for any bit pattern, zero included.
unsafe impl DeviceRepr for Fp8E4m3 {}
unsafe impl ValidAsZeroBits for Fp8E4m3 {}

/// An element type the buffer's calls take, with the dtype the checks compare against.
pub trait Element: DeviceRepr + ValidAsZeroBits + Copy {
    const ELEM: ElemType;
}
macro_rules! element {
    ($($t:ty => $elem:ident),* $(,)?) => {
        $(impl Element for $t {
            const ELEM: ElemType = ElemType::$elem;
        })*
    };
}
element!(bf16 => Bf16, Fp8E4m3 => Fp8E4m3, f32 => F32, i32 => I32, i64 => I64, bool => Bool);

/// What `DeviceArray::from_host` makes of `len` elements as [rows, cols]: (dims, shape), a
/// vector [rows] when `cols == 0` (so an [S, 0] matrix is a vector of S, which 0 elements do
/// not fill: lay an empty matrix out as [0, S], or as a vector of 0), or why they do not fit.
/// Pure: a program checks the arrays it will allocate on the CPU with it.
pub fn host_shape(
    len: usize,
    rows: usize,
    cols: usize,
) -> Result<(usize, [usize; 2]), BufferError> {
    let (dims, shape) = if cols == 0 {
        (1, [rows, 1])
    } else {
        (2, [rows, cols])
    };
    if len != shape[0] * shape[1] {
        return Err(BufferError::invalid(
            "DeviceArray::from_host",
            format!("{len} elements for a [{rows}, {cols}] array"),
        ));
    }
    Ok((dims, shape))
}

/// A row-major vector [len] or matrix [rows, cols] of `T` on this PE's GPU, owning its memory.
pub struct DeviceArray<T> {
    data: CudaSlice<T>,
    view: View,
}

impl<T: Element> DeviceArray<T> {
    fn wrap(data: CudaSlice<T>, stream: &CudaStream, dims: usize, shape: [usize; 2]) -> Self {
        let ptr = data.device_ptr(stream).0;
        let view = match dims {
            1 => View::vector(ptr, shape[0], T::ELEM),
            _ => View::matrix(ptr, shape[0], shape[1], T::ELEM),
        };
        Self { data, view }
    }

    /// `host` as a [rows, cols] matrix (`cols == 0` for a vector of `host.len()`).
    pub fn from_host(
        stream: &Arc<CudaStream>,
        host: &[T],
        rows: usize,
        cols: usize,
    ) -> Result<Self, BufferError> {
        let (dims, shape) = host_shape(host.len(), rows, cols)?;
        // An empty array still gets an address (the kernels take zero-row views).
        let data = if host.is_empty() {
            stream.alloc_zeros::<T>(1)
        } else {
            stream.clone_htod(host)
        }
        .map_err(BufferError::cuda("copying an array to the GPU"))?;
        Ok(Self::wrap(data, stream, dims, shape))
    }

    /// An output of `dims` dimensions: zeros, or with `poison` every byte POISON_BYTE.
    fn output(
        stream: &Arc<CudaStream>,
        dims: usize,
        shape: [usize; 2],
        poison: bool,
    ) -> Result<Self, BufferError> {
        let len = (shape[0] * shape[1]).max(1);
        let data = stream
            .alloc_zeros::<T>(len)
            .map_err(BufferError::cuda("allocating an output"))?;
        let array = Self::wrap(data, stream, dims, shape);
        if poison {
            let bytes = len * size_of::<T>();
            // SAFETY: the allocation just made, `bytes` long, on this stream.
            unsafe {
                cudarc::driver::result::memset_d8_async(
                    array.view.ptr,
                    POISON_BYTE,
                    bytes,
                    stream.cu_stream(),
                )
            }
            .map_err(BufferError::cuda("poisoning an output"))?;
        }
        Ok(array)
    }

    /// The elements, row-major (waits for the stream).
    pub fn to_host(&self, stream: &Arc<CudaStream>) -> Result<Vec<T>, BufferError> {
        let mut host = stream
            .clone_dtoh(&self.data)
            .map_err(BufferError::cuda("copying an array to the host"))?;
        host.truncate(self.len());
        Ok(host)
    }

    pub fn len(&self) -> usize {
        self.view.shape[0] * self.view.shape[1]
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn rows(&self) -> usize {
        self.view.rows()
    }
    pub fn cols(&self) -> usize {
        self.view.cols()
    }
    /// The raw layer's description of this array (valid while it lives).
    pub fn view(&self) -> View {
        self.view
    }
}

fn view_of<T: Element>(array: Option<&DeviceArray<T>>) -> Option<View> {
    array.map(DeviceArray::view)
}

/// Tokens to dispatch: bf16 rows, or fp8 rows with one f32 scale per `FP8_GROUP` channels.
#[derive(Clone, Copy)]
pub enum Tokens<'a> {
    Bf16(&'a DeviceArray<bf16>),
    Fp8(&'a DeviceArray<Fp8E4m3>, &'a DeviceArray<f32>),
}

/// Tokens received, in the format they were sent.
pub enum RecvTokens {
    Bf16(DeviceArray<bf16>),
    Fp8(DeviceArray<Fp8E4m3>, DeviceArray<f32>),
}

impl RecvTokens {
    pub fn rows(&self) -> usize {
        match self {
            Self::Bf16(x) => x.rows(),
            Self::Fp8(x, _) => x.rows(),
        }
    }
}

/// A token's experts: global ids (-1 for none) [N, K] and their weights [N, K].
#[derive(Clone, Copy)]
pub struct TopK<'a> {
    pub idx: &'a DeviceArray<i64>,
    pub weights: &'a DeviceArray<f32>,
}

/// `get_dispatch_layout`'s results: tokens per rank [R], per expert [E], routing [N, R].
pub struct Layout {
    pub num_tokens_per_rank: DeviceArray<i32>,
    /// Tokens per node (DeepEP's `num_tokens_per_rdma_rank`), when the buffer spans several.
    pub num_tokens_per_rdma_rank: Option<DeviceArray<i32>>,
    pub num_tokens_per_expert: DeviceArray<i32>,
    pub is_token_in_rank: DeviceArray<bool>,
}

/// DeepEP's intranode handle (src/handle.rs says what each part holds), owned.
pub struct DispatchHandle {
    pub rank_prefix_matrix: DeviceArray<i32>,
    pub channel_prefix_matrix: DeviceArray<i32>,
    pub recv_channel_prefix_matrix: DeviceArray<i32>,
    pub recv_src_idx: DeviceArray<i32>,
    pub is_token_in_rank: DeviceArray<bool>,
    pub send_head: DeviceArray<i32>,
}

impl DispatchHandle {
    fn views(&self) -> Handle {
        Handle {
            rank_prefix_matrix: self.rank_prefix_matrix.view(),
            channel_prefix_matrix: self.channel_prefix_matrix.view(),
            recv_channel_prefix_matrix: self.recv_channel_prefix_matrix.view(),
            recv_src_idx: self.recv_src_idx.view(),
            is_token_in_rank: self.is_token_in_rank.view(),
            send_head: self.send_head.view(),
        }
    }
}

/// A dispatch's results: the rows received (grouped by source rank), their top-k restricted
/// to this rank's experts (local ids, -1 elsewhere), tokens per local expert, the handle.
pub struct Dispatched {
    pub x: RecvTokens,
    pub topk_idx: Option<DeviceArray<i64>>,
    pub topk_weights: Option<DeviceArray<f32>>,
    pub num_recv_tokens_per_expert: Vec<i32>,
    pub handle: DispatchHandle,
}

impl<W: Deref<Target = World>> NvshmemBuffer<W> {
    fn stream(&self) -> Arc<CudaStream> {
        self.world().stream().clone()
    }

    fn output<T: Element>(&self, rows: usize, cols: usize) -> Result<DeviceArray<T>, BufferError> {
        let (dims, shape) = if cols == 0 {
            (1, [rows, 1])
        } else {
            (2, [rows, cols])
        };
        DeviceArray::output(&self.stream(), dims, shape, self.poison_outputs)
    }

    /// Every output the typed calls allocate is filled with POISON_BYTE first (a test sees
    /// any element no kernel wrote); off by default.
    pub fn set_poison_outputs(&mut self, poison: bool) {
        self.poison_outputs = poison;
    }

    /// DeepEP's `get_dispatch_layout` for `topk_idx` [N, K].
    pub fn get_dispatch_layout(
        &mut self,
        topk_idx: &DeviceArray<i64>,
        num_experts: usize,
    ) -> Result<Layout, BufferError> {
        let (n, num_tokens) = (self.world().n_pes(), topk_idx.rows());
        let num_nodes = n / self.spec().node_pes;
        let layout = Layout {
            num_tokens_per_rank: self.output(n, 0)?,
            num_tokens_per_rdma_rank: (num_nodes > 1)
                .then(|| self.output(num_nodes, 0))
                .transpose()?,
            num_tokens_per_expert: self.output(num_experts, 0)?,
            is_token_in_rank: self.output(num_tokens, n)?,
        };
        let out = LayoutOutputs {
            num_tokens_per_rank: layout.num_tokens_per_rank.view(),
            num_tokens_per_rdma_rank: layout.num_tokens_per_rdma_rank.as_ref().map(|a| a.view()),
            num_tokens_per_expert: layout.num_tokens_per_expert.view(),
            is_token_in_rank: layout.is_token_in_rank.view(),
        };
        let stream = self.stream();
        // SAFETY: typed arrays of this GPU, alive for the call; the world's stream.
        unsafe {
            self.get_dispatch_layout_raw(&topk_idx.view(), num_experts, &out, stream.cu_stream())
        }?;
        Ok(layout)
    }

    // ANCHOR: typed_dispatch
    /// DeepEP's intranode dispatch without a handle: the notify step (one bounded wait for
    /// the counts), then the tokens to the ranks of their experts.
    pub fn dispatch(
        &mut self,
        x: Tokens<'_>,
        topk: Option<TopK<'_>>,
        layout: &Layout,
        expert_alignment: usize,
        config: &Config,
    ) -> Result<Dispatched, BufferError> {
        let (n, c) = (self.world().n_pes(), config.num_channels());
        let stream = self.stream();
        let handle_part = |s: &Self| -> Result<[DeviceArray<i32>; 3], BufferError> {
            Ok([s.output(n, n)?, s.output(n, c)?, s.output(n, c)?])
        };
        let [rank_prefix, channel_prefix, recv_channel_prefix] = handle_part(self)?;
        let notify_in = NotifyInputs {
            num_tokens_per_rank: layout.num_tokens_per_rank.view(),
            num_tokens_per_expert: layout.num_tokens_per_expert.view(),
            is_token_in_rank: layout.is_token_in_rank.view(),
            expert_alignment,
        };
        let notify_out = NotifyOutputs {
            rank_prefix_matrix: rank_prefix.view(),
            channel_prefix_matrix: channel_prefix.view(),
            recv_channel_prefix_matrix: recv_channel_prefix.view(),
        };
        // SAFETY: typed arrays of this GPU, alive for the call; the world's stream.
        let counts =
            unsafe { self.notify_raw(&notify_in, &notify_out, config, true, stream.cu_stream()) }?
                .expect("notify_raw with wait returns the counts");
        let rows = counts.num_recv_tokens;
        let num_tokens = layout.is_token_in_rank.rows();
        let is_token_in_rank = DeviceArray::wrap(
            stream
                .clone_dtod(&layout.is_token_in_rank.data)
                .map_err(BufferError::cuda("copying the routing into the handle"))?,
            &stream,
            2,
            [num_tokens, n],
        );
        let handle = DispatchHandle {
            rank_prefix_matrix: rank_prefix,
            channel_prefix_matrix: channel_prefix,
            recv_channel_prefix_matrix: recv_channel_prefix,
            recv_src_idx: self.output(rows, 0)?,
            is_token_in_rank,
            send_head: self.output(num_tokens, n)?,
        };
        let recv_x = self.recv_tokens(x, rows)?;
        let num_topk = topk.map_or(0, |t| t.idx.cols());
        let (recv_idx, recv_w) = match topk {
            Some(_) => (
                Some(self.output::<i64>(rows, num_topk)?),
                Some(self.output::<f32>(rows, num_topk)?),
            ),
            None => (None, None),
        };
        let outputs = DispatchOutputs {
            recv_topk_idx: view_of(recv_idx.as_ref()),
            recv_topk_weights: view_of(recv_w.as_ref()),
            ..recv_views(&recv_x)
        };
        let inputs = DispatchInputs {
            topk_idx: topk.map(|t| t.idx.view()),
            topk_weights: topk.map(|t| t.weights.view()),
            num_experts: layout.num_tokens_per_expert.len(),
            ..token_views(x)
        };
        // SAFETY: as above.
        let handle_views = handle.views();
        unsafe { self.dispatch_raw(&inputs, &handle_views, &outputs, config, stream.cu_stream()) }?;
        Ok(Dispatched {
            x: recv_x,
            topk_idx: recv_idx,
            topk_weights: recv_w,
            num_recv_tokens_per_expert: counts.per_local_expert,
            handle,
        })
    }
    // ANCHOR_END: typed_dispatch

    /// Dispatch with the handle of an earlier dispatch of the same routing: no notify step.
    pub fn dispatch_cached(
        &mut self,
        x: Tokens<'_>,
        handle: &DispatchHandle,
        config: &Config,
    ) -> Result<RecvTokens, BufferError> {
        let recv_x = self.recv_tokens(x, handle.recv_src_idx.len())?;
        let stream = self.stream();
        // SAFETY: typed arrays of this GPU, alive for the call; the world's stream.
        unsafe {
            self.dispatch_raw(
                &token_views(x),
                &handle.views(),
                &recv_views(&recv_x),
                config,
                stream.cu_stream(),
            )
        }?;
        Ok(recv_x)
    }

    fn recv_tokens(&self, x: Tokens<'_>, rows: usize) -> Result<RecvTokens, BufferError> {
        Ok(match x {
            Tokens::Bf16(x) => RecvTokens::Bf16(self.output(rows, x.cols())?),
            Tokens::Fp8(x, s) => {
                RecvTokens::Fp8(self.output(rows, x.cols())?, self.output(rows, s.cols())?)
            }
        })
    }

    /// DeepEP's intranode combine with the handle of the dispatch that delivered `x`'s rows:
    /// (combined_x [N, H], combined_topk_weights [N, K] with `topk_weights`).
    pub fn combine(
        &mut self,
        x: &DeviceArray<bf16>,
        topk_weights: Option<&DeviceArray<f32>>,
        bias: [Option<&DeviceArray<bf16>>; 2],
        handle: &DispatchHandle,
        config: &Config,
    ) -> Result<(DeviceArray<bf16>, Option<DeviceArray<f32>>), BufferError> {
        let num_tokens = handle.send_head.rows();
        let combined = self.output::<bf16>(num_tokens, x.cols())?;
        let combined_w = match topk_weights {
            Some(w) => Some(self.output::<f32>(num_tokens, w.cols())?),
            None => None,
        };
        let inputs = CombineInputs {
            x: x.view(),
            topk_weights: view_of(topk_weights),
            bias: [view_of(bias[0]), view_of(bias[1])],
        };
        let outputs = CombineOutputs {
            combined_x: combined.view(),
            combined_topk_weights: view_of(combined_w.as_ref()),
        };
        let stream = self.stream();
        // SAFETY: typed arrays of this GPU, alive for the call; the world's stream.
        unsafe {
            self.combine_raw(
                &inputs,
                &handle.views(),
                &outputs,
                config,
                stream.cu_stream(),
            )
        }?;
        Ok((combined, combined_w))
    }
}

fn token_views(x: Tokens<'_>) -> DispatchInputs {
    let (x, x_scales) = match x {
        Tokens::Bf16(x) => (x.view(), None),
        Tokens::Fp8(x, s) => (x.view(), Some(s.view())),
    };
    DispatchInputs {
        x,
        x_scales,
        topk_idx: None,
        topk_weights: None,
        num_experts: 0,
    }
}

fn recv_views(x: &RecvTokens) -> DispatchOutputs {
    let (recv_x, recv_x_scales) = match x {
        RecvTokens::Bf16(x) => (x.view(), None),
        RecvTokens::Fp8(x, s) => (x.view(), Some(s.view())),
    };
    DispatchOutputs {
        recv_x,
        recv_x_scales,
        recv_topk_idx: None,
        recv_topk_weights: None,
    }
}
