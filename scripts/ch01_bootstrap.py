"""Chapter 1 from PyTorch: bootstrap NVSHMEM over torch.distributed, then a ring.

    torchrun --standalone --nproc_per_node=N scripts/ch01_bootstrap.py

Mirrors chapters/ch01-bootstrap/examples/ch01_bootstrap.rs: every PE initialises NVSHMEM
(rank 0's unique id travels over torch.distributed instead of the Rust rendezvous), prints
where it stands, checks that NVSHMEM's numbering matches torchrun's, then writes a pattern
derived from its rank into the next PE's symmetric buffer and checks what the previous PE
wrote into its own. Rank 0 prints every rank's lines (`pe <i>: ...`) and `N passed, M failed`
last.
"""

from __future__ import annotations

import os

import torch

from ch00_common import Tally, job_seed, main, nv, pattern_words, print_by_pe, start

# Ring message sizes in 4-byte words: one word, an odd size no block count divides, 64 MiB.
RING_SIZES_WORDS = (1, 1_000_003, 16 << 20)


def run() -> bool:
    init_seconds = start()
    me, n = nv.my_pe(), nv.n_pes()
    device = torch.cuda.current_device()
    _, (major, minor, patch) = nv.library_info()
    print_by_pe(
        f"PE {me} of {n} (PE {nv.node_pe()} of {nv.node_size()} on this node) on "
        f"cuda:{device} {torch.cuda.get_device_name(device)}: NVSHMEM {major}.{minor}.{patch} "
        f"initialised in {init_seconds * 1e3:.1f} ms"
    )
    tally = Tally()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # Folded runs (scripts/fold_pes.sh) keep torchrun's local rank in FOLD_LOCAL_RANK.
    local_rank = int(os.environ.get("FOLD_LOCAL_RANK", os.environ["LOCAL_RANK"]))
    local_world = int(os.environ["LOCAL_WORLD_SIZE"])
    tally.check(me == rank, f"my_pe {me} != RANK {rank}")
    tally.check(n == world, f"n_pes {n} != WORLD_SIZE {world}")
    tally.check(
        (nv.node_pe(), nv.node_size()) == (local_rank, local_world),
        f"node pe {nv.node_pe()}/{nv.node_size()} != LOCAL_RANK/LOCAL_WORLD_SIZE "
        f"{local_rank}/{local_world}",
    )
    seed = job_seed()
    for num_words in RING_SIZES_WORDS:
        ring_round(num_words, seed, tally)
    return tally.finish()


# ANCHOR: ring
def ring_round(num_words: int, job: int, tally: Tally) -> None:
    """One ring pass of `num_words` int32: put to the next PE, check what came from the previous."""
    me, n = nv.my_pe(), nv.n_pes()
    received = nv.empty((num_words,), torch.int32)  # collective, same size on every PE
    received.fill_(-1)  # poison: a slot nobody wrote keeps 0xFFFFFFFF
    # The seed differs per round, so data left over from another round cannot pass.
    seed = (job ^ (num_words * 0x9E3779B9)) & 0xFFFFFFFF
    staging = pattern_words(me, num_words, seed)
    nv.barrier()  # the poison lands before any peer writes into this buffer
    nv.put(received, staging, (me + 1) % n)
    nv.barrier()  # completes every PE's puts: our buffer holds the previous PE's pattern
    source = (me - 1) % n
    wrong = (received != pattern_words(source, num_words, seed)).sum().item()
    print_by_pe(f"ring of {num_words} words: {wrong} wrong words from pe {source}")
    tally.check(wrong == 0, f"{wrong} of {num_words} words from pe {source} are wrong")
# ANCHOR_END: ring


if __name__ == "__main__":
    main("ch01_bootstrap.py", run)
