//! Device memory of the refused calls (raw views over poisoned allocations), and a typed
//! dispatch's outputs copied back as bytes for the checks.

use super::*;

/// Device memory of one round trip (cudarc frees it when dropped).
pub(crate) struct Gpu<'s>(pub(crate) &'s Arc<CudaStream>);

impl Gpu<'_> {
    /// `len` elements of POISON_BYTE: what nothing wrote stays recognisable.
    pub(crate) fn poisoned<T: DeviceRepr>(&self, len: usize) -> Result<CudaSlice<T>, AnyError> {
        let len = len.max(1);
        // SAFETY: uninitialised device memory of `len` elements, filled next on this stream.
        let slice = unsafe { self.0.alloc::<T>(len) }?;
        unsafe { poison(self.ptr(&slice), len * size_of::<T>(), self.0) }?;
        Ok(slice)
    }

    pub(crate) fn ptr<T>(&self, slice: &CudaSlice<T>) -> u64 {
        slice.device_ptr(self.0).0
    }
}

/// A dispatch's outputs, the 3-D tensors of DeepEP flattened to 2-D, as bytes where the element
/// type depends on the precision: on the device, poisoned before the call ([`RecvBuffers`]),
/// or copied to the host ([`Received`]).
pub(crate) struct Recv<Bytes, I32s, I64s> {
    /// [L x n x T, hidden] fp8 or bf16.
    pub(crate) x: Bytes,
    /// fp8: f32 [L x hidden/128, n x T]; UE8M0: i32 [L x hidden/512, n x T].
    pub(crate) scales: Bytes,
    /// [L, n x T] i32: each row's token on its source rank.
    pub(crate) src_info: I32s,
    /// [L, n] i64: (begin << 32) | count of each source rank's rows.
    pub(crate) layout_range: I64s,
    /// [L] i32: valid rows per local expert.
    pub(crate) count: I32s,
}

pub(crate) type RecvBuffers = Recv<CudaSlice<u8>, CudaSlice<i32>, CudaSlice<i64>>;
pub(crate) type Received = Recv<Vec<u8>, Vec<i32>, Vec<i64>>;

/// recv_x_scales' element type and rows per local expert (none for bf16).
pub(crate) fn scale_shape(precision: Precision, hidden: usize) -> Option<(ElemType, usize)> {
    match precision {
        Precision::Bf16 => None,
        Precision::Fp8 | Precision::Fp8RoundScale => Some((ElemType::F32, hidden / 128)),
        Precision::Fp8Ue8m0 => Some((ElemType::I32, hidden / 512)),
    }
}

pub(crate) fn row_bytes(precision: Precision, hidden: usize) -> usize {
    if precision == Precision::Bf16 {
        hidden * 2
    } else {
        hidden
    }
}

/// Where the scale of channel group `group` (128 channels) of packed row `i` of local expert
/// `e` lies in the scales' bytes: column-major (one column per row), f32 or one exponent byte
/// of four in an int32.
pub(crate) fn scale_bytes(
    precision: Precision,
    layout: &LlShape,
    e: usize,
    group: usize,
    i: usize,
) -> Range<usize> {
    let rows_per_expert = layout.num_ranks * layout.max_tokens;
    let groups = layout.hidden / 128;
    if precision == Precision::Fp8Ue8m0 {
        let at = ((e * (groups / 4) + group / 4) * rows_per_expert + i) * 4 + group % 4;
        at..at + 1
    } else {
        let at = ((e * groups + group) * rows_per_expert + i) * 4;
        at..at + 4
    }
}

impl RecvBuffers {
    pub(crate) fn new(gpu: &Gpu, layout: &LlShape, precision: Precision) -> Result<Self, AnyError> {
        let (l, rows_per_expert) = (
            layout.num_local_experts(),
            layout.num_ranks * layout.max_tokens,
        );
        let scale_len = scale_shape(precision, layout.hidden)
            .map_or(0, |(_, per_expert)| l * per_expert * rows_per_expert * 4);
        Ok(Self {
            x: gpu.poisoned(l * rows_per_expert * row_bytes(precision, layout.hidden))?,
            scales: gpu.poisoned(scale_len)?,
            src_info: gpu.poisoned(l * rows_per_expert)?,
            layout_range: gpu.poisoned(l * layout.num_ranks)?,
            count: gpu.poisoned(l)?,
        })
    }

    pub(crate) fn views(
        &self,
        gpu: &Gpu,
        layout: &LlShape,
        precision: Precision,
    ) -> LlDispatchOutputs {
        let (l, n) = (layout.num_local_experts(), layout.num_ranks);
        let rows_per_expert = n * layout.max_tokens;
        let recv_elem = if precision == Precision::Bf16 {
            ElemType::Bf16
        } else {
            ElemType::Fp8E4m3
        };
        LlDispatchOutputs {
            recv_x: View::matrix(
                gpu.ptr(&self.x),
                l * rows_per_expert,
                layout.hidden,
                recv_elem,
            ),
            recv_x_scales: scale_shape(precision, layout.hidden).map(|(elem, per_expert)| {
                View::matrix(gpu.ptr(&self.scales), l * per_expert, rows_per_expert, elem)
            }),
            recv_src_info: View::matrix(gpu.ptr(&self.src_info), l, rows_per_expert, ElemType::I32),
            recv_layout_range: View::matrix(gpu.ptr(&self.layout_range), l, n, ElemType::I64),
            recv_count: View::vector(gpu.ptr(&self.count), l, ElemType::I32),
        }
    }
}

impl Received {
    /// A typed dispatch's outputs on the host, rows and scales as bytes whatever the format
    /// (the checks read them as the precision of the case says).
    pub(crate) fn from_typed(
        out: &LlDispatched,
        stream: &Arc<CudaStream>,
    ) -> Result<Self, AnyError> {
        // Each element's bytes as an array, not a Vec: at 8 ranks a round trip fetches 8 M
        // elements, and a heap allocation apiece cost more than the rest of the round trip.
        fn bytes<T: Element, const B: usize>(
            a: &DeviceArray<T>,
            stream: &Arc<CudaStream>,
            to_bytes: impl Fn(T) -> [u8; B],
        ) -> Result<Vec<u8>, AnyError> {
            Ok(a.to_host(stream)?.into_iter().flat_map(to_bytes).collect())
        }
        let f32_bytes = |v: f32| v.to_ne_bytes();
        let i32_bytes = |v: i32| v.to_ne_bytes();
        let fp8_bytes = |v: Fp8E4m3| [v.0];
        let (x, scales) = match &out.x {
            LlRecvTokens::Bf16(x) => (bytes(x, stream, |v: bf16| v.to_ne_bytes())?, Vec::new()),
            LlRecvTokens::Fp8(x, s) => (bytes(x, stream, fp8_bytes)?, bytes(s, stream, f32_bytes)?),
            LlRecvTokens::Fp8Ue8m0(x, s) => {
                (bytes(x, stream, fp8_bytes)?, bytes(s, stream, i32_bytes)?)
            }
        };
        Ok(Self {
            x,
            scales,
            src_info: out.handle.src_info.to_host(stream)?,
            layout_range: out.handle.layout_range.to_host(stream)?,
            count: out.recv_count.to_host(stream)?,
        })
    }
}
