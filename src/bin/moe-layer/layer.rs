//! The MoE layer in low-latency mode, the decode path of scripts/moe_model.py (`route`,
//! `low_latency_dispatch`, `ll_experts`, `low_latency_combine`), over the buffer's safe API.

use std::ops::Deref;
use std::sync::Arc;

use ch01_bootstrap::World;
use ch06_overlap::Gemm;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use half::bf16;
use nvshmem_tutorial::{
    DeviceArray, LlDispatchOptions, LlRecvTokens, LlStats, NvshmemBuffer, TopK,
};

use crate::AnyError;
use crate::gpu::SiluMul;
use crate::host::{self, Choice, MAX_TOKENS, Matrix, Shape};

/// One rank's part of the layer: the router, its experts, and the experts' work space, all on
/// this rank's GPU; every call runs on the world's stream, where the buffer's calls run.
pub(crate) struct MoeLayer {
    shape: Shape,
    /// Experts on this rank (L) and rows each receives (R x T).
    local_experts: usize,
    rows_per_expert: usize,
    stream: Arc<CudaStream>,
    gemm: Gemm,
    silu_mul: SiluMul,
    /// [hidden, experts]
    router: CudaSlice<bf16>,
    /// This rank's experts back to back: gate and up [L, hidden, ffn], down [L, ffn, hidden].
    gate: CudaSlice<bf16>,
    up: CudaSlice<bf16>,
    down: CudaSlice<bf16>,
    /// [L, R x T, ffn]: gate's outputs (then SiLU(gate) * up), up's outputs.
    gate_out: CudaSlice<bf16>,
    up_out: CudaSlice<bf16>,
    /// [L x R x T, hidden]: the experts' outputs, which combine sends back.
    expert_out: DeviceArray<bf16>,
}

/// One call's routing as the host saw it: the scores [N, experts] (the GPU's bf16, widened)
/// and the top-k chosen from them.
pub(crate) struct Routing {
    pub(crate) scores: Vec<f32>,
    pub(crate) choice: Choice,
}

fn ptr<T>(slice: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    slice.device_ptr(stream).0
}

impl MoeLayer {
    /// This rank's experts (`first..first + L`, L = experts / ranks) made from `seed`, as every
    /// rank would make them, and the work space for calls of up to T tokens per rank.
    pub(crate) fn new(world: &World, shape: Shape, seed: u64) -> Result<Self, AnyError> {
        let (me, ranks) = (world.my_pe(), world.n_pes());
        shape.check(ranks)?;
        let stream = world.stream().clone();
        let l = shape.local_experts(ranks);
        let rows_per_expert = ranks * MAX_TOKENS;
        let mine = |which| -> Result<CudaSlice<bf16>, AnyError> {
            let host: Vec<bf16> = (me * l..(me + 1) * l)
                .flat_map(|e| host::expert_matrix(seed, &shape, e, which))
                .collect();
            Ok(stream.clone_htod(&host)?)
        };
        let intermediate = l * rows_per_expert * shape.ffn;
        let out_rows = l * rows_per_expert;
        let zeros = vec![bf16::ZERO; out_rows * shape.hidden];
        Ok(Self {
            shape,
            local_experts: l,
            rows_per_expert,
            gemm: Gemm::new(stream.clone())?,
            silu_mul: SiluMul::compile(world.context())?,
            router: stream.clone_htod(&host::router(seed, &shape))?,
            gate: mine(Matrix::Gate)?,
            up: mine(Matrix::Up)?,
            down: mine(Matrix::Down)?,
            gate_out: stream.alloc_zeros(intermediate)?,
            up_out: stream.alloc_zeros(intermediate)?,
            expert_out: DeviceArray::from_host(&stream, &zeros, out_rows, shape.hidden)?,
            stream,
        })
    }

    fn dispatch_options(&self) -> LlDispatchOptions {
        LlDispatchOptions {
            num_max_dispatch_tokens_per_rank: MAX_TOKENS,
            num_experts: self.shape.experts,
            use_fp8: false,
            round_scale: false,
            use_ue8m0: false,
        }
    }

