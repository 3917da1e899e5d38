//! Chapter 4's runnable step:
//!
//! ```text
//! torchrun --standalone --nproc_per_node=N --no-python target/release/ch04-collectives
//! ```
//!
//! Runs every collective with every algorithm at sizes from 0 bytes to a few MiB (odd sizes,
//! sizes no PE count divides), each twice with fresh data into a poisoned output, against
//! the host references of `ch04_collectives::reference`. Then: many calls in a row with no
//! reset, a CUDA graph replayed with new inputs, and the mistakes, made on purpose.

use std::process::ExitCode;

use ch01_bootstrap::World;
use ch01_bootstrap::checks::{POISON_BYTE as POISON, Tally};
use ch02_symmetric_memory::SymmetricBuffer;
use ch04_collectives::reference::{self, HostElement, pattern_byte, pattern_value};
use ch04_collectives::{
    Algorithm, CollError, Collective, CollectivesConfig, Communicator, Reducible,
};
use cudarc::driver::{DeviceRepr, ValidAsZeroBits};

type AnyError = Box<dyn std::error::Error>;

/// Element counts per PE: nothing, one, odd, not a multiple of any PE count or of 16 bytes,
/// past the LL scratch.
const COUNTS: [usize; 7] = [0, 1, 13, 1000, 65_537, 262_147, 1_000_003];
/// Largest count any case uses, times the PE count it can be multiplied by.
const MAX_ELEMENTS: usize = 8 * 1_000_003;

fn main() -> ExitCode {
    ch01_bootstrap::checks::exit_code("ch04-collectives", run())
}

fn run() -> Result<bool, AnyError> {
    let world = World::from_env()?;
    let (me, n) = (world.my_pe(), world.n_pes());
    // ANCHOR: setup
    let comm = Communicator::new(&world, CollectivesConfig::default())?;
    // ANCHOR_END: setup
    let mut tally = Tally::default();
    let seed = world.job_seed() as u32;
    let bytes_in = SymmetricBuffer::<_, u8>::new(&world, MAX_ELEMENTS)?;
    let bytes_out = SymmetricBuffer::<_, u8>::new(&world, MAX_ELEMENTS)?;
    let f32_in = SymmetricBuffer::<_, f32>::new(&world, MAX_ELEMENTS)?;
    let f32_out = SymmetricBuffer::<_, f32>::new(&world, MAX_ELEMENTS)?;
    let bf16_in = SymmetricBuffer::<_, half::bf16>::new(&world, MAX_ELEMENTS)?;
    let bf16_out = SymmetricBuffer::<_, half::bf16>::new(&world, MAX_ELEMENTS)?;
    if me == 0 {
        println!(
            "pe 0/{n}: every collective x algorithm x size, twice each, against host references"
        );
    }

    for round in 0..2u32 {
        let seed = seed.wrapping_add(round);
        for count in COUNTS {
            let case = |c: Collective, a: Algorithm| {
                format!("{} {} count {count} round {round}", c.name(), a.name())
            };
            let bytes_of = |pe: usize, len: usize| {
                (0..len)
                    .map(|i| pattern_byte(pe, i, seed))
                    .collect::<Vec<u8>>()
            };

            for algorithm in Collective::Broadcast.algorithms().iter().copied() {
                let root = (count + round as usize) % n;
                let inputs: Vec<Vec<u8>> = (0..n).map(|p| bytes_of(p, count)).collect();
                let run = || comm.broadcast(&bytes_out, &bytes_in, count, root, Some(algorithm));
                let got = run_case(&comm, &bytes_in, &inputs[me], &bytes_out, count, run)?;
                let expected = reference::broadcast(&inputs, root);
                record(&mut tally, me, got, &expected, || {
                    case(Collective::Broadcast, algorithm)
                });
            }
            for algorithm in Collective::AllGather.algorithms().iter().copied() {
                let inputs: Vec<Vec<u8>> = (0..n).map(|p| bytes_of(p, count)).collect();
                let run = || comm.all_gather(&bytes_out, &bytes_in, count, Some(algorithm));
                let got = run_case(&comm, &bytes_in, &inputs[me], &bytes_out, n * count, run)?;
                record(&mut tally, me, got, &reference::all_gather(&inputs), || {
                    case(Collective::AllGather, algorithm)
                });
            }
            for algorithm in Collective::AllToAll.algorithms().iter().copied() {
                let inputs: Vec<Vec<u8>> = (0..n).map(|p| bytes_of(p, n * count)).collect();
                let run = || comm.all_to_all(&bytes_out, &bytes_in, count, Some(algorithm));
                let got = run_case(&comm, &bytes_in, &inputs[me], &bytes_out, n * count, run)?;
                record(
                    &mut tally,
                    me,
                    got,
                    &reference::all_to_all(&inputs, me, count),
                    || case(Collective::AllToAll, algorithm),
                );
            }
            check_reductions(&comm, &mut tally, &f32_in, &f32_out, count, seed)?;
            check_reductions(&comm, &mut tally, &bf16_in, &bf16_out, count, seed)?;
        }
    }
    check_all_to_all_v(&comm, &mut tally, &world, seed)?;
    check_many_calls(&comm, &mut tally, &f32_in, &f32_out, seed)?;
    check_graph_replay(&comm, &mut tally, &f32_in, &f32_out, seed)?;
    check_sync_all(&comm, &mut tally, &bytes_in, &bytes_out, seed)?;
    check_mistakes(&comm, &mut tally, &bytes_in, &bytes_out, &f32_in)?;
    drop(comm);
    check_device_errors(&world, &mut tally)?;
    Ok(tally.finish(&world)?)
}

