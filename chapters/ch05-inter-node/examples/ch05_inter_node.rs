//! Chapter 5's runnable step:
//!
//! ```text
//! torchrun --standalone --nproc_per_node=N --no-python target/release/ch05-inter-node
//! NVSHMEM_TUTORIAL_NODE_PES=2 torchrun --standalone --nproc_per_node=4 --no-python \
//!     target/release/ch05-inter-node        # one host as 2 nodes of 2 PEs
//! ```
//!
//! Builds the topology (nodes of torchrun's LOCAL_WORLD_SIZE, or of NVSHMEM_TUTORIAL_NODE_PES),
//! checks NVSHMEM's teams against it, then runs every collective three ways (hierarchical, on
//! NVSHMEM's team collectives, flat), every dtype and size class, twice with fresh data into
//! poisoned outputs, against host references; then calls in a row and a CUDA graph, the
//! mistakes made on purpose, counts that do not add up, and last a PE of another node that
//! never comes (a timeout that names node and local index).

use std::process::ExitCode;

use ch01_bootstrap::checks::{CaseSummary, POISON_BYTE, Tally};
use ch01_bootstrap::{LaunchEnv, World, check_placement, placement};
use ch02_symmetric_memory::SymmetricBuffer;
use ch04_collectives::DType;
use ch04_collectives::reference::{self as flat, pattern_byte, pattern_value};
use ch05_inter_node::reference::{Element, hier_all_reduce, hier_reduce_scatter};
use ch05_inter_node::{InterNodeConfig, InterNodeError, Method, Topology};

type AnyError = Box<dyn std::error::Error>;
type Buffer<'w> = SymmetricBuffer<&'w World, u8>;
type Topo<'w> = Topology<&'w World>;

/// Elements per PE: nothing, one, odd (no node size divides it), past chapter 4's LL scratch.
const COUNTS: [usize; 6] = [0, 1, 13, 1000, 65_537, 262_147];
/// Bytes of the largest input or output a case uses, per PE of the job.
const BYTES_PER_PE: usize = 4 * 262_147;

fn main() -> ExitCode {
    // NVSHMEM's team reduce-scatter stages a PE's whole input (the largest case's n x
    // BYTES_PER_PE) in its scratch: ask for that much at this job's size, read from torchrun's
    // environment before NVSHMEM starts (World::from_env reports a missing one).
    let n = LaunchEnv::from_env().map_or(1, |env| env.world_size);
    // SAFETY: first in main, one thread, before NVSHMEM starts.
    unsafe { ch04_collectives::team::default_reduce_scratch_for(n * BYTES_PER_PE) };
    ch01_bootstrap::checks::exit_code("ch05-inter-node", run())
}

fn run() -> Result<bool, AnyError> {
    let world = World::from_env()?;
    let mut check = Checker {
        tally: Tally::default(),
        me: world.my_pe(),
        summary: CaseSummary::default(),
    };
    check_place(&world, &mut check.tally)?;
    // ANCHOR: setup
    let topo = Topology::from_env(&world, InterNodeConfig::default())?;
    // ANCHOR_END: setup
    describe(&topo);
    let len = BYTES_PER_PE * world.n_pes();
    let bufs = (Buffer::new(&world, len)?, Buffer::new(&world, len)?);
    for round in 0..2u32 {
        let seed = (world.job_seed() as u32).wrapping_add(round);
        for count in COUNTS {
            for method in Method::ALL {
                check_byte_collectives(&topo, &mut check, &bufs, method, count, seed)?;
                check_reductions::<f32>(&topo, &mut check, &bufs, method, count, seed)?;
                check_reductions::<half::bf16>(&topo, &mut check, &bufs, method, count, seed)?;
            }
        }
    }
    for method in [Method::Hierarchical, Method::Flat] {
        check_all_to_all_v(&topo, &mut check, &bufs, method, world.job_seed() as u32)?;
    }
    check_many_calls_and_a_graph(&topo, &mut check, &bufs)?;
    check_mistakes(&topo, &mut check, &bufs)?;
    drop(topo);
    check_device_errors(&world, &mut check, &bufs)?;
    check.summary.print(check.me);
    Ok(check.tally.finish(&world)?)
}

