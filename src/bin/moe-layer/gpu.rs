//! What the experts need on the GPU besides the buffer: row-major bf16 GEMMs through cuBLAS
//! (strided-batched: one call covers every local expert), and the one elementwise kernel of
//! the expert MLP, SiLU(gate) * up, compiled at run time with NVRTC (the kernels crate's nvcc
//! pipeline is for NVSHMEM kernels; this one needs nothing of NVSHMEM).

use std::ffi::CString;
use std::sync::Arc;

use cudarc::cublas::{CudaBlas, result, sys};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::{self, Ptx};
use half::bf16;

use crate::AnyError;

/// Checks that cuBLAS and NVRTC load, the way cudarc will load them: cudarc panics on a
/// missing library at its first call (chapter 6's `probe_cublas`, for both libraries).
pub(crate) fn probe_libraries() -> Result<(), String> {
    // SAFETY: each loads the library (running its initialisers) and nothing else.
    let present = unsafe {
        [
            ("cuBLAS", "cublas", cudarc::cublas::sys::is_culib_present()),
            ("NVRTC", "nvrtc", cudarc::nvrtc::sys::is_culib_present()),
        ]
    };
    for (name, lib, found) in present {
        if !found {
            return Err(format!(
                "{name} not found (searched {}): install the CUDA 13 toolkit's lib{lib}, or put \
                 the folder that holds lib{lib}.so.13 on LD_LIBRARY_PATH",
                cudarc::get_lib_name_candidates(lib).join(", ")
            ));
        }
    }
    Ok(())
}

// ANCHOR: column_major
/// cuBLAS's arguments for `batch` row-major products `y[b] = x[b] @ w[b]`, x [m, k], w [k, n],
/// y [m, n], each operand's matrices back to back.
///
/// cuBLAS is column-major: the bytes of a row-major [r, c] matrix are its column-major
/// [c, r] transpose with leading dimension c. So cuBLAS computes y^T = w^T x^T: its "m" is
/// our n, its "n" our m, its first operand our w (leading dimension n), its second our x
/// (leading dimension k), its result y^T (leading dimension n). No transposes are asked for
/// (both CUBLAS_OP_N): the transposes are only how cuBLAS reads our bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ColumnMajor {
    pub(crate) m: i32,
    pub(crate) n: i32,
    pub(crate) k: i32,
    /// The first operand (w): leading dimension and elements between batches.
    pub(crate) lda: i32,
    pub(crate) stride_a: i64,
    /// The second operand (x).
    pub(crate) ldb: i32,
    pub(crate) stride_b: i64,
    /// The result (y).
    pub(crate) ldc: i32,
    pub(crate) stride_c: i64,
    pub(crate) batch: i32,
}

impl ColumnMajor {
    pub(crate) fn row_major(
        batch: usize,
        (m, n, k): (usize, usize, usize),
    ) -> Result<Self, String> {
        let int = |v: usize| i32::try_from(v).map_err(|_| format!("{v} does not fit cuBLAS's i32"));
        let stride = |a: usize, b: usize| {
            a.checked_mul(b)
                .and_then(|s| i64::try_from(s).ok())
                .ok_or(format!(
                    "{a} x {b} elements do not fit cuBLAS's i64 strides"
                ))
        };
        Ok(Self {
            m: int(n)?,
            n: int(m)?,
            k: int(k)?,
            lda: int(n)?,
            stride_a: stride(k, n)?,
            ldb: int(k)?,
            stride_b: stride(m, k)?,
            ldc: int(n)?,
            stride_c: stride(m, n)?,
            batch: int(batch)?,
        })
    }
}
// ANCHOR_END: column_major

/// A cuBLAS handle on one stream: every GEMM it runs is ordered there (the world's stream,
/// where the buffer's calls run too).
pub(crate) struct Gemm {
    blas: CudaBlas,
}

impl Gemm {
    pub(crate) fn new(stream: Arc<CudaStream>) -> Result<Self, AnyError> {
        let blas = CudaBlas::new(stream).map_err(|e| format!("creating a cuBLAS handle: {e:?}"))?;
        Ok(Self { blas })
    }

