//! What the buffer's binding reads from torch and asks of it.
//!
//! A tensor crosses as itself: [`Tensor`] (a `FromPyObject`) reads its address, shape,
//! strides, dtype and device once, and [`Tensor::view`] turns it into the Rust crate's
//! [`View`] after checking that it lives on the buffer's GPU, so a CPU tensor or one on
//! another GPU is an error before anything is launched. Outputs are allocated here too
//! ([`Alloc`], torch.empty called from Rust), so that one DeepEP call is one crossing from
//! Python into Rust. The callables, the dtypes and the keyword arguments are looked up once;
//! a call pays a few attribute reads per input tensor and one torch.empty per output.
//!
//! Nothing here imports torch at module load: the package imports without it, and [`Torch`]
//! loads it at the first buffer call.

use std::sync::Mutex;

use nvshmem_tutorial::{ElemType, View};
use pyo3::exceptions::PyTypeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple};

use crate::errors::Error;

/// The element types the buffer takes, in the order of the per-type caches below.
const ELEMS: [ElemType; 6] = [
    ElemType::Bf16,
    ElemType::Fp8E4m3,
    ElemType::F32,
    ElemType::I32,
    ElemType::I64,
    ElemType::Bool,
];

/// `elem`'s place in `ELEMS` (a new element type fails to build here until it has one).
fn elem_index(elem: ElemType) -> usize {
    match elem {
        ElemType::Bf16 => 0,
        ElemType::Fp8E4m3 => 1,
        ElemType::F32 => 2,
        ElemType::I32 => 3,
        ElemType::I64 => 4,
        ElemType::Bool => 5,
    }
}

/// One `T` per element type, in `ELEMS` order.
fn per_elem<T: std::fmt::Debug>(make: impl FnMut(ElemType) -> PyResult<T>) -> PyResult<[T; 6]> {
    let made = ELEMS.into_iter().map(make).collect::<PyResult<Vec<T>>>()?;
    Ok(made.try_into().expect("one per element type"))
}

/// torch's functions the binding calls, looked up once per process.
pub(crate) struct Torch {
    empty: Py<PyAny>,
    /// `torch._C._cuda_getCurrentRawStream(device)`: the current stream's handle, without
    /// the Stream object `torch.cuda.current_stream()` builds.
    current_raw_stream: Py<PyAny>,
    /// `torch._C._cuda_getDevice()`.
    current_device: Py<PyAny>,
    /// `torch.cuda.current_stream` and `torch.cuda.set_stream`: only for
    /// `allocate_on_comm_stream`, which swaps torch's current stream around the allocations.
    current_stream: Py<PyAny>,
    set_stream: Py<PyAny>,
    dtypes: [Py<PyAny>; 6],
}

static TORCH: PyOnceLock<Torch> = PyOnceLock::new();

impl Torch {
    pub(crate) fn get(py: Python<'_>) -> PyResult<&'static Torch> {
        TORCH.get_or_try_init(py, || {
            let torch = py.import("torch")?;
            let c = torch.getattr("_C")?;
            let cuda = torch.getattr("cuda")?;
            let dtype = |e: ElemType| torch.getattr(e.name()).map(Bound::unbind);
            Ok::<_, PyErr>(Torch {
                empty: torch.getattr("empty")?.unbind(),
                current_raw_stream: c.getattr("_cuda_getCurrentRawStream")?.unbind(),
                current_device: c.getattr("_cuda_getDevice")?.unbind(),
                current_stream: cuda.getattr("current_stream")?.unbind(),
                set_stream: cuda.getattr("set_stream")?.unbind(),
                dtypes: per_elem(dtype)?,
            })
        })
    }

    /// The handle of torch's current stream on GPU `device`.
    pub(crate) fn current_stream(&self, py: Python<'_>, device: i32) -> PyResult<u64> {
        self.current_raw_stream.call1(py, (device,))?.extract(py)
    }

    /// torch's current GPU.
    pub(crate) fn current_device(&self, py: Python<'_>) -> PyResult<i32> {
        self.current_device.call0(py)?.extract(py)
    }

    /// torch's current stream on `device` as its Stream object.
    pub(crate) fn current_stream_object<'py>(
        &self,
        py: Python<'py>,
        device: i32,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.current_stream.bind(py).call1((device,))
    }

