"""Chapter 5 from PyTorch: collectives across nodes, three ways.

    torchrun --standalone --nproc_per_node=N scripts/ch05_inter_node.py
    NVSHMEM_TUTORIAL_NODE_PES=2 torchrun --standalone --nproc_per_node=4 \\
        scripts/ch05_inter_node.py              # one host as 2 nodes of 2 PEs

Mirrors chapters/ch05-inter-node/examples/ch05_inter_node.rs with the Python package. On the
topology the environment gives (nodes of torchrun's LOCAL_WORLD_SIZE PEs, or virtual nodes of
NVSHMEM_TUTORIAL_NODE_PES), every collective runs with every method (hierarchical,
nvshmem_teams, flat) at sizes from 0 to 65537 elements, into poisoned outputs, against
references computed with plain torch from every rank's input (every rank can rebuild every
other rank's input from the shared seed). Sums are checked against a reference in the method's
own order (each node in local order, then the nodes, for hierarchical and nvshmem_teams; PE
order for flat) within a tolerance suited to bf16 or fp32 sums. What a method cannot do
(nvshmem_teams: fp32 sums, all-to-all) must raise before anything is launched. Then a CUDA
graph of a hierarchical all-reduce and a flat all-gather replayed with new inputs, all-to-all-v
with counts only the GPU knows, the mistakes, and last counts that do not add up (found on the
GPU; the topology is unusable after them). Rank 0 prints every rank's lines (`pe <i>: ...`) and
`N passed, M failed` last.

PEs folded onto fewer GPUs (scripts/fold_pes.sh, torch.distributed over gloo) need CUDA MPS:
without it NVSHMEM refuses the node and rail team split that makes the topology.
"""

from __future__ import annotations

import os
from collections import defaultdict

import torch

# NVSHMEM's team reduce-scatter stages its whole input in half of the team's reduction
# scratch (512 KiB by default in NVSHMEM 3.4.5) and does not split larger calls: the
# nvshmem_teams rows at 65537 elements need more, set before NVSHMEM starts (the Rust
# programs do the same: chapter 4's team::default_reduce_scratch).
os.environ.setdefault("NVSHMEM_REDUCE_SCRATCH_SIZE", "16M")

from ch00_common import Tally, job_seed, main, nv, print_by_pe, start  # noqa: E402

COUNTS = (0, 1, 13, 1000, 65_537)
MOVERS = ("all_gather", "broadcast", "all_to_all")
REDUCTIONS = ("all_reduce", "all_reduce in place", "reduce_scatter")
TAIL = 16  # elements past every output that no call may write
UINT8_POISON = 0xA5
# Unit roundoff of each dtype the reductions take.
ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24}

summary: dict = defaultdict(lambda: [0, 0])


def record(tally: Tally, key: str, ok: bool, what) -> None:
    """A tally check, also counted per (collective, method) for the summary."""
    summary[key][0 if ok else 1] += 1
    tally.check(ok, what)