/// Chapter 1's placement check: torchrun's nodes may be virtual (several agents on one host).
fn check_place(world: &World, tally: &mut Tally) -> Result<(), AnyError> {
    let env = LaunchEnv::from_env()?;
    let local_rank = placement::torchrun_local_rank(&env, |name| std::env::var(name).ok());
    let placement = check_placement(&env, local_rank, world.place());
    tally.check(world.my_pe(), placement.is_ok(), || {
        format!("{placement:?}")
    });
    if world.my_pe() == 0 {
        println!(
            "pe 0: placement: {placement:?} (NVSHMEM's node team: {} PEs)",
            world.node_size()
        );
    }
    Ok(())
}

// ANCHOR: describe
/// What the topology made: the layout, and NVSHMEM's node and rail teams, member by member.
fn describe(topo: &Topo) {
    let (layout, me) = (topo.layout(), topo.world().my_pe());
    let (node, rail) = (
        layout.node_team(layout.node_of(me)),
        layout.rail_team(layout.local_of(me)),
    );
    println!(
        "pe {me}: {}: {}; node team (NVSHMEM team {}) = pes {:?}, rail team (team {}) = pes {:?}",
        layout.describe(),
        layout.name(me),
        topo.teams().node,
        node.members(),
        topo.teams().rail,
        rail.members()
    );
}
// ANCHOR_END: describe

/// Test data that shows where it came from: bytes, or values exact in the element type
/// (small integers for NVSHMEM's reductions, which sum in an order of their own).
fn inputs_of<T: Element>(n: usize, len: usize, seed: u32, integers: bool) -> Vec<Vec<T>> {
    let value = |p, i| match integers {
        true => (pattern_byte(p, i, seed) % 9) as f32 - 4.0,
        false => pattern_value(p, i, seed),
    };
    (0..n)
        .map(|p| (0..len).map(|i| T::from_f32(value(p, i))).collect())
        .collect()
}

// ANCHOR: byte_collectives
/// All-gather, broadcast and all-to-all move bytes: every method, the same reference.
fn check_byte_collectives(
    topo: &Topo,
    check: &mut Checker,
    (input, out): &(Buffer, Buffer),
    method: Method,
    count: usize,
    seed: u32,
) -> Result<(), AnyError> {
    let (me, n, s) = (
        topo.world().my_pe(),
        topo.layout().n_pes,
        topo.world().stream().cu_stream(),
    );
    let bytes_of = |len: usize| -> Vec<Vec<u8>> {
        (0..n)
            .map(|p| (0..len).map(|i| pattern_byte(p, i, seed)).collect())
            .collect()
    };
    let (i, o) = (input.device_ptr(), out.device_ptr());
    let inputs = bytes_of(count);
    let expected = flat::all_gather(&inputs);
    let key = format!("all_gather {}", method.name());
    check.case(topo, key, (input, &inputs[me]), (out, &expected), || {
        topo.all_gather_raw(method, o, i, count, s)
    })?;
    let root = (count + 1) % n;
    let key = format!("broadcast {}", method.name());
    let expected = flat::broadcast(&inputs, root);
    check.case(topo, key, (input, &inputs[me]), (out, &expected), || {
        topo.broadcast_raw(method, o, i, count, root, s)
    })?;
    if method != Method::NvshmemTeams {
        let inputs = bytes_of(n * count);
        let expected = flat::all_to_all(&inputs, me, count);
        let key = format!("all_to_all {}", method.name());
        check.case(topo, key, (input, &inputs[me]), (out, &expected), || {
            topo.all_to_all_raw(method, o, i, count, s)
        })?;
    }
    Ok(())
}
// ANCHOR_END: byte_collectives

