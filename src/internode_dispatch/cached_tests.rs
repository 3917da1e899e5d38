//! The cached dispatch's CPU tests: its plan is the full dispatch's (same rings, slot, handle
//! positions 3-6 and words) with the handle's outputs left alone, every refusal names its
//! argument, and the kernel writes handle 7-9 only where the full dispatch passes them.

use super::tests::{HIDDEN, call, config, plan_of, spec_for};
use super::*;
use crate::test_views::{assert_mentions, matrix, vector};
use crate::view::ElemType;

/// The cached call of the full call `call(n, g, 12, 64, 0)` made: the same routing, positions,
/// x and recv_x, with its recv_src_meta.
fn cached_call(n: usize, g: usize) -> InternodeCachedDispatchCall {
    let full = call(n, g, 12, 64, 0);
    InternodeCachedDispatchCall {
        inputs: full.inputs,
        handle: InternodeCachedHandle {
            is_token_in_rank: full.is_token_in_rank,
            prefixes: full.handle,
            recv_src_meta: full.outputs.recv_src_meta,
        },
        recv_x: full.outputs.recv_x,
        recv_x_scales: None,
    }
}

#[test]
fn a_cached_dispatch_is_the_full_one_without_writing_the_handle() {
    for (n, g) in [(4, 2), (8, 1), (16, 8), (64, 4)] {
        let spec = spec_for(&config(), n, g, n - 1);
        let full = plan_of(&spec, &config(), &call(n, g, 12, 64, 0)).unwrap();
        let cached = plan_internode_cached_dispatch(&spec, &config(), &cached_call(n, g)).unwrap();
        let (f, c) = (full.args, cached.args);
        assert_eq!(cached.num_channels, full.num_channels);
        // Not written: the handle's outputs (and no top-k).
        let none = (c.send_rdma_head, c.send_nvl_head, c.recv_src_meta);
        assert_eq!(none, (0, 0, 0));
        assert_eq!(
            (c.recv_topk_idx, c.topk_idx, c.num_forwarded_rows),
            (0, 0, 0)
        );
        // Everything else is the full dispatch's: the same positions, rings, words and rows.
        let same = |a: &InternodeDispatchArgs| {
            (
                a.x,
                a.is_token_in_rank,
                a.recv_rdma_channel_prefix_matrix,
                a.recv_rdma_rank_prefix_sum,
                a.recv_gbl_channel_prefix_matrix,
                a.recv_gbl_rank_prefix_sum,
                a.recv_x,
                a.calls,
                a.num_recv_rows,
            )
        };
        assert_eq!(same(&c), same(&f));
        assert_eq!(
            (c.rings.base, c.rings.chunk_words, c.slot.bytes),
            (f.rings.base, f.rings.chunk_words, f.slot.bytes)
        );
        assert_eq!(
            (c.nvl_counters.tails, c.nvl, c.topo.node_start),
            (f.nvl_counters.tails, f.nvl, f.topo.node_start)
        );
    }
    // fp8 with scales after a bf16 full dispatch: the row format is the call's own.
    let (n, g) = (8, 2);
    let spec = spec_for(&config(), n, g, 3);
    let mut x = cached_call(n, g);
    x.inputs.x = matrix(1, 64, HIDDEN, ElemType::Fp8E4m3);
    x.inputs.x_scales = Some(matrix(17, 64, HIDDEN / 128, ElemType::F32));
    x.recv_x = matrix(11, 192, HIDDEN, ElemType::Fp8E4m3);
    x.recv_x_scales = Some(matrix(18, 192, HIDDEN / 128, ElemType::F32));
    let a = plan_internode_cached_dispatch(&spec, &config(), &x)
        .unwrap()
        .args;
    assert_eq!((a.slot.bytes, a.slot.num_scales), (7_408, 56));
}