    // ANCHOR: forward
    /// The layer on this rank's tokens `x` [N, hidden] bf16 (N <= T): its output [N, hidden]
    /// bf16, and the routing it took.
    pub(crate) fn forward<W: Deref<Target = World>>(
        &mut self,
        buffer: &mut NvshmemBuffer<W>,
        x: &DeviceArray<bf16>,
    ) -> Result<(DeviceArray<bf16>, Routing), AnyError> {
        let routing = self.route(x)?;
        let (n, k) = (x.rows(), self.shape.top_k);
        let topk_idx = DeviceArray::from_host(&self.stream, &routing.choice.idx, n, k)?;
        let topk_weights = DeviceArray::from_host(&self.stream, &routing.choice.weights, n, k)?;
        // Every token to its k experts' ranks; each local expert's rows arrive together.
        let options = self.dispatch_options();
        let received = buffer.low_latency_dispatch(x, &topk_idx, LlStats::default(), options)?;
        let LlRecvTokens::Bf16(rows) = &received.x else {
            return Err("a bf16 low-latency dispatch returned fp8 rows".into());
        };
        self.experts(rows)?;
        // Every result back to its token's rank, summed there with the token's k weights.
        let topk = TopK {
            idx: &topk_idx,
            weights: &topk_weights,
        };
        let out =
            buffer.low_latency_combine(Some(&self.expert_out), topk, None, &received.handle)?;
        Ok((out, routing))
    }
    // ANCHOR_END: forward

    // ANCHOR: route
    /// scores = x @ router on the GPU (cuBLAS); softmax and top-k on the host.
    fn route(&self, x: &DeviceArray<bf16>) -> Result<Routing, AnyError> {
        let Shape {
            hidden, experts, ..
        } = self.shape;
        let n = x.rows();
        if x.cols() != hidden || n == 0 || n > MAX_TOKENS {
            return Err(format!(
                "x is [{n}, {}]: the layer takes [1..={MAX_TOKENS}, {hidden}] bf16",
                x.cols()
            )
            .into());
        }
        let scores = self.stream.alloc_zeros::<bf16>(n * experts)?;
        let (router, out) = (ptr(&self.router, &self.stream), ptr(&scores, &self.stream));
        // SAFETY: x [n, hidden], router [hidden, experts] and scores [n, experts], bf16 on
        // this GPU, alive until the copy below (on the same stream) has waited for the GEMM.
        unsafe {
            self.gemm
                .bf16_batched(1, (n, experts, hidden), x.view().ptr, router, out)
        }?;
        // One sync per layer: this copy waits for the GEMM, and the top-k runs on the host.
        // Python keeps it on the GPU (torch.topk); a decode step that must never wait (CUDA
        // graphs) would too.
        let scores = host::to_f32(&self.stream.clone_dtoh(&scores)?);
        let choice = host::top_k(&scores, experts, self.shape.top_k);
        Ok(Routing { scores, choice })
    }
    // ANCHOR_END: route

    // ANCHOR: experts
    /// Python's `ll_experts`: local expert e's rows are rows[e] = [R x T, hidden], the valid
    /// ones first. Every row is computed, so nothing waits for the counts (combine reads only
    /// the valid ones): three batched GEMMs, one per matrix for all L experts at once, and
    /// SiLU(gate) * up between them.
    fn experts(&mut self, rows: &DeviceArray<bf16>) -> Result<(), AnyError> {
        let (l, m) = (self.local_experts, self.rows_per_expert);
        let (h, f) = (self.shape.hidden, self.shape.ffn);
        if rows.rows() != l * m || rows.cols() != h {
            return Err(format!(
                "received rows are [{}, {}], not [{l} x {m}, {h}]",
                rows.rows(),
                rows.cols()
            )
            .into());
        }
        let s = &self.stream;
        let (x, y) = (rows.view().ptr, self.expert_out.view().ptr);
        let (gate, up, down) = (ptr(&self.gate, s), ptr(&self.up, s), ptr(&self.down, s));
        let (g, u) = (ptr(&self.gate_out, s), ptr(&self.up_out, s));
        // SAFETY (each GEMM): x [l, m, h]; gate and up [l, h, f]; g and u [l, m, f]; down
        // [l, f, h]; y [l, m, h]: bf16 on this GPU, owned by the layer or borrowed for the
        // call, every kernel on the one stream.
        unsafe {
            self.gemm.bf16_batched(l, (m, f, h), x, gate, g)?;
            self.gemm.bf16_batched(l, (m, f, h), x, up, u)?;
        }
        self.silu_mul.launch(s, &mut self.gate_out, &self.up_out)?;
        // SAFETY: as above.
        unsafe { self.gemm.bf16_batched(l, (m, h, f), g, down, y) }?;
        Ok(())
    }
    // ANCHOR_END: experts
}
