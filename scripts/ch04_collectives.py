"""Chapter 4 from PyTorch: collectives on symmetric tensors.

    torchrun --standalone --nproc_per_node=N scripts/ch04_collectives.py

Mirrors chapters/ch04-collectives/examples/ch04_collectives/main.rs with the Python package: every
collective and algorithm at sizes from 0 to 1 MB (odd ones, ones no PE count divides), into
poisoned outputs, against references computed with plain torch from every rank's input
(every rank can rebuild every other rank's input from the shared seed); a CUDA graph of an
all-reduce and an all-gather replayed with new inputs; all-to-all-v with counts only the GPU
knows; and the mistakes, which must raise before anything is launched. Rank 0 prints every
rank's lines (`pe <i>: ...`) and `N passed, M failed` last.
"""

from __future__ import annotations

import torch

from ch00_common import Tally, job_seed, main, nv, print_by_pe, start

COUNTS = (0, 1, 13, 1000, 65_537)
ALGORITHMS = {
    "broadcast": ("one_shot", "scatter_gather"),
    "all_gather": ("one_shot", "direct", "ring"),
    "all_to_all": ("one_shot", "direct"),
    "all_reduce": ("one_shot", "two_shot"),
    "reduce_scatter": ("one_shot", "pull"),
}


def inputs_of(seed: int, numel: int, dtype: torch.dtype) -> list:
    """Every rank's input, as every rank can rebuild it: values that show where they came
    from, exactly representable in bf16 so fp32 sums of them are exact."""
    n = nv.n_pes()
    out = []
    for pe in range(n):
        g = torch.Generator(device="cuda").manual_seed(seed * 131 + pe)
        values = torch.randint(-64, 64, (numel,), generator=g, device="cuda").to(dtype) / 4
        out.append(values)
    return out


# ANCHOR: check_one
def check_one(tally: Tally, name: str, algorithm: str, count: int, dtype: torch.dtype, seed: int) -> None:
    """One collective, one algorithm, one size: run it and compare with plain torch."""
    me, n = nv.my_pe(), nv.n_pes()
    in_numel = {"all_to_all": n * count, "reduce_scatter": n * count}.get(name, count)
    out_numel = {"all_gather": n * count, "all_to_all": n * count}.get(name, count)
    inputs = inputs_of(seed, in_numel, dtype)
    input = nv.empty((in_numel,), dtype)
    output = nv.empty((out_numel,), dtype)
    input.copy_(inputs[me])
    output.fill_(float("nan"))  # poison: a slot nothing wrote cannot pass
    root = count % n
    if name == "broadcast":
        nv.broadcast(output, input, root, algorithm=algorithm)
        expected = inputs[root]
    elif name == "all_gather":
        nv.all_gather(output, input, algorithm=algorithm)
        expected = torch.cat(inputs)
    elif name == "all_to_all":
        nv.all_to_all(output, input, algorithm=algorithm)
        expected = torch.cat([x[me * count : (me + 1) * count] for x in inputs])
    elif name == "all_reduce":
        nv.all_reduce(output, input, algorithm=algorithm)
        expected = torch.stack(inputs).float().sum(0).to(dtype)
    else:
        nv.reduce_scatter(output, input, algorithm=algorithm)
        expected = torch.stack([x[me * count : (me + 1) * count] for x in inputs]).float().sum(0).to(dtype)
    torch.cuda.synchronize()
    tally.check(torch.equal(output, expected), lambda: f"{name} {algorithm} {dtype} count {count}: wrong result")
# ANCHOR_END: check_one


def supported(algorithm: str, count: int, dtype: torch.dtype) -> bool:
    """One-shot (LL) algorithms hold at most 512 KiB per peer in their scratch; every case
    here sends `count` elements per peer."""
    return algorithm != "one_shot" or count * torch.finfo(dtype).bits // 8 <= 512 << 10