    /// Makes `stream` (a torch Stream object) torch's current stream.
    pub(crate) fn set_stream(&self, stream: &Bound<'_, PyAny>) -> PyResult<()> {
        self.set_stream.bind(stream.py()).call1((stream,)).map(drop)
    }
}

/// dtype objects seen so far and the element type each is (None: one the buffer does not
/// take). torch's dtypes are singletons, so after the first sight of each a lookup is a
/// pointer comparison; the entry holds a reference, so its address cannot be reused.
static SEEN_DTYPES: Mutex<Vec<(Py<PyAny>, Option<ElemType>)>> = Mutex::new(Vec::new());

fn elem_of(dtype: &Bound<'_, PyAny>) -> PyResult<Option<ElemType>> {
    let seen = |list: &Vec<(Py<PyAny>, Option<ElemType>)>| {
        list.iter()
            .find(|(d, _)| d.as_ptr() == dtype.as_ptr())
            .map(|&(_, e)| e)
    };
    let lock = || SEEN_DTYPES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(elem) = seen(&lock()) {
        return Ok(elem);
    }
    let name = dtype.str()?.to_string();
    let elem = ElemType::from_name(name.strip_prefix("torch.").unwrap_or(&name));
    let mut list = lock();
    if seen(&list).is_none() && list.len() < 64 {
        list.push((dtype.clone().unbind(), elem));
    }
    Ok(elem)
}

/// Dimensions a tensor may have here (the 3-D ones are low-latency mode's).
const MAX_DIMS: usize = 4;

/// A torch tensor as the binding reads it: once, when a call takes it as an argument.
pub(crate) struct Tensor<'py> {
    pub obj: Bound<'py, PyAny>,
    ptr: u64,
    dims: usize,
    shape: [usize; MAX_DIMS],
    /// In elements.
    strides: [usize; MAX_DIMS],
    elem: Option<ElemType>,
    /// torch's `get_device()`: the GPU's index, -1 for a CPU tensor.
    device: i64,
}

/// The items of a tuple (torch.Size, or what `stride()` returns) as sizes.
fn sizes(obj: &Bound<'_, PyAny>, out: &mut [usize; MAX_DIMS]) -> PyResult<usize> {
    let tuple = obj.cast::<PyTuple>()?;
    let dims = tuple.len();
    if dims > MAX_DIMS {
        return Err(Error::Invalid(format!(
            "a tensor of {dims} dimensions; the buffer takes at most {MAX_DIMS}"
        ))
        .into());
    }
    for (i, item) in tuple.iter().enumerate() {
        out[i] = item.extract()?;
    }
    Ok(dims)
}

impl<'a, 'py> FromPyObject<'a, 'py> for Tensor<'py> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let py = obj.py();
        let data_ptr = obj.call_method0(intern!(py, "data_ptr")).map_err(|_| {
            let kind = obj.get_type().name().map(|n| n.to_string());
            PyTypeError::new_err(format!(
                "expected a torch.Tensor, got {}",
                kind.unwrap_or_default()
            ))
        })?;
        let mut shape = [1; MAX_DIMS];
        let mut strides = [1; MAX_DIMS];
        let dims = sizes(&obj.getattr(intern!(py, "shape"))?, &mut shape)?;
        sizes(&obj.call_method0(intern!(py, "stride"))?, &mut strides)?;
        Ok(Tensor {
            ptr: data_ptr.extract()?,
            dims,
            shape,
            strides,
            elem: elem_of(&obj.getattr(intern!(py, "dtype"))?)?,
            device: obj.call_method0(intern!(py, "get_device"))?.extract()?,
            obj: obj.to_owned(),
        })
    }
}

impl<'py> Tensor<'py> {
    fn shape(&self) -> &[usize] {
        &self.shape[..self.dims]
    }

