//! The process-wide NVSHMEM state behind the Python module, and the rule for freeing.
//!
//! # Why freeing is deferred
//! `nvshmem_free` is collective: every PE must free the same allocations in the same order.
//! Python frees an object when its reference count reaches zero, which happens at a different
//! moment on every rank (a tensor kept alive a little longer on one rank, a garbage-collector
//! pass on another). Freeing right then would make one PE wait in `nvshmem_free` for peers
//! that are busy elsewhere: a deadlock, or a heap whose layout differs between PEs.
//!
//! So dropping the last reference only *releases* an allocation: its id goes onto
//! [`RELEASED`]. "The last reference" is a [`Token`]: every torch storage over the allocation
//! (the tensor `empty()` returned, and every peer view of it) holds an `Arc` of it in its
//! DLPack context, and the token's `Drop` does the release. That is plain Rust, with no call
//! into Python: torch runs DLPack deleters on whichever thread frees the storage, with or
//! without the GIL. Memory is returned at collective points that every rank reaches in the same
//! order (`empty()`, `collect()`, `finalize()`): the Python layer gathers every rank's released
//! ids over torch.distributed and calls [`free_released`] with the intersection, which frees
//! them in allocation order. An allocation released on one rank but still in use on another
//! simply waits for a later collection.
//!
//! A `Buffer` (chapters 7-8) follows the same rule: its symmetric allocation is an
//! [`Owned`] entry, kept alive by a token that the `BufferCore` and every region view over
//! its memory hold (buffer.rs), so that a view never outlives the memory it shows.
//!
//! # Locks and the GIL
//! [`STATE`] is only ever locked with the GIL released (every native entry point takes it
//! inside `Python::detach`). Holding it while waiting for the GIL could deadlock against a
//! thread that holds the GIL and waits for the lock. [`RELEASED`] is locked from `Drop`, with
//! the GIL held, but only for a push: nothing ever waits for the GIL while holding it.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use ch01_bootstrap::World;
use ch02_symmetric_memory::SymmetricBuffer;
use pyo3::prelude::*;

use crate::errors::Error;

/// One symmetric allocation, as bytes. Python gives it a dtype and a shape with views.
pub type Buffer = SymmetricBuffer<Arc<World>, u8>;

/// Alive while any torch storage over the allocation lives; its `Drop` releases it.
#[derive(Debug)]
pub struct Token {
    id: u64,
}

impl Drop for Token {
    fn drop(&mut self) {
        // Never nvshmem_free here: it is collective (see the module docs).
        release(self.id);
    }
}

pub struct Allocation {
    pub buffer: Buffer,
    /// The token the storages hold; dead once every one of them is gone.
    pub token: Weak<Token>,
    /// Bytes the caller asked for (the buffer holds at least one byte more when this is 0).
    pub num_bytes: usize,
    /// Python dropped its last reference on this rank.
    pub released: bool,
}

/// Symmetric memory that is not a tensor of ours (a `Buffer`'s allocation, inside the
/// object that owns it), under the same rule: kept while its token lives, freed collectively.
pub struct Owned {
    /// Never read: holding it keeps the memory; dropping it is the collective free.
    _owner: Arc<dyn Any + Send + Sync>,
    pub num_bytes: usize,
    pub released: bool,
}

pub struct State {
    pub world: Arc<World>,
    /// Chapter 4's collectives, made at the first collective call (which every PE makes at
    /// the same point of its program, so the communicator's collective allocation lines up).
    pub collectives: Option<ch04_collectives::Communicator<Arc<World>>>,
    /// Chapter 5's topology (nodes, teams, RMA groups, stages), made at the first inter-node
    /// collective call, at the same point of every PE's program, like `collectives`.
    pub inter_node: Option<ch05_inter_node::Topology<Arc<World>>>,
    /// Live allocations by id. Ids only grow, so key order is allocation order: the order
    /// every PE made them in, and the order in which they must be freed.
    pub allocations: BTreeMap<u64, Allocation>,
    /// Live `Owned` memory by id (ids from the same counter as `allocations`).
    pub owned: BTreeMap<u64, Owned>,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);
/// Ids whose Python owner died, not yet seen by [`take_released`].
static RELEASED: Mutex<Vec<u64>> = Mutex::new(Vec::new());
/// Unique across worlds: an id from a finalized world never names a later allocation.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Locks a mutex even if a panic poisoned it: the data stays consistent at every await-free
/// point, and a poisoned lock must not turn every later call into a panic.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs `f` on the state, or fails with `NotInitialized(what)`. Call with the GIL released.
pub fn with_state<R>(
    what: &'static str,
    f: impl FnOnce(&mut State) -> Result<R, Error>,
) -> Result<R, Error> {
    let mut guard = lock(&STATE);
    let state = guard.as_mut().ok_or(Error::NotInitialized(what))?;
    f(state)
}

