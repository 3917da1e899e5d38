//! Chapter 4's runnable step:
//!
//! ```text
//! torchrun --standalone --nproc_per_node=N --no-python target/release/ch04-collectives
//! ```
//!
//! Runs every collective with every algorithm at sizes from 0 to 8 MB (odd sizes, sizes no PE
//! count divides), twice with fresh data into a poisoned output, against the host references
//! of `ch04_collectives::reference`; then the all-reduce just past the size table's last
//! threshold (the table's choice there), 1000 calls in a row with no reset, a CUDA graph
//! replayed with new inputs, the barrier's ordering, and the mistakes, made on purpose.

mod failures;
mod large;

use std::process::ExitCode;

use ch01_bootstrap::World;
use ch01_bootstrap::checks::{CaseSummary, POISON_BYTE, Tally};
use ch02_symmetric_memory::SymmetricBuffer;
use ch04_collectives::reference::{self, HostElement, pattern_byte, pattern_value};
use ch04_collectives::{
    Algorithm, CollError, Collective, CollectivesConfig, Communicator, DType, Reducible, SIZE_TABLE,
};
use cudarc::driver::{DeviceRepr, ValidAsZeroBits};
use failures::*;
use large::*;

type AnyError = Box<dyn std::error::Error>;
type Buffer<'w, T> = SymmetricBuffer<&'w World, T>;

/// Element counts per PE: nothing, one, odd, not a multiple of any PE count or of 16 bytes,
/// past the LL scratch.
const COUNTS: [usize; 7] = [0, 1, 13, 1000, 65_537, 262_147, 1_000_003];
/// Largest count a case uses times the largest PE count it is multiplied by.
const MAX_ELEMENTS: usize = 8 * 1_000_003;

fn main() -> ExitCode {
    ch01_bootstrap::checks::exit_code("ch04-collectives", run())
}

fn run() -> Result<bool, AnyError> {
    let world = World::from_env()?;
    // ANCHOR: setup
    let comm = Communicator::new(&world, CollectivesConfig::default())?;
    // ANCHOR_END: setup
    println!(
        "pe {}: grids of up to {} blocks, one per SM this PE may fill ({} PE(s) on this GPU)",
        world.my_pe(),
        world.num_sms(),
        world.gpu_pes()
    );
    let mut check = Checker::new(&comm);
    let bytes = (
        Buffer::<u8>::new(&world, MAX_ELEMENTS)?,
        Buffer::<u8>::new(&world, MAX_ELEMENTS)?,
    );
    let f32s = (
        Buffer::<f32>::new(&world, MAX_ELEMENTS)?,
        Buffer::<f32>::new(&world, MAX_ELEMENTS)?,
    );
    let bf16s = (
        Buffer::<half::bf16>::new(&world, MAX_ELEMENTS)?,
        Buffer::<half::bf16>::new(&world, MAX_ELEMENTS)?,
    );
    for round in 0..2u32 {
        let seed = (world.job_seed() as u32).wrapping_add(round);
        for count in COUNTS {
            check_byte_collectives(&comm, &mut check, &bytes, count, seed)?;
            check_reductions(&comm, &mut check, &f32s, count, seed)?;
            check_reductions(&comm, &mut check, &bf16s, count, seed)?;
        }
    }
    check_all_to_all_v(&comm, &mut check, world.job_seed() as u32)?;
    check_largest_all_reduce(&comm, &mut check, world.job_seed() as u32)?;
    check_pipelined_broadcast(&comm, &mut check, world.job_seed() as u32)?;
    check_many_calls(&comm, &mut check, &f32s)?;
    check_graph_replay(&comm, &mut check, &f32s)?;
    check_sync_all(&comm, &mut check, &bytes)?;
    check_mistakes(&comm, &mut check, &bytes, &f32s.0)?;
    drop(comm);
    check_device_errors(&world, &mut check)?;
    check.summary.print(check.me);
    Ok(check.tally.finish(&world)?)
}

// ANCHOR: byte_collectives
/// Broadcast, all-gather and all-to-all move bytes: u8 elements, so every size is legal.
fn check_byte_collectives(
    comm: &Communicator<&World>,
    check: &mut Checker,
    (input, out): &(Buffer<u8>, Buffer<u8>),
    count: usize,
    seed: u32,
) -> Result<(), AnyError> {
    let (me, n) = (comm.world().my_pe(), comm.world().n_pes());
    let inputs_of = |len: usize| -> Vec<Vec<u8>> {
        (0..n)
            .map(|p| (0..len).map(|i| pattern_byte(p, i, seed)).collect())
            .collect()
    };
    for &algorithm in Collective::Broadcast.algorithms() {
        let (root, inputs) = (count % n, inputs_of(count));
        let expected = reference::broadcast(&inputs, root);
        check.case(
            comm,
            Collective::Broadcast,
            algorithm,
            "u8",
            (input, &inputs[me]),
            (out, &expected),
            || comm.broadcast(out, input, count, root, Some(algorithm)),
        )?;
    }
    for &algorithm in Collective::AllGather.algorithms() {
        let inputs = inputs_of(count);
        let expected = reference::all_gather(&inputs);
        check.case(
            comm,
            Collective::AllGather,
            algorithm,
            "u8",
            (input, &inputs[me]),
            (out, &expected),
            || comm.all_gather(out, input, count, Some(algorithm)),
        )?;
    }
    for &algorithm in Collective::AllToAll.algorithms() {
        let inputs = inputs_of(n * count);
        let expected = reference::all_to_all(&inputs, me, count);
        check.case(
            comm,
            Collective::AllToAll,
            algorithm,
            "u8",
            (input, &inputs[me]),
            (out, &expected),
            || comm.all_to_all(out, input, count, Some(algorithm)),
        )?;
    }
    Ok(())
}
// ANCHOR_END: byte_collectives