// ANCHOR: reductions
/// All-reduce (out of place and in place) and reduce-scatter, each against the reference of
/// its own order of sums: node by node (hierarchical), PE by PE (flat), or any (NVSHMEM's,
/// on small integers that every order sums exactly).
fn check_reductions<T: Element>(
    topo: &Topo,
    check: &mut Checker,
    (input, out): &(Buffer, Buffer),
    method: Method,
    count: usize,
    seed: u32,
) -> Result<(), AnyError> {
    if method == Method::NvshmemTeams && T::DTYPE == DType::F32 {
        return Ok(()); // NVSHMEM's baseline reduces bf16 only (chapter 4's team_call)
    }
    let (me, layout, s) = (
        topo.world().my_pe(),
        *topo.layout(),
        topo.world().stream().cu_stream(),
    );
    let (i, o, dtype) = (input.device_ptr(), out.device_ptr(), T::DTYPE);
    let name = |c: &str| format!("{c} {} {}", method.name(), dtype.name());
    let integers = method == Method::NvshmemTeams;
    let values = inputs_of::<T>(layout.n_pes, count, seed, integers);
    let expected = match method {
        Method::Flat => flat::all_reduce(&values, count),
        _ => hier_all_reduce(&values, &layout, count),
    };
    let (host, want) = (T::to_bytes(&values[me]), T::to_bytes(&expected));
    check.case(
        topo,
        name("all_reduce"),
        (input, &host),
        (out, &want),
        || topo.all_reduce_raw(method, o, i, count, dtype, s),
    )?;
    let in_place = || topo.all_reduce_raw(method, i, i, count, dtype, s);
    check.case(
        topo,
        name("all_reduce in place"),
        (input, &host),
        (input, &want),
        in_place,
    )?;
    let values = inputs_of::<T>(layout.n_pes, layout.n_pes * count, seed ^ 1, integers);
    let expected = match method {
        Method::Flat => flat::reduce_scatter(&values, me, count),
        _ => hier_reduce_scatter(&values, &layout, me, count),
    };
    let (host, want) = (T::to_bytes(&values[me]), T::to_bytes(&expected));
    let call = || topo.reduce_scatter_raw(method, o, i, count, dtype, s);
    check.case(
        topo,
        name("reduce_scatter"),
        (input, &host),
        (out, &want),
        call,
    )
}
// ANCHOR_END: reductions

/// All-to-all-v with counts only the device knows: random (often none to a peer), everything
/// to the last PE, nothing at all. Rows of 7168 bytes, one bf16 token of hidden size 3584.
fn check_all_to_all_v(
    topo: &Topo,
    check: &mut Checker,
    (input, out): &(Buffer, Buffer),
    method: Method,
    seed: u32,
) -> Result<(), AnyError> {
    let (me, n, stream) = (
        topo.world().my_pe(),
        topo.layout().n_pes,
        topo.world().stream(),
    );
    let row_bytes = 7168;
    let max_rows = BYTES_PER_PE * n / row_bytes;
    for shape in ["random", "all to the last pe", "none"] {
        let rows = |p: usize, q: usize| match shape {
            "random" => (kernels::pattern_word(p, q as u64, seed) % 5) as usize,
            "all to the last pe" => usize::from(q == n - 1) * (1 + p % 3),
            _ => 0,
        };
        let splits: Vec<Vec<usize>> = (0..n)
            .map(|p| (0..n).map(|q| rows(p, q)).collect())
            .collect();
        let inputs: Vec<Vec<u8>> = (0..n)
            .map(|p| {
                (0..splits[p].iter().sum::<usize>() * row_bytes)
                    .map(|i| pattern_byte(p, i, seed))
                    .collect()
            })
            .collect();
        let (expected, counts, offsets) = flat::all_to_all_v(&inputs, &splits, me, row_bytes);
        let in_splits =
            stream.clone_htod(&splits[me].iter().map(|&r| r as i64).collect::<Vec<_>>())?;
        let outputs = stream.alloc_zeros::<i64>(2 * n)?;
        let (splits_ptr, _) = cudarc::driver::DevicePtr::device_ptr(&in_splits, stream);
        let (outputs_ptr, _) = cudarc::driver::DevicePtr::device_ptr(&outputs, stream);
        let (i, o, s) = (input.device_ptr(), out.device_ptr(), stream.cu_stream());
        let key = format!("all_to_all_v {} {shape}", method.name());
        // SAFETY: both count arrays are device slices of n and 2n int64, alive for the call.
        let call = || unsafe {
            topo.all_to_all_v_raw(
                method,
                o,
                max_rows,
                i,
                max_rows,
                row_bytes,
                splits_ptr,
                outputs_ptr,
                s,
            )
        };
        check.case(
            topo,
            key.clone(),
            (input, &inputs[me]),
            (out, &expected),
            call,
        )?;
        let got = stream.clone_dtoh(&outputs)?;
        check
            .tally
            .check(me, got == [counts, offsets].concat(), || {
                format!("{key}: counts {got:?}")
            });
    }
    Ok(())
}

