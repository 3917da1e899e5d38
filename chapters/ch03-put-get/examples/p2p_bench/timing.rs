//! The one timing loop every measurement of the p2p benchmark goes through ([`Bench`]), and
//! the CUDA-graph capture it replays.

use super::*;

/// What every measurement needs: the events, the L2 flush buffer, and the chapter's kernels
/// (whose error record is read after every sample).
pub(super) struct Bench<'a> {
    ops: &'a DeviceOps<'a>,
    stream: &'a Arc<CudaStream>,
    flush: CudaSlice<u8>,
    start: CudaEvent,
    end: CudaEvent,
}

impl<'a> Bench<'a> {
    pub(super) fn new(ops: &'a DeviceOps<'a>) -> Result<Self, AnyError> {
        let world = ops.world();
        let event = || {
            world
                .context()
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
        };
        Ok(Self {
            ops,
            stream: world.stream(),
            flush: world.stream().alloc_zeros(FLUSH_BYTES)?,
            start: event()?,
            end: event()?,
        })
    }

    // ANCHOR: samples_ms
    /// The one timing loop every method goes through: one warm-up sample, then NUM_SAMPLES
    /// timed ones, each after an L2 flush (and a barrier when `both` PEs take part, so that
    /// they start together), with CUDA events around `enqueue_sample(sample_idx)`. Returns
    /// the timed samples in ms. A kernel's timed-out wait ends the run with its error.
    pub(super) fn samples_ms(
        &self,
        both: bool,
        mut enqueue_sample: impl FnMut(usize) -> Result<(), AnyError>,
    ) -> Result<Vec<f64>, AnyError> {
        let mut samples = Vec::with_capacity(NUM_SAMPLES);
        let flush_ptr = self.flush.device_address(self.stream);
        for sample_idx in 0..=NUM_SAMPLES {
            // SAFETY: `flush` holds FLUSH_BYTES.
            unsafe {
                let value = sample_idx as u8;
                let stream = self.stream.cu_stream();
                cudarc::driver::result::memset_d8_async(flush_ptr, value, FLUSH_BYTES, stream)
            }?;
            if both {
                self.ops.world().barrier_all()?;
            }
            self.start.record(self.stream)?;
            enqueue_sample(sample_idx)?;
            self.end.record(self.stream)?;
            let ms = self.start.elapsed_ms(&self.end)? as f64;
            self.ops.finish_waiting("a timed kernel")?;
            if sample_idx > 0 {
                samples.push(ms);
            }
        }
        Ok(samples)
    }
    // ANCHOR_END: samples_ms

    /// This PE's NUM_SAMPLES times of one operation, in us: `enqueue` is captured K times into
    /// a CUDA graph (K from [`bench::ops_per_sample`]), which the timing loop replays.
    pub(super) fn time_ops_samples(
        &self,
        both: bool,
        num_bytes: usize,
        enqueue: impl FnMut() -> Result<(), AnyError>,
    ) -> Result<Vec<f64>, AnyError> {
        let num_ops = bench::ops_per_sample(num_bytes);
        let graph = capture(self.stream, num_ops, enqueue)?;
        graph.upload()?;
        let samples = self.samples_ms(both, |_| Ok(graph.launch()?))?;
        Ok(scaled(samples, 1e3 / num_ops as f64))
    }

    /// Median time of one operation on this PE alone, in us.
    pub(super) fn time_ops(
        &self,
        num_bytes: usize,
        enqueue: impl FnMut() -> Result<(), AnyError>,
    ) -> Result<f64, AnyError> {
        Ok(bench::median(
            &mut self.time_ops_samples(false, num_bytes, enqueue)?,
        ))
    }
}

pub(super) fn scaled(samples: Vec<f64>, factor: f64) -> Vec<f64> {
    samples.into_iter().map(|ms| ms * factor).collect()
}

/// Captures `num_ops` calls of `enqueue` on `stream` into an instantiated graph.
pub(super) fn capture(
    stream: &Arc<CudaStream>,
    num_ops: usize,
    mut enqueue: impl FnMut() -> Result<(), AnyError>,
) -> Result<CudaGraph, AnyError> {
    stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let enqueued = (0..num_ops).try_for_each(|_| enqueue());
    // End the capture even when enqueueing failed, or the stream stays in capture mode.
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0));
    enqueued?;
    Ok(graph?.ok_or("stream capture produced no graph")?)
}
