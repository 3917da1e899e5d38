//! Signals: how a receiver learns that data has landed, and how a signal word is reused.
//!
//! `putmem_signal` delivers the bytes and *then* updates a 64-bit word on the receiver (SET
//! it to a value or ADD to it); a receiver that sees the new value also sees the data. The
//! receiver waits on the word, bounded: a kernel that gives up records what it waited for in
//! [`DeviceOps`]'s error record, and [`DeviceOps::finish_waiting`] turns that into
//! [`PutGetError::Timeout`].
//!
//! A signal word is reused, round after round, without ever being reset while a peer may
//! still write it. Its values only rise: round r waits for a larger value than round r - 1
//! (the running total of ADDs, or a round number that SET writes), so a message from an
//! earlier round can never satisfy a later wait. The caller keeps the count
//! ([`Wait::new`] takes the value to wait for), as the kernels' `expected` and
//! `first_value` arguments show.
//!
//! A kernel whose blocks wait for the blocks of the peer's launch needs every block of every
//! PE resident at once; otherwise the resident blocks spin for ones that cannot start until
//! they finish. [`check_co_resident`] refuses a larger grid before launching, naming the
//! largest one the GPU holds.

use std::ops::Deref;

use ch01_bootstrap::World;
use ch02_symmetric_memory::{SymmetricBuffer, check_pe};
use cudarc::driver::{CudaFunction, DeviceRepr, LaunchConfig, PushKernelArg};

use crate::device::TransferArgs;
use crate::transfer::local_bytes;
use crate::{DeviceOps, LaunchShape, LocalBuffer, Put, PutGetError, config};

/// How a signal word is updated once the data before it has landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalOp {
    /// The signal becomes the value (one producer, a sequence number).
    Set,
    /// The value is added (many producers, the consumer waits for the sum).
    Add,
}

impl SignalOp {
    fn raw(self) -> i32 {
        match self {
            SignalOp::Set => nvshmem_sys::SIGNAL_SET,
            SignalOp::Add => nvshmem_sys::SIGNAL_ADD,
        }
    }
}

/// Word `index` of a symmetric u64 buffer, used as a signal: one address names the word on
/// every PE (a producer updates the receiver's copy, the receiver waits on its own).
#[derive(Clone, Copy)]
pub struct SignalWord<'a> {
    world: &'a World,
    /// Device pointer to one u64, symmetric.
    ptr: u64,
}

impl<'a> SignalWord<'a> {
    pub fn new<W: Deref<Target = World>>(
        signals: &'a SymmetricBuffer<W, u64>,
        index: usize,
    ) -> Result<Self, PutGetError> {
        Ok(Self {
            world: signals.world(),
            ptr: signals.element_ptr(index, 1)?,
        })
    }
}

/// What a consumer waits for: this PE's copy of `word` to reach at least `expected`, raised
/// by `from_pe` (named in the error if it never comes).
#[derive(Clone, Copy)]
pub struct Wait<'a> {
    word: SignalWord<'a>,
    expected: u64,
    from_pe: usize,
}

impl<'a> Wait<'a> {
    pub fn new(word: SignalWord<'a>, expected: u64, from_pe: usize) -> Result<Self, PutGetError> {
        check_pe(word.world, from_pe)?;
        Ok(Self {
            word,
            expected,
            from_pe,
        })
    }
}

// ANCHOR: put_signal_on_stream
/// Host-initiated `putmem_signal`, on the world's stream: the put, then `word` on the put's
/// PE is updated with `op`/`value` once the data has landed there. The consumer on that PE
/// waits on the word, not on a barrier.
pub fn put_signal_on_stream(put: &Put, word: &SignalWord, op: SignalOp, value: u64) {
    let world = put.world();
    // SAFETY: the put was checked when it was made and borrows its buffers; `word` is one
    // u64 inside a live symmetric allocation.
    unsafe {
        (world.nvshmem().putmem_signal_on_stream)(
            put.dest() as *mut _,
            put.source() as *const _,
            put.num_bytes(),
            word.ptr as *mut u64,
            value,
            op.raw(),
            put.pe() as i32,
            world.stream().cu_stream() as _,
        )
    };
}
// ANCHOR_END: put_signal_on_stream

