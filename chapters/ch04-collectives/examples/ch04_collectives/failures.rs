//! What must fail, and how: mistakes refused before anything is enqueued, and device errors
//! (a bounded wait that times out) reported with the PE, the call and the block.

use super::*;

/// Every mistake is an error before anything is launched.
pub(crate) fn check_mistakes(
    comm: &Communicator<&World>,
    check: &mut Checker,
    (input, out): &(Buffer<u8>, Buffer<u8>),
    floats: &Buffer<f32>,
) -> Result<(), AnyError> {
    let world = comm.world();
    let (me, n) = (world.my_pe(), world.n_pes());
    let local = world.stream().alloc_zeros::<u8>(4096)?;
    let (local_ptr, _) = cudarc::driver::DevicePtr::device_ptr(&local, world.stream());
    let stream = world.stream().cu_stream();
    let tally = &mut check.tally;
    let non_symmetric = comm.all_gather_raw(out.device_ptr(), local_ptr, 64, None, stream);
    tally.expect_error(
        me,
        "non-symmetric input",
        non_symmetric,
        "not inside NVSHMEM's symmetric heap",
    );
    let too_small = comm.all_gather(out, input, MAX_ELEMENTS / n + 1, None);
    tally.expect_error(me, "output too small", too_small, "past the end");
    let wrong = comm.all_reduce(floats, floats, 16, Some(Algorithm::Ring));
    tally.expect_error(
        me,
        "algorithm of another collective",
        wrong,
        "one_shot, two_shot",
    );
    let past_ll = comm.all_gather(out, input, MAX_ELEMENTS / 8, Some(Algorithm::OneShot));
    tally.expect_error(me, "LL past its scratch", past_ll, "ll_max_bytes");
    tally.expect_error(
        me,
        "root out of range",
        comm.broadcast(out, input, 16, n, None),
        "out of range",
    );
    Ok(())
}

/// Failures only the device can see: all-to-all-v counts that do not add up, and a peer that
/// never joins a call. The kernel records each and returns; the host raises.
pub(crate) fn check_device_errors(world: &World, check: &mut Checker) -> Result<(), AnyError> {
    let (me, n, stream) = (world.my_pe(), world.n_pes(), world.stream());
    let config = CollectivesConfig {
        timeout_ms: 300,
        ..CollectivesConfig::default()
    };
    let input = Buffer::<u8>::new(world, 64)?;
    let out = Buffer::<u8>::new(world, 64)?;

    let comm = Communicator::new(world, config)?;
    // PE 0 claims to send more rows than its input has: every PE sees it in the counts.
    let in_splits = stream.clone_htod(&vec![if me == 0 { 100i64 } else { 1 }; n])?;
    let mut out_splits_offsets = stream.alloc_zeros::<i64>(2 * n)?;
    comm.all_to_all_v(&out, &input, 4, &in_splits, &mut out_splits_offsets)?;
    stream.synchronize()?;
    check
        .tally
        .expect_error(me, "bad splits", comm.check(), "pe 0's in_splits");
    check.tally.expect_error(
        me,
        "a failed communicator stays failed",
        comm.sync_all(),
        "unusable",
    );
    drop(comm);

    if n > 1 {
        let comm = Communicator::new(world, config)?;
        if me == 0 {
            comm.sync_all()?; // a barrier no other PE enters
            stream.synchronize()?;
            check.tally.expect_error(
                me,
                "timeout",
                comm.check(),
                "timed out after 300 ms waiting for pe",
            );
        } else {
            let healthy = comm.check();
            check.tally.check(me, healthy.is_ok(), || {
                format!("a PE that made no call failed: {healthy:?}")
            });
        }
        world.barrier_all()?;
        // PE 0's timeout marked its job broken (its teardown skips the collective frees); the
        // others must skip them too, or their frees would wait for PE 0 in vain.
        ch01_bootstrap::world::mark_broken();
    }
    Ok(())
}
