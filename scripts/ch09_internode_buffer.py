"""Issue 32 from PyTorch: normal-mode dispatch and combine across nodes with nvshmem_tutorial.Buffer.

    NVSHMEM_TUTORIAL_NODE_PES=1 torchrun --standalone --nproc_per_node=2 scripts/ch09_internode_buffer.py  # 2 nodes of 1
    NVSHMEM_TUTORIAL_NODE_PES=2 torchrun --standalone --nproc_per_node=4 scripts/ch09_internode_buffer.py  # 2 nodes of 2
    NVSHMEM_TUTORIAL_NODE_PES=1 torchrun --standalone --nproc_per_node=4 scripts/ch09_internode_buffer.py  # 4 nodes of 1

Without NVSHMEM_TUTORIAL_NODE_PES the script makes nodes of one rank (set before NVSHMEM
starts), so on one host every peer is another node. Through DeepEP's API (``dispatch`` and
``combine`` go across nodes because ``runtime.get_num_rdma_ranks() > 1``), against a reference
built with plain torch from every rank's inputs (all_gather): seeded random top-k routing with
-1 entries, hidden 2048 / 4096 / 7168, bf16 and fp8 with column-major scales, with and without
top-k, async with a previous event (and allocate_on_comm_stream), DeepEP's default config; the
edge cases: a node that receives nothing, every token to one expert, expert 0 first for every
token, zero tokens on a rank, tokens sent nowhere; the cached handle and num_worst_tokens when
the buffer has them (else one line says they were skipped, and why); DeepEP's own checks from
tests/test_internode.py (layout :88-93, counts :152-154, order by ``handle[-4]`` :107-113, top-k
:159-171, combine with two biases and its tolerances :200-217); pairs in a row with changing
routing; bad input refused by name. Every output is checked: the rows and their order, the
received top-k, all ten handle positions against their definitions (DeepEP's for 0-6; ours,
buffer.py's docstring, for 7-9), combined_x bit for bit against the kernels' summation order
and within a tolerance of the exact sum, and the combined weights exactly.

Then mode sharing, DeepEP's ``--test-ll-compatibility``, on a second buffer (made once the first
is destroyed) with ``low_latency_mode=True`` and num_rdma_bytes the larger of the two modes'
hints: a normal dispatch and combine across nodes (1000 tokens x 7168 bf16, checked as above);
a low-latency dispatch before ``clean_low_latency_buffer``, plain and with the receive hook,
each refused with an InvalidArgumentError naming it; the clean, then a bf16 and an fp8
low-latency pair (128 tokens x 2048) checked as scripts/ch08_low_latency.py checks them (its
``pair``: each local expert's rows, count, src_info and layout_range, the fp8 scales, the
receive stats, and the combine within 1e-5 bf16 / 1e-3 fp8 of torch's); a normal dispatch while
a low-latency receive hook is pending, refused naming the hook, then the hook's dispatch and its
combine checked; normal calls again, which need nothing before them (bf16 and fp8, checked as
above); the low-latency send refused again before the next clean; destroy.

The torch reference (topology, seeded routing, the rows, handle and combine a call must return,
DeepEP's fp8 recipe) is scripts/ch09_reference.py. Each comparison is a check of its own, by name.
Rank 0 prints every rank's lines (`pe <i>: ...`) and `N passed, M failed` last: 550 checks per rank
at any N (mode sharing's section adds 94: three round trips of 26, 26 and 27, four refusals before
the clean, two low-latency pairs of 4, the refused normal call and the hook's dispatch and combine;
524 where the ranks keep fewer than 20 SMs resident, which skips DeepEP's default config), whatever
NVSHMEM_TUTORIAL_PAIRS says (the pairs count as one check); a buffer without the cached dispatch (20
checks) or num_worst_tokens (54) says so in a "skipped, not built yet" line. Tried on CPU against a
loop-by-loop model of the buffer (gloo, 2 x 1, 2 x 2, 4 x 1), where wrong handle positions 3, 5, 7,
8, 9, a wrong row order and a combine rounded once each fail it, and so do a low-latency send let
through before the clean, a normal call let through while a hook is pending, and a low-latency
src_info off by one.
"""

from __future__ import annotations