// ANCHOR: co_resident
/// `Err` unless all blocks of `shape` can be resident at once on a GPU of `num_sms` SMs that
/// holds `blocks_per_sm` blocks of this kernel per SM (cuOccupancyMaxActiveBlocksPerMultiprocessor).
pub fn check_co_resident(
    kernel: &'static str,
    shape: LaunchShape,
    blocks_per_sm: u32,
    num_sms: u32,
) -> Result<(), PutGetError> {
    if u64::from(shape.num_blocks) <= u64::from(blocks_per_sm) * u64::from(num_sms) {
        return Ok(());
    }
    Err(PutGetError::NotCoResident {
        kernel,
        num_blocks: shape.num_blocks,
        threads_per_block: shape.threads_per_block,
        blocks_per_sm,
        num_sms,
    })
}

impl DeviceOps<'_> {
    /// The launch configuration of a kernel whose blocks wait for the peer's blocks, after
    /// checking that the whole grid fits on this GPU at once.
    fn co_resident_config(
        &self,
        kernel: &CudaFunction,
        name: &'static str,
        shape: LaunchShape,
    ) -> Result<LaunchConfig, PutGetError> {
        let config = shape.checked()?;
        let blocks_per_sm = kernel
            .occupancy_max_active_blocks_per_multiprocessor(shape.threads_per_block, 0, None)
            .map_err(PutGetError::cuda("querying the kernel's occupancy"))?;
        check_co_resident(name, shape, blocks_per_sm, self.num_sms)?;
        Ok(config)
    }
}
// ANCHOR_END: co_resident