/// 200 calls in a row, both ways, no host synchronisation and no reset; then a hierarchical
/// all-reduce and a flat all-gather captured once in a CUDA graph and replayed with new data.
fn check_many_calls_and_a_graph(
    topo: &Topo,
    check: &mut Checker,
    (input, out): &(Buffer, Buffer),
) -> Result<(), AnyError> {
    let (me, layout, stream) = (topo.world().my_pe(), *topo.layout(), topo.world().stream());
    let (i, o, s, count) = (
        input.device_ptr(),
        out.device_ptr(),
        stream.cu_stream(),
        4099,
    );
    let values = inputs_of::<f32>(layout.n_pes, count, 77, false);
    let want = f32::to_bytes(&hier_all_reduce(&values, &layout, count));
    let many = || {
        for call in 0..200 {
            match call % 4 {
                0 => topo.all_reduce_raw(Method::Hierarchical, o, i, count, DType::F32, s)?,
                1 => topo.all_reduce_raw(Method::Flat, o, i, count, DType::F32, s)?,
                2 => topo.rail_sync_raw(s)?,
                _ => topo.all_gather_raw(Method::Hierarchical, o, i, 64, s)?,
            }
        }
        topo.all_reduce_raw(Method::Hierarchical, o, i, count, DType::F32, s)
    };
    check.case(
        topo,
        "after 200 calls".into(),
        (input, &f32::to_bytes(&values[me])),
        (out, &want),
        many,
    )?;
    // ANCHOR: graph
    let gathered = Buffer::new(topo.world(), 4 * count * layout.n_pes)?;
    stream.begin_capture(
        cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
    )?;
    let captured = topo
        .all_reduce_raw(Method::Hierarchical, o, i, count, DType::F32, s)
        .and_then(|()| topo.all_gather_raw(Method::Flat, gathered.device_ptr(), o, 4 * count, s));
    let graph = stream.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0))?;
    captured?;
    let graph = graph.ok_or("stream capture produced no graph")?;
    for replay in 0..3 {
        let values = inputs_of::<f32>(layout.n_pes, count, replay, false);
        let want = f32::to_bytes(&hier_all_reduce(&values, &layout, count)).repeat(layout.n_pes);
        let host = f32::to_bytes(&values[me]);
        let replay = || {
            let what = "replaying the graph";
            graph.launch().map_err(InterNodeError::cuda(what))
        };
        check.case(
            topo,
            "graph replay".into(),
            (input, &host),
            (&gathered, &want),
            replay,
        )?;
    }
    // ANCHOR_END: graph
    Ok(())
}

/// Every mistake is an error before anything is launched.
fn check_mistakes(
    topo: &Topo,
    check: &mut Checker,
    (input, out): &(Buffer, Buffer),
) -> Result<(), AnyError> {
    let (world, n) = (topo.world(), topo.layout().n_pes);
    let (me, s, i, o) = (
        world.my_pe(),
        world.stream().cu_stream(),
        input.device_ptr(),
        out.device_ptr(),
    );
    let local = world.stream().alloc_zeros::<u8>(4096)?;
    let (local_ptr, _) = cudarc::driver::DevicePtr::device_ptr(&local, world.stream());
    let tally = &mut check.tally;
    let non_symmetric = topo.all_gather_raw(Method::Hierarchical, o, local_ptr, 64, s);
    tally.expect_error(
        me,
        "non-symmetric input",
        non_symmetric,
        "not inside NVSHMEM's symmetric heap",
    );
    let root = topo.broadcast_raw(Method::Hierarchical, o, i, 16, n, s);
    tally.expect_error(me, "root out of range", root, "out of range");
    let f32_teams = topo.all_reduce_raw(Method::NvshmemTeams, o, i, 16, DType::F32, s);
    tally.expect_error(me, "f32 on NVSHMEM's teams", f32_teams, "bf16 only");
    let a2a_teams = topo.all_to_all_raw(Method::NvshmemTeams, o, i, 16, s);
    tally.expect_error(
        me,
        "all-to-all on NVSHMEM's teams",
        a2a_teams,
        "no team all-to-all-v",
    );
    // The stages hold 64 MiB: an all-gather whose output per PE is larger must say which
    // field to raise (when it stages at all: nodes of one PE, or one node, do not).
    let layout = topo.layout();
    if layout.num_nodes() > 1 && layout.node_pes > 1 {
        let plan = ch05_inter_node::plan::all_gather(layout, (64 << 20) / n + 1);
        tally.expect_error(
            me,
            "stage too small",
            plan.check_fits(topo.config()),
            "stage_bytes",
        );
    }
    Ok(topo.check()?)
}

