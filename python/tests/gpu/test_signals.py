"""put_signal / signal_op / wait_signal: the pairwise handshake, on 2+ GPUs.

Every test orders torch kernels around the handshake on one stream with no host
synchronisation in between: a kernel produces the source, put_signal sends it, the receiver's
stream waits on its signal word, and a kernel consumes the inbox right after. If the signal
could overtake the data, or the wait did not hold the stream back, the consumer would read the
poison. (pytest runs files in name order: this one comes before test_symmetric.py, whose last
test finalizes NVSHMEM.)
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import nvshmem_tutorial as nv


def ring() -> tuple[int, int, int]:
    """(this PE, next PE, previous PE)."""
    me, n = nv.my_pe(), nv.n_pes()
    return me, (me + 1) % n, (me - 1) % n


def data_from(pe: int, num: int, salt: int) -> torch.Tensor:
    """float32 [num] on this GPU that any rank can rebuild for `pe` (never all zeros)."""
    g = torch.Generator(device="cuda").manual_seed(2_000_029 * (pe + 1) + salt)
    return torch.randn(num, generator=g, device="cuda") * 8 + 1


def signal_words(num: int) -> torch.Tensor:
    """Collective: symmetric uint64 [num], zero on every PE before anyone signals."""
    words = nv.zeros((num,), torch.uint64)
    nv.barrier()  # the zeros land everywhere before any peer's signal
    return words


def read_words(words: torch.Tensor) -> list:
    """The words as Python ints (through int64: torch has few uint64 kernels)."""
    return words.view(torch.int64).tolist()


def all_ranks_agree(ok: bool) -> bool:
    flag = torch.tensor([0 if ok else 1], device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(flag)
    return flag.item() == 0


@pytest.mark.parametrize("nbi", [False, True], ids=["blocking", "nbi"])
@pytest.mark.parametrize("op", ["set", "add"])
def test_put_signal_then_wait_orders_torch_kernels(op, nbi):
    """producer kernel -> put_signal -> (peer) wait_signal -> consumer kernel, no host sync.

    "set": one put of the whole inbox, signal := 41, the receiver waits for == 41.
    "add": the inbox in two halves, each adding 20 and 21: the receiver waits for >= 41, so
    it passes only when both halves (and their data) have landed.
    """
    me, nxt, prv = ring()
    num = 4 << 20  # 16 MiB of fp32: a signal that overtook the data would show
    inbox = nv.empty((num,), torch.float32)
    inbox.fill_(float("nan"))  # poison
    words = signal_words(4)  # the barrier inside also orders the poison before peers' puts
    src = data_from(me, num, salt=1)
    src.mul_(3).add_(1)  # a kernel producing the source right before the put
    if op == "set":
        nv.put_signal(inbox, src, nxt, words[1], 41, op="set", nbi=nbi)
        nv.wait_signal(words[1], 41, cmp="eq")
    else:
        half = num // 2
        nv.put_signal(inbox[:half], src[:half], nxt, words[1], 20, op="add", nbi=nbi)
        nv.put_signal(inbox[half:], src[half:], nxt, words[1], 21, op="add", nbi=nbi)
        nv.wait_signal(words[1], 41)  # cmp="ge"
    if nbi:
        nv.quiet()  # src stays untouched until the non-blocking puts have read it
    doubled = inbox * 2  # a kernel consuming the inbox right after the wait
    expected = (data_from(prv, num, salt=1) * 3 + 1) * 2
    got_words = read_words(words)
    ok = torch.equal(doubled, expected) and got_words == [0, 41, 0, 0]
    assert all_ranks_agree(ok), f"words {got_words}"


def test_signal_op_ready_handshake_and_put_signal_of_a_reshaped_source():
    """The receiver says "ready" with signal_op (two adds, waited for with eq), the sender
    waits for it before its put_signal; src has another shape but the same numel as dst."""
    me, nxt, prv = ring()
    inbox = nv.empty((64, 128), torch.bfloat16)
    inbox.fill_(float("nan"))
    words = signal_words(2)  # [0]: "ready" (we -> prv), [1]: "data" (prv -> us)
    nv.signal_op(words[0], 3, prv, op="add")  # our inbox is poisoned: prv may write it
    nv.signal_op(words[0:1], 4, prv, op="add")  # a 1-element slice works too
    nv.wait_signal(words[0], 7, cmp="eq")  # nxt is ready for us
    src = data_from(me, 64 * 128, salt=2).to(torch.bfloat16)
    nv.put_signal(inbox, src, nxt, words[1], 1)
    nv.wait_signal(words[1], 0, cmp="ne")
    got = inbox.float().sum()  # consumer kernel
    expected = data_from(prv, 64 * 128, salt=2).to(torch.bfloat16).view(64, 128)
    ok = torch.equal(inbox, expected) and bool(torch.isfinite(got).item())
    assert all_ranks_agree(ok and read_words(words) == [7, 1])


def test_zero_bytes_still_signal():
    me, nxt, prv = ring()
    words = signal_words(1)
    empty_dst = nv.empty((0,), torch.float32)
    nv.put_signal(empty_dst, torch.empty(0, device="cuda"), nxt, words[0], 5)
    nv.wait_signal(words[0], 5, cmp="ge")
    assert all_ranks_agree(read_words(words) == [5])


def test_put_signal_on_a_side_stream():
    me, nxt, prv = ring()
    inbox = nv.zeros((3, 1000), torch.int64)
    words = signal_words(1)
    side = torch.cuda.Stream()
    src = torch.arange(1000, device="cuda", dtype=torch.int64) * (me + 2)
    side.wait_stream(torch.cuda.current_stream())  # src is produced before the side stream reads it
    nv.put_signal(inbox[2], src, nxt, words[0], 1, stream=side)
    nv.wait_signal(words[0], 1, stream=side)
    torch.cuda.current_stream().wait_stream(side)
    expected = torch.zeros((3, 1000), dtype=torch.int64, device="cuda")
    expected[2] = torch.arange(1000, device="cuda", dtype=torch.int64) * (prv + 2)
    assert all_ranks_agree(torch.equal(inbox, expected))


def test_graph_replay_never_passes_on_a_stale_signal():
    """The benchmark's scheme: K put_signal(add 1) + wait(>= i) captured once, the words
    zeroed (then a barrier) before every replay. Each replay sends fresh data; a replay that
    passed on the previous replay's count would let the consumer copy read stale data."""
    me, nxt, prv = ring()
    k, num = 4, 1 << 16
    inbox = nv.empty((2, num), torch.float32)  # double buffer: slot i % 2
    words = signal_words(1)
    src = torch.empty(num, device="cuda")
    seen = torch.empty((k, num), device="cuda")
    seen[0].copy_(inbox[0])  # load the copy kernel once, outside the capture
    torch.cuda.synchronize()
    dist.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        for i in range(k):
            nv.put_signal(inbox[i % 2], src, nxt, words[0], 1, op="add")
            nv.wait_signal(words[0], i + 1)
            seen[i].copy_(inbox[i % 2])  # consumer right after the wait
    ok = True
    for replay in range(3):
        words.view(torch.int64).zero_()
        src.fill_(float(1000 * replay + me))
        inbox.fill_(float("nan"))
        torch.cuda.synchronize()
        dist.barrier()  # every PE's words are zero before any PE replays
        graph.replay()
        torch.cuda.synchronize()
        ok &= bool((seen == float(1000 * replay + prv)).all().item())
        ok &= read_words(words) == [k]
        dist.barrier()  # the partner has finished reading before we poison again
    del graph
    assert all_ranks_agree(ok)


