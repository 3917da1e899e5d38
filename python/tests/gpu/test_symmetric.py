"""Symmetric tensors, peer views, put/get/barrier ordering and freeing on 2+ GPUs."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

import nvshmem_tutorial as nv

ALL_DTYPES = [
    torch.bfloat16,
    torch.float16,
    torch.float32,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.int32,
    torch.int64,
    torch.uint8,
]


def me() -> int:
    return nv.my_pe()


def ring() -> tuple[int, int, int]:
    """(n_pes, next pe, previous pe)."""
    n = nv.n_pes()
    return n, (me() + 1) % n, (me() - 1) % n


def data_from(pe: int, shape, dtype, salt: int) -> torch.Tensor:
    """Test data that says where it came from: any rank can rebuild what `pe` sent."""
    g = torch.Generator(device="cuda").manual_seed(1_000_003 * (pe + 1) + salt)
    values = torch.randn(shape, generator=g, device="cuda") * 8
    if dtype.is_floating_point:
        return values.to(dtype)
    return values.abs().to(torch.int64).remainder(120).to(dtype) + pe


def all_ranks_agree(ok: bool) -> bool:
    """Collective: True only if `ok` on every rank (so every rank asserts the same thing)."""
    flag = torch.tensor([0 if ok else 1], device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(flag)
    return flag.item() == 0


def test_topology_matches_torchrun():
    assert nv.is_initialized()
    assert nv.my_pe() == dist.get_rank()
    assert nv.n_pes() == dist.get_world_size()
    # Folded runs (scripts/fold_pes.sh) keep torchrun's local rank in FOLD_LOCAL_RANK.
    assert nv.node_pe() == int(os.environ.get("FOLD_LOCAL_RANK", os.environ["LOCAL_RANK"]))
    assert nv.node_size() == int(os.environ["LOCAL_WORLD_SIZE"])


def test_init_is_idempotent():
    nv.init()
    assert nv.my_pe() == dist.get_rank()


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_symmetric_tensor_round_trips(dtype):
    t = nv.empty((3, 257), dtype)
    assert t.shape == (3, 257) and t.dtype == dtype and t.is_contiguous()
    assert t.device == torch.device("cuda", torch.cuda.current_device())
    assert nv.is_symmetric(t) and nv.is_symmetric(t[1:2, 5:9])
    assert not nv.is_symmetric(torch.empty(4, device="cuda"))
    expected = data_from(me(), (3, 257), dtype, salt=1)
    t.copy_(expected)
    assert torch.equal(t.cpu().view(torch.uint8), expected.cpu().view(torch.uint8))
    # Zero-copy: a byte view of the same storage sees the same bytes, and writes through it
    # show up in the typed tensor.
    as_bytes = t.view(torch.uint8)
    as_bytes[0, :4] = torch.tensor([1, 2, 3, 4], dtype=torch.uint8, device="cuda")
    assert t.view(torch.uint8)[0, :4].tolist() == [1, 2, 3, 4]


def test_zeros_and_odd_shapes():
    z = nv.zeros((5, 0, 3), torch.float32)
    assert z.shape == (5, 0, 3) and z.numel() == 0
    s = nv.zeros(7, torch.int64)
    assert s.shape == (7,) and s.sum().item() == 0
    scalar = nv.empty((), torch.float16)
    assert scalar.shape == ()


def test_peer_view_reads_and_writes_the_peer_copy():
    n, nxt, prv = ring()
    x = nv.empty((64, 32), torch.float32)
    mine = data_from(me(), (64, 32), torch.float32, salt=2)
    x.copy_(mine)
    nv.barrier()  # our copy is filled before any peer reads it
    own = nv.peer_view(x, me())
    view = nv.peer_view(x, nxt)
    assert own is not None and own.data_ptr() == x.data_ptr()
    assert view is not None, "single node: every PE must be NVLink/PCIe reachable"
    assert view.shape == x.shape and view.stride() == x.stride() and view.dtype == x.dtype
    read = view.clone()  # a torch kernel reading the peer's memory
    # A strided view of a symmetric tensor has a strided peer view.
    cols = nv.peer_view(x[:, ::2], nxt)
    read_cols = cols.clone()
    nv.barrier()  # everyone has read before anyone overwrites
    view.mul_(-1).add_(float(me()))  # store into the peer's copy
    nv.barrier()  # our stores are complete on the peer and theirs on us
    expected_read = data_from(nxt, (64, 32), torch.float32, salt=2)
    assert torch.equal(read, expected_read)
    assert torch.equal(read_cols, expected_read[:, ::2])
    assert torch.equal(x, -mine + float(prv))


def test_peer_view_of_a_slice_and_of_a_bad_pe():
    x = nv.empty(100, torch.int32)
    part = x[10:20]
    view = nv.peer_view(part, ring()[1])
    assert view.shape == (10,)
    with pytest.raises(nv.PeOutOfRangeError, match="out of range"):
        nv.peer_view(x, nv.n_pes())
    with pytest.raises(nv.PeOutOfRangeError, match="out of range"):
        nv.peer_view(x, -1)
    with pytest.raises(nv.NotSymmetricError, match="not inside NVSHMEM's symmetric heap"):
        nv.peer_view(torch.zeros(4, device="cuda"), 0)


@pytest.mark.parametrize("nbi", [False, True], ids=["blocking", "nbi"])
def test_put_orders_with_torch_kernels_on_the_stream(nbi):
    """produce (kernel) -> put -> barrier -> consume (kernel), no host synchronisation."""
    n, nxt, prv = ring()
    shape = (4096, 1024)  # 16 MiB of fp32: a race would show
    inbox = nv.empty(shape, torch.float32)
    inbox.fill_(float("nan"))  # poison
    nv.barrier()  # the poison lands before any peer's put
    src = data_from(me(), shape, torch.float32, salt=3)
    src.mul_(3).add_(1)  # a kernel right before the put, on the same stream
    nv.put(inbox, src, nxt, nbi=nbi)
    if nbi:
        nv.quiet()
    nv.barrier()
    doubled = inbox * 2  # a kernel right after the barrier
    expected = (data_from(prv, shape, torch.float32, salt=3) * 3 + 1) * 2
    assert all_ranks_agree(torch.equal(doubled, expected))


@pytest.mark.parametrize("nbi", [False, True], ids=["blocking", "nbi"])
def test_get_reads_the_peer_copy_in_stream_order(nbi):
    n, nxt, prv = ring()
    shared = nv.empty((1 << 20,), torch.bfloat16)
    shared.copy_(data_from(me(), (1 << 20,), torch.bfloat16, salt=4))
    nv.barrier()  # every PE's copy is written before anyone reads
    local = torch.full((1 << 20,), float("nan"), dtype=torch.bfloat16, device="cuda")
    nv.get(local, shared, prv, nbi=nbi)
    if nbi:
        nv.quiet()
    result = local.float().sum()  # consumer kernel right after, same stream
    expected = data_from(prv, (1 << 20,), torch.bfloat16, salt=4)
    ok = torch.equal(local, expected) and torch.isfinite(result).item()
    nv.barrier()  # nobody overwrites `shared` while a peer may still read it
    assert all_ranks_agree(ok)


def test_put_on_a_side_stream_and_a_slice():
    n, nxt, prv = ring()
    inbox = nv.zeros((8, 1000), torch.int64)
    nv.barrier()
    side = torch.cuda.Stream()
    src = data_from(me(), (1000,), torch.int64, salt=5)
    side.wait_stream(torch.cuda.current_stream())
    nv.put(inbox[3], src, nxt, stream=side)  # a contiguous row of the symmetric tensor
    nv.barrier(stream=side)
    torch.cuda.current_stream().wait_stream(side)
    expected = torch.zeros((8, 1000), dtype=torch.int64, device="cuda")
    expected[3] = data_from(prv, (1000,), torch.int64, salt=5)
    assert all_ranks_agree(torch.equal(inbox, expected))


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_put_every_dtype(dtype):
    n, nxt, prv = ring()
    inbox = nv.empty((333,), dtype)
    nv.barrier()
    nv.put(inbox, data_from(me(), (333,), dtype, salt=6), nxt)
    nv.barrier()
    expected = data_from(prv, (333,), dtype, salt=6)
    assert all_ranks_agree(torch.equal(inbox.view(torch.uint8), expected.view(torch.uint8)))


def test_bad_arguments_raise_before_anything_is_enqueued():
    n = nv.n_pes()
    sym = nv.empty((256,), torch.float32)
    local = torch.zeros(256, device="cuda")
    # 512 floats starting at `sym`, which holds 256: torch cannot make such a view of `sym`
    # (storage bounds), so wrap the address directly, as a buggy extension might.
    overhang = nv._tensors._tensor_at(sym.data_ptr(), 2048, sym).view(torch.float32)
    cases = [
        (lambda: nv.put(sym, local.cpu(), 0), nv.InvalidArgumentError, "CPU tensor"),
        (lambda: nv.put(sym.cpu(), local, 0), nv.InvalidArgumentError, "CPU tensor"),
        (lambda: nv.put(local, local, 0), nv.NotSymmetricError, "symmetric heap"),
        (lambda: nv.get(local, local, 0), nv.NotSymmetricError, "symmetric heap"),
        (lambda: nv.put(sym, local, n), nv.PeOutOfRangeError, f"PEs 0..{n}"),
        (lambda: nv.get(local, sym, -1), nv.PeOutOfRangeError, "out of range"),
        (lambda: nv.put(sym, local.half(), 0), nv.InvalidArgumentError, "dtype"),
        (lambda: nv.put(sym, local[:100], 0), nv.InvalidArgumentError, "shape"),
        (lambda: nv.put(sym[::2], local[:128], 0), nv.InvalidArgumentError, "not contiguous"),
        (lambda: nv.put(sym, local, 0, stream="s"), nv.InvalidArgumentError, "stream"),
        (lambda: nv.put(sym, [1.0], 0), nv.InvalidArgumentError, "torch.Tensor"),
        (lambda: nv.put(sym, local, 1.5), nv.InvalidArgumentError, "pe must be an int"),
        (lambda: nv.put(overhang, torch.zeros(512, device="cuda"), 0), nv.OutOfBoundsError, "past the end"),
        (lambda: nv.empty((4,), torch.complex64), nv.InvalidArgumentError, "not supported"),
        (lambda: nv.empty((-1,), torch.float32), nv.InvalidArgumentError, ">= 0"),
        (lambda: nv.empty((4,), torch.float32, device="cpu"), nv.InvalidArgumentError, "GPU"),
        (lambda: nv.peer_view(local.cpu(), 0), nv.InvalidArgumentError, "CPU tensor"),
        (lambda: nv.empty((1 << 45,), torch.uint8), nv.InvalidArgumentError, "larger than"),
    ]
    for call, error, text in cases:
        with pytest.raises(error, match=text):
            call()
    # Nothing above reached the stream or a peer: the job is still healthy.
    nv.barrier()
    torch.cuda.synchronize()


def test_different_sizes_on_different_ranks_fail_on_every_rank():
    nv.collect()  # free what earlier tests released, so `live` only counts what follows
    before = nv.heap_usage()["live"]
    with pytest.raises(nv.InvalidArgumentError, match="identical on every rank"):
        nv.empty((16 + me(),), torch.float32)
    assert nv.heap_usage()["live"] == before  # nothing was allocated anywhere
    ok = nv.empty((16,), torch.float32)  # and the next allocation works
    assert ok.shape == (16,)


def test_freeing_waits_for_every_rank_and_every_reference():
    import gc

    nv.collect()
    base = nv.heap_usage()
    x = nv.empty((1 << 20,), torch.float32)
    gc.collect()
    # Alive while referenced: neither the capsule's end nor a GC pass releases it.
    assert nv.heap_usage() == {
        "live": base["live"] + 1,
        "released": 0,
        "bytes": base["bytes"] + (4 << 20),
    }
    part = x[5:10]
    peer = nv.peer_view(x, ring()[1])
    del x
    gc.collect()
    assert nv.collect() == 0  # `part` and `peer` still hold the allocation
    del part
    assert nv.collect() == 0  # the peer view keeps the allocation alive too
    # Released on rank 0 only: no rank frees it yet (nvshmem_free is collective).
    if me() == 0:
        del peer
    else:
        keep = peer
    first = nv.collect()
    usage = nv.heap_usage()
    if me() != 0:
        del keep
        del peer
    second = nv.collect()
    final = nv.heap_usage()
    assert first == 0
    assert usage["released"] == (1 if me() == 0 else 0)
    assert second == 1
    assert final["live"] == base["live"] and final["bytes"] == base["bytes"]


def test_freed_memory_is_reused_by_the_next_allocation():
    nv.collect()
    a = nv.empty((1 << 22,), torch.uint8)
    address = a.data_ptr()
    del a
    b = nv.empty((1 << 22,), torch.uint8)  # empty() collects first: `a` is freed on all ranks
    assert nv.heap_usage()["released"] == 0
    # NVSHMEM's allocator hands the same slot back; what matters is that it is usable.
    b.fill_(7)
    nv.barrier()
    assert b.sum().item() == 7 * (1 << 22) and isinstance(address, int)


def test_zz_finalize_then_every_call_is_a_clear_error():
    # Last test of the session (file order): finalize, then nothing works but init.
    leftover = nv.empty((8,), torch.float32)
    with pytest.warns(RuntimeWarning, match="still referenced"):
        nv.finalize()
    assert not nv.is_initialized()
    with pytest.raises(nv.NotInitializedError):
        nv.my_pe()
    with pytest.raises(nv.NotInitializedError):
        nv.put(leftover, leftover, 0)
    with pytest.raises(nv.NotInitializedError):
        nv.barrier()
    del leftover
    nv.finalize()  # a second finalize is a no-op