// ANCHOR: device_errors
/// Failures only the device sees: all-to-all-v counts that do not add up (every PE sees them
/// and refuses), then a PE of another node that never joins a call. The second leaves the
/// job broken (chapter 1's mark_broken): it is the last check before the tally.
fn check_device_errors(
    world: &World,
    check: &mut Checker,
    (input, out): &(Buffer, Buffer),
) -> Result<(), AnyError> {
    let (me, n, stream) = (world.my_pe(), world.n_pes(), world.stream());
    let config = InterNodeConfig {
        timeout_ms: 300,
        ..InterNodeConfig::default()
    };
    let (i, o, s) = (input.device_ptr(), out.device_ptr(), stream.cu_stream());
    let topo = Topology::from_env(world, config)?;
    let in_splits = stream.clone_htod(&vec![if me == 0 { -1i64 } else { 1 }; n])?;
    let outputs = stream.alloc_zeros::<i64>(2 * n)?;
    let (splits_ptr, _) = cudarc::driver::DevicePtr::device_ptr(&in_splits, stream);
    let (outputs_ptr, _) = cudarc::driver::DevicePtr::device_ptr(&outputs, stream);
    // SAFETY: device slices of n and 2n int64.
    unsafe {
        topo.all_to_all_v_raw(
            Method::Hierarchical,
            o,
            n,
            i,
            n,
            64,
            splits_ptr,
            outputs_ptr,
            s,
        )
    }?;
    stream.synchronize()?;
    check
        .tally
        .expect_error(me, "bad splits", topo.check(), "'s in_splits are negative");
    drop(topo);
    let topo = Topology::from_env(world, config)?;
    // ANCHOR: node_never_comes
    if topo.layout().num_nodes() > 1 {
        // Node 0's PEs meet in a rail barrier that node 1's PEs enter only later.
        if topo.layout().node_of(me) == 0 {
            topo.rail_sync_raw(s)?;
            stream.synchronize()?;
            // Any node but this one may be the one the message names, at this local index.
            let local = topo.layout().local_of(me);
            let expected = format!("local {local}) to enter call 1");
            check
                .tally
                .expect_error(me, "a node that never comes", topo.check(), &expected);
        }
        world.barrier_all()?;
        if topo.layout().node_of(me) != 0 {
            topo.rail_sync_raw(s)?; // node 0 announced it: this one completes
            stream.synchronize()?;
            check.tally.check(me, topo.check().is_ok(), || {
                "the late node's barrier failed".into()
            });
        }
        println!(
            "pe {me}: the deliberate timeout leaves the job broken: every PE skips NVSHMEM's collective teardown from here"
        );
        ch01_bootstrap::world::mark_broken();
    }
    // ANCHOR_END: node_never_comes
    Ok(())
}
// ANCHOR_END: device_errors

// ---- the checking harness: ch01's Tally, one case at a time ----------------------------------

/// Runs cases against host references and counts them per (collective, method, variant).
struct Checker {
    tally: Tally,
    me: usize,
    summary: CaseSummary,
}

impl Checker {
    /// Uploads this PE's input, poisons the output (unless it is the input), runs `call`, and
    /// compares the output's first bytes with `expected` and the next 16 with the poison.
    fn case(
        &mut self,
        topo: &Topo,
        key: String,
        (input, host_input): (&Buffer, &[u8]),
        (out, expected): (&Buffer, &[u8]),
        call: impl FnOnce() -> Result<(), InterNodeError>,
    ) -> Result<(), AnyError> {
        input.copy_from_host_at(0, host_input)?;
        let in_place = std::ptr::eq(input, out);
        if !in_place {
            out.fill_bytes(POISON_BYTE)?;
        }
        call()?;
        let tail = if in_place {
            0
        } else {
            16.min(out.len() - expected.len())
        };
        let got = out.copy_to_host_range(0, expected.len() + tail)?;
        // The copy waited for the call: its failure record is final.
        topo.check()?;
        let wrong = got[..expected.len()]
            .iter()
            .zip(expected)
            .position(|(g, e)| g != e);
        let spilled = got[expected.len()..].iter().any(|&b| b != POISON_BYTE);
        let ok = wrong.is_none() && !spilled;
        self.summary.record(&key, ok);
        self.tally.check(self.me, ok, || {
            format!(
                "{key}, {} bytes: first wrong byte {wrong:?}, wrote past the end: {spilled}",
                expected.len()
            )
        });
        Ok(())
    }
}
