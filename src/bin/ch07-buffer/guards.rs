//! The guards only the GPU can make, on a live buffer through the raw layer (`*_raw` over
//! views): input that looks right to every plan but disagrees with what arrives. Each call
//! completes on every rank, the next `check()` raises the input error once, and the buffer
//! stays usable: a round trip with fresh routing passes after them.

use std::sync::Arc;

use ch01_bootstrap::World;
use ch01_bootstrap::checks::Tally;
use cudarc::driver::CudaStream;
use half::bf16;
use nvshmem_tutorial::{
    CombineInputs, CombineOutputs, Config, DeviceArray, DispatchInputs, DispatchOutputs, ElemType,
    Handle, Layout, NotifyInputs, NotifyOutputs, NvshmemBuffer, View,
};

use super::{
    AnyError, EXPERTS_PER_RANK, HIDDEN, NUM_TOPK, Tokens, check_round_trip, received_rows, upload,
};

/// `rows` bf16 rows of HIDDEN, every bit set (a NaN no kernel writes).
fn poisoned_rows(stream: &Arc<CudaStream>, rows: usize) -> Result<DeviceArray<bf16>, AnyError> {
    upload(
        stream,
        &vec![bf16::from_bits(u16::MAX); rows * HIDDEN],
        rows,
        HIDDEN,
    )
}

/// Tokens that every rank sends to every rank (top-k = the first expert of each rank), so that
/// every rank receives n_pes x num_tokens rows, in a known order.
fn to_every_rank(rank: usize, num_tokens: usize, n: usize) -> Tokens {
    let x = (0..num_tokens * HIDDEN)
        .map(|i| bf16::from_f32(((i % 53) as f32 - 26.0) / 4.0 + rank as f32))
        .collect();
    let topk_idx = (0..num_tokens * NUM_TOPK)
        .map(|i| match i % NUM_TOPK {
            k if k < n => (k * EXPERTS_PER_RANK) as i64,
            _ => -1,
        })
        .collect();
    let topk_weights = (0..num_tokens * NUM_TOPK)
        .map(|i| 0.25 + (i % 13) as f32)
        .collect();
    Tokens {
        x,
        topk_idx,
        topk_weights,
        num_tokens,
    }
}

/// A handle's arrays for `num_tokens` tokens and `num_rows` received rows, the routing taken
/// from `layout`.
struct HandleArrays {
    rank_prefix: DeviceArray<i32>,
    channel_prefix: DeviceArray<i32>,
    recv_channel_prefix: DeviceArray<i32>,
    recv_src_idx: DeviceArray<i32>,
    send_head: DeviceArray<i32>,
}

impl HandleArrays {
    fn new(
        s: &Arc<CudaStream>,
        n: usize,
        c: usize,
        num_tokens: usize,
        num_rows: usize,
    ) -> Result<Self, AnyError> {
        Ok(Self {
            rank_prefix: upload(s, &vec![-1; n * n], n, n)?,
            channel_prefix: upload(s, &vec![-1; n * c], n, c)?,
            recv_channel_prefix: upload(s, &vec![-1; n * c], n, c)?,
            recv_src_idx: upload(s, &vec![-1; num_rows], num_rows, 0)?,
            send_head: upload(s, &vec![-1; num_tokens * n], num_tokens, n)?,
        })
    }

    fn notify_outputs(&self) -> NotifyOutputs {
        NotifyOutputs {
            rank_prefix_matrix: self.rank_prefix.view(),
            channel_prefix_matrix: self.channel_prefix.view(),
            recv_channel_prefix_matrix: self.recv_channel_prefix.view(),
        }
    }

    /// The handle, with its received rows cut to the first `rows` (num_worst_tokens).
    fn handle(&self, layout: &Layout, rows: usize) -> Handle {
        Handle {
            rank_prefix_matrix: self.rank_prefix.view(),
            channel_prefix_matrix: self.channel_prefix.view(),
            recv_channel_prefix_matrix: self.recv_channel_prefix.view(),
            recv_src_idx: View::vector(self.recv_src_idx.view().ptr, rows, ElemType::I32),
            is_token_in_rank: layout.is_token_in_rank.view(),
            send_head: self.send_head.view(),
        }
    }
}