import os

os.environ.setdefault("NVSHMEM_TUTORIAL_NODE_PES", "1")  # nodes of one rank unless told (before NVSHMEM starts)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from ch00_common import Tally, gather_rows, main, nv, pairs_in_a_row, print_by_pe, start  # noqa: E402
import ch08_low_latency as ll  # noqa: E402 - its low-latency pair and torch reference
from ch09_reference import (  # noqa: E402 - the torch reference across nodes
    EXPERTS_PER_RANK, NUM_TOPK, Reference, Topology, by_node, fp8_of, routing)
from nvshmem_tutorial.buffer import Buffer, Config  # noqa: E402

MAX_HIDDEN = 7168
# The low-latency calls' hidden. The larger hint is then normal mode's at 2 x 1 and 4 x 1 and
# low latency's at 2 x 2: each mode also runs in a region sized by the other.
LL_HIDDEN = 2048


class NotBuilt:
    """Features the buffer refuses as not built yet (a ValueError naming issue 32's step): each
    is reported once, and its checks are not counted."""

    def __init__(self) -> None:
        self.seen: dict = {}

    def call(self, what: str, fn):
        """`fn()`, or None when it raises a ValueError naming issue 32 (every rank alike)."""
        try:
            return fn()
        except ValueError as error:
            if "issue 32" not in str(error):
                raise
            self.seen.setdefault(what, str(error).splitlines()[0])
            return None

    def lines(self) -> list:
        return [f"skipped, not built yet: {what}: {why}" for what, why in self.seen.items()]


NOT_BUILT = NotBuilt()