/// All-reduce and reduce-scatter with every algorithm, for one element type.
fn check_reductions<T>(
    comm: &Communicator<&World>,
    tally: &mut Tally,
    input: &SymmetricBuffer<&World, T>,
    out: &SymmetricBuffer<&World, T>,
    count: usize,
    seed: u32,
) -> Result<(), AnyError>
where
    T: Reducible + HostElement + ValidAsZeroBits + Default,
{
    let (me, n) = (comm.world().my_pe(), comm.world().n_pes());
    let dtype = T::DTYPE.name();
    let values_of = |pe: usize, len: usize| {
        (0..len)
            .map(|i| T::from_f32(pattern_value(pe, i, seed)))
            .collect::<Vec<T>>()
    };
    for algorithm in Collective::AllReduce.algorithms().iter().copied() {
        let inputs: Vec<Vec<T>> = (0..n).map(|p| values_of(p, count)).collect();
        let run = || comm.all_reduce(out, input, count, Some(algorithm));
        let got = run_case(comm, input, &inputs[me], out, count, run)?;
        record(
            tally,
            me,
            got,
            &reference::all_reduce(&inputs, count),
            || format!("all_reduce {} {dtype} count {count}", algorithm.name()),
        );
    }
    // In place: the output is the input.
    let inputs: Vec<Vec<T>> = (0..n).map(|p| values_of(p, count)).collect();
    upload(input, &inputs[me])?;
    comm.all_reduce(input, input, count, Some(Algorithm::TwoShot))?;
    let got = download(input, count)?;
    comm.check()?;
    record(
        tally,
        me,
        Some(got),
        &reference::all_reduce(&inputs, count),
        || format!("all_reduce two_shot in place {dtype} count {count}"),
    );
    for algorithm in Collective::ReduceScatter.algorithms().iter().copied() {
        let inputs: Vec<Vec<T>> = (0..n).map(|p| values_of(p, n * count)).collect();
        let run = || comm.reduce_scatter(out, input, count, Some(algorithm));
        let got = run_case(comm, input, &inputs[me], out, count, run)?;
        record(
            tally,
            me,
            got,
            &reference::reduce_scatter(&inputs, me, count),
            || format!("reduce_scatter {} {dtype} count {count}", algorithm.name()),
        );
    }
    Ok(())
}