/// [`with_state`] the way every Python entry point calls it: with the GIL released (see "Locks
/// and the GIL"), its error turned into the Python exception for it.
pub fn with_state_detached<R: Send>(
    py: Python<'_>,
    what: &'static str,
    f: impl FnOnce(&mut State) -> Result<R, Error> + Send,
) -> PyResult<R> {
    py.detach(|| with_state(what, f)).map_err(Into::into)
}

/// `with_state_detached` for a collective call: every (address, bytes) range `ranges` returns
/// (given the job's PE count) is located in a live symmetric allocation and the context bound
/// to this thread before `call` runs.
pub fn with_located<R: Send>(
    py: Python<'_>,
    what: &'static str,
    ranges: impl FnOnce(usize) -> Result<Vec<(u64, usize)>, Error> + Send,
    call: impl FnOnce(&mut State) -> Result<R, Error> + Send,
) -> PyResult<R> {
    with_state_detached(py, what, move |s: &mut State| {
        for (ptr, num_bytes) in ranges(s.world.n_pes())? {
            if num_bytes > 0 {
                s.locate(ptr, num_bytes)?;
            }
        }
        s.bind()?;
        call(s)
    })
}

pub fn is_initialized() -> bool {
    lock(&STATE).is_some()
}

/// Installs a freshly initialised world. `Err` if one is already installed.
pub fn install(init: impl FnOnce() -> Result<World, Error>) -> Result<(), Error> {
    let mut guard = lock(&STATE);
    if guard.is_some() {
        return Err(Error::Invalid(
            "NVSHMEM is already initialised in this process (nvshmem_tutorial.init() is \
             idempotent; call finalize() before initialising again)"
                .into(),
        ));
    }
    *guard = Some(State {
        world: Arc::new(init()?),
        collectives: None,
        inter_node: None,
        allocations: BTreeMap::new(),
        owned: BTreeMap::new(),
    });
    Ok(())
}

/// Called by [`Token`]'s `Drop`: marks `id` released (never frees; see module docs).
fn release(id: u64) {
    lock(&RELEASED).push(id);
}

impl State {
    /// Collective: a new allocation of `num_bytes` (at least one byte is allocated, so a
    /// zero-element tensor still has an address). Returns (id, device pointer, token).
    pub fn alloc(&mut self, num_bytes: usize) -> Result<(u64, u64, Arc<Token>), Error> {
        let buffer = Buffer::new(self.world.clone(), num_bytes.max(1))?;
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let token = Arc::new(Token { id });
        let ptr = buffer.device_ptr();
        self.allocations.insert(
            id,
            Allocation {
                buffer,
                token: Arc::downgrade(&token),
                num_bytes,
                released: false,
            },
        );
        Ok((id, ptr, token))
    }

    /// Takes `owner` (symmetric memory of `num_bytes`, allocated collectively just now) under
    /// the freeing rule: it lives while the returned token does, then waits for a collective
    /// point. Every PE adopts its buffers in the same order, so the ids agree.
    pub fn adopt(&mut self, owner: Arc<dyn Any + Send + Sync>, num_bytes: usize) -> Arc<Token> {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let token = Arc::new(Token { id });
        self.owned.insert(
            id,
            Owned {
                _owner: owner,
                num_bytes,
                released: false,
            },
        );
        token
    }

    /// The token of the live allocation containing device address `ptr`, for a new storage
    /// (a peer view) that must keep the allocation alive.
    pub fn token_for(&self, ptr: u64) -> Result<Arc<Token>, Error> {
        let (id, _) = self.locate(ptr, 0)?;
        self.allocations[&id].token.upgrade().ok_or_else(|| {
            Error::Invalid(format!(
                "allocation {id} has been released (no tensor references it any more)"
            ))
        })
    }

    /// Moves the ids dropped since the last call into the table, and returns every released,
    /// not yet freed id in allocation order. Ids of earlier worlds are forgotten.
    pub fn take_released(&mut self) -> Vec<u64> {
        let newly: Vec<u64> = std::mem::take(&mut *lock(&RELEASED));
        for id in newly {
            if let Some(allocation) = self.allocations.get_mut(&id) {
                allocation.released = true;
            } else if let Some(owned) = self.owned.get_mut(&id) {
                owned.released = true;
            }
        }
        let tensors = self.allocations.iter().map(|(&id, a)| (id, a.released));
        let owned = self.owned.iter().map(|(&id, o)| (id, o.released));
        let mut ids: Vec<u64> = tensors
            .chain(owned)
            .filter_map(|(id, released)| released.then_some(id))
            .collect();
        ids.sort_unstable();
        ids
    }

    /// Whether `id` is a live allocation or owned memory of this rank, and released.
    fn released(&self, id: u64) -> Option<bool> {
        let tensor = self.allocations.get(&id).map(|a| a.released);
        tensor.or_else(|| self.owned.get(&id).map(|o| o.released))
    }

