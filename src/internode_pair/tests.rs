//! The graph pair's CPU tests: the four launches of a pair with outputs of `num_worst_tokens`
//! plan at every layout with nothing sized by a count, the combine reading the dispatch's
//! handle, and every way a pair cannot go into a graph is refused naming the fix.

use super::*;
use crate::internode_dispatch::tests::{HIDDEN, call, config, spec_for};
use crate::test_views::{assert_mentions, matrix, vector};
use crate::view::ElemType;

const T: usize = 64;

/// A change that makes a good pair bad.
type Spoil = fn(&mut InternodePair);

/// A pair of `n` ranks in nodes of `g` with top-k K (0: none) and outputs of `worst` rows.
fn pair(n: usize, g: usize, k: usize, worst: usize) -> InternodePair {
    let full = call(n, g, 12, T, k);
    let mut received = full.outputs;
    let rows = |i: u64, cols: usize, elem: ElemType| matrix(i, worst, cols, elem);
    received.recv_x = rows(11, HIDDEN, ElemType::Bf16);
    received.recv_src_meta = rows(14, 2, ElemType::I32);
    received.send_nvl_head = rows(16, g, ElemType::I32);
    if k > 0 {
        received.recv_topk_idx = Some(rows(12, k, ElemType::I64));
        received.recv_topk_weights = Some(rows(13, k, ElemType::F32));
    }
    InternodePair {
        num_worst_tokens: worst,
        layout: InternodeNotifyInputs {
            num_tokens_per_rank: vector(30, n, ElemType::I32),
            num_tokens_per_rdma_rank: vector(31, n / g, ElemType::I32),
            num_tokens_per_expert: vector(32, 4 * n, ElemType::I32),
            is_token_in_rank: full.is_token_in_rank,
            expert_alignment: 1,
        },
        handle: full.handle,
        dispatch: full.inputs,
        received,
        combine: CombineInputs {
            x: rows(20, HIDDEN, ElemType::Bf16),
            topk_weights: (k > 0).then(|| rows(21, k, ElemType::F32)),
            bias: [Some(matrix(24, T, HIDDEN, ElemType::Bf16)), None],
        },
        combined: CombineOutputs {
            combined_x: matrix(22, T, HIDDEN, ElemType::Bf16),
            combined_topk_weights: (k > 0).then(|| matrix(23, T, k, ElemType::F32)),
        },
    }
}

#[test]
fn a_worst_sized_pair_plans_four_launches_sized_by_num_worst_tokens_only() {
    for (n, g) in [(4, 2), (8, 1), (16, 8), (16, 2), (64, 8)] {
        let spec = spec_for(&config(), n, g, n - 1);
        for k in [0, 8] {
            let p = plan_internode_pair(&spec, (&config(), &config()), &pair(n, g, k, 500))
                .unwrap_or_else(|e| panic!("{n} in nodes of {g}, K {k}: {e}"));
            // The full notify, then the cached one before the combine; the host waits on neither
            // (its counts pointer is filled at launch and never read back for a pair).
            assert!(!p.notify.cached() && p.barrier.cached());
            let (d, c) = (p.dispatch.args, p.combine.args);
            assert_eq!((d.num_recv_rows, d.num_forwarded_rows), (500, 500));
            assert_eq!((c.num_recv_rows, c.num_forwarded_rows), (500, 500));
            // The combine reads the handle the dispatch writes, on the device.
            assert_eq!(
                (c.send_rdma_head, c.send_nvl_head),
                (d.send_rdma_head, d.send_nvl_head)
            );
            let prefixes = |a: u64, b: u64| (a, b);
            assert_eq!(
                prefixes(c.recv_gbl_rank_prefix_sum, c.recv_rdma_rank_prefix_sum),
                prefixes(d.recv_gbl_rank_prefix_sum, d.recv_rdma_rank_prefix_sum)
            );
            assert_eq!(
                p.notify.args.recv_gbl_rank_prefix_sum,
                d.recv_gbl_rank_prefix_sum
            );
            assert_eq!(d.bad_input, spec.input_error);
            // The same views plan the same launches: a replay's arguments are its capture's.
            let again = plan_internode_pair(&spec, (&config(), &config()), &pair(n, g, k, 500));
            assert_eq!(format!("{:?}", again.unwrap()), format!("{p:?}"));
        }
    }
}