    /// The element type and the device, checked: the buffer's dtypes, on GPU `device`.
    fn checked(&self, name: &str, device: i32) -> Result<ElemType, Error> {
        if self.device != device as i64 {
            let here = if self.device < 0 {
                "a CPU tensor".to_string()
            } else {
                format!("on cuda:{}", self.device)
            };
            return Err(Error::Invalid(format!(
                "{name} is {here}, but this buffer's GPU is cuda:{device}: pass tensors on \
                 cuda:{device} (.to('cuda:{device}'))"
            )));
        }
        self.elem.ok_or_else(|| {
            let dtype = self.obj.getattr("dtype").map(|d| d.to_string());
            Error::Invalid(format!(
                "{name} is {}; the buffer takes bfloat16, float8_e4m3fn, float32, int32, int64 \
                 and bool tensors",
                dtype.unwrap_or_default()
            ))
        })
    }

    /// `name` as a 1-D or 2-D view on GPU `device`. Its shape, dtype and strides are the
    /// plans' to check; this only refuses what a [`View`] cannot describe.
    pub(crate) fn view(&self, name: &str, device: i32) -> Result<View, Error> {
        let elem = self.checked(name, device)?;
        if !(1..=2).contains(&self.dims) {
            return Err(Error::Invalid(format!(
                "{name} must be 1-D or 2-D, got shape {:?}",
                self.shape()
            )));
        }
        Ok(View {
            ptr: self.ptr,
            dims: self.dims,
            shape: [
                self.shape[0],
                if self.dims == 2 { self.shape[1] } else { 1 },
            ],
            strides: [
                self.strides[0],
                if self.dims == 2 { self.strides[1] } else { 1 },
            ],
            elem,
        })
    }

    /// `name` [..., cols] as the matrix of its rows: the leading dimensions merged, which
    /// torch's contiguity rule must allow (DeepEP's low-latency combine takes
    /// [experts, slots, hidden]).
    pub(crate) fn rows(&self, name: &str, device: i32) -> Result<View, Error> {
        if self.dims <= 2 {
            return self.view(name, device);
        }
        let elem = self.checked(name, device)?;
        let cols = self.shape[self.dims - 1];
        let leading = View {
            ptr: self.ptr,
            dims: 2,
            shape: [self.shape[..self.dims - 1].iter().product(), cols],
            strides: [cols, self.strides[self.dims - 1]],
            elem,
        };
        // The merged view is exact when the tensor is contiguous (torch's rule) over all
        // its dimensions; anything else would be read as other rows.
        let contiguous = {
            let mut expected = 1;
            (0..self.dims).rev().all(|d| {
                let ok = self.shape[d] == 1 || self.strides[d] == expected;
                expected *= self.shape[d];
                ok
            }) || self.shape().contains(&0)
        };
        if !contiguous {
            return Err(Error::Invalid(format!(
                "{name} must be contiguous (call .contiguous()), got shape {:?} with strides \
                 {:?}",
                self.shape(),
                &self.strides[..self.dims]
            )));
        }
        Ok(leading)
    }
}

/// An optional tensor argument as an optional view.
pub(crate) fn optional_view(
    tensor: &Option<Tensor<'_>>,
    name: &str,
    device: i32,
) -> Result<Option<View>, Error> {
    tensor.as_ref().map(|t| t.view(name, device)).transpose()
}

/// Output allocation for one buffer: torch.empty with the keyword arguments of each dtype
/// on the buffer's GPU, built once.
pub(crate) struct Alloc {
    kwargs: [Py<PyDict>; 6],
}

impl Alloc {
    pub(crate) fn new(py: Python<'_>, device: i32) -> PyResult<Self> {
        let torch = Torch::get(py)?;
        let device = py
            .import("torch")?
            .getattr("device")?
            .call1(("cuda", device))?;
        let kwargs = per_elem(|elem| {
            let dict = PyDict::new(py);
            dict.set_item("dtype", torch.dtypes[elem_index(elem)].bind(py))?;
            dict.set_item("device", &device)?;
            Ok(dict.unbind())
        })?;
        Ok(Self { kwargs })
    }
}