// ANCHOR: all_to_all_v
/// all-to-all-v with counts that only the device knows: random splits (some PE sending
/// nothing to some peer), then every row to PE 0.
fn check_all_to_all_v(
    comm: &Communicator<&World>,
    tally: &mut Tally,
    world: &World,
    seed: u32,
) -> Result<(), AnyError> {
    let (me, n) = (world.my_pe(), world.n_pes());
    let row_len = 7168; // one token of a hidden size 7168 model, in bytes here
    let rows_for = |p: usize, q: usize, shape: usize| match shape {
        0 => (kernels::pattern_word(p, q as u64, seed) % 9) as usize, // 0..=8 rows, often none
        _ => {
            if q == 0 {
                5 + p
            } else {
                0
            }
        } // everything to PE 0
    };
    let input = SymmetricBuffer::<_, u8>::new(world, 64 * row_len)?;
    let out = SymmetricBuffer::<_, u8>::new(world, 64 * row_len)?;
    let stream = world.stream();
    for shape in 0..2 {
        let splits: Vec<Vec<usize>> = (0..n)
            .map(|p| (0..n).map(|q| rows_for(p, q, shape)).collect())
            .collect();
        let inputs: Vec<Vec<u8>> = (0..n)
            .map(|p| {
                (0..splits[p].iter().sum::<usize>() * row_len)
                    .map(|i| pattern_byte(p, i, seed))
                    .collect()
            })
            .collect();
        upload(&input, &inputs[me])?;
        out.fill_bytes(POISON)?;
        let in_splits =
            stream.clone_htod(&splits[me].iter().map(|&r| r as i64).collect::<Vec<_>>())?;
        let mut out_splits_offsets = stream.alloc_zeros::<i64>(2 * n)?;
        comm.all_to_all_v(&out, &input, row_len, &in_splits, &mut out_splits_offsets)?;
        let counts_offsets = stream.clone_dtoh(&out_splits_offsets)?;
        let (expected, counts, offsets) = reference::all_to_all_v(&inputs, &splits, me, row_len);
        let got = download(&out, expected.len())?;
        comm.check()?;
        tally.check(
            me,
            got == expected && counts_offsets == [counts, offsets].concat(),
            || format!("all_to_all_v shape {shape}: rows or counts differ ({counts_offsets:?})"),
        );
    }
    Ok(())
}
// ANCHOR_END: all_to_all_v

/// 1000 calls in a row, alternating algorithms, no host synchronisation and no reset in
/// between; the last result of each algorithm is checked.
fn check_many_calls(
    comm: &Communicator<&World>,
    tally: &mut Tally,
    input: &SymmetricBuffer<&World, f32>,
    out: &SymmetricBuffer<&World, f32>,
    seed: u32,
) -> Result<(), AnyError> {
    let (me, n) = (comm.world().my_pe(), comm.world().n_pes());
    let count = 4099;
    let inputs: Vec<Vec<f32>> = (0..n)
        .map(|p| (0..count).map(|i| pattern_value(p, i, seed ^ 7)).collect())
        .collect();
    upload(input, &inputs[me])?;
    out.fill_bytes(POISON)?;
    for call in 0..1000 {
        match call % 4 {
            0 => comm.all_reduce(out, input, count, Some(Algorithm::OneShot))?,
            1 => comm.all_reduce(out, input, count, Some(Algorithm::TwoShot))?,
            2 => comm.sync_all()?,
            _ => comm.all_gather(out, input, count / n, None)?,
        }
    }
    comm.all_reduce(out, input, count, None)?;
    let got = download(out, count)?;
    comm.check()?;
    record(
        tally,
        me,
        Some(got),
        &reference::all_reduce(&inputs, count),
        || "1000 consecutive calls, then all_reduce".into(),
    );
    Ok(())
}

// ANCHOR: graph
/// Capture an all-reduce and an all-gather once, replay the graph with new inputs.
fn check_graph_replay(
    comm: &Communicator<&World>,
    tally: &mut Tally,
    input: &SymmetricBuffer<&World, f32>,
    out: &SymmetricBuffer<&World, f32>,
    seed: u32,
) -> Result<(), AnyError> {
    let (me, n) = (comm.world().my_pe(), comm.world().n_pes());
    let count = 1024;
    let gathered = SymmetricBuffer::<_, f32>::new(comm.world(), n * count)?;
    let stream = comm.world().stream();
    stream.begin_capture(
        cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
    )?;
    comm.all_reduce(out, input, count, Some(Algorithm::OneShot))?;
    comm.all_gather(&gathered, out, count, Some(Algorithm::Direct))?;
    let graph = stream
        .end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0))?
        .ok_or("stream capture produced no graph")?;
    for replay in 0..5u32 {
        let inputs: Vec<Vec<f32>> = (0..n)
            .map(|p| {
                (0..count)
                    .map(|i| pattern_value(p, i, seed ^ replay))
                    .collect()
            })
            .collect();
        upload(input, &inputs[me])?;
        gathered.fill_bytes(POISON)?;
        graph.launch()?;
        let got = download(&gathered, n * count)?;
        comm.check()?;
        let sum = reference::all_reduce(&inputs, count);
        record(tally, me, Some(got), &sum.repeat(n), || {
            format!("graph replay {replay}")
        });
    }
    Ok(())
}
// ANCHOR_END: graph