impl DeviceOps<'_> {
    // ANCHOR: device_put_signal
    /// The handshake on a ring: every block of this PE's kernel puts its slice of `put` with
    /// `putmem_signal`, adding 1 to `wait`'s word on the put's PE; then waits until this PE's
    /// copy of the word reaches `wait`'s value, which every block of the previous PE has
    /// raised by one, and copies its slice of its own inbox (the put's destination, read
    /// here) into `seen`. Returns once the kernel finished; a timeout becomes
    /// [`PutGetError::Timeout`].
    pub fn put_signal_ring<T: DeviceRepr>(
        &self,
        shape: LaunchShape,
        put: &Put,
        wait: &Wait,
        seen: &impl LocalBuffer<T>,
    ) -> Result<(), PutGetError> {
        let name = "put_signal_ring";
        let config = self.co_resident_config(&self.put_signal_ring, name, shape)?;
        let stream = self.world.stream();
        let seen = local_bytes("destination", seen, put.num_bytes(), stream)?;
        let transfer = TransferArgs::of(put);
        let (signal, expected) = (wait.word.ptr, wait.expected);
        let (next, previous) = (put.pe() as i32, wait.from_pe as i32);
        self.arm()?;
        let mut launch = stream.launch_builder(&self.put_signal_ring);
        transfer.push(&mut launch);
        launch.arg(&signal).arg(&expected);
        launch.arg(&next).arg(&previous).arg(&seen);
        self.push_wait_report(&mut launch);
        // SAFETY: matches put_signal_ring's signature; every range was checked above or when
        // the put was made.
        unsafe { launch.launch(config) }.map_err(PutGetError::cuda("launching put_signal_ring"))?;
        self.finish_waiting(name)
    }
    // ANCHOR_END: device_put_signal

    /// The consumer alone, for a producer that is not a kernel of this launch (the host's
    /// [`put_signal_on_stream`]): waits (bounded) until `wait` is met, then copies
    /// `inbox[0..count]` into `seen`. Its blocks wait for the signal, not for each other, so
    /// any grid works.
    pub fn wait_signal_copy<W: Deref<Target = World>, T: DeviceRepr>(
        &self,
        shape: LaunchShape,
        wait: &Wait,
        inbox: &SymmetricBuffer<W, T>,
        count: usize,
        seen: &impl LocalBuffer<T>,
    ) -> Result<(), PutGetError> {
        let config = shape.checked()?;
        let inbox = inbox.element_ptr(0, count)?;
        let num_bytes = (count * size_of::<T>()) as u64;
        let stream = self.world.stream();
        let seen = local_bytes("destination", seen, num_bytes as usize, stream)?;
        let (signal, expected, from) = (wait.word.ptr, wait.expected, wait.from_pe as i32);
        self.arm()?;
        let mut launch = stream.launch_builder(&self.wait_signal_copy);
        launch.arg(&inbox).arg(&signal).arg(&expected);
        launch.arg(&seen).arg(&num_bytes).arg(&from);
        self.push_wait_report(&mut launch);
        // SAFETY: matches wait_signal_copy's signature; local ranges checked above.
        unsafe { launch.launch(config) }
            .map_err(PutGetError::cuda("launching wait_signal_copy"))?;
        self.finish_waiting("wait_signal_copy")
    }

    // ANCHOR: device_pingpong
    /// Enqueues one side of the ping-pong: `num_iters` round trips of the put (to the peer,
    /// and the same back) through `word`, whose values run from `first_value + 1` to
    /// `first_value + num_iters`; `word` must be at most `first_value` on both PEs before
    /// either launches. One block of `threads_per_block`. Call [`DeviceOps::finish_waiting`]
    /// after timing it.
    pub fn launch_pingpong(
        &self,
        threads_per_block: u32,
        put: &Put,
        word: &SignalWord,
        first_value: u64,
        initiator: bool,
        num_iters: u64,
    ) -> Result<(), PutGetError> {
        let shape = LaunchShape {
            num_blocks: 1,
            threads_per_block,
        };
        let config = self.co_resident_config(&self.pingpong, "pingpong", shape)?;
        let transfer = TransferArgs::of(put);
        let (peer, initiator) = (put.pe() as i32, initiator as i32);
        self.arm()?;
        let mut launch = self.world.stream().launch_builder(&self.pingpong);
        transfer.push(&mut launch);
        launch.arg(&word.ptr).arg(&first_value);
        launch.arg(&peer).arg(&initiator).arg(&num_iters);
        self.push_wait_report(&mut launch);
        // SAFETY: matches pingpong's signature; ranges checked when the put was made.
        unsafe { launch.launch(config) }.map_err(PutGetError::cuda("launching pingpong"))?;
        Ok(())
    }
    // ANCHOR_END: device_pingpong

    /// The two arguments every waiting kernel ends with: its timeout in SM cycles and the
    /// error record it reports into.
    fn push_wait_report<'a>(&'a self, launch: &mut cudarc::driver::LaunchArgs<'a>) {
        launch.arg(&self.timeout_cycles).arg(&self.error_ptr);
    }

    /// Clears the error record before a kernel that waits.
    fn arm(&self) -> Result<(), PutGetError> {
        // SAFETY: `error_ptr` holds 4 u64.
        unsafe {
            cudarc::driver::result::memset_d8_async(
                self.error_ptr,
                0,
                32,
                self.world.stream().cu_stream(),
            )
        }
        .map_err(PutGetError::cuda("clearing the error record"))
    }

    // ANCHOR: finish_waiting
    /// Waits for the stream, then turns a timeout the kernel recorded into an error that
    /// names this PE, the PE it waited for and the signal values.
    pub fn finish_waiting(&self, kernel: &'static str) -> Result<(), PutGetError> {
        let stream = self.world.stream();
        stream
            .synchronize()
            .map_err(PutGetError::cuda("waiting for the kernel"))?;
        let record = stream
            .clone_dtoh(&self.error)
            .map_err(PutGetError::cuda("reading the error record"))?;
        if record[0] == 0 {
            return Ok(());
        }
        Err(PutGetError::Timeout {
            me: self.world.my_pe(),
            kernel,
            from_pe: record[1],
            expected: record[2],
            seen: record[3],
            timeout_ms: config::WAIT_TIMEOUT_MS,
        })
    }
    // ANCHOR_END: finish_waiting
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grid_larger_than_the_gpu_holds_is_refused() {
        let shape = |num_blocks| LaunchShape {
            num_blocks,
            threads_per_block: 256,
        };
        assert!(check_co_resident("put_signal_ring", shape(264), 2, 132).is_ok());
        let err = check_co_resident("put_signal_ring", shape(265), 2, 132)
            .unwrap_err()
            .to_string();
        assert!(err.contains("at most 264 blocks"), "{err}");
        // A kernel that does not fit at all (too many registers for the block size).
        assert!(check_co_resident("pingpong", shape(1), 0, 132).is_err());
    }
}
