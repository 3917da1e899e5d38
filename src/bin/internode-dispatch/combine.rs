//! One combine of internode-dispatch's loop, with the handle its dispatch left: every rank
//! sends back, for each row it received, a row its experts could have made (values that differ
//! by rank, so the sums round and their order shows), top-k weights when the dispatch had
//! top-k, and the call's biases. combined_x against the reference (`reference.rs`) bitwise in
//! the kernel's order and within TOLERANCE of the flat exact sum, the weights exactly. And the
//! combine's refusals, each before anything is launched.

use std::sync::Arc;

use ch01_bootstrap::World;
use ch01_bootstrap::checks::Tally;
use cudarc::driver::CudaStream;
use half::bf16;
use nvshmem_tutorial::internode::Job;
use nvshmem_tutorial::{
    BufferError, CombineInputs, CombineOutputs, Config, DeviceArray, InternodeCombineCall,
    InternodeCombineHandle, NvshmemBuffer,
};

use crate::dispatch::Dispatched;
use crate::internode_case::Case;
use crate::reference::{
    TOLERANCE, bias, combine_weight, combined_weight, expert_out, flat, received, two_level,
};
use crate::shared::AnyError;

/// The combine's arrays of one call on the GPU, outputs poisoned.
pub(crate) struct CombineArrays {
    x: DeviceArray<bf16>,
    topk_weights: Option<DeviceArray<f32>>,
    bias: [Option<DeviceArray<bf16>>; 2],
    combined_x: DeviceArray<bf16>,
    combined_topk_weights: Option<DeviceArray<f32>>,
}

impl CombineArrays {
    /// Rank `me`'s rows back for the rows `d` delivered (in received order), its weights when
    /// `d` had top-k, the biases `biases` names.
    pub(crate) fn new(
        stream: &Arc<CudaStream>,
        job: &Job,
        me: usize,
        hidden: usize,
        d: &Dispatched,
        biases: [bool; 2],
    ) -> Result<Self, BufferError> {
        // A row per output row of the dispatch: those received, then (num_worst_tokens) zeros,
        // which the combine never reads.
        let rows = received(job, me);
        let (m, t_count) = (d.num_rows, job.routing[me].len());
        let mut x: Vec<bf16> = rows
            .iter()
            .flat_map(|&(s, t)| (0..hidden).map(move |j| expert_out(me, s, t, j)))
            .collect();
        x.resize(m * hidden, bf16::ZERO);
        let (mut topk_weights, mut combined_topk_weights) = (None, None);
        if let Some(k) = d.num_topk {
            let mut w: Vec<f32> = rows
                .iter()
                .flat_map(|&(s, t)| (0..k).map(move |j| combine_weight(me, s, t, j)))
                .collect();
            w.resize(m * k, 0.0);
            topk_weights = Some(DeviceArray::from_host(stream, &w, m, k)?);
            let nan = vec![f32::NAN; t_count * k];
            combined_topk_weights = Some(DeviceArray::from_host(stream, &nan, t_count, k)?);
        }
        let bias_of = |which: usize| -> Result<Option<DeviceArray<bf16>>, BufferError> {
            if !biases[which] {
                return Ok(None);
            }
            let b: Vec<bf16> = (0..t_count)
                .flat_map(|t| (0..hidden).map(move |j| bias(which, t, j)))
                .collect();
            DeviceArray::from_host(stream, &b, t_count, hidden).map(Some)
        };
        let poison = vec![bf16::from_bits(u16::MAX); t_count * hidden];
        Ok(Self {
            x: DeviceArray::from_host(stream, &x, m, hidden)?,
            topk_weights,
            bias: [bias_of(0)?, bias_of(1)?],
            combined_x: DeviceArray::from_host(stream, &poison, t_count, hidden)?,
            combined_topk_weights,
        })
    }

    pub(crate) fn inputs(&self) -> CombineInputs {
        CombineInputs {
            x: self.x.view(),
            topk_weights: self.topk_weights.as_ref().map(DeviceArray::view),
            bias: [0, 1].map(|i| self.bias[i].as_ref().map(DeviceArray::view)),
        }
    }