/// A contiguous array of `shape` at `ptr` as a view: a vector, or the matrix of its rows.
fn shaped(ptr: u64, shape: &[usize], elem: ElemType) -> View {
    match shape {
        [len] => View::vector(ptr, *len, elem),
        [leading @ .., cols] => View::matrix(ptr, leading.iter().product(), *cols, elem),
        [] => View::vector(ptr, 1, elem),
    }
}

/// Where a call's outputs come from. `Planned`: views of the shape and dtype each output
/// will have, at an address that passes every alignment check and is never dereferenced (the
/// plans are pure), and `None` for the tensor. A call plans with these first, so bad input
/// is refused before an output is allocated or a step that peers wait for (the notify step)
/// is launched. `Allocated`: torch.empty on the buffer's GPU.
pub(crate) enum Outputs<'a> {
    Planned,
    Allocated(&'a Alloc),
}

impl Outputs<'_> {
    /// An output of `shape` and `elem` and its view (the matrix of its rows, or a vector).
    pub(crate) fn make<'py>(
        &self,
        py: Python<'py>,
        shape: &[usize],
        elem: ElemType,
    ) -> PyResult<(Bound<'py, PyAny>, View)> {
        const PLACEHOLDER: u64 = 1 << 40;
        let Outputs::Allocated(alloc) = self else {
            return Ok((py.None().into_bound(py), shaped(PLACEHOLDER, shape, elem)));
        };
        let kwargs = alloc.kwargs[elem_index(elem)].bind(py);
        let empty = Torch::get(py)?.empty.bind(py);
        let tensor = empty.call(PyTuple::new(py, shape)?, Some(kwargs))?;
        let ptr: u64 = tensor.call_method0(intern!(py, "data_ptr"))?.extract()?;
        Ok((tensor, shaped(ptr, shape, elem)))
    }

    /// `N` outputs, each (shape, dtype), as their tensors and views.
    pub(crate) fn make_all<'py, const N: usize>(
        &self,
        py: Python<'py>,
        specs: [(&[usize], ElemType); N],
    ) -> PyResult<([Bound<'py, PyAny>; N], [View; N])> {
        let mut made = Vec::with_capacity(N);
        for (shape, elem) in specs {
            made.push(self.make(py, shape, elem)?);
        }
        let views = std::array::from_fn(|i| made[i].1);
        let tensors = made
            .into_iter()
            .map(|(tensor, _)| tensor)
            .collect::<Vec<_>>();
        Ok((tensors.try_into().expect("N outputs made"), views))
    }

    /// An output that exists only `with` something (fp8 scales, top-k): `(None, None)`
    /// without.
    pub(crate) fn make_if<'py>(
        &self,
        py: Python<'py>,
        with: bool,
        shape: &[usize],
        elem: ElemType,
    ) -> PyResult<(Bound<'py, PyAny>, Option<View>)> {
        if !with {
            return Ok((py.None().into_bound(py), None));
        }
        let (tensor, view) = self.make(py, shape, elem)?;
        Ok((tensor, Some(view)))
    }
}

/// The describe-a-tensor step alone, for the CPU tests: (address, shape, strides, dtype) of
/// the view a call would make of `tensor` named `name` for a buffer on GPU `device`
/// (`as_rows`: leading dimensions merged, as the low-latency combine reads `x`).
#[pyfunction]
#[pyo3(name = "_view")]
pub fn describe_view(
    tensor: Tensor<'_>,
    name: &str,
    device: i32,
    as_rows: bool,
) -> PyResult<(u64, Vec<usize>, Vec<usize>, &'static str)> {
    let view = if as_rows {
        tensor.rows(name, device)
    } else {
        tensor.view(name, device)
    }?;
    Ok((
        view.ptr,
        view.shape[..view.dims].to_vec(),
        view.strides[..view.dims].to_vec(),
        view.elem.name(),
    ))
}