/// All-reduce (out of place and in place) and reduce-scatter, every algorithm, one dtype.
fn check_reductions<T>(
    comm: &Communicator<&World>,
    check: &mut Checker,
    (input, out): &(Buffer<T>, Buffer<T>),
    count: usize,
    seed: u32,
) -> Result<(), AnyError>
where
    T: Reducible + HostElement + ValidAsZeroBits + Default,
{
    let (me, n) = (comm.world().my_pe(), comm.world().n_pes());
    let dtype = T::DTYPE.name();
    let inputs_of = |len: usize| -> Vec<Vec<T>> {
        (0..n)
            .map(|p| {
                (0..len)
                    .map(|i| T::from_f32(pattern_value(p, i, seed)))
                    .collect()
            })
            .collect()
    };
    for &algorithm in Collective::AllReduce.algorithms() {
        let inputs = inputs_of(count);
        let expected = reference::all_reduce(&inputs, count);
        check.case(
            comm,
            Collective::AllReduce,
            algorithm,
            dtype,
            (input, &inputs[me]),
            (out, &expected),
            || comm.all_reduce(out, input, count, Some(algorithm)),
        )?;
        // In place: the output is the input.
        check.case(
            comm,
            Collective::AllReduce,
            algorithm,
            "in place",
            (input, &inputs[me]),
            (input, &expected),
            || comm.all_reduce(input, input, count, Some(algorithm)),
        )?;
    }
    for &algorithm in Collective::ReduceScatter.algorithms() {
        let inputs = inputs_of(n * count);
        let expected = reference::reduce_scatter(&inputs, me, count);
        check.case(
            comm,
            Collective::ReduceScatter,
            algorithm,
            dtype,
            (input, &inputs[me]),
            (out, &expected),
            || comm.reduce_scatter(out, input, count, Some(algorithm)),
        )?;
    }
    Ok(())
}

// ANCHOR: all_to_all_v
// ANCHOR_END: all_to_all_v

/// 1000 calls in a row, cycling through algorithms, no host synchronisation and no reset in
/// between: the call numbering and the double-buffered scratch must hold up.
fn check_many_calls(
    comm: &Communicator<&World>,
    check: &mut Checker,
    (input, out): &(Buffer<f32>, Buffer<f32>),
) -> Result<(), AnyError> {
    let (me, n) = (comm.world().my_pe(), comm.world().n_pes());
    let count = 4099;
    let inputs: Vec<Vec<f32>> = (0..n)
        .map(|p| (0..count).map(|i| pattern_value(p, i, 77)).collect())
        .collect();
    let expected = reference::all_reduce(&inputs, count);
    check.case(
        comm,
        Collective::AllReduce,
        Algorithm::OneShot,
        "after 1000 calls",
        (input, &inputs[me]),
        (out, &expected),
        || {
            for call in 0..1000 {
                match call % 5 {
                    0 => comm.all_reduce(out, input, count, Some(Algorithm::OneShot))?,
                    1 => comm.all_reduce(out, input, count, Some(Algorithm::TwoShot))?,
                    2 => comm.all_reduce(out, input, count, Some(Algorithm::RsAg))?,
                    3 => comm.sync_all()?,
                    _ => comm.all_gather(out, input, count / n, None)?,
                }
            }
            comm.all_reduce(out, input, count, None)
        },
    )
}