/// sync_all orders stream work across PEs: write, barrier, read the neighbour's copy,
/// barrier, write again. Without the barriers the read would see the old round or poison.
fn check_sync_all(
    comm: &Communicator<&World>,
    tally: &mut Tally,
    mine: &SymmetricBuffer<&World, u8>,
    seen: &SymmetricBuffer<&World, u8>,
    seed: u32,
) -> Result<(), AnyError> {
    let world = comm.world();
    let (me, n) = (world.my_pe(), world.n_pes());
    let next = (me + 1) % n;
    let len = 1 << 20;
    let mut ok = true;
    for round in 0..20u32 {
        upload(
            mine,
            &(0..len)
                .map(|i| pattern_byte(me, i, seed ^ round))
                .collect::<Vec<_>>(),
        )?;
        comm.sync_all()?;
        let get = ch03_put_get::Get::new(seen, mine, 0, len, next)?;
        ch03_put_get::get_on_stream(ch03_put_get::Completion::Blocking, &get);
        let got = download(seen, len)?;
        ok &= (0..len).all(|i| got[i] == pattern_byte(next, i, seed ^ round));
        comm.sync_all()?;
    }
    comm.check()?;
    tally.check(me, ok, || {
        "sync_all: a read after the barrier saw another round".into()
    });
    Ok(())
}

/// Every mistake is an error before anything is launched.
fn check_mistakes(
    comm: &Communicator<&World>,
    tally: &mut Tally,
    bytes_in: &SymmetricBuffer<&World, u8>,
    bytes_out: &SymmetricBuffer<&World, u8>,
    f32_in: &SymmetricBuffer<&World, f32>,
) -> Result<(), AnyError> {
    let world = comm.world();
    let (me, n) = (world.my_pe(), world.n_pes());
    let stream = world.stream().cu_stream();
    let local = world.stream().alloc_zeros::<u8>(4096)?;
    let (local_ptr, _) = cudarc::driver::DevicePtr::device_ptr(&local, world.stream());
    let cases: Vec<(&str, Result<(), CollError>, &str)> = vec![
        (
            "non-symmetric input",
            comm.all_gather_raw(bytes_out.device_ptr(), local_ptr, 64, None, stream),
            "not inside NVSHMEM's symmetric heap",
        ),
        (
            "output too small",
            comm.all_gather(bytes_out, bytes_in, MAX_ELEMENTS / n + 1, None),
            "past the end",
        ),
        (
            "algorithm of another collective",
            comm.all_reduce(f32_in, f32_in, 16, Some(Algorithm::Ring)),
            "one_shot, two_shot",
        ),
        (
            "LL past its scratch",
            comm.all_gather(
                bytes_out,
                bytes_in,
                MAX_ELEMENTS / 8,
                Some(Algorithm::OneShot),
            ),
            "ll_max_bytes",
        ),
        (
            "root out of range",
            comm.broadcast(bytes_out, bytes_in, 16, n, None),
            "out of range",
        ),
    ];
    for (what, result, expected) in cases {
        tally.expect_error(me, what, result, expected);
    }
    Ok(())
}