    // ANCHOR: gemm
    /// `y[b] = x[b] @ w[b]` for b in 0..batch: x [batch, m, k], w [batch, k, n] and y
    /// [batch, m, n], row-major bf16 at device addresses, accumulated in f32 (as torch.bmm).
    ///
    /// The addresses are raw because the buffer's typed arrays (`DeviceArray`) give views,
    /// not cudarc slices, which cudarc's `Gemm` trait would need.
    ///
    /// # Safety
    /// `x`, `w` and `y` must be device memory of the handle's context holding those shapes, and
    /// nothing else may write them until the GEMM is done on the handle's stream.
    pub(crate) unsafe fn bf16(
        &self,
        batch: usize,
        (m, n, k): (usize, usize, usize),
        x: u64,
        w: u64,
        y: u64,
    ) -> Result<(), AnyError> {
        let c = ColumnMajor::row_major(batch, (m, n, k))?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (bf16, op) = (
            sys::cudaDataType::CUDA_R_16BF,
            sys::cublasOperation_t::CUBLAS_OP_N,
        );
        // SAFETY: the caller's; the sizes fit cuBLAS's integers (checked above).
        unsafe {
            result::gemm_strided_batched_ex(
                *self.blas.handle(),
                op,
                op,
                c.m,
                c.n,
                c.k,
                (&alpha as *const f32).cast(),
                w as *const _,
                bf16,
                c.lda,
                c.stride_a,
                x as *const _,
                bf16,
                c.ldb,
                c.stride_b,
                (&beta as *const f32).cast(),
                y as *mut _,
                bf16,
                c.ldc,
                c.stride_c,
                c.batch,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| format!("cuBLAS bf16 GEMM, {batch} x [{m}, {k}] @ [{k}, {n}]: {e:?}").into())
    }
    // ANCHOR_END: gemm
}

// ANCHOR: silu_mul
/// `gate[i] = SiLU(gate[i]) * up[i]` over bf16 values, in f32, rounded once. bf16 is read and
/// written by its bits (the upper half of an f32), so NVRTC needs no header and no include
/// path.
const SILU_MUL_SOURCE: &str = r#"
__device__ float from_bf16(unsigned short v) { return __uint_as_float(((unsigned int)v) << 16); }
__device__ unsigned short to_bf16(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN stays NaN
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // to nearest, ties even
}
extern "C" __global__ void silu_mul(unsigned short* gate, const unsigned short* up,
                                    unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        float g = from_bf16(gate[i]);
        gate[i] = to_bf16(g / (1.0f + expf(-g)) * from_bf16(up[i]));
    }
}
"#;
// ANCHOR_END: silu_mul

/// An NVRTC program, destroyed when dropped.
struct Program(nvrtc::sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: a program made by create_program, destroyed once.
        let _ = unsafe { nvrtc::result::destroy_program(self.0) };
    }
}

fn nvrtc_error(what: &'static str) -> impl Fn(nvrtc::result::NvrtcError) -> String {
    move |e| format!("NVRTC, {what}: {e:?}")
}

/// `source` compiled by NVRTC into a cubin for `arch` (sm_90, say); a compile error carries
/// NVRTC's log.
pub(crate) fn compile_cubin(source: &str, arch: &str) -> Result<Vec<u8>, String> {
    let source = CString::new(source).map_err(|_| "a NUL byte in the kernel source".to_string())?;
    let program =
        Program(nvrtc::result::create_program(&source, None).map_err(nvrtc_error("creating"))?);
    let options = [format!("--gpu-architecture={arch}")];
    // SAFETY: a live program; options without NUL bytes.
    if let Err(e) = unsafe { nvrtc::result::compile_program(program.0, &options) } {
        // SAFETY: a live program, just compiled.
        let log = unsafe { nvrtc::result::get_program_log(program.0) }.unwrap_or_default();
        let log: Vec<u8> = log
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        return Err(format!(
            "NVRTC could not compile for {arch} ({e:?}):\n{}",
            String::from_utf8_lossy(&log)
        ));
    }
    let mut size = 0usize;
    // SAFETY: a live, compiled program; `cubin` holds the size NVRTC reported.
    let cubin = unsafe {
        nvrtc::sys::nvrtcGetCUBINSize(program.0, &mut size)
            .result()
            .map_err(nvrtc_error("sizing the cubin"))?;
        let mut cubin = vec![0u8; size];
        nvrtc::sys::nvrtcGetCUBIN(program.0, cubin.as_mut_ptr().cast())
            .result()
            .map_err(nvrtc_error("reading the cubin"))?;
        cubin
    };
    Ok(cubin)
}

const SILU_THREADS: usize = 256;
/// Enough blocks to fill any GPU; the loop covers the rest.
const SILU_MAX_BLOCKS: usize = 4096;

/// The SiLU kernel, compiled for this context's GPU.
pub(crate) struct SiluMul {
    function: CudaFunction,
}