fn notify_inputs(layout: &Layout, num_tokens_per_rank: View) -> NotifyInputs {
    NotifyInputs {
        num_tokens_per_rank,
        num_tokens_per_expert: layout.num_tokens_per_expert.view(),
        is_token_in_rank: layout.is_token_in_rank.view(),
        expert_alignment: 1,
    }
}

/// The first `rows` rows of `array`, as the raw layer sees outputs of that many rows.
fn first_rows<T: nvshmem_tutorial::Element>(array: &DeviceArray<T>, rows: usize) -> View {
    let v = array.view();
    match v.dims {
        1 => View::vector(v.ptr, rows, v.elem),
        _ => View::matrix(v.ptr, rows, v.cols(), v.elem),
    }
}

/// Received rows of bf16 x, and their source indices, against the host reference: rows below
/// `stored` as sent, the rest still poisoned. Returns how many rows are wrong.
fn wrong_rows(
    all: &[Tokens],
    received: &[(usize, usize)],
    stored: usize,
    x: &[bf16],
    src: &[i32],
) -> usize {
    let mut wrong = 0;
    for (row, &(s, t)) in received.iter().enumerate() {
        let got = &x[row * HIDDEN..(row + 1) * HIDDEN];
        wrong += usize::from(if row < stored {
            got != &all[s].x[t * HIDDEN..(t + 1) * HIDDEN] || src[row] != t as i32
        } else {
            got.iter().any(|v| v.to_bits() != u16::MAX) || src[row] != -1
        });
    }
    wrong
}

pub(crate) fn check_device_guards(
    buffer: &mut NvshmemBuffer<&World>,
    tally: &mut Tally,
    config: &Config,
    seed: u64,
) -> Result<(), AnyError> {
    check_worst_tokens_too_small(buffer, tally, config)?;
    check_counts_disagree(buffer, tally, config, seed)?;
    let n = buffer.world().n_pes();
    let all: Vec<Tokens> = (0..n)
        .map(|r| Tokens::new(seed ^ 0x6a7d, r, 500, EXPERTS_PER_RANK * n, false))
        .collect();
    check_round_trip(buffer, tally, &all, config, "after the device guards")
}

/// num_worst_tokens below what arrives: every rank sends its tokens to every rank and gives its
/// outputs room for half of what it receives. The rows that fit arrive as sent, the rest are
/// dropped (the outputs' poisoned tail past them stays untouched), the next check names
/// num_worst_tokens, and a combine with that handle runs, reports it again and sums zeros for
/// the dropped rows.
fn check_worst_tokens_too_small(
    buffer: &mut NvshmemBuffer<&World>,
    tally: &mut Tally,
    config: &Config,
) -> Result<(), AnyError> {
    const NUM_TOKENS: usize = 96;
    let world = buffer.world();
    let (me, n, stream) = (world.my_pe(), world.n_pes(), world.stream().clone());
    let all: Vec<Tokens> = (0..n).map(|r| to_every_rank(r, NUM_TOKENS, n)).collect();
    let (mine, received) = (&all[me], received_rows(&all, me));
    let (rows, worst) = (received.len(), received.len() / 2);
    let x = upload(&stream, &mine.x, NUM_TOKENS, HIDDEN)?;
    let topk_idx = upload(&stream, &mine.topk_idx, NUM_TOKENS, NUM_TOPK)?;
    let topk_weights = upload(&stream, &mine.topk_weights, NUM_TOKENS, NUM_TOPK)?;
    let layout = buffer.get_dispatch_layout(&topk_idx, EXPERTS_PER_RANK * n)?;
    let arrays = HandleArrays::new(&stream, n, config.num_channels(), NUM_TOKENS, rows)?;
    let handle = arrays.handle(&layout, worst);
    // Room for every row, poisoned; the dispatch is told of the first `worst` only.
    let recv_x = poisoned_rows(&stream, rows)?;
    let recv_idx = upload(&stream, &vec![-1i64; rows * NUM_TOPK], rows, NUM_TOPK)?;
    let recv_w = upload(
        &stream,
        &vec![f32::from_bits(u32::MAX); rows * NUM_TOPK],
        rows,
        NUM_TOPK,
    )?;
    let inputs = DispatchInputs {
        x: x.view(),
        x_scales: None,
        topk_idx: Some(topk_idx.view()),
        topk_weights: Some(topk_weights.view()),
        num_experts: EXPERTS_PER_RANK * n,
    };
    let outputs = DispatchOutputs {
        recv_x: first_rows(&recv_x, worst),
        recv_x_scales: None,
        recv_topk_idx: Some(first_rows(&recv_idx, worst)),
        recv_topk_weights: Some(first_rows(&recv_w, worst)),
    };
    let notify_in = notify_inputs(&layout, layout.num_tokens_per_rank.view());
    let s = stream.cu_stream();
    // SAFETY: views of the arrays above (outputs: their first `worst` rows), which outlive
    // the synchronisation below; the world's stream.
    unsafe {
        buffer.notify_raw(&notify_in, &arrays.notify_outputs(), config, false, s)?;
        buffer.dispatch_raw(&inputs, &handle, &outputs, config, s)?;
    }
    stream.synchronize()?;
    let key = format!("Pass num_worst_tokens >= {rows}");
    tally.expect_error(
        me,
        "num_worst_tokens below the rows received",
        buffer.check(),
        &key,
    );
    let got = (
        recv_x.to_host(&stream)?,
        arrays.recv_src_idx.to_host(&stream)?,
    );
    let mut wrong = wrong_rows(&all, &received, worst, &got.0, &got.1);
    let weights = recv_w.to_host(&stream)?;
    wrong += weights[worst * NUM_TOPK..]
        .iter()
        .filter(|w| w.to_bits() != u32::MAX)
        .count();
    tally.check(me, wrong == 0, || {
        format!("num_worst_tokens {worst} < {rows}: {wrong} rows wrong (as sent, then untouched)")
    });
    check_combine_past_the_rows(buffer, tally, config, (&all, &handle, &recv_x, worst))
}