    /// Collective: frees `ids` (which every PE agreed on) in allocation order.
    pub fn free_released(&mut self, ids: &[u64]) -> Result<usize, Error> {
        let mut ids = ids.to_vec();
        ids.sort_unstable();
        ids.dedup();
        // Validate everything before freeing anything: a partial free would leave this PE's
        // heap out of step with the others.
        for id in &ids {
            match self.released(*id) {
                Some(true) => {}
                Some(false) => {
                    return Err(Error::Invalid(format!(
                        "allocation {id} is still referenced on this rank and cannot be freed"
                    )));
                }
                None => {
                    return Err(Error::Invalid(format!(
                        "allocation {id} is not a live allocation of this rank"
                    )));
                }
            }
        }
        if ids.is_empty() {
            return Ok(0);
        }
        // Torch kernels on any stream may still read or write the memory we are about to
        // free (the tensor died on the host, its last kernels may not have run yet).
        self.bind()?;
        self.world
            .context()
            .synchronize()
            .map_err(Error::cuda("waiting for the GPU before freeing"))?;
        for id in &ids {
            // Dropping the buffer is the collective nvshmem_free (ch02's Drop).
            drop(self.allocations.remove(id));
            drop(self.owned.remove(id));
        }
        Ok(ids.len())
    }

    /// The live allocation containing bytes `ptr..ptr + num_bytes`: (id, offset in it).
    ///
    /// A pointer outside NVSHMEM's heap is `NotSymmetric` (ch02's membership test); one
    /// inside the heap but in none of our allocations is too (freed, or another library's).
    pub fn locate(&self, ptr: u64, num_bytes: usize) -> Result<(u64, usize), Error> {
        ch02_symmetric_memory::check_symmetric(&self.world, ptr)?;
        let found = self.allocations.iter().find(|(_, a)| {
            let start = a.buffer.device_ptr();
            ptr >= start && ptr < start + a.buffer.num_bytes() as u64
        });
        let Some((&id, allocation)) = found else {
            return Err(Error::Invalid(format!(
                "device address {ptr:#x} is inside NVSHMEM's symmetric heap but in no live \
                 allocation of nvshmem_tutorial (freed by finalize(), or allocated by another \
                 library): use a tensor from nvshmem_tutorial.empty()"
            )));
        };
        let offset = (ptr - allocation.buffer.device_ptr()) as usize;
        // ch02's range check, in bytes (the buffer's element type is u8).
        if allocation.buffer.check_range(offset, num_bytes).is_err()
            || offset + num_bytes > allocation.num_bytes.max(1)
        {
            return Err(Error::OutOfBounds {
                offset,
                num_bytes,
                len: allocation.num_bytes,
            });
        }
        Ok((id, offset))
    }

    /// Binds the world's context to this thread: NVSHMEM's on-stream calls and CUDA's
    /// synchronisation use the current context, and the GIL-free thread we run on may never
    /// have had one.
    pub fn bind(&self) -> Result<(), Error> {
        self.world
            .context()
            .bind_to_thread()
            .map_err(Error::cuda("binding the context"))
    }

    /// `Err` unless `pe` names a PE of this job.
    pub fn check_pe(&self, pe: i64) -> Result<usize, Error> {
        if pe < 0 {
            return Err(Error::NegativePe {
                pe,
                n_pes: self.world.n_pes(),
            });
        }
        ch02_symmetric_memory::check_pe(&self.world, pe as usize)?;
        Ok(pe as usize)
    }
}

/// Collective: frees every allocation (referenced or not), then finalises NVSHMEM. Returns
/// how many allocations Python still referenced: their tensors now point at freed memory.
pub fn finalize() -> Result<usize, Error> {
    let Some(mut state) = lock(&STATE).take() else {
        return Ok(0);
    };
    state.take_released();
    let still_referenced = state.allocations.values().filter(|a| !a.released).count()
        + state.owned.values().filter(|o| !o.released).count();
    let ctx = state.world.context().clone();
    let _ = ctx.bind_to_thread();
    let synced = ctx.synchronize();
    // The communicator and the topology were allocated after some tensors and before others;
    // freeing them first is still the same order on every PE, which is all nvshmem_free needs
    // (the topology's teams are destroyed with it, collectively too).
    drop(state.collectives.take());
    drop(state.inter_node.take());
    // Allocation order on every PE: pop from the front of the ordered map (the buffers'
    // memory last: the same order on every PE too).
    while let Some((_, allocation)) = state.allocations.pop_first() {
        drop(allocation);
    }
    while let Some((_, owned)) = state.owned.pop_first() {
        drop(owned);
    }
    // The last Arc: World's Drop runs nvshmemx_hostlib_finalize.
    drop(state);
    lock(&RELEASED).clear();
    synced.map_err(Error::cuda("waiting for the GPU before finalizing"))?;
    Ok(still_referenced)
}
