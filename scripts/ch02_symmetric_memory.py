"""Chapter 2 from PyTorch: symmetric tensors and peer views.

    torchrun --standalone --nproc_per_node=N scripts/ch02_symmetric_memory.py

Mirrors chapters/ch02-symmetric-memory/examples/ch02_symmetric_memory.rs: one symmetric offset
names the same buffer on every PE; stores through a peer view (a plain torch kernel writing
the peer's memory) land in the peer's tensor once a barrier has passed; and the mistakes
symmetric memory invites (different sizes on different PEs, a PE that does not exist, a range
past the end, a tensor from outside the heap) are exceptions, not corruption. Rank 0 prints
every rank's lines (`pe <i>: ...`) and `N passed, M failed` last.
"""

from __future__ import annotations

import os

import torch

from ch00_common import Tally, job_seed, main, nv, pattern_words, print_by_pe, start

INBOX_WORDS = 3 << 20


def run() -> bool:
    start()
    me, n = nv.my_pe(), nv.n_pes()
    heap = os.environ.get("NVSHMEM_SYMMETRIC_SIZE", "unset: NVSHMEM's default of 1 GiB")
    print_by_pe(f"PE {me} of {n}: symmetric heap NVSHMEM_SYMMETRIC_SIZE={heap}")
    tally = Tally()
    same_offset_everywhere(tally)
    peer_stores_land_after_a_barrier(tally)
    mistakes_are_caught(tally)
    return tally.finish()


# ANCHOR: same_offset
def same_offset_everywhere(tally: Tally) -> None:
    """Two allocations made in the same order sit at the same distance on every PE."""
    me, n = nv.my_pe(), nv.n_pes()
    first = nv.empty((1000,), torch.uint8)
    second = nv.empty((4096,), torch.int32)
    distance = second.data_ptr() - first.data_ptr()
    # Every PE writes its distance into slot `me` of every PE's table, through peer views.
    table = nv.empty((n,), torch.int64)
    table.fill_(-1)
    nv.barrier()
    notes = []
    for pe in range(n):
        peer_table = nv.peer_view(table, pe)
        if peer_table is None:
            notes.append(f"pe {pe} is not load/store reachable; skipping it")
            continue
        peer_table[me] = distance  # a torch kernel storing into pe's memory
    nv.barrier()
    distances = table.tolist()
    print_by_pe(notes + [f"second - first = {distance} bytes; as seen by every PE: {distances}"])
    tally.check(
        all(d == distance for d in distances),
        f"symmetric offsets differ across PEs: {distances}",
    )
# ANCHOR_END: same_offset


def peer_stores_land_after_a_barrier(tally: Tally) -> None:
    """Each PE stores a pattern into the next PE's inbox through the peer view; everyone
    passes a barrier and checks its own inbox."""
    me, n = nv.my_pe(), nv.n_pes()
    nxt, previous = (me + 1) % n, (me - 1) % n
    inbox = nv.empty((INBOX_WORDS,), torch.int32)
    inbox.fill_(-1)  # poison: what nobody writes stays 0xFFFFFFFF
    nv.barrier()  # no peer may store before our poison has landed
    seed = job_seed()
    next_inbox = nv.peer_view(inbox, nxt)
    if next_inbox is None:
        print_by_pe(f"pe {nxt} is not load/store reachable; chapter 3's put reaches it")
        tally.check(True)
        return
    next_inbox.copy_(pattern_words(me, INBOX_WORDS, seed))
    nv.barrier()  # our stores are complete, and so are the previous PE's into our inbox
    wrong = (inbox != pattern_words(previous, INBOX_WORDS, seed)).sum().item()
    print_by_pe(
        f"stored {INBOX_WORDS} words into pe {nxt}; {wrong} wrong words from pe {previous}"
    )
    tally.check(wrong == 0, f"{wrong} words from pe {previous} are wrong")


def mistakes_are_caught(tally: Tally) -> None:
    me, n = nv.my_pe(), nv.n_pes()
    # Different sizes on different PEs: every PE gets the same error (with 2+ PEs).
    asked = 4096 + (4096 * me if n > 1 else 0)
    if n > 1:
        tally.expect_error(
            lambda: nv.empty((asked,), torch.uint8), nv.InvalidArgumentError, "differs"
        )
    same = nv.empty((4096,), torch.uint8)
    tally.check(same.numel() == 4096, "equal sizes reported as a mismatch")

    buffer = nv.empty((1024,), torch.float32)
    # 1025 floats from the start of a 1024-float allocation (torch itself refuses to make such
    # a view, so wrap the address directly, as a buggy extension might).
    overhang = nv._tensors._tensor_at(buffer.data_ptr(), 1025 * 4, buffer).view(torch.float32)
    tally.expect_error(lambda: nv.peer_view(buffer, n), nv.PeOutOfRangeError, "out of range")
    tally.expect_error(
        lambda: nv.put(overhang, torch.zeros(1025, device="cuda"), 0),
        nv.OutOfBoundsError,
        "past the end",
    )
    tally.expect_error(
        lambda: nv.put(buffer, torch.zeros(3, device="cuda"), 0), nv.InvalidArgumentError, "shape"
    )
    tally.expect_error(
        lambda: nv.empty((1 << 45,), torch.uint8), nv.InvalidArgumentError, "larger than the GPU"
    )
    private = torch.zeros(16, dtype=torch.int32, device="cuda")  # torch's caching allocator
    tally.check(not nv.is_symmetric(private), "a cudaMalloc tensor passed as symmetric")
    tally.expect_error(lambda: nv.peer_view(private, 0), nv.NotSymmetricError, "symmetric heap")
    tally.check(nv.is_symmetric(buffer), "a symmetric tensor rejected")


if __name__ == "__main__":
    main("ch02_symmetric_memory.py", run)