#[test]
fn a_pair_that_a_graph_cannot_hold_is_refused_naming_the_fix() {
    let (n, g) = (8, 2);
    let spec = spec_for(&config(), n, g, 3);
    let error_of = |p: &InternodePair, combine: &Config| {
        plan_internode_pair(&spec, (&config(), combine), p)
            .expect_err("a pair a graph cannot hold was planned")
            .to_string()
    };
    // Outputs of the counts: the host would have to wait for them.
    let mut counted = pair(n, g, 8, 192);
    counted.num_worst_tokens = 0;
    assert_mentions(
        &error_of(&counted, &config()),
        &["internode_pair", "num_worst_tokens = 0", "cannot wait"],
    );
    // recv_x, send_nvl_head or the combine's x of other than num_worst_tokens rows.
    let spoils: [(&str, Spoil); 4] = [
        ("send_nvl_head has 400 rows", |p| {
            p.received.send_nvl_head = matrix(16, 400, 2, ElemType::I32)
        }),
        ("recv_x has 499 rows", |p| {
            p.received.recv_x = matrix(11, 499, HIDDEN, ElemType::Bf16);
            p.received.recv_src_meta = matrix(14, 499, 2, ElemType::I32);
        }),
        ("recv_src_meta has 7 rows", |p| {
            p.received.recv_src_meta = matrix(14, 7, 2, ElemType::I32)
        }),
        ("the combine's x has 300 rows", |p| {
            p.combine.x = matrix(20, 300, HIDDEN, ElemType::Bf16)
        }),
    ];
    for (name, spoil) in spoils {
        let mut short = pair(n, g, 8, 500);
        spoil(&mut short);
        let error = error_of(&short, &config());
        assert_mentions(
            &error,
            &[
                "internode_pair",
                name,
                "num_worst_tokens = 500",
                "as DeepEP's",
            ],
        );
    }
    // Configs on other channels, and a combine its own plan refuses (sub-rings below a chunk).
    let other = Config::new(48, 8, 256, 16, 128).unwrap();
    assert_mentions(
        &error_of(&pair(n, g, 8, 500), &other),
        &["num_sms = 48", "same num_sms"],
    );
    let small = Config::new(24, 8, 32, 16, 128).unwrap();
    assert_mentions(
        &error_of(&pair(n, g, 8, 500), &small),
        &["internode_combine", "sub-rings of"],
    );
    // num_worst_tokens past i32.
    let mut huge = pair(n, g, 0, 500);
    huge.num_worst_tokens = 1 << 31;
    assert_mentions(
        &error_of(&huge, &config()),
        &["num_worst_tokens = 2147483648", "at most"],
    );
}

/// The pair's launch path never waits for the GPU on the host, which a capture forbids: the
/// notify goes without `wait` (the one host wait of the internode calls, `wait_for_counts`,
/// and its start marker sit under `if wait` in `internode_notify_raw`), and nothing in the path
/// (the notify before that wait, the dispatch's and the combine's launches) synchronises,
/// copies to the host or records an event.
#[test]
fn the_pairs_launches_wait_for_nothing_on_the_host() {
    let source = include_str!("mod.rs");
    let path = source
        .split("pub unsafe fn internode_pair_raw(")
        .nth(1)
        .and_then(|s| s.split("\n    }\n").next())
        .expect("internode_pair_raw");
    assert!(path.contains("internode_notify_raw(&full, &pair.handle, configs.0, false, stream)"));
    let notify = include_str!("../internode_notify/mod.rs");
    let gated = notify
        .split("if wait {")
        .nth(1)
        .expect("the notify's wait is gated")
        .split('}')
        .next()
        .unwrap();
    assert!(gated.contains("mark_started"), "{gated}");
    assert!(notify.contains("if !wait {\n            return Ok(None);"));
    let after = notify.split("if !wait {").nth(1).unwrap();
    assert!(
        after.contains("wait_for_counts"),
        "the counts are read only past `if !wait`"
    );
    let dispatch = include_str!("../internode_dispatch/mod.rs");
    let combine = include_str!("../internode_combine/mod.rs");
    for path in [path, &notify.replace(after, ""), dispatch, combine] {
        for host_wait in [
            "synchronize",
            "to_host",
            "wait_for_counts(",
            "event::record",
            "sleep",
        ] {
            assert!(
                !path.contains(host_wait),
                "a host wait ({host_wait}) on the pair's path"
            );
        }
    }
}