/// Combine with that handle: x holds `worst` rows, the handle names more. Token t of this rank
/// was row me x T + t on every rank, so it comes back as the sum of n copies of itself where
/// that row exists and as 0 where it does not.
fn check_combine_past_the_rows(
    buffer: &mut NvshmemBuffer<&World>,
    tally: &mut Tally,
    config: &Config,
    (all, handle, recv_x, worst): (&[Tokens], &Handle, &DeviceArray<bf16>, usize),
) -> Result<(), AnyError> {
    let world = buffer.world();
    let (me, n, stream) = (world.my_pe(), world.n_pes(), world.stream().clone());
    let num_tokens = all[me].num_tokens;
    let combined = poisoned_rows(&stream, num_tokens)?;
    let inputs = CombineInputs {
        x: first_rows(recv_x, worst),
        topk_weights: None,
        bias: [None, None],
    };
    let outputs = CombineOutputs {
        combined_x: combined.view(),
        combined_topk_weights: None,
    };
    // SAFETY: views of live arrays, synchronised below; the world's stream.
    unsafe { buffer.combine_raw(&inputs, handle, &outputs, config, stream.cu_stream()) }?;
    stream.synchronize()?;
    let result = buffer.check();
    tally.expect_error(
        me,
        "combine with a handle past x's rows",
        result,
        "num_worst_tokens",
    );
    let got = combined.to_host(&stream)?;
    let mut wrong = 0;
    for t in 0..num_tokens {
        let stored = me * num_tokens + t < worst;
        for h in 0..HIDDEN {
            let value = all[me].x[t * HIDDEN + h].to_f32();
            let sum = if stored {
                (0..n).fold(0.0f32, |acc, _| acc + value)
            } else {
                0.0
            };
            wrong += usize::from(got[t * HIDDEN + h] != bf16::from_f32(sum));
        }
    }
    tally.check(me, wrong == 0, || {
        format!("combine past x's {worst} rows: {wrong} values wrong (dropped rows must add 0)")
    });
    Ok(())
}