# ANCHOR: round_trip
def round_trip(buffer: Buffer, tally: Tally, config: Config, num_tokens: int, hidden: int, seed: int, *, fp8: bool = False,
               topk: bool = True, bias: int = 3, streams: str = "sync", what: str = "", **route) -> bool:
    """Layout, dispatch (cached and fixed-size where built), combine: against torch, each
    comparison a check of its own. `bias`: bit 0 bias_0, bit 1 bias_1; `streams`: "sync",
    "async" (previous event, async_finish) or "comm" (also allocate_on_comm_stream)."""
    topo = Topology(buffer)
    me = topo.me
    g = torch.Generator(device="cuda").manual_seed(seed * 977 + me)
    x = (torch.randint(-64, 64, (num_tokens, hidden), generator=g, device="cuda") / 8).to(torch.bfloat16)
    idx = routing(num_tokens, topo, seed * 31 + me, **route)
    w = torch.rand((num_tokens, NUM_TOPK), generator=g, device="cuda")
    ref = Reference(topo, x, idx, w, config.num_sms // 2)
    checks: dict = {}
    per_rank, per_node, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx, topo.num_experts)
    checks["layout: is_token_in_rank"] = torch.equal(in_rank, ref.in_rank[me])
    checks["layout: num_tokens_per_rank"] = torch.equal(per_rank, ref.in_rank[me].sum(0).int())
    checks["layout: num_tokens_per_rdma_rank"] = per_node is not None and torch.equal(
        per_node, by_node(ref.in_rank[me], topo.nodes, topo.g).any(2).sum(0).int())
    checks["layout: num_tokens_per_expert"] = torch.equal(per_expert, torch.bincount(idx[idx >= 0], minlength=topo.num_experts).int())
    sent = fp8_of(x) if fp8 else x
    # ANCHOR: dispatch_call
    stream_args: dict = {}
    if streams != "sync":
        stream_args = {"previous_event": buffer.capture(), "async_finish": True, "allocate_on_comm_stream": streams == "comm"}
    args = {"num_tokens_per_rank": per_rank, "num_tokens_per_rdma_rank": per_node, "is_token_in_rank": in_rank,
            "num_tokens_per_expert": per_expert, "config": config}
    if topk:
        args.update({"topk_idx": idx, "topk_weights": w})
    out = NOT_BUILT.call("fp8 dispatch across nodes", lambda: buffer.dispatch(sent, **args, **stream_args))
    if out is None:
        return True
    recv, recv_idx, recv_w, per_expert_list, handle, event = out
    # ANCHOR_END: dispatch_call
    if streams != "sync":
        event.current_stream_wait()
    if fp8:
        q, scales = sent
        want_q = ref.rows(gather_rows(q.view(torch.uint8)))
        want_s = ref.rows(gather_rows(scales.contiguous()))
        checks["dispatch: recv_x fp8 bytes"] = torch.equal(recv[0].view(torch.uint8), want_q)
        checks["dispatch: recv_x_scales"] = torch.equal(recv[1], want_s)
    else:
        checks["dispatch: recv_x"] = torch.equal(recv, ref.rows(ref.xs))
    if topk:
        checks["dispatch: recv_topk_idx"] = torch.equal(recv_idx, ref.recv_idx)
        checks["dispatch: recv_topk_weights"] = torch.equal(recv_w, ref.recv_w)
    else:
        checks["dispatch: no top-k without topk_idx"] = recv_idx is None and recv_w is None
    # From the notify step's counts: the same with or without top-k (as DeepEP's).
    checks["dispatch: num_recv_tokens_per_expert_list"] = per_expert_list == ref.per_expert
    checks.update(ref.handle_checks(handle, in_rank))
    recv_x = recv[0] if fp8 else recv
    # The cached dispatch: the handle instead of the notify step, the same rows.
    cached = NOT_BUILT.call("cached dispatch across nodes", lambda: buffer.dispatch(sent, handle=handle, config=config))
    if cached is not None:
        got = cached[0]
        same = torch.equal(got[0].view(torch.uint8), recv_x.view(torch.uint8)) and torch.equal(got[1], recv[1]) if fp8 else torch.equal(got, recv)
        checks["cached dispatch: the same rows"] = same and cached[1:5] == (None, None, None, None)
    if topk:
        worst = num_tokens_max(num_tokens) * topo.n
        fixed = NOT_BUILT.call("num_worst_tokens across nodes",
                               lambda: buffer.dispatch(sent, **args, num_worst_tokens=worst))
        if fixed is not None:
            w_recv, w_idx, _, w_list, _, _ = fixed
            count = recv_x.shape[0]
            w_rows = w_recv[0] if fp8 else w_recv
            checks["num_worst_tokens: no per-expert list"] = w_list == []
            checks["num_worst_tokens: the received rows first"] = (
                w_rows.shape[0] == worst and torch.equal(w_rows[:count].view(torch.uint8), recv_x.view(torch.uint8)))
            checks["num_worst_tokens: recv_topk_idx -1 past them"] = bool((w_idx[count:] == -1).all())
    # Combine: rank r's "experts" return its rows times (r + 1) (rounded to bf16), with the
    # received weights when there is top-k, and the biases `bias` names.
    scale = [r + 1 for r in range(topo.n)]
    rows = ref.rows(ref.xs).float() * scale[me]  # what this rank received, as bf16 (fp8 calls too)
    y = rows.to(torch.bfloat16)
    biases = tuple(
        (torch.randint(-16, 16, (num_tokens, hidden), generator=g, device="cuda") / 4).to(torch.bfloat16) if bias >> i & 1 else None
        for i in range(2)
    )
    # ANCHOR: combine_call
    combine_args = {"handle": handle, "config": config, **stream_args}
    if streams != "sync":
        combine_args["previous_event"] = buffer.capture()
    if topk:
        combine_args["topk_weights"] = recv_w
    given = biases if biases[1] is not None else biases[0]  # DeepEP takes one tensor or a pair
    combined, combined_w, event = buffer.combine(y, bias=given, **combine_args)
    # ANCHOR_END: combine_call
    if streams != "sync":
        event.current_stream_wait()
    want, exact, magnitude, want_w = ref.combined(biases, scale)
    checks["combine: combined_x bit for bit (node sums rounded, then the total)"] = torch.equal(combined, want)
    tolerance = (2.0 ** -7 + 2.0 ** -20) * magnitude
    checks["combine: combined_x within 2^-7 of the exact sum"] = bool(((combined.float() - exact).abs() <= tolerance).all())
    if topk:
        checks["combine: combined_topk_weights"] = torch.equal(combined_w, want_w)
    else:
        checks["combine: no weights without topk_weights"] = combined_w is None
    label = f"{what}: {num_tokens} tokens x {hidden}{' fp8' if fp8 else ''}{'' if topk else ', no top-k'}, {streams}"
    return all([tally.check(ok, f"{label}: {name} differs from torch's") for name, ok in checks.items()])