    pub(crate) fn outputs(&self) -> CombineOutputs {
        CombineOutputs {
            combined_x: self.combined_x.view(),
            combined_topk_weights: self.combined_topk_weights.as_ref().map(DeviceArray::view),
        }
    }
}

/// The parts of `d`'s handle the combine reads.
fn handle_of(d: &Dispatched) -> InternodeCombineHandle {
    InternodeCombineHandle {
        is_token_in_rank: d.layout.is_token_in_rank.view(),
        prefixes: d.handle.handle(),
        send_rdma_head: d.arrays.send_rdma_head.view(),
        send_nvl_head: d.arrays.send_nvl_head.view(),
    }
}

/// A combine on the world's stream (collective), synchronised.
fn combine(
    buffer: &NvshmemBuffer<&World>,
    inputs: CombineInputs,
    handle: InternodeCombineHandle,
    outputs: CombineOutputs,
    config: &Config,
) -> Result<(), BufferError> {
    let stream = buffer.world().stream();
    let call = InternodeCombineCall {
        inputs,
        handle,
        outputs,
    };
    // SAFETY: every view is a live array of this GPU, kept alive by the caller until the stream
    // is synchronised below; the world's stream belongs to the buffer's context.
    unsafe { buffer.internode_combine_raw(&call, config, stream.cu_stream()) }?;
    stream
        .synchronize()
        .map_err(BufferError::cuda("synchronising after the combine"))
}

// ANCHOR: combine_and_check
/// The combine of `case` with the handle `d` left, under `config` (its own RDMA chunk), with
/// the biases `biases` names; every output checked. Whether all held.
pub(crate) fn combine_and_check(
    buffer: &NvshmemBuffer<&World>,
    case: &Case,
    d: &Dispatched,
    config: &Config,
    (hidden, biases): (usize, [bool; 2]),
    tally: &mut Tally,
) -> Result<bool, AnyError> {
    let world = buffer.world();
    let (me, stream) = (world.my_pe(), world.stream());
    let job = &case.job;
    let arrays = CombineArrays::new(stream, job, me, hidden, d, biases)?;
    combine(
        buffer,
        arrays.inputs(),
        handle_of(d),
        arrays.outputs(),
        config,
    )?;
    check_combine(buffer, case, d, &arrays, (hidden, biases), tally)
}

/// Every output of the combine into `arrays` against the reference, after the rows the notify
/// counted and the failure record: whether all held.
pub(crate) fn check_combine(
    buffer: &NvshmemBuffer<&World>,
    case: &Case,
    d: &Dispatched,
    arrays: &CombineArrays,
    (hidden, biases): (usize, [bool; 2]),
    tally: &mut Tally,
) -> Result<bool, AnyError> {
    let world = buffer.world();
    let (me, stream) = (world.my_pe(), world.stream());
    let job = &case.job;
    let before = tally.failed;
    let (rows, counted) = (received(job, me).len(), d.notify_count(stream)?);
    tally.check(me, rows == counted, || {
        format!("the reference receives {rows} rows, the notify counted {counted}")
    });
    let record = buffer.check();
    tally.check(me, record.is_ok(), || {
        format!(
            "{}: the combine's failure record: {record:?}",
            case.describe()
        )
    });
    check_combined(job, me, (hidden, biases), arrays, stream, tally)?;
    Ok(tally.failed == before)
}
// ANCHOR_END: combine_and_check