// ANCHOR: graph
/// An all-reduce and an all-gather captured once, the graph replayed with new inputs: the
/// call numbers live on the device, so every replay is a new call.
fn check_graph_replay(
    comm: &Communicator<&World>,
    check: &mut Checker,
    (input, out): &(Buffer<f32>, Buffer<f32>),
) -> Result<(), AnyError> {
    let (me, n) = (comm.world().my_pe(), comm.world().n_pes());
    let count = 1024;
    let gathered = Buffer::<f32>::new(comm.world(), n * count)?;
    let stream = comm.world().stream();
    stream.begin_capture(
        cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
    )?;
    let captured = comm
        .all_reduce(out, input, count, Some(Algorithm::OneShot))
        .and_then(|()| comm.all_gather(&gathered, out, count, Some(Algorithm::Direct)));
    let graph = stream.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0))?;
    captured?;
    let graph = graph.ok_or("stream capture produced no graph")?;
    for replay in 0..5 {
        let inputs: Vec<Vec<f32>> = (0..n)
            .map(|p| (0..count).map(|i| pattern_value(p, i, replay)).collect())
            .collect();
        let expected = reference::all_reduce(&inputs, count).repeat(n);
        check.case(
            comm,
            Collective::AllGather,
            Algorithm::Direct,
            "graph replay",
            (input, &inputs[me]),
            (&gathered, &expected),
            || {
                graph.launch().map_err(|source| CollError::Cuda {
                    what: "replaying the graph",
                    source,
                })
            },
        )?;
    }
    Ok(())
}
// ANCHOR_END: graph

/// sync_all orders stream work across PEs: write, barrier, read the neighbour's copy,
/// barrier, write again. Without the barriers a read could see the other round.
fn check_sync_all(
    comm: &Communicator<&World>,
    check: &mut Checker,
    (mine, seen): &(Buffer<u8>, Buffer<u8>),
) -> Result<(), AnyError> {
    let world = comm.world();
    let (me, next) = (world.my_pe(), (world.my_pe() + 1) % world.n_pes());
    let len = 1 << 20;
    for round in 0..20u32 {
        mine.copy_from_host_at(
            0,
            &(0..len)
                .map(|i| pattern_byte(me, i, round))
                .collect::<Vec<_>>(),
        )?;
        comm.sync_all()?;
        let get = ch03_put_get::Get::new(seen, mine, 0, len, next)?;
        ch03_put_get::get_on_stream(ch03_put_get::Completion::Blocking, &get);
        let got = seen.copy_to_host_range(0, len)?;
        comm.sync_all()?;
        check.record(
            Collective::SyncAll,
            Algorithm::Signal,
            "read after barrier",
            &got,
            &(0..len)
                .map(|i| pattern_byte(next, i, round))
                .collect::<Vec<_>>(),
        );
    }
    Ok(comm.check()?)
}

// ANCHOR: device_errors
// ANCHOR_END: device_errors

// ---- the checking harness: ch01's Tally, one case at a time ----------------------------------

/// Runs cases against host references and counts them per (collective, algorithm, variant).
struct Checker {
    tally: Tally,
    me: usize,
    summary: CaseSummary,
}

impl Checker {
    fn new(comm: &Communicator<&World>) -> Self {
        Self {
            tally: Tally::default(),
            me: comm.world().my_pe(),
            summary: CaseSummary::default(),
        }
    }

    /// Uploads this PE's input, poisons the output, runs `call`, and compares the output
    /// with `expected`. A call refused because its algorithm cannot take the size (LL past
    /// its scratch) is not a case.
    #[allow(clippy::too_many_arguments)]
    fn case<T: DeviceRepr + ValidAsZeroBits + Default + Clone + PartialEq + std::fmt::Debug>(
        &mut self,
        comm: &Communicator<&World>,
        collective: Collective,
        algorithm: Algorithm,
        variant: &str,
        (input, host_input): (&Buffer<T>, &[T]),
        (out, expected): (&Buffer<T>, &[T]),
        call: impl FnOnce() -> Result<(), CollError>,
    ) -> Result<(), AnyError> {
        input.copy_from_host_at(0, host_input)?;
        if !std::ptr::eq(input, out) {
            out.fill_bytes(POISON_BYTE)?;
        }
        match call() {
            Err(CollError::AlgorithmNotApplicable { .. }) => return Ok(()),
            other => other?,
        }
        // No barrier before the next case: its upload and poison are safe because a call
        // returns only after every peer is done with this PE's buffers (the tickets).
        let got = out.copy_to_host_range(0, expected.len())?;
        // The copy waited for the call, so its failure record is final: a call that gave up
        // left its output unwritten, and that is its error, not a wrong result.
        comm.check()?;
        self.record(collective, algorithm, variant, &got, expected);
        Ok(())
    }

    fn record<T: PartialEq + std::fmt::Debug>(
        &mut self,
        c: Collective,
        a: Algorithm,
        variant: &str,
        got: &[T],
        expected: &[T],
    ) {
        let key = format!("{:<14} {:<14} {variant}", c.name(), a.name());
        let wrong = got.iter().zip(expected).position(|(g, e)| g != e);
        let ok = got.len() == expected.len() && wrong.is_none();
        self.summary.record(&key, ok);
        self.tally.check(self.me, ok, || {
            let at = wrong.unwrap_or(0);
            format!(
                "{key}, {} elements: element {at} is {:?}, expected {:?}",
                expected.len(),
                got.get(at),
                expected.get(at)
            )
        });
    }
}