# ANCHOR_END: round_trip


def num_tokens_max(num_tokens: int) -> int:
    """The most tokens any rank has this call (collective): num_worst_tokens must be the same
    on every rank."""
    counts: list = [None] * dist.get_world_size()
    dist.all_gather_object(counts, num_tokens)
    return max(counts)


def all_reduced(t: torch.Tensor) -> torch.Tensor:
    """Collective: the sum over ranks of `t` (gloo, when ranks share a GPU, on host copies)."""
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    total = t.to(device).clone()
    dist.all_reduce(total)
    return total.to(t.device)


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """DeepEP's tests/utils.py calc_diff."""
    x, y = x.double() + 1, y.double() + 1
    denominator = (x * x + y * y).sum()
    return float(1 - 2 * (x * y).sum() / denominator)


def deepep_checks(buffer: Buffer, tally: Tally, config: Config, num_tokens: int, hidden: int) -> None:
    """DeepEP's own checks from tests/test_internode.py, ported: x = rank everywhere; the
    received count against the all-reduced per-rank counts (:152), the per-expert list against
    the all-reduced per-expert counts (:154), every row from rank i equal to i in the range
    handle[-4] gives it (check_data, :107-113), the weights likewise (:166-171), and the
    combine with bias_0 = 1 and a random bias_1 divided by the token's rank count back to x
    (:200-217, calc_diff < 5e-6, weights < 1e-9)."""
    topo = Topology(buffer)
    me, n = topo.me, topo.n
    torch.manual_seed(me + 17)
    x = torch.ones((num_tokens, hidden), dtype=torch.bfloat16, device="cuda") * me
    idx = routing(num_tokens, topo, 1234 + me)
    w = torch.ones((num_tokens, NUM_TOPK), dtype=torch.float32, device="cuda") * me
    per_rank, per_node, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx, topo.num_experts)
    gbl_per_rank, gbl_per_expert = all_reduced(per_rank), all_reduced(per_expert)
    recv_x, recv_idx, recv_w, per_expert_list, handle, _ = buffer.dispatch(
        x, num_tokens_per_rank=per_rank, num_tokens_per_rdma_rank=per_node, is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w, config=config)
    prefix = handle[-4]

    def check_data(check_x: torch.Tensor) -> bool:
        ok = bool(torch.equal(check_x.amin(dim=1), check_x.amax(dim=1))) if check_x.numel() else True
        start = 0
        for i in range(n):
            end = int(prefix[i])
            ok = ok and int((check_x[start:end, :].int() - i).sum()) == 0 and check_x[start:end].shape[0] == end - start
            start = end
        return ok

    tally.check(int(gbl_per_rank[me]) == recv_x.size(0), f"DeepEP :152: {int(gbl_per_rank[me])} != {recv_x.size(0)} rows")
    tally.check(gbl_per_expert.view(n, -1)[me].tolist() == per_expert_list, "DeepEP :154: the per-expert list")
    tally.check(check_data(recv_x), "DeepEP check_data (:107-113): rows by source rank in handle[-4]'s ranges")
    local_ok = bool((recv_idx.eq(-1) | ((recv_idx >= 0) & (recv_idx < EXPERTS_PER_RANK))).all())
    counts_ok = all(int(recv_idx.eq(i).sum()) == count for i, count in enumerate(per_expert_list))
    tally.check(local_ok and counts_ok, "DeepEP :159-164: recv_topk_idx local ids and counts")
    # In place, as DeepEP's test (:169-170), whose combine then takes these weights (:205).
    if recv_w.numel():
        recv_w[recv_idx.eq(-1)] = recv_w.amax(dim=1, keepdim=True).expand_as(recv_w)[recv_idx.eq(-1)]
    tally.check(check_data(recv_w), "DeepEP :166-171: recv_topk_weights by source rank")
    bias_0 = torch.ones((num_tokens, hidden), dtype=torch.bfloat16, device="cuda")
    bias_1 = torch.randn((num_tokens, hidden), dtype=torch.bfloat16, device="cuda")
    combined, combined_w, _ = buffer.combine(recv_x, handle, topk_weights=recv_w, bias=(bias_0, bias_1), config=config)
    sends = in_rank.sum(dim=1).unsqueeze(1)
    check_x = (combined.float() - bias_0.float() - bias_1.float()) / sends
    reached = sends.squeeze(1) > 0  # a token sent nowhere divides by 0 (DeepEP's routing has none)
    tally.check(calc_diff(check_x[reached], x[reached]) < 5e-6, "DeepEP :210-212: combined_x back to x")
    tally.check(calc_diff(combined_w[reached] / sends[reached], w[reached]) < 1e-9, "DeepEP :213-217: combined weights back to w")


