"""The torch reference of scripts/ch09_internode_buffer.py (issue 32's Python side): this job's
topology as the buffer sees it, seeded routing with the edge cases, and what a dispatch and
combine across nodes must return, computed from every rank's inputs (all_gather): the rows in
DeepEP's order, every handle position by its definition, the combine in the kernels' summation
order and exactly; and the fp8 recipe of DeepEP's test."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ch00_common import gather_rows
from nvshmem_tutorial.buffer import Buffer

EXPERTS_PER_RANK = 8
NUM_TOPK = 8
FP8_GROUP = 128


class Topology:
    """This job's ranks as the buffer sees them: n ranks in N nodes of G."""

    def __init__(self, buffer: Buffer) -> None:
        self.n, self.me = dist.get_world_size(), dist.get_rank()
        self.nodes = buffer.runtime.get_num_rdma_ranks()
        self.g = self.n // self.nodes
        self.node, self.local = self.me // self.g, self.me % self.g
        self.num_experts = EXPERTS_PER_RANK * self.n


def routing(num_tokens: int, topo: Topology, seed: int, *, skew: bool = False, one_expert: int | None = None,
            skip_node: int | None = None, nowhere: bool = False) -> torch.Tensor:
    """[num_tokens, K] int64 global expert ids, distinct per token, about 10% -1. `skew`: every
    token's first choice is expert 0; `one_expert`: every token goes to that expert only;
    `skip_node`: no expert on that node (its ranks receive nothing); `nowhere`: every 5th token
    is all -1 (it comes back as its biases only)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    scores = torch.rand((num_tokens, topo.num_experts), generator=g, device="cuda")
    if skew:
        scores[:, 0] += 10
    if skip_node is not None:
        per_node = EXPERTS_PER_RANK * topo.g
        scores[:, skip_node * per_node:(skip_node + 1) * per_node] = -1  # (n - G) x 8 >= K others remain
    idx = scores.topk(NUM_TOPK, dim=1).indices
    drop = torch.rand(idx.shape, generator=g, device="cuda") < 0.1
    idx = torch.where(drop, torch.full_like(idx, -1), idx)
    if one_expert is not None:
        idx = torch.full_like(idx, -1)
        idx[:, 0] = one_expert
    if nowhere:
        idx[::5] = -1
    return idx


def in_rank_of(idx: torch.Tensor, n: int) -> torch.Tensor:
    """[T, n] bool: which ranks a token's experts are on (DeepEP's is_token_in_rank)."""
    ranks = torch.where(idx >= 0, idx // EXPERTS_PER_RANK, torch.full_like(idx, n))
    return torch.nn.functional.one_hot(ranks, n + 1)[..., :n].amax(1).bool()


def channel_of(num_tokens: int, num_channels: int) -> torch.Tensor:
    """[T] int64: each token's channel (DeepEP's get_channel_task_range: ceil(T / C) a channel)."""
    per = max(1, -(-num_tokens // num_channels))
    return torch.arange(num_tokens, device="cuda") // per


def channel_prefix(mask: torch.Tensor, num_channels: int) -> torch.Tensor:
    """[cols, C] int32: per column of mask [T, cols], its tokens in channels 0..=c."""
    chan = channel_of(mask.shape[0], num_channels)
    counts = [mask[chan == c].sum(0) for c in range(num_channels)]
    return torch.stack(counts, 1).cumsum(1).int()


def by_node(mask: torch.Tensor, nodes: int, g: int) -> torch.Tensor:
    """[T, n] as [T, N, G] (the row count explicit: a view of 0 rows cannot infer it)."""
    return mask.view(mask.shape[0], nodes, g)


def mask_bits(mask: torch.Tensor) -> torch.Tensor:
    """[rows] int32: mask [rows, G] bool as bits (bit l: local rank l)."""
    weights = 1 << torch.arange(mask.shape[1], device=mask.device)
    return (mask.long() * weights).sum(1).int()


class Reference:
    """Every rank's inputs and, from them, what this rank must receive, forward, hold in its
    handle and get back from the combine."""

    def __init__(self, topo: Topology, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor, num_channels: int) -> None:
        self.topo, self.c = topo, num_channels
        self.xs, self.idxs, self.ws = gather_rows(x), gather_rows(idx), gather_rows(w)
        self.in_rank = [in_rank_of(i, topo.n) for i in self.idxs]
        me, g, nodes = topo.me, topo.g, topo.nodes
        self.mine = [r[:, me] for r in self.in_rank]  # source s's tokens that come here
        self.rows_from = torch.tensor([int(m.sum()) for m in self.mine], device="cuda")
        local = [(i >= 0) & (i // EXPERTS_PER_RANK == me) for i in self.idxs]
        self.recv_idx = torch.cat([torch.where(lo, i - me * EXPERTS_PER_RANK, -1)[m] for i, lo, m in zip(self.idxs, local, self.mine)])
        self.recv_w = torch.cat([torch.where(lo, w_, 0.0)[m] for w_, lo, m in zip(self.ws, local, self.mine)])
        self.per_expert = [int((self.recv_idx == e).sum()) for e in range(EXPERTS_PER_RANK)]
        # Forwarded: from the rail peer on each node b, its tokens with a rank on our node.
        fw_chan, fw_mask = [], []
        for b in range(nodes):
            s = b * g + topo.local
            ours = by_node(self.in_rank[s], nodes, g)[:, topo.node, :]
            has = ours.any(1)
            fw_chan.append(channel_of(ours.shape[0], num_channels)[has])
            fw_mask.append(ours[has])
        self.fw_chan, self.fw_mask = torch.cat(fw_chan), torch.cat(fw_mask)

    def rows(self, per_source: list) -> torch.Tensor:
        """What arrives here of per-source rows (every rank's, in rank order): grouped by source
        rank, then token (channels are contiguous token ranges), DeepEP's order."""
        return torch.cat([rows[m] for rows, m in zip(per_source, self.mine)])

    def handle_checks(self, handle: tuple, in_rank: torch.Tensor) -> dict:
        """All ten positions against their definitions (buffer_internode_normal.md 2.10)."""
        topo, c = self.topo, self.c
        me, n, g, nodes = topo.me, topo.n, topo.g, topo.nodes
        own = self.in_rank[me]
        node_any = by_node(own, nodes, g).any(2)
        checks = {"handle: a 10-tuple": len(handle) == 10}
        checks["handle[0]: is_token_in_rank, the one given"] = handle[0] is in_rank
        checks["handle[1]: rdma_channel_prefix_matrix"] = torch.equal(handle[1], channel_prefix(node_any, c))
        checks["handle[2]: gbl_channel_prefix_matrix"] = torch.equal(handle[2], channel_prefix(own, c))
        forwarded = []
        for b in range(nodes):
            s = b * g + topo.local
            forwarded.append(channel_prefix(by_node(self.in_rank[s], nodes, g)[:, topo.node, :].any(1, keepdim=True), c)[0])
        forwarded = torch.stack(forwarded)
        checks["handle[3]: recv_rdma_channel_prefix_matrix"] = torch.equal(handle[3], forwarded)
        checks["handle[4]: recv_rdma_rank_prefix_sum"] = torch.equal(handle[4], forwarded[:, -1].cumsum(0).int())
        per_channel = torch.stack([channel_prefix(m.unsqueeze(1), c)[0] for m in self.mine])  # [n, C] inclusive
        before = torch.cat([torch.zeros(1, dtype=torch.int64, device="cuda"), self.rows_from.cumsum(0)[:-1]])
        starts = before.unsqueeze(1) + torch.cat([torch.zeros((n, 1), dtype=torch.int32, device="cuda"), per_channel[:, :-1]], 1)
        checks["handle[5]: recv_gbl_channel_prefix_matrix (first row of each source's channel)"] = torch.equal(handle[5], starts.int())
        checks["handle[6] = handle[-4]: recv_gbl_rank_prefix_sum"] = torch.equal(handle[-4], self.rows_from.cumsum(0).int())
        meta = handle[7]
        want_meta = torch.cat([
            torch.stack([torch.full((int(m.sum()),), s // g, dtype=torch.int32, device="cuda"),
                         mask_bits(by_node(self.in_rank[s][m], nodes, g)[:, topo.node, :])], 1)
            for s, m in enumerate(self.mine)
        ])
        checks["handle[7]: recv_src_meta [M, 8] uint8 = {source node, in-node mask}"] = (
            meta.dtype == torch.uint8 and tuple(meta.shape) == (want_meta.shape[0], 8)
            and torch.equal(meta.contiguous().view(torch.int32), want_meta))
        chan = channel_of(own.shape[0], c)
        want_head = torch.full(node_any.shape, -1, dtype=torch.int32, device="cuda")
        for ch in range(c):
            sel = chan == ch
            sub = node_any[sel]
            want_head[sel] = torch.where(sub, sub.int().cumsum(0) - 1, -1).int()
        checks["handle[8]: send_rdma_head"] = torch.equal(handle[8], want_head)
        nvl = handle[9]
        ok = tuple(nvl.shape) == tuple(self.fw_mask.shape) and torch.equal(nvl == -1, ~self.fw_mask)
        for ch in range(c):
            for lo in range(g if ok else 0):
                at = nvl[(self.fw_chan == ch) & self.fw_mask[:, lo], lo]
                ok = ok and torch.equal(at.sort().values, torch.arange(at.numel(), dtype=at.dtype, device="cuda"))
        checks["handle[9]: send_nvl_head [M_r, G], -1 off the mask, a permutation per NVL stream"] = ok
        return checks

    def combined(self, bias: tuple, out_scale: list) -> tuple:
        """This rank's tokens combined as the kernels do: rank r returns bf16(x * out_scale[r]);
        per node, the rows of its ranks summed in fp32 and rounded to bf16; then bias0 + bias1 +
        the node sums in fp32, rounded once. Also the exact fp32 sum and its magnitude (for the
        tolerance), and the combined weights."""
        topo = self.topo
        x, in_rank = self.xs[topo.me].float(), self.in_rank[topo.me]
        total = torch.zeros_like(x)
        exact = torch.zeros_like(x)
        magnitude = torch.zeros_like(x)
        for b in bias:
            if b is not None:
                total, exact, magnitude = total + b.float(), exact + b.float(), magnitude + b.float().abs()
        for k in range(topo.nodes):
            node_sum = torch.zeros_like(x)
            for r in range(k * topo.g, (k + 1) * topo.g):
                y = (x * out_scale[r]).to(torch.bfloat16).float() * in_rank[:, r].unsqueeze(1)
                node_sum, exact, magnitude = node_sum + y, exact + y, magnitude + y.abs()
            goes = in_rank[:, k * topo.g:(k + 1) * topo.g].any(1).unsqueeze(1)
            total = total + torch.where(goes, node_sum.to(torch.bfloat16).float(), 0.0)
        idx, w = self.idxs[topo.me], self.ws[topo.me]
        return total.to(torch.bfloat16), exact, magnitude, torch.where(idx >= 0, w, 0.0)


def fp8_of(x: torch.Tensor) -> tuple:
    """x as fp8 e4m3 with per-token, per-128-column f32 scales, column-major as DeepEP's test
    passes them (test_internode.py:39)."""
    t, hidden = x.shape
    groups = x.view(t, hidden // FP8_GROUP, FP8_GROUP).float()
    amax = groups.abs().amax(2).clamp(1e-4)
    q = (groups * (448 / amax.unsqueeze(2))).to(torch.float8_e4m3fn).view(t, hidden)
    return q, (amax / 448).T.contiguous().T
