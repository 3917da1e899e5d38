//! The cases past the byte sweep: all-to-all-v with counts only the GPU knows, the largest
//! all-reduce (the size table's last algorithm), and broadcasts long enough for their pipeline,
//! by both of its units.

use ch04_collectives::algorithm::BROADCAST_UNITS_FROM;

use super::*;

/// all-to-all-v with counts only the device knows: random splits (often none from a PE to a
/// peer), then everything to PE 0. Rows of 7168 bytes, one token of a hidden-size-7168 model.
pub(crate) fn check_all_to_all_v(
    comm: &Communicator<&World>,
    check: &mut Checker,
    seed: u32,
) -> Result<(), AnyError> {
    let world = comm.world();
    let (me, n, stream) = (world.my_pe(), world.n_pes(), world.stream());
    let row_len = 7168;
    // Random: up to 8 rows from each PE. All to PE 0: 5 + p rows from PE p, so PE 0 receives
    // 5n + n(n - 1)/2 (68 at n = 8).
    let max_rows = (8 * n).max(5 * n + n * (n - 1) / 2);
    let input = Buffer::<u8>::new(world, max_rows * row_len)?;
    let out = Buffer::<u8>::new(world, max_rows * row_len)?;
    for shape in ["random", "all to pe 0"] {
        let rows = |p: usize, q: usize| match shape {
            "random" => (kernels::pattern_word(p, q as u64, seed) % 9) as usize,
            _ => usize::from(q == 0) * (5 + p),
        };
        let splits: Vec<Vec<usize>> = (0..n)
            .map(|p| (0..n).map(|q| rows(p, q)).collect())
            .collect();
        let inputs: Vec<Vec<u8>> = (0..n)
            .map(|p| {
                (0..splits[p].iter().sum::<usize>() * row_len)
                    .map(|i| pattern_byte(p, i, seed))
                    .collect()
            })
            .collect();
        let (expected, counts, offsets) = reference::all_to_all_v(&inputs, &splits, me, row_len);
        let in_splits =
            stream.clone_htod(&splits[me].iter().map(|&r| r as i64).collect::<Vec<_>>())?;
        let mut out_splits_offsets = stream.alloc_zeros::<i64>(2 * n)?;
        check.case(
            comm,
            Collective::AllToAllV,
            Algorithm::Direct,
            shape,
            (&input, &inputs[me]),
            (&out, &expected),
            || comm.all_to_all_v(&out, &input, row_len, &in_splits, &mut out_splits_offsets),
        )?;
        let got = stream.clone_dtoh(&out_splits_offsets)?;
        check
            .tally
            .check(me, got == [counts, offsets].concat(), || {
                format!("all_to_all_v {shape}: counts {got:?}")
            });
    }
    Ok(())
}

/// The all-reduce past the size table's last threshold, by the table's choice (rs_ag there):
/// a count no PE count or vector divides, out of place and in place, f32. The sizes above
/// stop at 4 MB of all-reduce, where every block moves one piece of its chunk; here each
/// moves several.
pub(crate) fn check_largest_all_reduce(
    comm: &Communicator<&World>,
    check: &mut Checker,
    seed: u32,
) -> Result<(), AnyError> {
    let (me, n) = (comm.world().my_pe(), comm.world().n_pes());
    let threshold = SIZE_TABLE
        .iter()
        .filter(|r| r.0 == Collective::AllReduce && r.1 < usize::MAX)
        .map(|r| r.1)
        .max()
        .unwrap_or(0);
    let count = threshold / 4 + 1001;
    let algorithm = comm
        .plan(Collective::AllReduce, None, 4 * count, Some(DType::F32))?
        .algorithm;
    check.tally.check(me, algorithm == Algorithm::RsAg, || {
        format!(
            "all_reduce of {} B: the table chose {}",
            4 * count,
            algorithm.name()
        )
    });
    let input = Buffer::<f32>::new(comm.world(), count)?;
    let out = Buffer::<f32>::new(comm.world(), count)?;
    let inputs: Vec<Vec<f32>> = (0..n)
        .map(|p| (0..count).map(|i| pattern_value(p, i, seed)).collect())
        .collect();
    let expected = reference::all_reduce(&inputs, count);
    for in_place in [false, true] {
        let out = if in_place { &input } else { &out };
        check.case(
            comm,
            Collective::AllReduce,
            algorithm,
            if in_place {
                "largest, in place"
            } else {
                "largest"
            },
            (&input, &inputs[me]),
            (out, &expected),
            || comm.all_reduce(out, &input, count, None),
        )?;
    }
    Ok(())
}

/// Broadcasts long enough for the pipeline's steps (the byte cases above stop at 1 MB, one
/// step), by both of its units: the block (`scatter_gather`) and the 4-warp unit
/// (`scatter_gather_units`), each from the last PE and from PE 0, out of place and in place.
/// Two sizes: where the table switches to the units at n > 2 (`BROADCAST_UNITS_FROM`, 4 MiB:
/// one step), and 24 MiB + 5 bytes (on 4x H100 at N = 4, 2 steps of the block pipeline and 5 of
/// the units', the last round 16 bytes of one unit; at N = 2 one step and no forwarder).
/// First, that the table chooses the units there at n > 2 and the block pipeline at n = 2.
pub(crate) fn check_pipelined_broadcast(
    comm: &Communicator<&World>,
    check: &mut Checker,
    seed: u32,
) -> Result<(), AnyError> {
    let (me, n) = (comm.world().my_pe(), comm.world().n_pes());
    let largest = (24 << 20) + 5;
    let input = Buffer::<u8>::new(comm.world(), largest)?;
    let out = Buffer::<u8>::new(comm.world(), largest)?;
    for count in [BROADCAST_UNITS_FROM, largest] {
        let chosen = comm
            .plan(Collective::Broadcast, None, count, None)?
            .algorithm;
        let rule = if n > 2 {
            Algorithm::ScatterGatherUnits
        } else {
            Algorithm::ScatterGather
        };
        check.tally.check(me, chosen == rule, || {
            format!(
                "broadcast of {count} B at n = {n}: the table chose {}",
                chosen.name()
            )
        });
        for root in [n - 1, 0] {
            let inputs: Vec<Vec<u8>> = (0..n)
                .map(|p| {
                    (0..count)
                        .map(|i| pattern_byte(p, i, seed + root as u32))
                        .collect()
                })
                .collect();
            let expected = reference::broadcast(&inputs, root);
            for algorithm in [Algorithm::ScatterGather, Algorithm::ScatterGatherUnits] {
                for in_place in [false, true] {
                    let out = if in_place { &input } else { &out };
                    let variant = format!(
                        "pipelined {count} B{}",
                        if in_place { ", in place" } else { "" }
                    );
                    check.case(
                        comm,
                        Collective::Broadcast,
                        algorithm,
                        &variant,
                        (&input, &inputs[me]),
                        (out, &expected),
                        || comm.broadcast(out, &input, count, root, Some(algorithm)),
                    )?;
                }
            }
        }
    }
    Ok(())
}