def bad_input(buffer: Buffer, tally: Tally, config: Config) -> None:
    """Every rank makes the same bad calls; each is refused, naming what is wrong, before
    anything is launched."""
    topo = Topology(buffer)
    Invalid = nv.InvalidArgumentError
    idx = routing(64, topo, 5)
    per_rank, per_node, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx, topo.num_experts)
    x = torch.ones((64, 2048), dtype=torch.bfloat16, device="cuda")
    layout = {"num_tokens_per_rank": per_rank, "is_token_in_rank": in_rank, "num_tokens_per_expert": per_expert, "config": config}
    tally.expect_error(lambda: buffer.dispatch(x, **layout), Invalid, "num_tokens_per_rdma_rank")
    tally.expect_error(lambda: buffer.dispatch(x, **layout, num_tokens_per_rdma_rank=per_node.long()), Invalid,
                       "num_tokens_per_rdma_rank must be int32")
    tally.expect_error(lambda: buffer.dispatch(x[:10], **layout, num_tokens_per_rdma_rank=per_node), Invalid, "x must be")
    recv, _, _, _, handle, _ = buffer.dispatch(x, **layout, num_tokens_per_rdma_rank=per_node)
    tally.expect_error(lambda: buffer.combine(recv, handle[:6], config=config), Invalid, "10-tuple")
    tally.expect_error(lambda: buffer.combine(recv.float(), handle, config=config), Invalid, "x must be bfloat16")
    narrow = torch.ones((64, 1024), dtype=torch.bfloat16, device="cuda")
    tally.expect_error(lambda: buffer.combine(recv, handle, bias=narrow, config=config), Invalid, "bias[0] must be")
    combined, _, _ = buffer.combine(recv, handle, config=config)  # the good pair still goes through
    counts = in_rank.sum(1, keepdim=True).to(torch.bfloat16)
    tally.check(torch.equal(combined, (x * counts).to(torch.bfloat16)), "after the refusals: a combine of ones is not the rank count")


def mode_sharing(tally: Tally, config: Config, nvl_bytes: int, normal_rdma_bytes: int) -> None:
    """DeepEP's test_internode.py --test-ll-compatibility (test_loop): one buffer made with
    low_latency_mode=True, num_rdma_bytes the larger of the two modes' hints, serves normal calls
    across nodes; then clean_low_latency_buffer and low-latency calls, checked as
    scripts/ch08_low_latency.py checks them; then normal calls again. The switch rules are
    src/mode_sharing/'s: normal -> low latency needs the clean (a send without it is refused,
    naming it), low latency -> normal needs nothing but no pending receive hook."""
    n = dist.get_world_size()
    ll_experts = ll.EXPERTS_PER_RANK * n
    ll_bytes = Buffer.get_low_latency_rdma_size_hint(ll.MAX_TOKENS, LL_HIDDEN, n, ll_experts)
    buffer = Buffer(dist.group.WORLD, nvl_bytes, max(normal_rdma_bytes, ll_bytes), low_latency_mode=True,
                    explicitly_destroy=True)
    round_trip(buffer, tally, config, 1000, MAX_HIDDEN, 20, what="mode sharing, normal calls first")
    refused_before_clean(buffer, tally, ll_experts, "after the first normal calls")
    buffer.clean_low_latency_buffer(ll.MAX_TOKENS, LL_HIDDEN, ll_experts)
    ll.pair(buffer, tally, ll.MAX_TOKENS, LL_HIDDEN, 21, what="mode sharing, after clean_low_latency_buffer")
    ll.pair(buffer, tally, ll.MAX_TOKENS, LL_HIDDEN, 22, use_fp8=True, what="mode sharing, after clean_low_latency_buffer")
    hook_before_normal(buffer, tally, config, ll_experts)
    round_trip(buffer, tally, config, 1000, MAX_HIDDEN, 23, what="mode sharing, normal calls after low-latency ones")
    round_trip(buffer, tally, config, 1000, MAX_HIDDEN, 24, fp8=True, what="mode sharing, normal calls after low-latency ones")
    refused_before_clean(buffer, tally, ll_experts, "after the normal calls that followed")
    buffer.destroy()


