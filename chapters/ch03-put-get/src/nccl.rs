//! The NCCL baseline the p2p benchmark compares against: finding the library, and a
//! communicator over two PEs whose unique id travels through NVSHMEM. NCCL is opened at run
//! time (cudarc's dynamic loading), so a machine without it still builds and tests.

use std::sync::Arc;

use ch01_bootstrap::World;
use ch02_symmetric_memory::SymmetricBuffer;
use cudarc::driver::{CudaSlice, CudaStream};
use cudarc::nccl::sys as nccl;

use crate::{Completion, Put, PutGetError, put_on_stream};

/// "2.28.9" from NCCL's version code (22809; codes below 10000 use the old 1000-based form).
pub fn nccl_version_string(code: i32) -> String {
    if code >= 10000 {
        format!("{}.{}.{}", code / 10000, (code % 10000) / 100, code % 100)
    } else {
        format!("{}.{}.{}", code / 1000, (code % 1000) / 100, code % 100)
    }
}

// ANCHOR: nccl_probe
/// `Ok` when cudarc will find NCCL; otherwise the reason and the fix. cudarc opens NCCL on
/// first use and panics when none of its candidate names (`libnccl.so`, `libnccl.so.13`, ...)
/// opens; NCCL's pip wheel ships only `libnccl.so.2`, which is not among them. Trying the
/// same names first turns that panic into a message.
pub fn probe_nccl() -> Result<(), String> {
    let mut reasons = Vec::new();
    for name in cudarc::get_lib_name_candidates("nccl") {
        // SAFETY: NCCL's initialisers only set up its own state.
        match unsafe { libloading::Library::new(&name) } {
            Ok(_) => return Ok(()),
            Err(e) => reasons.push(format!("{name}: {e}")),
        }
    }
    Err(nccl_missing_message(&reasons))
}

pub fn nccl_missing_message(reasons: &[String]) -> String {
    format!(
        "NCCL could not be opened ({}{}). cudarc looks for libnccl.so, but the NCCL wheel ships \
         libnccl.so.2: make a directory with a symlink libnccl.so -> .../nvidia/nccl/lib/libnccl.so.2 \
         and put it first on LD_LIBRARY_PATH (benchmarks/run_p2p.sh does this)",
        reasons
            .iter()
            .take(2)
            .cloned()
            .collect::<Vec<_>>()
            .join("; "),
        match reasons.len() {
            0..=2 => String::new(),
            n => format!("; {} more names tried", n - 2),
        }
    )
}
// ANCHOR_END: nccl_probe

/// An NCCL failure as a [`PutGetError`], naming the call.
fn nccl_error(call: &'static str) -> impl Fn(cudarc::nccl::result::NcclError) -> PutGetError {
    move |e| PutGetError::Nccl(format!("{call}: {e:?}"))
}

// ANCHOR: nccl_comm
/// An NCCL communicator over the two PEs of a 2-PE job, sending from and receiving into
/// `buffer`. Its 128-byte unique id travels through NVSHMEM itself: PE 0 puts it into every
/// PE's symmetric copy, a barrier completes the puts.
pub struct NcclPair<'w> {
    comm: nccl::ncclComm_t,
    peer: i32,
    /// Local device pointer [buffer_len] u8 (borrowed for 'w): what is sent, and where what
    /// is received lands. Read once here, because `p2p` may run inside a stream capture,
    /// where cudarc's per-use event bookkeeping must not happen.
    buffer_ptr: u64,
    buffer_len: usize,
    _buffer: &'w CudaSlice<u8>,
    stream: &'w Arc<CudaStream>,
}

