//! `ch04-coll-bench --nvshmem`: NVSHMEM's own team collectives as a peer, each (collective,
//! size) checked against the host reference first, then timed as ours are.

use ch01_bootstrap::World;
use ch02_symmetric_memory::SymmetricBuffer;
use ch04_collectives::{Collective, reference, team};

use crate::{AnyError, MAX_BYTES, Timer, busbw_factor, header, sizes, wanted, write_csv};

/// NVSHMEM's collectives are checked against the host reference up to this size (the
/// reference holds every PE's input on the host).
const MAX_CHECKED_BYTES: usize = 16 << 20;
/// NVSHMEM's collectives are timed up to this size. Above it NVSHMEM 3.4.5's own all-reduce
/// (NCCL off) runs near 1 GB/s, and on 2x H100 (2026-11-26) its 64 MiB step did not end
/// within run_coll.sh's 300 s: a peer that slow says nothing more at larger sizes.
const NVSHMEM_PEER_MAX_BYTES: usize = 16 << 20;
/// The collectives NVSHMEM has as on-stream team calls, in the order ours are timed.
const TEAM_COLLECTIVES: [Collective; 5] = [
    Collective::AllReduce,
    Collective::ReduceScatter,
    Collective::AllGather,
    Collective::Broadcast,
    Collective::AllToAll,
];

// ANCHOR: nvshmem_team_peer
/// NVSHMEM's own team collectives over the world team, sized and timed as ours: each
/// (collective, size) up to MAX_CHECKED_BYTES checked once against the host reference, then
/// K calls per graph replay (eager calls if NVSHMEM's call cannot be captured).
pub(crate) fn nvshmem_team_peer(
    world: &World,
    timer: &Timer,
    out_path: &str,
) -> Result<bool, AnyError> {
    let (me, n) = (world.my_pe(), world.n_pes());
    let input = SymmetricBuffer::<_, u8>::new(world, MAX_BYTES)?;
    let out = SymmetricBuffer::<_, u8>::new(world, MAX_BYTES)?;
    let stream = world.stream();
    let (mut rows, mut failed) = (Vec::new(), 0usize);
    let scratch = team::process_reduce_scratch_bytes()?;
    for size in sizes().into_iter().filter(|&s| s <= NVSHMEM_PEER_MAX_BYTES) {
        for collective in TEAM_COLLECTIVES.into_iter().filter(|c| wanted(c.name())) {
            if past_scratch(collective, size, n, scratch, me)? {
                continue;
            }
            if size <= MAX_CHECKED_BYTES && !check_team_call(world, collective, &out, &input, size)?
            {
                failed += 1;
            }
            let enqueue = || {
                Ok(
                    team::enqueue_team(world, collective, &out, &input, size, 0, stream)
                        .map(|_| ())?,
                )
            };
            let (us, timing) = timer.time_or_eager(world, size, enqueue)?;
            let busbw = size as f64 / (us * 1e-6) / 1e9 * busbw_factor(collective, n);
            let name = collective.name();
            rows.push(format!(
                "{name},team_world_nccl_off,nvshmem,{timing},{n},{size},{us:.3},{busbw:.3}"
            ));
            if me == 0 {
                println!(
                    "pe 0: nvshmem {name:<14} {size:>10} B {us:>10.2} us {busbw:>8.1} GB/s ({timing})"
                );
            }
        }
    }
    if me == 0 {
        let mut text = header(world)?;
        text.push_str(&format!(
            "# nvshmem peer: team collectives on stream over NVSHMEM_TEAM_WORLD (method nvshmem), \
             NVSHMEM_DISABLE_NCCL={} (NVSHMEM's own implementation, not NCCL); bf16 sum \
             reductions; broadcast from PE 0, out of place; checked against the host reference \
             up to {} MiB; timed up to {} MiB; reduce-scatter up to half of \
             NVSHMEM_REDUCE_SCRATCH_SIZE={scratch} bytes\n",
            std::env::var("NVSHMEM_DISABLE_NCCL").unwrap_or_default(),
            MAX_CHECKED_BYTES >> 20,
            NVSHMEM_PEER_MAX_BYTES >> 20
        ));
        write_csv(out_path, text, &rows)?;
    }
    world.barrier_all()?;
    println!("pe {me}: nvshmem team collectives: {failed} wrong result(s)");
    Ok(failed == 0)
}
// ANCHOR_END: nvshmem_team_peer