def refused(tally: Tally, call, text: str, what: str) -> bool:
    """A check that `call` raises InvalidArgumentError naming `text` (refused before any launch,
    every rank alike, so the buffer stays usable)."""
    try:
        call()
    except nv.InvalidArgumentError as error:
        return tally.check(text in str(error), f"{what}: refused without naming {text!r}: {error}")
    except Exception as other:  # noqa: BLE001 - reported as a failed check
        return tally.check(False, f"{what}: expected InvalidArgumentError naming {text!r}, got {type(other).__name__}: {other}")
    return tally.check(False, f"{what}: not refused (expected InvalidArgumentError naming {text!r})")


def refused_before_clean(buffer: Buffer, tally: Tally, num_experts: int, when: str) -> None:
    """A low-latency send after a normal call, without the clean between: its puts could land
    in a peer's landing ring that the peer still forwards from, so it is refused, the send of a
    hook call too. The calls that follow show the buffer still usable."""
    x, idx, _ = ll.inputs(ll.MAX_TOKENS, LL_HIDDEN, 30)
    for hook in (False, True):
        refused(tally, lambda h=hook: buffer.low_latency_dispatch(x, idx, ll.MAX_TOKENS, num_experts, return_recv_hook=h),
                "clean_low_latency_buffer", f"mode sharing, {when}: low_latency_dispatch (return_recv_hook={hook})")


def hook_before_normal(buffer: Buffer, tally: Tally, config: Config, num_experts: int) -> None:
    """Low latency -> normal needs no call (a normal call's notify is a barrier each rank
    enters after its low-latency calls), but not while a receive is pending (the peers' puts
    may still land in the shared bytes): that normal call is refused, naming the hook; after
    the hook the low-latency pair completes, checked as ch08's."""
    topo = Topology(buffer)
    per_rank, per_node, per_expert, in_rank, _ = buffer.get_dispatch_layout(routing(64, topo, 40), topo.num_experts)
    normal_x = torch.ones((64, 2048), dtype=torch.bfloat16, device="cuda")
    layout = {"num_tokens_per_rank": per_rank, "num_tokens_per_rdma_rank": per_node, "is_token_in_rank": in_rank,
              "num_tokens_per_expert": per_expert, "config": config}
    x, idx, w = ll.inputs(ll.MAX_TOKENS, LL_HIDDEN, 41)
    recv, count, handle, _, hook = buffer.low_latency_dispatch(x, idx, ll.MAX_TOKENS, num_experts, use_fp8=False,
                                                               return_recv_hook=True)
    refused(tally, lambda: buffer.dispatch(normal_x, **layout), "receive hook",
            "mode sharing: a normal dispatch while a low-latency receive hook is pending")
    hook()
    problem = ll.check_dispatch(recv, count, handle, x, idx, LL_HIDDEN, use_fp8=False)
    tally.check(not problem, f"mode sharing, the hook's dispatch after the refused normal call: {problem}")
    combined, _, _ = buffer.low_latency_combine(ll.expert_outputs(recv, False), idx, w, handle)
    diff = ll.combine_error(combined, ll.expected_combine(x, idx, w))
    tally.check(diff <= 1e-5 and not bool(combined.isnan().any()),
                f"mode sharing, the hook's combine: combined_x differs from torch (diff {diff:.2e})")