impl<'w> NcclPair<'w> {
    /// Collective over both PEs.
    pub fn new(world: &'w World, buffer: &'w CudaSlice<u8>) -> Result<Self, PutGetError> {
        let me = world.my_pe();
        if world.n_pes() != 2 {
            return Err(PutGetError::Nccl(format!(
                "NcclPair connects the two PEs of a 2-PE job; this job has {}: launch with \
                 --nproc_per_node=2",
                world.n_pes()
            )));
        }
        let id_buffer = SymmetricBuffer::<_, u8>::new(world, 128)?;
        if me == 0 {
            let id = cudarc::nccl::result::get_uniqueid().map_err(nccl_error("ncclGetUniqueId"))?;
            let bytes: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
            id_buffer.copy_from_host(&bytes)?;
            for pe in 1..world.n_pes() {
                let put = Put::new(&id_buffer, 0, &id_buffer, 128, pe)?;
                put_on_stream(Completion::Blocking, &put);
            }
        }
        world.barrier_all()?;
        let bytes = id_buffer.copy_to_host()?;
        let mut id = nccl::ncclUniqueId { internal: [0; 128] };
        for (dst, &src) in id.internal.iter_mut().zip(&bytes) {
            *dst = src as _;
        }
        let mut comm = std::ptr::null_mut();
        world
            .context()
            .bind_to_thread()
            .map_err(PutGetError::cuda("binding the context"))?;
        // SAFETY: collective over the job's PEs with the same id; `comm` is an out-parameter.
        unsafe {
            cudarc::nccl::result::comm_init_rank(&mut comm, world.n_pes() as i32, id, me as i32)
        }
        .map_err(nccl_error("ncclCommInitRank"))?;
        let comm = Self {
            comm,
            peer: (1 - me) as i32,
            buffer_ptr: crate::LocalBuffer::device_address(buffer, world.stream()),
            buffer_len: cudarc::driver::DeviceSlice::len(buffer),
            _buffer: buffer,
            stream: world.stream(),
        };
        // Connect the pair now, outside any graph capture: NCCL sets up a peer's channels on
        // the first send/recv to it. Grouped, so that neither side blocks the other.
        // SAFETY: group calls take no arguments; every PE issues the same sequence.
        unsafe { nccl::ncclGroupStart() }
            .result()
            .map_err(nccl_error("ncclGroupStart"))?;
        let warmed_up = comm.p2p(true, 8).and_then(|()| comm.p2p(false, 8));
        // SAFETY: closes the group opened above, on every path.
        let closed = unsafe { nccl::ncclGroupEnd() }.result();
        warmed_up?;
        closed.map_err(nccl_error("ncclGroupEnd"))?;
        comm.stream
            .synchronize()
            .map_err(PutGetError::cuda("connecting NCCL's pair"))?;
        Ok(comm)
    }

    /// `ncclSend` (`send`) or `ncclRecv` of the first `num_bytes` u8 of `buffer` with the
    /// peer.
    pub fn p2p(&self, send: bool, num_bytes: usize) -> Result<(), PutGetError> {
        let side = if send { "source" } else { "destination" };
        crate::local_range(side, self.buffer_len, 0, num_bytes, 1)?;
        let buffer = self.buffer_ptr as *mut _;
        let u8s = nccl::ncclDataType_t::ncclUint8;
        let (peer, comm, stream) = (self.peer, self.comm, self.stream.cu_stream() as _);
        // SAFETY: `buffer` holds at least `num_bytes` (checked above); `comm` is live.
        let status = unsafe {
            if send {
                nccl::ncclSend(buffer, num_bytes, u8s, peer, comm, stream)
            } else {
                nccl::ncclRecv(buffer, num_bytes, u8s, peer, comm, stream)
            }
        };
        status
            .result()
            .map(drop)
            .map_err(nccl_error("ncclSend/ncclRecv"))
    }
}
// ANCHOR_END: nccl_comm

impl Drop for NcclPair<'_> {
    fn drop(&mut self) {
        // SAFETY: created by comm_init_rank; no work of ours is pending on it after a sync.
        unsafe {
            let _ = nccl::ncclCommDestroy(self.comm);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_read_both_encodings() {
        assert_eq!(nccl_version_string(22809), "2.28.9");
        assert_eq!(nccl_version_string(2708), "2.7.8");
    }

    #[test]
    fn missing_nccl_message_gives_the_fix() {
        let msg = nccl_missing_message(&["libnccl.so: not found".into()]);
        assert!(msg.contains("libnccl.so: not found"), "{msg}");
        assert!(msg.contains("LD_LIBRARY_PATH"), "{msg}");
    }
}