def test_bad_signal_arguments_raise_before_anything_is_enqueued():
    me, nxt, prv = ring()
    n = nv.n_pes()
    words = signal_words(4)
    sym = nv.empty((256,), torch.float32)
    local = torch.zeros(256, device="cuda")
    as_int64 = nv.empty((2,), torch.int64)
    local_word = torch.zeros(1, dtype=torch.int64, device="cuda").view(torch.uint64)
    block = nv.empty((4,), torch.uint64)
    block_src = torch.zeros(4, dtype=torch.int64, device="cuda").view(torch.uint64)
    # One word whose 8 bytes start 4 bytes before the end of a 16-byte allocation.
    pair = nv.empty((2,), torch.uint64)
    overhang = nv._tensors._tensor_at(pair.data_ptr() + 12, 8, pair)
    cases = [
        (lambda: nv.put_signal(sym, local, nxt, words[0].cpu(), 1), nv.InvalidArgumentError, "CPU tensor"),
        (lambda: nv.put_signal(sym, local.cpu(), nxt, words[0], 1), nv.InvalidArgumentError, "CPU tensor"),
        (lambda: nv.put_signal(local, local, nxt, words[0], 1), nv.NotSymmetricError, "symmetric heap"),
        (lambda: nv.put_signal(sym, local, nxt, local_word, 1), nv.NotSymmetricError, "symmetric heap"),
        (lambda: nv.put_signal(sym, local, nxt, as_int64[0], 1), nv.InvalidArgumentError, "uint64"),
        (lambda: nv.put_signal(sym, local, nxt, words, 1), nv.InvalidArgumentError, "exactly one signal word"),
        (lambda: nv.put_signal(sym, local, nxt, words[0:0], 1), nv.InvalidArgumentError, "exactly one signal word"),
        (lambda: nv.put_signal(sym, local, nxt, [0], 1), nv.InvalidArgumentError, "torch.Tensor"),
        (lambda: nv.put_signal(sym, local, n, words[0], 1), nv.PeOutOfRangeError, f"PEs 0..{n}"),
        (lambda: nv.put_signal(sym, local, -1, words[0], 1), nv.PeOutOfRangeError, "out of range"),
        (lambda: nv.put_signal(sym, local.half(), nxt, words[0], 1), nv.InvalidArgumentError, "dtype"),
        (lambda: nv.put_signal(sym, local[:100], nxt, words[0], 1), nv.InvalidArgumentError, "equal numel"),
        (lambda: nv.put_signal(sym[::2], local[:128], nxt, words[0], 1), nv.InvalidArgumentError, "not contiguous"),
        (lambda: nv.put_signal(block, block_src, nxt, block[2], 1), nv.InvalidArgumentError, "inside dst"),
        (lambda: nv.put_signal(sym, local, nxt, words[0], 1, op="or"), nv.InvalidArgumentError, "op='or'"),
        (lambda: nv.put_signal(sym, local, nxt, words[0], -1), nv.InvalidArgumentError, "does not fit"),
        (lambda: nv.put_signal(sym, local, nxt, words[0], 1, stream="s"), nv.InvalidArgumentError, "stream"),
        (lambda: nv.signal_op(words[0], 1, n), nv.PeOutOfRangeError, "out of range"),
        (lambda: nv.signal_op(local_word, 1, nxt), nv.NotSymmetricError, "symmetric heap"),
        (lambda: nv.signal_op(as_int64[1], 1, nxt), nv.InvalidArgumentError, "uint64"),
        (lambda: nv.wait_signal(words[0].cpu(), 1), nv.InvalidArgumentError, "CPU tensor"),
        (lambda: nv.wait_signal(local_word, 1), nv.NotSymmetricError, "symmetric heap"),
        (lambda: nv.wait_signal(words[:2], 1), nv.InvalidArgumentError, "exactly one signal word"),
        (lambda: nv.wait_signal(as_int64[0], 1), nv.InvalidArgumentError, "uint64"),
        (lambda: nv.wait_signal(words[0], 1, cmp="always"), nv.InvalidArgumentError, "cmp='always'"),
    ]
    # Views torch may refuse to build from a raw byte range (pointer alignment rules differ
    # between releases): test them when torch builds them.
    try:
        overhang_word = overhang.view(torch.uint64)
        cases.append(
            (lambda: nv.wait_signal(overhang_word, 1), nv.OutOfBoundsError, "past the end")
        )
    except RuntimeError:
        pass
    try:
        misaligned = nv._tensors._tensor_at(pair.data_ptr() + 4, 8, pair).view(torch.uint64)
        cases.append(
            (lambda: nv.wait_signal(misaligned, 1), nv.InvalidArgumentError, "8-byte aligned")
        )
    except RuntimeError:
        pass
    for call, error, text in cases:
        with pytest.raises(error, match=text):
            call()
    # Nothing above reached a stream or a peer: no wait is pending, the job is healthy.
    nv.barrier()
    torch.cuda.synchronize()
    assert read_words(words) == [0, 0, 0, 0]