def run() -> bool:
    start()
    me, n = dist.get_rank(), dist.get_world_size()
    tally = Tally()
    layout = nv.inter_node_layout()
    g, nodes = layout[1], layout[2]
    if nodes < 2:
        raise RuntimeError(f"{n} ranks in nodes of {g} are one node: run with NVSHMEM_TUTORIAL_NODE_PES below {n}")
    probe = Config(24, 8, 256, 16, 128)
    nvl_bytes, rdma_bytes = probe.get_buffer_size_hints_for_nodes(MAX_HIDDEN * 2, n, g)
    buffer = Buffer(dist.group.WORLD, nvl_bytes, rdma_bytes, explicitly_destroy=True)
    topo = Topology(buffer)
    tally.check(topo.nodes == nodes and topo.g == g, f"get_num_rdma_ranks() = {topo.nodes}, expected {nodes} nodes of {g}")
    tally.check(buffer.runtime.get_rdma_rank() == me // g, f"get_rdma_rank() = {buffer.runtime.get_rdma_rank()}, expected {me // g}")
    tally.check(buffer.runtime.get_root_rdma_rank(True) == me % g and buffer.runtime.get_root_rdma_rank(False) == 0,
                "get_root_rdma_rank: not (local index, 0)")
    # Every rank the same SM count: the smallest that all keep resident (MPS shares differ).
    most: list = [None] * n
    dist.all_gather_object(most, buffer.runtime.internode_max_num_sms())
    num_sms = min(24, min(most)) & ~1
    config = Config(num_sms, 8, 256, 16, 128)
    for hidden in (2048, 4096, MAX_HIDDEN):
        round_trip(buffer, tally, config, 1000, hidden, hidden, what="random routing")
        round_trip(buffer, tally, config, 1000, hidden, hidden + 1, fp8=True, what="random routing")
    round_trip(buffer, tally, config, 700, 2048, 3, topk=False, bias=1, what="random routing")
    round_trip(buffer, tally, config, 700, 2048, 4, fp8=True, topk=False, bias=0, what="random routing")
    round_trip(buffer, tally, config, 500, 2048, 5, streams="async", bias=2, what="after a previous event")
    round_trip(buffer, tally, config, 500, 2048, 6, streams="comm", what="allocated on the comm stream")
    round_trip(buffer, tally, config, 400, 2048, 7, skip_node=nodes - 1, what=f"node {nodes - 1} receives nothing")
    round_trip(buffer, tally, config, 400, 2048, 8, one_expert=EXPERTS_PER_RANK * n - 1, what="every token to one expert")
    round_trip(buffer, tally, config, 400, 2048, 9, skew=True, what="expert 0 first for every token")
    round_trip(buffer, tally, config, 0 if me == 0 else 300, 2048, 10, what="zero tokens on rank 0")
    round_trip(buffer, tally, config, 300, 2048, 11, nowhere=True, what="every 5th token sent nowhere")
    if num_sms >= Buffer.num_sms:  # DeepEP's default configs (Buffer.num_sms = 20 SMs)
        default = Buffer.get_dispatch_config(n)
        round_trip(buffer, tally, default, 300, 2048, 12, what="DeepEP's default config")
    deepep_checks(buffer, tally, config, 1000, MAX_HIDDEN)
    pairs = pairs_in_a_row(200)
    ok = True
    for i in range(pairs):
        # RDMA chunk changing between calls, as DeepEP's tuning loop does over one buffer.
        chunked = Config(num_sms, 8, 256, (16, 8, 4, 12)[i % 4], 128)
        ok = round_trip(buffer, Tally(), chunked, 64 + i % 50, 2048, 100 + i, fp8=i % 4 == 3, topk=i % 3 != 2, bias=i % 4,
                        what="pair") and ok
    tally.check(ok, f"{pairs} dispatch/combine pairs in a row with changing routing: a result differed")
    print_by_pe([f"{tally.passed} checks passed", *NOT_BUILT.lines()])
    bad_input(buffer, tally, config)
    round_trip(buffer, tally, config, 300, 2048, 13, what="after bad input")
    buffer.destroy()
    # A buffer of its own, made once this one is gone: NVSHMEM's heap need not hold both.
    mode_sharing(tally, config, nvl_bytes, rdma_bytes)
    return tally.finish()


if __name__ == "__main__":
    main("ch09_internode_buffer.py", run)
