//! What the experts need on the GPU besides the buffer and chapter 6's cuBLAS wrapper
//! (`ch06_overlap::Gemm`, whose strided-batched GEMM covers every local expert in one call):
//! the one elementwise kernel of the expert MLP, SiLU(gate) * up, compiled at run time with
//! NVRTC (the kernels crate's nvcc pipeline is for NVSHMEM kernels; this one needs nothing of
//! NVSHMEM).

use std::ffi::CString;
use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::{self, Ptx};
use half::bf16;

use crate::AnyError;

/// Checks that NVRTC loads, the way cudarc will load it: cudarc panics on a missing library
/// at its first call (chapter 6's `probe_cublas` does the same for cuBLAS).
pub(crate) fn probe_nvrtc() -> Result<(), String> {
    // SAFETY: loads the library (running its initialisers) and nothing else.
    if unsafe { nvrtc::sys::is_culib_present() } {
        return Ok(());
    }
    Err(format!(
        "NVRTC not found (searched {}): install the CUDA 13 toolkit's libnvrtc, or put the \
         folder that holds libnvrtc.so.13 on LD_LIBRARY_PATH",
        cudarc::get_lib_name_candidates("nvrtc").join(", ")
    ))
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
        match probe_nvrtc() {
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
