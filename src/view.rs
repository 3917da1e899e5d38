//! Device views: what the buffer's calls take and fill instead of tensors. A view is an
//! address on this PE's GPU with a shape, strides (in elements) and an element type; the
//! caller owns the memory (torch's caching allocator from Python, cudarc from Rust).

use crate::error::BufferError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElemType {
    Bf16,
    Fp8E4m3,
    F32,
    I32,
    I64,
    Bool,
}

impl ElemType {
    pub fn size(self) -> usize {
        match self {
            Self::Fp8E4m3 | Self::Bool => 1,
            Self::Bf16 => 2,
            Self::F32 | Self::I32 => 4,
            Self::I64 => 8,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Self::Bf16 => "bfloat16",
            Self::Fp8E4m3 => "float8_e4m3fn",
            Self::F32 => "float32",
            Self::I32 => "int32",
            Self::I64 => "int64",
            Self::Bool => "bool",
        }
    }
    /// From torch's dtype name (`str(dtype)` without `torch.`).
    pub fn from_name(name: &str) -> Option<Self> {
        [
            Self::Bf16,
            Self::Fp8E4m3,
            Self::F32,
            Self::I32,
            Self::I64,
            Self::Bool,
        ]
        .into_iter()
        .find(|e| e.name() == name)
    }
}

/// A 1-D or 2-D array on this PE's GPU. 1-D views have `shape[1] == 1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View {
    pub ptr: u64,
    pub dims: usize,
    pub shape: [usize; 2],
    /// In elements.
    pub strides: [usize; 2],
    pub elem: ElemType,
}

impl View {
    pub fn vector(ptr: u64, len: usize, elem: ElemType) -> Self {
        Self {
            ptr,
            dims: 1,
            shape: [len, 1],
            strides: [1, 1],
            elem,
        }
    }
    pub fn matrix(ptr: u64, rows: usize, cols: usize, elem: ElemType) -> Self {
        Self {
            ptr,
            dims: 2,
            shape: [rows, cols],
            strides: [cols, 1],
            elem,
        }
    }
    pub fn rows(&self) -> usize {
        self.shape[0]
    }
    pub fn cols(&self) -> usize {
        self.shape[1]
    }
    /// torch's rule (`Tensor.is_contiguous`): row-major strides, where a dimension of size 1
    /// may have any stride and an empty array is contiguous whatever its strides.
    pub fn is_contiguous(&self) -> bool {
        let shape = &self.shape[..self.dims];
        if shape.contains(&0) {
            return true;
        }
        let mut expected = 1;
        for d in (0..self.dims).rev() {
            if shape[d] != 1 && self.strides[d] != expected {
                return false;
            }
            expected *= shape[d];
        }
        true
    }
    fn describe(&self) -> String {
        format!("{} {:?}", self.elem.name(), &self.shape[..self.dims])
    }

    /// `Err` naming `name` unless this is a contiguous `elem` array of `shape` (a `None`
    /// dimension matches any size).
    pub fn expect(
        &self,
        what: &'static str,
        name: &str,
        elem: ElemType,
        shape: &[Option<usize>],
    ) -> Result<(), BufferError> {
        let shape_ok = self.dims == shape.len()
            && shape
                .iter()
                .zip(self.shape)
                .all(|(want, have)| want.is_none_or(|w| w == have));
        if self.elem != elem || !shape_ok {
            let want: Vec<String> = shape
                .iter()
                .map(|d| d.map_or("_".into(), |d| d.to_string()))
                .collect();
            return Err(BufferError::invalid(
                what,
                format!(
                    "{name} must be {} [{}], got {}",
                    elem.name(),
                    want.join(", "),
                    self.describe()
                ),
            ));
        }
        if !self.is_contiguous() {
            return Err(BufferError::invalid(
                what,
                format!(
                    "{name} ({}) must be contiguous (call .contiguous())",
                    self.describe()
                ),
            ));
        }
        self.expect_aligned(what, name, elem.size())
    }

    /// `Err` naming `name` unless its address is a multiple of `align` bytes (the kernels
    /// copy rows 16 bytes at a time; every element must sit at a multiple of its size).
    pub fn expect_aligned(
        &self,
        what: &'static str,
        name: &str,
        align: usize,
    ) -> Result<(), BufferError> {
        if !self.ptr.is_multiple_of(align as u64) {
            return Err(BufferError::invalid(
                what,
                format!(
                    "{name} starts at {:#x}, not a multiple of {align} bytes: pass a tensor of \
                     its own (.clone()) rather than a view that starts mid-row",
                    self.ptr
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expectations_name_the_argument_and_what_it_should_be() {
        let v = View::matrix(0x1000, 4, 8, ElemType::I32);
        assert!(
            v.expect("dispatch", "x", ElemType::I32, &[Some(4), None])
                .is_ok()
        );
        let err = v
            .expect("dispatch", "topk_idx", ElemType::I64, &[Some(4), None])
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "dispatch: topk_idx must be int64 [4, _], got int32 [4, 8]"
        );
        let refused = |v: View| {
            v.expect("dispatch", "x", ElemType::I32, &[None, None])
                .unwrap_err()
                .to_string()
        };
        let strided = View {
            strides: [1, 4],
            ..v
        };
        assert!(refused(strided).contains("contiguous"));
        // torch's rule: a size-1 dimension's stride does not count (DeepEP's [N, 1] routing),
        // and an empty array is contiguous whatever its strides.
        let column = View {
            strides: [1, 1],
            ..View::matrix(0x1000, 4096, 1, ElemType::Bool)
        };
        assert!(column.is_contiguous());
        let empty = View {
            strides: [7, 3],
            ..View::matrix(0x1000, 0, 8, ElemType::I32)
        };
        assert!(empty.is_contiguous());
        let misaligned = View::matrix(0x1002, 4, 8, ElemType::I32);
        assert!(refused(misaligned).contains("not a multiple of 4 bytes"));
        assert_eq!(
            ElemType::from_name("float8_e4m3fn"),
            Some(ElemType::Fp8E4m3)
        );
    }
}