# ANCHOR: graph
def graph_replay(tally: Tally, seed: int) -> None:
    """Capture an all-reduce and an all-gather once; replay with new inputs."""
    me, n = nv.my_pe(), nv.n_pes()
    x = nv.empty((4096,), torch.float32)
    summed = nv.empty((4096,), torch.float32)
    gathered = nv.empty((n * 4096,), torch.float32)
    x.zero_()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up outside the graph, as torch asks
        nv.all_reduce(summed, x)
        nv.all_gather(gathered, summed)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        nv.all_reduce(summed, x)
        nv.all_gather(gathered, summed)
    for replay in range(5):
        inputs = inputs_of(seed + replay, 4096, torch.float32)
        x.copy_(inputs[me])
        graph.replay()
        torch.cuda.synchronize()
        expected = torch.stack(inputs).sum(0).repeat(n)
        tally.check(torch.equal(gathered, expected), f"graph replay {replay}: wrong result")
# ANCHOR_END: graph


def all_to_all_v(tally: Tally, seed: int) -> None:
    """Uneven splits that only the GPU knows, rows of 7168 bf16 (one MoE token)."""
    me, n = nv.my_pe(), nv.n_pes()
    hidden = 7168
    g = torch.Generator().manual_seed(seed)
    splits = torch.randint(0, 9, (n, n), generator=g)  # splits[p][q]: rows p sends to q
    rows = [inputs_of(seed + p, int(splits[p].sum()) * hidden, torch.bfloat16)[p].view(-1, hidden) for p in range(n)]
    # (each rank rebuilds every rank's rows from the seed, as inputs_of does for the others)
    input = nv.empty((8 * n, hidden), torch.bfloat16)
    output = nv.empty((8 * n, hidden), torch.bfloat16)
    input[: rows[me].shape[0]].copy_(rows[me])
    output.fill_(float("nan"))
    in_splits = splits[me].to("cuda")
    out_splits_offsets = torch.full((2, n), -1, dtype=torch.int64, device="cuda")
    nv.all_to_all_v(output, input, in_splits, out_splits_offsets)
    torch.cuda.synchronize()
    expected = []
    for p in range(n):
        first = int(splits[p][:me].sum())
        expected.append(rows[p][first : first + int(splits[p][me])])
    expected = torch.cat(expected)
    counts = splits[:, me]
    offsets = torch.cumsum(counts, 0) - counts
    tally.check(torch.equal(output[: expected.shape[0]], expected), "all_to_all_v: wrong rows")
    tally.check(
        torch.equal(out_splits_offsets.cpu(), torch.stack([counts, offsets])),
        lambda: f"all_to_all_v: counts/offsets {out_splits_offsets.tolist()}",
    )


def mistakes(tally: Tally) -> None:
    """Each must raise before anything is launched."""
    x = nv.empty((1024,), torch.float32)
    local = torch.zeros(1024, device="cuda")
    tally.expect_error(lambda: nv.all_reduce(x, local), nv.NotSymmetricError, "symmetric heap")
    tally.expect_error(lambda: nv.all_reduce(x, x.to(torch.int32)), nv.InvalidArgumentError, "dtype")
    ints = nv.empty((1024,), torch.int32)
    tally.expect_error(lambda: nv.all_reduce(ints, ints), nv.InvalidArgumentError, "bfloat16 or torch.float32")
    tally.expect_error(lambda: nv.all_gather(x, x), nv.InvalidArgumentError, "copies of input")
    tally.expect_error(lambda: nv.all_reduce(x, x, algorithm="ring"), nv.InvalidArgumentError, "one_shot, two_shot")
    tally.expect_error(lambda: nv.all_reduce(x, x, algorithm="fastest"), nv.InvalidArgumentError, "unknown algorithm")
    tally.expect_error(lambda: nv.broadcast(x, x, nv.n_pes()), nv.PeOutOfRangeError, "out of range")


def run() -> bool:
    start()
    seed = job_seed()
    tally = Tally()
    for name, algorithms in ALGORITHMS.items():
        # Reductions in both dtypes they take; the others only move bytes.
        dtypes = (torch.bfloat16, torch.float32) if name in ("all_reduce", "reduce_scatter") else (torch.bfloat16,)
        for algorithm in algorithms:
            for dtype in dtypes:
                for count in COUNTS:
                    if supported(algorithm, count, dtype):
                        check_one(tally, name, algorithm, count, dtype, seed)
        nv.collect()
    print_by_pe(f"{tally.passed} collective cases checked")
    graph_replay(tally, seed)
    all_to_all_v(tally, seed)
    mistakes(tally)
    nv.sync_all()
    nv.check_collectives()
    return tally.finish()


if __name__ == "__main__":
    main("ch04_collectives.py", run)