/// Whether NVSHMEM cannot take `collective` at `size` bytes: a reduce-scatter past half of its
/// reduction scratch (chapter 4's team.rs, `check_reduce_scratch`). PE 0 says so.
fn past_scratch(
    collective: Collective,
    size: usize,
    n: usize,
    scratch: usize,
    me: usize,
) -> Result<bool, AnyError> {
    let past = team::check_reduce_scratch(&team::team_call(collective, size, n)?, scratch).is_err();
    if past && me == 0 {
        println!(
            "pe 0: nvshmem {} {size} B: past its reduction scratch, not timed",
            collective.name()
        );
    }
    Ok(past)
}

/// One call of NVSHMEM's `collective` on fresh data, compared with the host reference. The
/// inputs show where they came from (PE, index); the output is poisoned first. Reductions use
/// small integers, exact in bf16 whatever order NVSHMEM sums them in.
fn check_team_call(
    world: &World,
    collective: Collective,
    out: &SymmetricBuffer<&World, u8>,
    input: &SymmetricBuffer<&World, u8>,
    size: usize,
) -> Result<bool, AnyError> {
    let (me, n) = (world.my_pe(), world.n_pes());
    let call = team::team_call(collective, size, n)?;
    let seed =
        (world.job_seed() as u32) ^ (size as u32).wrapping_mul(0x9E37_79B9) ^ collective as u32;
    let inputs: Vec<Vec<u8>> = (0..n)
        .map(|pe| team_input(collective, pe, call.in_bytes, seed))
        .collect();
    input.copy_from_host_at(0, &inputs[me])?; // the call reads the first in_bytes
    out.fill_bytes(0xFF)?; // bf16 NaN, and no pattern byte run
    world.barrier_all()?;
    team::enqueue_team(world, collective, out, input, size, 0, world.stream())?;
    world.barrier_all()?;
    let got = out.copy_to_host_range(0, call.out_bytes)?;
    let expected = team_reference(collective, &inputs, me, n, call.out_bytes);
    let wrong = got.iter().zip(&expected).filter(|(a, b)| a != b).count();
    if wrong > 0 {
        eprintln!(
            "pe {me}: nvshmem {} at {size} B: {wrong} wrong bytes of {}",
            collective.name(),
            call.out_bytes
        );
    }
    Ok(wrong == 0)
}

/// PE `pe`'s input bytes: pattern bytes, or for the reductions bf16 integers in [-8, 8].
fn team_input(collective: Collective, pe: usize, num_bytes: usize, seed: u32) -> Vec<u8> {
    if matches!(
        collective,
        Collective::AllReduce | Collective::ReduceScatter
    ) {
        (0..num_bytes / 2)
            .flat_map(|i| {
                let value = (reference::pattern_byte(pe, i, seed) % 17) as f32 - 8.0;
                half::bf16::from_f32(value).to_le_bytes()
            })
            .collect()
    } else {
        (0..num_bytes)
            .map(|i| reference::pattern_byte(pe, i, seed))
            .collect()
    }
}

/// What PE `me`'s output must hold, from every PE's input (broadcast's root is PE 0).
fn team_reference(
    collective: Collective,
    inputs: &[Vec<u8>],
    me: usize,
    n: usize,
    out_bytes: usize,
) -> Vec<u8> {
    let as_bf16 = |bytes: &Vec<u8>| -> Vec<half::bf16> {
        bytes
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]))
            .collect()
    };
    let to_bytes =
        |values: Vec<half::bf16>| values.into_iter().flat_map(|v| v.to_le_bytes()).collect();
    match collective {
        Collective::AllReduce => {
            let values: Vec<_> = inputs.iter().map(as_bf16).collect();
            to_bytes(reference::all_reduce(&values, out_bytes / 2))
        }
        Collective::ReduceScatter => {
            let values: Vec<_> = inputs.iter().map(as_bf16).collect();
            to_bytes(reference::reduce_scatter(&values, me, out_bytes / 2))
        }
        Collective::AllGather => reference::all_gather(inputs),
        Collective::AllToAll => reference::all_to_all(inputs, me, out_bytes / n),
        _ => reference::broadcast(inputs, 0),
    }
}
