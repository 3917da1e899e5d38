//! How many SMs a stream of stores needs: the stores' rate by SM count to the peer and within
//! this GPU, and the copy engine within it, at one size (benchmarks/notes/buffer_few_sms.md).

use super::*;

/// How many SMs a stream of stores needs: blocks of 1024 threads (one per SM) storing one
/// FEW_SMS_BYTES message to the peer and within this GPU, and the copy engine within it.
pub(super) const FEW_SMS_BLOCKS: [u32; 7] = [2, 4, 8, 12, 16, 24, 32];
pub(super) const FEW_SMS_BYTES: usize = 64 << 20;

/// The stores' rate by SM count, to the peer (`store_by_sms`) and within this GPU
/// (`store_local_by_sms`), into the sweep; the copy engine within this GPU
/// (`copy_engine_local`) into the rows. What a kernel that moves rows on few SMs can expect of
/// each SM (benchmarks/notes/buffer_few_sms.md).
pub(super) fn few_sms<W: std::ops::Deref<Target = World>>(
    bench: &Bench,
    ops: &DeviceOps,
    dst: &SymmetricBuffer<W, u8>,
    src: &CudaSlice<u8>,
    sweep: &mut Vec<SweepPoint>,
    rows: &mut Vec<Row>,
) -> Result<(), AnyError> {
    let num_bytes = FEW_SMS_BYTES;
    let remote = Put::new(dst, 0, src, num_bytes, 1)?;
    let local = Put::new(dst, 0, src, num_bytes, 0)?;
    for num_blocks in FEW_SMS_BLOCKS {
        let shape = LaunchShape {
            num_blocks,
            threads_per_block: 1024,
        };
        for (method, put) in [("store_by_sms", &remote), ("store_local_by_sms", &local)] {
            let us = bench.time_ops(num_bytes, || Ok(ops.store(shape, put, false)?))?;
            sweep.push(SweepPoint {
                method,
                scope: "grid",
                num_blocks,
                threads_per_block: 1024,
                num_bytes,
                us,
            });
        }
    }
    let stream = ops.world().stream();
    let (to, from) = (local.dest(), src.device_address(stream));
    let us = bench.time_ops(num_bytes, || {
        // SAFETY: `to` is this PE's own copy of `dst` (FEW_SMS_BYTES checked by `local`),
        // `from` the local source of at least as many bytes.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(to, from, num_bytes, stream.cu_stream())
        }?;
        Ok(())
    })?;
    rows.push(Row::new("copy_engine_local", num_bytes, us));
    let line = |m: &str, b: u32| {
        sweep
            .iter()
            .find(|p| p.method == m && p.num_blocks == b && p.num_bytes == num_bytes)
            .map_or(0.0, |p| num_bytes as f64 / p.us / 1e3)
    };
    for b in FEW_SMS_BLOCKS {
        println!(
            "pe 0: {b:>2} SMs, 64 MiB: stores to the peer {:.0} GB/s, within this GPU {:.0} GB/s",
            line("store_by_sms", b),
            line("store_local_by_sms", b)
        );
    }
    println!(
        "pe 0: copy engine within this GPU, 64 MiB: {:.0} GB/s",
        num_bytes as f64 / us / 1e3
    );
    Ok(())
}
