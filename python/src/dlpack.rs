//! DLPack capsules: how a device pointer becomes a torch tensor without a copy.
//!
//! Why DLPack and not `__cuda_array_interface__`: torch builds a tensor from the CUDA array
//! interface by asking the driver which GPU owns the pointer. For a peer view that answer is
//! the *peer's* GPU (NVSHMEM maps the peer's physical memory into our address space), so
//! `torch.as_tensor(..., device=ours)` would silently copy instead of aliasing. A DLPack
//! tensor names its device explicitly, and torch takes it as given. (The interface path also
//! needs numpy at run time, which torch does not require.)
//!
//! Layout: DLPack 0.8's unversioned `DLManagedTensor` in a capsule named "dltensor"; the
//! consumer renames the capsule to "used_dltensor" and calls our deleter when its tensor dies.

use std::ffi::{CStr, c_void};
use std::sync::Arc;

use pyo3::ffi;
use pyo3::prelude::*;

use crate::state::Token;

#[repr(C)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

const DL_CUDA: i32 = 2;
const DL_UINT: u8 = 1;
const CAPSULE_NAME: &CStr = c"dltensor";
const USED_CAPSULE_NAME: &CStr = c"used_dltensor";

/// What the capsule owns: the shape/stride arrays DLTensor points into, and the token that
/// keeps the symmetric allocation from being released while torch's storage lives.
struct Context {
    shape: [i64; 1],
    strides: [i64; 1],
    /// Never read: holding it is the point.
    _owner: Arc<Token>,
}

unsafe extern "C" fn delete_managed(managed: *mut DLManagedTensor) {
    if managed.is_null() {
        return;
    }
    // SAFETY: `managed` and its context were leaked from Boxes in `byte_tensor` and are
    // deleted exactly once (by the consumer, or by the capsule destructor if never consumed).
    let managed = unsafe { Box::from_raw(managed) };
    let context = unsafe { Box::from_raw(managed.manager_ctx as *mut Context) };
    // No Python here: torch calls this on whatever thread frees the storage, possibly
    // without the GIL. Dropping the token only pushes an id onto a queue.
    drop(context);
}

unsafe extern "C" fn capsule_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: called by Python with the GIL held on our capsule. Only a capsule that was never
    // consumed still carries the name "dltensor"; a consumer renamed it and owns the tensor.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, CAPSULE_NAME.as_ptr()) == 1 {
            let managed = ffi::PyCapsule_GetPointer(capsule, CAPSULE_NAME.as_ptr());
            delete_managed(managed as *mut DLManagedTensor);
        } else {
            ffi::PyErr_Clear(); // IsValid does not raise, but keep the error state clean
        }
    }
}

/// A DLPack capsule for `num_bytes` bytes (1-D uint8) at device address `ptr` on CUDA GPU
/// `device`, holding `owner` until the consumer's tensor dies.
pub fn byte_tensor(
    py: Python<'_>,
    ptr: u64,
    num_bytes: usize,
    device: i32,
    owner: Arc<Token>,
) -> PyResult<Py<PyAny>> {
    let context = Box::into_raw(Box::new(Context {
        shape: [num_bytes as i64],
        strides: [1],
        _owner: owner,
    }));
    let managed = Box::into_raw(Box::new(DLManagedTensor {
        dl_tensor: DLTensor {
            data: ptr as usize as *mut c_void,
            device: DLDevice {
                device_type: DL_CUDA,
                device_id: device,
            },
            ndim: 1,
            dtype: DLDataType {
                code: DL_UINT,
                bits: 8,
                lanes: 1,
            },
            // SAFETY: `context` is a live Box until the deleter runs.
            shape: unsafe { (*context).shape.as_mut_ptr() },
            strides: unsafe { (*context).strides.as_mut_ptr() },
            byte_offset: 0,
        },
        manager_ctx: context as *mut c_void,
        deleter: Some(delete_managed),
    }));
    // SAFETY: GIL held; on failure we free what we leaked and return Python's error.
    let capsule = unsafe {
        ffi::PyCapsule_New(
            managed as *mut c_void,
            CAPSULE_NAME.as_ptr(),
            Some(capsule_destructor),
        )
    };
    if capsule.is_null() {
        unsafe { delete_managed(managed) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a new, owned reference.
    Ok(unsafe { Bound::from_owned_ptr(py, capsule) }.unbind())
}

/// Marks `capsule` consumed ("used_dltensor") after a consumer built a tensor from it, so that
/// its destructor never runs the deleter the consumer now owns. Consumers are supposed to
/// rename it themselves; doing it again is harmless and makes a double free impossible even
/// with one that does not. Not a capsule of ours, or already renamed: nothing happens.
pub fn mark_consumed(capsule: &Bound<'_, PyAny>) {
    let raw = capsule.as_ptr();
    // SAFETY: GIL held (we have a Bound); IsValid accepts any object and never raises.
    unsafe {
        if ffi::PyCapsule_IsValid(raw, CAPSULE_NAME.as_ptr()) == 1 {
            ffi::PyCapsule_SetName(raw, USED_CAPSULE_NAME.as_ptr());
        }
    }
}