/// num_tokens_per_rank that disagrees with is_token_in_rank (each rank claims 3 more tokens for
/// the next rank): the notify step goes by the routing, so the call completes, the next check
/// names num_tokens_per_rank, the handle's matrices are the routing's, and a dispatch with that
/// handle delivers what the routing says.
fn check_counts_disagree(
    buffer: &mut NvshmemBuffer<&World>,
    tally: &mut Tally,
    config: &Config,
    seed: u64,
) -> Result<(), AnyError> {
    let world = buffer.world();
    let (me, n, stream) = (world.my_pe(), world.n_pes(), world.stream().clone());
    let all: Vec<Tokens> = (0..n)
        .map(|r| Tokens::new(seed ^ 0xc0de, r, 300, EXPERTS_PER_RANK * n, false))
        .collect();
    let (mine, received) = (&all[me], received_rows(&all, me));
    let topk_idx = upload(&stream, &mine.topk_idx, mine.num_tokens, NUM_TOPK)?;
    let layout = buffer.get_dispatch_layout(&topk_idx, EXPERTS_PER_RANK * n)?;
    let mut claimed = layout.num_tokens_per_rank.to_host(&stream)?;
    let next = (me + 1) % n;
    claimed[next] += 3;
    let claimed_dev = upload(&stream, &claimed, n, 0)?;
    let arrays = HandleArrays::new(
        &stream,
        n,
        config.num_channels(),
        mine.num_tokens,
        received.len(),
    )?;
    let notify_in = notify_inputs(&layout, claimed_dev.view());
    // SAFETY: views of the arrays above; the world's stream. The notify step's own wait may
    // raise the error (it checks the record while it waits), or the check after it.
    let result = unsafe {
        buffer.notify_raw(
            &notify_in,
            &arrays.notify_outputs(),
            config,
            true,
            stream.cu_stream(),
        )
    }
    .and_then(|_| buffer.check());
    let key = format!("num_tokens_per_rank[{next}] = {}", claimed[next]);
    tally.expect_error(
        me,
        "num_tokens_per_rank that disagrees with the routing",
        result,
        &key,
    );
    // rank_prefix_matrix[i][j]: tokens ranks 0..=i send to rank j, by the routing.
    let want: Vec<i32> = (0..n * n)
        .map(|k| {
            (0..=k / n)
                .map(|i| {
                    (0..all[i].num_tokens)
                        .filter(|&t| all[i].goes_to(t, k % n))
                        .count() as i32
                })
                .sum()
        })
        .collect();
    let got = arrays.rank_prefix.to_host(&stream)?;
    tally.check(me, got == want, || {
        format!("counts that disagree: rank_prefix_matrix {got:?}, by the routing {want:?}")
    });
    dispatch_with(buffer, tally, config, (&all, &layout, &arrays, &received))
}

/// A cached dispatch (bf16 x, no top-k) with the handle of that notify step: every row the
/// routing sends arrives, in order.
fn dispatch_with(
    buffer: &mut NvshmemBuffer<&World>,
    tally: &mut Tally,
    config: &Config,
    (all, layout, arrays, received): (&[Tokens], &Layout, &HandleArrays, &[(usize, usize)]),
) -> Result<(), AnyError> {
    let world = buffer.world();
    let (me, stream) = (world.my_pe(), world.stream().clone());
    let rows = received.len();
    let x = upload(&stream, &all[me].x, all[me].num_tokens, HIDDEN)?;
    let recv_x = poisoned_rows(&stream, rows)?;
    let inputs = DispatchInputs {
        x: x.view(),
        x_scales: None,
        topk_idx: None,
        topk_weights: None,
        num_experts: layout.num_tokens_per_expert.len(),
    };
    let outputs = DispatchOutputs {
        recv_x: recv_x.view(),
        recv_x_scales: None,
        recv_topk_idx: None,
        recv_topk_weights: None,
    };
    // SAFETY: views of live arrays, synchronised below; the world's stream.
    unsafe {
        buffer.dispatch_raw(
            &inputs,
            &arrays.handle(layout, rows),
            &outputs,
            config,
            stream.cu_stream(),
        )
    }?;
    let (got_x, got_src) = (
        recv_x.to_host(&stream)?,
        arrays.recv_src_idx.to_host(&stream)?,
    );
    let wrong = wrong_rows(all, received, rows, &got_x, &got_src);
    tally.check(me, wrong == 0 && buffer.check().is_ok(), || {
        format!("dispatch after counts that disagree: {wrong} of {rows} rows wrong")
    });
    Ok(())
}