def data_of(seed: int, pe: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """PE `pe`'s input, as every rank can rebuild it: random bytes, or normal values (whose
    sums round, so that the order of a sum shows)."""
    g = torch.Generator(device="cuda").manual_seed(seed * 131 + pe)
    if dtype == torch.uint8:
        return torch.randint(0, 256, (numel,), generator=g, device="cuda", dtype=torch.uint8)
    return torch.randn(numel, generator=g, device="cuda").to(dtype)


def poison(t: torch.Tensor) -> None:
    t.fill_(UINT8_POISON if t.dtype == torch.uint8 else float("nan"))


def poisoned(t: torch.Tensor) -> bool:
    return bool((t == UINT8_POISON).all() if t.dtype == torch.uint8 else torch.isnan(t).all())


def groups_of(layout: nv.InterNodeLayout, method: str) -> list:
    """The PEs of each partial sum, in summing order: each node's PEs in local order
    (hierarchical, nvshmem_teams), or every PE in PE order (flat, one group)."""
    if method == "flat":
        return [list(range(layout.n_pes))]
    g = layout.node_pes
    return [[node * g + local for local in range(g)] for node in range(layout.num_nodes)]


# ANCHOR: ordered_sum
def ordered_sum(parts: list, groups: list, dtype: torch.dtype) -> torch.Tensor:
    """Each group summed in order in fp32 and rounded to `dtype` (what a node's reduce-scatter
    leaves), then the groups' sums summed in order in fp32 and rounded once more."""
    partials = []
    for members in groups:
        acc = torch.zeros_like(parts[0], dtype=torch.float32)
        for pe in members:
            acc += parts[pe].float()
        partials.append(acc.to(dtype))
    acc = torch.zeros_like(parts[0], dtype=torch.float32)
    for partial in partials:
        acc += partial.float()
    return acc.to(dtype)


def close(got: torch.Tensor, want: torch.Tensor, parts: list, method: str, dtype: torch.dtype) -> bool:
    """|got - want| within a few roundings of the sum of |inputs|: the reference has the
    method's order, so two roundings of slack (an fp32 sum that rounds the other way); NVSHMEM's
    team reductions sum in an order of their own, possibly rounding at every step."""
    n = len(parts)
    roundings = 2 * (n + 2) if method == "nvshmem_teams" else 4
    magnitude = torch.zeros_like(want, dtype=torch.float32)
    for part in parts:
        magnitude += part.float().abs()
    bound = (roundings * ROUNDOFF[dtype] + n * 2.0**-24) * magnitude + 1e-30
    return bool(((got.float() - want.float()).abs() <= bound).all())
# ANCHOR_END: ordered_sum


def refusal(name: str, method: str, dtype: torch.dtype):
    """What a call the method cannot run must say, or None."""
    if method != "nvshmem_teams":
        return None
    if name == "all_to_all":
        return "has no all-to-all"
    if name in REDUCTIONS and dtype == torch.float32:
        return "reduces bf16 only"
    return None


# ANCHOR: check_one
def check_one(tally: Tally, layout, name: str, method: str, count: int, dtype: torch.dtype, seed: int) -> None:
    """One collective, one method, one size: run it and compare with plain torch."""
    me, n = nv.my_pe(), layout.n_pes
    in_numel = {"all_to_all": n * count, "reduce_scatter": n * count}.get(name, count)
    out_numel = {"all_gather": n * count, "all_to_all": n * count}.get(name, count)
    inputs = [data_of(seed, pe, in_numel, dtype) for pe in range(n)]
    input = nv.empty((in_numel,), dtype)
    space = nv.empty((out_numel + TAIL,), dtype)
    input.copy_(inputs[me])
    poison(space)  # a slot nothing wrote cannot pass
    output = input if name == "all_reduce in place" else space[:out_numel]
    root = (count + 1) % n
    calls = {
        "all_gather": lambda: nv.inter_node_all_gather(output, input, method=method),
        "broadcast": lambda: nv.inter_node_broadcast(output, input, root, method=method),
        "all_to_all": lambda: nv.inter_node_all_to_all(output, input, method=method),
        "all_reduce": lambda: nv.inter_node_all_reduce(output, input, method=method),
        "all_reduce in place": lambda: nv.inter_node_all_reduce(output, input, method=method),
        "reduce_scatter": lambda: nv.inter_node_reduce_scatter(output, input, method=method),
    }
    key = f"{name} {method}"
    text = refusal(name, method, dtype)
    if text is not None:
        before = tally.failed
        tally.expect_error(calls[name], nv.InvalidArgumentError, text)
        summary[key + " (refused)"][0 if tally.failed == before else 1] += 1
        return
    calls[name]()
    torch.cuda.synchronize()
    nv.check_inter_node()
    if name in MOVERS:
        expected = {
            "all_gather": lambda: torch.cat(inputs),
            "broadcast": lambda: inputs[root],
            "all_to_all": lambda: torch.cat([x[me * count : (me + 1) * count] for x in inputs]),
        }[name]()
        ok = torch.equal(output, expected)
    else:
        chunk = slice(me * count, (me + 1) * count) if name == "reduce_scatter" else slice(None)
        parts = [x[chunk] for x in inputs]
        expected = ordered_sum(parts, groups_of(layout, method), dtype)
        ok = close(output, expected, parts, method, dtype)
    untouched = poisoned(space[out_numel:])
    record(
        tally,
        key,
        ok and untouched,
        lambda: f"{key} {dtype} count {count}: right result {ok}, output past its end untouched {untouched}",
    )
# ANCHOR_END: check_one


# ANCHOR: graph
def graph_replay(tally: Tally, layout, seed: int) -> None:
    """Capture a hierarchical all-reduce and a flat all-gather once; replay with new inputs."""
    me, n, count = nv.my_pe(), layout.n_pes, 4099
    x = nv.empty((count,), torch.float32)
    summed = nv.empty((count,), torch.float32)
    gathered = nv.empty((n * count,), torch.float32)
    x.zero_()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up outside the graph, as torch asks
        nv.inter_node_all_reduce(summed, x)
        nv.inter_node_all_gather(gathered, summed, method="flat")
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        nv.inter_node_all_reduce(summed, x)
        nv.inter_node_all_gather(gathered, summed, method="flat")
    for replay in range(3):
        inputs = [data_of(seed + replay, pe, count, torch.float32) for pe in range(n)]
        x.copy_(inputs[me])
        graph.replay()
        torch.cuda.synchronize()
        want = ordered_sum(inputs, groups_of(layout, "hierarchical"), torch.float32)
        ok = close(gathered.view(n, count), want.expand(n, count), inputs, "hierarchical", torch.float32)
        # Every PE's sum is the same bits: the all-gather only moves them.
        same = all(torch.equal(gathered[p * count : (p + 1) * count], gathered[:count]) for p in range(n))
        record(tally, "graph replay", ok and same, f"graph replay {replay}: wrong result")
# ANCHOR_END: graph


def all_to_all_v(tally: Tally, layout, method: str, seed: int) -> None:
    """Uneven splits that only the GPU knows: random (often none to a peer), everything to the
    last PE, nothing at all. Rows of 3584 bf16 (7168 bytes, one MoE token); every PE passes
    the same number of input rows."""
    me, n, hidden = nv.my_pe(), layout.n_pes, 3584
    input = nv.empty((4 * n, hidden), torch.bfloat16)
    output = nv.empty((4 * n, hidden), torch.bfloat16)
    out_splits_offsets = torch.full((2, n), -1, dtype=torch.int64, device="cuda")
    key = f"all_to_all_v {method}"
    if method == "nvshmem_teams":
        in_splits = torch.zeros(n, dtype=torch.int64, device="cuda")
        before = tally.failed
        tally.expect_error(
            lambda: nv.inter_node_all_to_all_v(output, input, in_splits, out_splits_offsets, method=method),
            nv.InvalidArgumentError,
            "has no all-to-all",
        )
        summary[key + " (refused)"][0 if tally.failed == before else 1] += 1
        return
    g = torch.Generator().manual_seed(seed)
    shapes = {
        "random": torch.randint(0, 5, (n, n), generator=g),
        "all to the last pe": torch.tensor([[(1 + p % 3) * (q == n - 1) for q in range(n)] for p in range(n)]),
        "none": torch.zeros((n, n), dtype=torch.int64),
    }
    for i, (shape, splits) in enumerate(shapes.items()):  # splits[p][q]: rows p sends to q
        rows = [
            data_of(seed ^ (i + 1), p, int(splits[p].sum()) * hidden, torch.bfloat16).view(-1, hidden)
            for p in range(n)
        ]
        input[: rows[me].shape[0]].copy_(rows[me])
        poison(output)
        out_splits_offsets.fill_(-1)
        in_splits = splits[me].to(device="cuda", dtype=torch.int64)
        nv.inter_node_all_to_all_v(output, input, in_splits, out_splits_offsets, method=method)
        torch.cuda.synchronize()
        nv.check_inter_node()
        expected = []
        for p in range(n):
            first = int(splits[p][:me].sum())
            expected.append(rows[p][first : first + int(splits[p][me])])
        expected = torch.cat(expected)
        counts = splits[:, me].to(torch.int64)
        offsets = torch.cumsum(counts, 0) - counts
        total = expected.shape[0]
        ok = torch.equal(output[:total], expected) and poisoned(output[total:])
        record(tally, key, ok, f"{key} {shape}: wrong rows, or rows written past the {total} received")
        got = out_splits_offsets.cpu()
        ok = torch.equal(got, torch.stack([counts, offsets]))
        record(tally, key, ok, lambda: f"{key} {shape}: counts/offsets {got.tolist()}")


def mistakes(tally: Tally, layout) -> None:
    """Each must raise before anything is launched."""
    n = layout.n_pes
    x = nv.empty((1024,), torch.float32)
    y = nv.empty((1024,), torch.float32)
    local = torch.zeros(1024, device="cuda")
    ints = nv.empty((1024,), torch.int32)
    invalid = nv.InvalidArgumentError
    tally.expect_error(lambda: nv.inter_node_all_reduce(x, local), nv.NotSymmetricError, "symmetric heap")
    tally.expect_error(lambda: nv.inter_node_all_reduce(x, y, method="hier"), invalid, "is not one of")
    tally.expect_error(lambda: nv.inter_node_broadcast(y, x, n), nv.PeOutOfRangeError, "out of range")
    tally.expect_error(lambda: nv.inter_node_broadcast(x, x, 0), invalid, "overlap")
    tally.expect_error(lambda: nv.inter_node_all_gather(x[: 1024 // n * n], x[: 1024 // n]), invalid, "overlap")
    tally.expect_error(lambda: nv.inter_node_all_reduce(ints, ints), invalid, "bfloat16 or torch.float32")
    # The stages hold 64 MiB: an all-gather whose output is larger must name the field to raise
    # (when it stages at all: nodes of one PE, or one node, do not).
    if layout.num_nodes > 1 and layout.node_pes > 1:
        each = (64 << 20) // n + 1
        big_in = nv.empty((each,), torch.uint8)
        big_out = nv.empty((n * each,), torch.uint8)
        tally.expect_error(lambda: nv.inter_node_all_gather(big_out, big_in), invalid, "stage_bytes")
        del big_in, big_out
    nv.check_inter_node()


def counts_that_do_not_add_up(tally: Tally, layout) -> None:
    """PE 0 sends -1 rows: every PE finds it on the GPU and the next check raises. Last: the
    topology is unusable after it (finalize() frees it)."""
    me, n = nv.my_pe(), layout.n_pes
    input = nv.empty((n, 16), torch.float32)
    output = nv.empty((n, 16), torch.float32)
    in_splits = torch.full((n,), -1 if me == 0 else 1, dtype=torch.int64, device="cuda")
    out_splits_offsets = torch.zeros((2, n), dtype=torch.int64, device="cuda")
    nv.inter_node_all_to_all_v(output, input, in_splits, out_splits_offsets)
    torch.cuda.synchronize()
    tally.expect_error(nv.check_inter_node, nv.NvshmemError, "'s in_splits are negative")


def describe(tally: Tally, layout) -> None:
    """The layout, and that it is the one the environment asks for."""
    me = nv.my_pe()
    wanted = os.environ.get(nv._native.NODE_PES_VAR) or os.environ.get("LOCAL_WORLD_SIZE")
    tally.check(
        wanted is None or layout.node_pes == int(wanted),
        f"nodes of {layout.node_pes} PEs, but the environment asks for {wanted}",
    )
    tally.check(me == layout.node * layout.node_pes + layout.local, f"pe {me} is not {layout}")
    nodes = f"{layout.num_nodes} node(s) x {layout.node_pes} PE(s)"
    print_by_pe(f"{nodes}: pe {me} (node {layout.node}, local {layout.local})")


def print_summary() -> None:
    lines = []
    for key in sorted(summary):
        passed, failed = summary[key]
        lines.append(f"{key:<46} {passed:>3} ok" + (f", {failed} FAILED" if failed else ""))
    print_by_pe(lines if nv.my_pe() == 0 else None)


def run() -> bool:
    start()
    seed = job_seed()
    tally = Tally()
    layout = nv.inter_node_layout()
    describe(tally, layout)
    for name in MOVERS + REDUCTIONS:
        dtypes = (torch.bfloat16, torch.float32) if name in REDUCTIONS else (torch.uint8, torch.bfloat16)
        for method in nv.INTER_NODE_METHODS:
            for dtype in dtypes:
                for count in COUNTS:
                    check_one(tally, layout, name, method, count, dtype, seed)
        nv.collect()
    graph_replay(tally, layout, seed)
    for method in nv.INTER_NODE_METHODS:
        all_to_all_v(tally, layout, method, seed)
    mistakes(tally, layout)
    nv.collect()
    print_summary()
    counts_that_do_not_add_up(tally, layout)
    return tally.finish()


if __name__ == "__main__":
    main("ch05_inter_node.py", run)