impl SiluMul {
    /// Compiled for this context's GPU as a cubin, not PTX: the driver loads a cubin of any
    /// CUDA 13 NVRTC, while PTX from an NVRTC newer than the driver would be refused.
    pub(crate) fn compile(ctx: &Arc<CudaContext>) -> Result<Self, AnyError> {
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| format!("reading the GPU's compute capability: {e:?}"))?;
        let cubin = compile_cubin(SILU_MUL_SOURCE, &format!("sm_{major}{minor}"))?;
        let module = ctx
            .load_module(Ptx::from_binary(cubin))
            .map_err(|e| format!("loading silu_mul's cubin: {e:?}"))?;
        let function = module
            .load_function("silu_mul")
            .map_err(|e| format!("finding silu_mul in its module: {e:?}"))?;
        Ok(Self { function })
    }

    /// `gate = SiLU(gate) * up`, elementwise, on `stream`.
    pub(crate) fn launch(
        &self,
        stream: &Arc<CudaStream>,
        gate: &mut CudaSlice<bf16>,
        up: &CudaSlice<bf16>,
    ) -> Result<(), AnyError> {
        if gate.len() != up.len() {
            return Err(
                format!("silu_mul: gate has {} values, up {}", gate.len(), up.len()).into(),
            );
        }
        let n = gate.len() as u64;
        let blocks = gate.len().div_ceil(SILU_THREADS).clamp(1, SILU_MAX_BLOCKS);
        let config = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (SILU_THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: silu_mul's parameters are (unsigned short*, const unsigned short*, unsigned
        // long long), in this order: two bf16 arrays of n values on this context, and n.
        unsafe {
            stream
                .launch_builder(&self.function)
                .arg(gate)
                .arg(up)
                .arg(&n)
                .launch(config)
        }
        .map_err(|e| format!("launching silu_mul: {e:?}"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What cuBLAS does with `ColumnMajor`'s arguments (op N, N, column-major, strided
    /// batches), element by element, on f32.
    fn cublas_on_host(c: &ColumnMajor, a: &[f32], b: &[f32], out: &mut [f32]) {
        let [m, n, k, lda, ldb, ldc] = [c.m, c.n, c.k, c.lda, c.ldb, c.ldc].map(|v| v as usize);
        let [sa, sb, sc] = [c.stride_a, c.stride_b, c.stride_c].map(|v| v as usize);
        for p in 0..c.batch as usize {
            for i in 0..m {
                for j in 0..n {
                    let sum: f32 = (0..k)
                        .map(|l| a[p * sa + i + l * lda] * b[p * sb + l + j * ldb])
                        .sum();
                    out[p * sc + i + j * ldc] = sum;
                }
            }
        }
    }

    #[test]
    fn column_major_arguments_give_the_row_major_product_of_every_batch() {
        let (batch, m, n, k) = (3, 5, 4, 6);
        let x: Vec<f32> = (0..batch * m * k).map(|i| (i % 7) as f32 - 3.0).collect();
        let w: Vec<f32> = (0..batch * k * n)
            .map(|i| (i % 5) as f32 * 0.5 - 1.0)
            .collect();
        let c = ColumnMajor::row_major(batch, (m, n, k)).unwrap();
        let mut y = vec![f32::NAN; batch * m * n];
        // cuBLAS's first operand is w, its second x (see ColumnMajor).
        cublas_on_host(&c, &w, &x, &mut y);
        for b in 0..batch {
            let want = crate::host::matmul(
                &x[b * m * k..(b + 1) * m * k],
                &w[b * k * n..(b + 1) * k * n],
                (m, k, n),
            );
            assert_eq!(&y[b * m * n..(b + 1) * m * n], &want[..], "batch {b}");
        }
    }

    #[test]
    fn sizes_past_cublas_integers_are_errors() {
        let e = ColumnMajor::row_major(1, (1 << 31, 8, 8)).unwrap_err();
        assert!(e.contains("does not fit cuBLAS's i32"), "{e}");
        assert!(ColumnMajor::row_major(usize::MAX, (1, 1, 1)).is_err());
        assert!(ColumnMajor::row_major(1, (usize::MAX, usize::MAX, 1)).is_err());
    }

    /// The kernel's rounding, transcribed: it must agree with half's round-to-nearest-even.
    fn to_bf16_bits(f: f32) -> u16 {
        let u = f.to_bits();
        if (u & 0x7fff_ffff) > 0x7f80_0000 {
            return 0x7fc0;
        }
        ((u + 0x7fff + ((u >> 16) & 1)) >> 16) as u16
    }

    #[test]
    fn the_kernels_bf16_rounding_is_round_to_nearest_even() {
        let mut state = 0x1234_5678u32;
        let mut values = vec![0.0, -0.0, 1.0, 3.0e38, -3.4e38, f32::INFINITY, f32::NAN];
        values.push(f32::from_bits(0x3f80_8000)); // a tie, rounds down to even
        values.push(f32::from_bits(0x3f81_8000)); // a tie, rounds up to even
        values.push(f32::from_bits(0x3f80_8001)); // just past a tie, rounds up
        for _ in 0..100_000 {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            values.push(f32::from_bits(state));
        }
        for v in values {
            let want = bf16::from_f32(v);
            let got = to_bf16_bits(v);
            if v.is_nan() {
                assert!(bf16::from_bits(got).is_nan());
            } else {
                assert_eq!(got, want.to_bits(), "{v:e}");
            }
        }
    }

    #[test]
    fn the_kernel_compiles_where_nvrtc_is_present() {
        // No GPU needed to compile; without NVRTC the probe's error names what it searched.
        match probe_libraries() {
            Err(e) => assert!(e.contains("LD_LIBRARY_PATH"), "{e}"),
            Ok(()) => {
                let cubin = compile_cubin(SILU_MUL_SOURCE, "sm_90").expect("silu_mul compiles");
                assert_eq!(&cubin[..4], b"\x7fELF");
                let error = compile_cubin("this is not CUDA", "sm_90").unwrap_err();
                assert!(error.contains("could not compile for sm_90"), "{error}");
            }
        }
    }
}