#[test]
fn every_bad_cached_call_is_refused_naming_it() {
    let (n, g) = (8, 2);
    let spec = spec_for(&config(), n, g, 3);
    type Spoil = fn(&mut InternodeCachedDispatchCall);
    let cases: [(&[&str], Spoil); 7] = [
        (&["no topk_idx or topk_weights", "DeepEP"], |x| {
            let full = call(8, 2, 12, 64, 8);
            x.inputs.topk_idx = full.inputs.topk_idx;
            x.inputs.topk_weights = full.inputs.topk_weights;
        }),
        (
            &["recv_x has 100 rows", "recv_src_meta", "allocate recv_x"],
            |x| x.recv_x = matrix(11, 100, HIDDEN, ElemType::Bf16),
        ),
        (&["recv_src_meta must be int32 [_, 2]"], |x| {
            x.handle.recv_src_meta = matrix(14, 192, 8, ElemType::I32)
        }),
        (&["recv_gbl_rank_prefix_sum"], |x| {
            x.handle.prefixes.recv_gbl_rank_prefix_sum = vector(10, 2, ElemType::I32)
        }),
        (&["is_token_in_rank"], |x| {
            x.handle.is_token_in_rank = matrix(4, 64, 4, ElemType::Bool)
        }),
        (&["fp8 x needs recv_x_scales"], |x| {
            x.inputs.x = matrix(1, 64, HIDDEN, ElemType::Fp8E4m3);
            x.inputs.x_scales = Some(matrix(17, 64, 56, ElemType::F32));
            x.recv_x = matrix(11, 192, HIDDEN, ElemType::Fp8E4m3);
        }),
        (&["recv_x must be bfloat16"], |x| {
            x.recv_x = matrix(11, 192, 4096, ElemType::Bf16)
        }),
    ];
    for (parts, spoil) in cases {
        let mut x = cached_call(n, g);
        spoil(&mut x);
        let error = plan_internode_cached_dispatch(&spec, &config(), &x)
            .expect_err("a bad cached call was planned")
            .to_string();
        assert_mentions(&error, &[&["internode_cached_dispatch"], parts].concat());
    }
}

/// The kernel's every store into handle 7-9 sits behind a null check, so a cached dispatch
/// (null) leaves the handle as the full one wrote it.
#[test]
fn the_kernel_writes_the_handle_only_when_given_it() {
    let code = include_str!("../../kernels/cuda/buffer/internode_dispatch.cu");
    for output in ["send_rdma_head", "send_nvl_head", "recv_src_meta"] {
        let store = format!("a.{output}[");
        let guard = format!("a.{output} != nullptr");
        let stores: Vec<&str> = code.split('\n').filter(|l| l.contains(&store)).collect();
        assert!(!stores.is_empty(), "{output} is written");
        for line in stores {
            // The guard is on the store's line or on the loop or branch just above it.
            let at = code.find(line).unwrap();
            let before = &code[code[..at]
                .rfind("for (")
                .max(code[..at].rfind("if ("))
                .unwrap()..at];
            assert!(
                line.contains(&guard) || before.contains(&guard),
                "{output}: a store without `{guard}`: {line}"
            );
        }
    }
}

/// internode-dispatch's pair 4 at 2 nodes of 1 (the GPU failure of 2026-11-27): rank 0 sends no
/// tokens and receives everything, rank 1 sends T and receives none, fp8 rows with column-major
/// scales. Both ranks' cached (and full) dispatches plan, so neither refuses on the host and
/// leaves the other in the cached notify: the [0, S] scales with torch's strides of an empty
/// array's transpose ([1, 1]), and the [0, H] / [0, S] outputs.
#[test]
fn a_rank_without_tokens_or_rows_plans_fp8_with_column_major_scales() {
    let (n, g, s) = (2, 1, HIDDEN / 128);
    for (me, t, m) in [(0, 0, 300), (1, 300, 0)] {
        let spec = spec_for(&config(), n, g, me);
        let mut x = cached_call(n, g);
        x.inputs.x = matrix(1, t, HIDDEN, ElemType::Fp8E4m3);
        x.inputs.x_scales = Some(View {
            strides: [1, t.max(1)],
            ..matrix(17, t, s, ElemType::F32)
        });
        x.handle.is_token_in_rank = matrix(4, t, n, ElemType::Bool);
        x.handle.recv_src_meta = matrix(14, m, 2, ElemType::I32);
        x.recv_x = matrix(11, m, HIDDEN, ElemType::Fp8E4m3);
        x.recv_x_scales = Some(matrix(18, m, s, ElemType::F32));
        let a = plan_internode_cached_dispatch(&spec, &config(), &x)
            .unwrap_or_else(|e| panic!("rank {me}: {e}"))
            .args;
        assert_eq!((a.num_tokens, a.num_recv_rows), (t as i32, m as i32));
        assert_eq!(
            (a.scale_token_stride, a.scale_hidden_stride),
            (1, t.max(1) as i64)
        );
        // The full dispatch that made the handle, with the same rows.
        let mut full = call(n, g, 12, t, 0);
        full.inputs = x.inputs;
        full.outputs.recv_x = x.recv_x;
        full.outputs.recv_x_scales = x.recv_x_scales;
        full.outputs.recv_src_meta = x.handle.recv_src_meta;
        full.outputs.send_nvl_head = matrix(16, m, g, ElemType::I32);
        plan_of(&spec, &config(), &full).unwrap_or_else(|e| panic!("rank {me}, full: {e}"));
    }
}