/// combined_x bitwise against the kernel's order and within TOLERANCE of the flat exact sum;
/// the combined weights exactly.
fn check_combined(
    job: &Job,
    me: usize,
    (hidden, biases): (usize, [bool; 2]),
    arrays: &CombineArrays,
    stream: &Arc<CudaStream>,
    tally: &mut Tally,
) -> Result<(), AnyError> {
    let got = arrays.combined_x.to_host(stream)?;
    let (mut unlike, mut far) = (0, 0);
    for t in 0..job.routing[me].len() {
        let row = &got[t * hidden..(t + 1) * hidden];
        let want = two_level(job, me, t, hidden, biases);
        unlike += row
            .iter()
            .zip(&want)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        for (v, (sum, size)) in row.iter().zip(flat(job, me, t, hidden, biases)) {
            far += usize::from((f64::from(v.to_f32()) - sum).abs() > TOLERANCE * size);
        }
    }
    tally.check(me, unlike == 0, || {
        format!(
            "combined_x: {unlike} elements differ from the two-level sum (member, then node order)"
        )
    });
    tally.check(me, far == 0, || {
        format!(
            "combined_x: {far} elements farther than {TOLERANCE} x magnitude from the exact sum"
        )
    });
    if let Some(w) = &arrays.combined_topk_weights {
        let w = w.to_host(stream)?;
        let k = w.len() / job.routing[me].len().max(1);
        let wrong = (0..w.len())
            .filter(|&i| w[i].to_bits() != combined_weight(job, me, i / k, i % k).to_bits())
            .count();
        tally.check(me, wrong == 0, || {
            format!("combined_topk_weights: {wrong} differ from the ranks' weights summed")
        });
    }
    Ok(())
}

// ANCHOR: combine_refusals
/// Calls the plan refuses before anything is launched, each naming what is wrong: x of another
/// dtype, a bias of another width, combined weights without weights, send_nvl_head of another
/// width, and (nodes of several ranks) sub-rings too small for the RDMA chunk.
pub(crate) fn check_refusals(
    buffer: &NvshmemBuffer<&World>,
    case: &Case,
    d: &Dispatched,
    config: &Config,
    hidden: usize,
    tally: &mut Tally,
) -> Result<(), AnyError> {
    let world = buffer.world();
    let (me, stream) = (world.my_pe(), world.stream());
    let job = &case.job;
    let good = CombineArrays::new(stream, job, me, hidden, d, [true, false])?;
    let (m, t_count) = (d.num_rows, job.routing[me].len());
    let f32_rows = DeviceArray::from_host(stream, &vec![0f32; m * hidden], m, hidden)?;
    let narrow = DeviceArray::from_host(stream, &vec![bf16::ZERO; t_count * 8], t_count, 8)?;
    let weights = DeviceArray::from_host(stream, &vec![0f32; t_count * 2], t_count, 2)?;
    let handle = handle_of(d);
    let mut try_combine = |what: &str,
                           inputs: CombineInputs,
                           outputs: CombineOutputs,
                           handle: InternodeCombineHandle,
                           config: &Config,
                           expected: &str| {
        let result = combine(buffer, inputs, handle, outputs, config);
        tally.expect_error(me, what, result, expected);
    };
    let x_f32 = CombineInputs {
        x: f32_rows.view(),
        ..good.inputs()
    };
    try_combine(
        "x of f32",
        x_f32,
        good.outputs(),
        handle,
        config,
        "internode_combine: x must be",
    );
    let wide_bias = CombineInputs {
        bias: [Some(narrow.view()), None],
        ..good.inputs()
    };
    try_combine(
        "a bias of another width",
        wide_bias,
        good.outputs(),
        handle,
        config,
        "bias[0] must be",
    );
    let lone_weights = CombineOutputs {
        combined_topk_weights: Some(weights.view()),
        ..good.outputs()
    };
    let without = CombineInputs {
        topk_weights: None,
        ..good.inputs()
    };
    try_combine(
        "combined weights without weights",
        without,
        lone_weights,
        handle,
        config,
        "combined_topk_weights",
    );
    let nvl = &d.arrays.send_nvl_head;
    let wider_nvl = InternodeCombineHandle {
        send_nvl_head: nvshmem_tutorial::View::matrix(
            nvl.view().ptr,
            nvl.view().rows() / 2,
            2 * job.node_pes,
            nvshmem_tutorial::ElemType::I32,
        ),
        ..handle
    };
    try_combine(
        "send_nvl_head of another width",
        good.inputs(),
        good.outputs(),
        wider_nvl,
        config,
        "send_nvl_head must be",
    );
    if job.node_pes > 1 {
        let small = Config::new(config.num_sms, 8, 32, 16, 128)?;
        try_combine(
            "sub-rings below a chunk",
            good.inputs(),
            good.outputs(),
            handle,
            &small,
            "sub-rings of",
        );
    }
    Ok(())
}
// ANCHOR_END: combine_refusals