// ANCHOR: device_errors
/// Failures only the device can see: all-to-all-v counts that do not add up, and a peer that
/// never joins a call. Each is recorded by the kernel, which returns; the host raises.
fn check_device_errors(world: &World, tally: &mut Tally) -> Result<(), AnyError> {
    let (me, n) = (world.my_pe(), world.n_pes());
    let config = CollectivesConfig {
        timeout_ms: 300,
        ..CollectivesConfig::default()
    };
    let stream = world.stream();
    let input = SymmetricBuffer::<_, u8>::new(world, 64)?;
    let out = SymmetricBuffer::<_, u8>::new(world, 64)?;

    let comm = Communicator::new(world, config)?;
    // PE 0 claims to send more rows than its input has: every PE sees it in the counts.
    let splits: Vec<i64> = (0..n).map(|_| if me == 0 { 100 } else { 1 }).collect();
    let in_splits = stream.clone_htod(&splits)?;
    let mut out_splits_offsets = stream.alloc_zeros::<i64>(2 * n)?;
    comm.all_to_all_v(&out, &input, 4, &in_splits, &mut out_splits_offsets)?;
    stream.synchronize()?;
    tally.expect_error(me, "bad splits", comm.check(), "pe 0's in_splits");
    tally.expect_error(
        me,
        "a failed communicator stays failed",
        comm.sync_all(),
        "unusable",
    );
    drop(comm);

    if n > 1 {
        let comm = Communicator::new(world, config)?;
        // PE 0 waits in a barrier that no one else enters.
        if me == 0 {
            comm.sync_all()?;
            stream.synchronize()?;
        }
        let message = comm
            .check()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        let ok = if me == 0 {
            message.contains("timed out after 300 ms")
        } else {
            message.is_empty()
        };
        tally.check(me, ok, || format!("timeout: got `{message}`"));
        world.barrier_all()?;
    }
    Ok(())
}
// ANCHOR_END: device_errors

// ---- the checking harness ------------------------------------------------------------------

/// Uploads this PE's input, poisons the output, runs `collective` and downloads `out_len`
/// elements of the output (None when the call was refused, e.g. LL past its scratch).
fn run_case<T: DeviceRepr + ValidAsZeroBits + Default + Clone>(
    comm: &Communicator<&World>,
    input: &SymmetricBuffer<&World, T>,
    host_input: &[T],
    out: &SymmetricBuffer<&World, T>,
    out_len: usize,
    collective: impl FnOnce() -> Result<(), CollError>,
) -> Result<Option<Vec<T>>, AnyError> {
    upload(input, host_input)?;
    out.fill_bytes(POISON)?;
    match collective() {
        Err(CollError::AlgorithmNotApplicable { .. }) => return Ok(None),
        other => other?,
    }
    let got = download(out, out_len)?;
    comm.check()?;
    Ok(Some(got))
}

fn record<T: PartialEq + std::fmt::Debug>(
    tally: &mut Tally,
    me: usize,
    got: Option<Vec<T>>,
    expected: &[T],
    case: impl FnOnce() -> String,
) {
    let Some(got) = got else { return };
    let first_wrong = got.iter().zip(expected).position(|(g, e)| g != e);
    tally.check(
        me,
        got.len() == expected.len() && first_wrong.is_none(),
        || {
            let at = first_wrong.unwrap_or(0);
            format!(
                "{}: element {at}: got {:?}, expected {:?}",
                case(),
                got.get(at),
                expected.get(at)
            )
        },
    );
}

/// host -> elements 0..host.len() of this PE's copy, on the world's stream.
fn upload<T: DeviceRepr>(buffer: &SymmetricBuffer<&World, T>, host: &[T]) -> Result<(), AnyError> {
    let ptr = buffer.element_ptr(0, host.len())?;
    if !host.is_empty() {
        // SAFETY: the range was checked; the copy is ordered before later work on the stream.
        unsafe {
            cudarc::driver::result::memcpy_htod_async(
                ptr,
                host,
                buffer.world().stream().cu_stream(),
            )
        }?;
    }
    Ok(())
}

/// Elements 0..len of this PE's copy, after the world's stream finished its work.
fn download<T: DeviceRepr + ValidAsZeroBits + Default + Clone>(
    buffer: &SymmetricBuffer<&World, T>,
    len: usize,
) -> Result<Vec<T>, AnyError> {
    let ptr = buffer.element_ptr(0, len)?;
    let mut host = vec![T::default(); len];
    let stream = buffer.world().stream();
    if len > 0 {
        // SAFETY: the range was checked; we synchronise before reading `host`.
        unsafe { cudarc::driver::result::memcpy_dtoh_async(&mut host, ptr, stream.cu_stream()) }?;
    }
    stream.synchronize()?;
    Ok(host)
}
