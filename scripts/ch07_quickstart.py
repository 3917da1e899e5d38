"""Chapter 7's buffer from PyTorch, as a whole program: DeepEP's normal-mode calls, checked.

    torchrun --standalone --nproc_per_node=2 scripts/ch07_quickstart.py

Every rank routes its tokens to the experts of every rank (top-8 of 8 experts per rank),
dispatches them, runs a stand-in expert (the identity: an expert returns the row it got), and
combines. With identity experts, combine must give back each token times the number of ranks
it went to: checked against plain torch. Ends with one line `N passed, M failed` (rank 0).
The full check of chapter 7 (fp8, cached and fixed-size dispatch, async, edge routings) is
scripts/ch07_buffer.py.
"""

import os

import torch
import torch.distributed as dist

# ANCHOR: quickstart
from nvshmem_tutorial.buffer import Buffer, Config  # or: import deep_ep; Buffer, Config = deep_ep.Buffer, deep_ep.Config

NUM_TOKENS, HIDDEN, TOP_K, EXPERTS_PER_RANK = 4096, 7168, 8, 8


def moe_round_trip(group: dist.ProcessGroup) -> torch.Tensor:
    num_experts = EXPERTS_PER_RANK * group.size()
    # DeepEP's tuning knobs: SMs to use, tokens per chunk the sender pushes, and the ring's
    # size in tokens. The hint is the NVLink buffer those need for rows of HIDDEN bf16.
    config = Config(24, 8, 256)
    buffer = Buffer(group, num_nvl_bytes=config.get_nvl_buffer_size_hint(HIDDEN * 2, group.size()))

    x = torch.randn(NUM_TOKENS, HIDDEN, dtype=torch.bfloat16, device="cuda")  # this rank's tokens
    scores = torch.rand(NUM_TOKENS, num_experts, device="cuda")              # a stand-in router
    topk_idx = scores.topk(TOP_K, dim=1).indices                              # int64 [tokens, 8]
    topk_weights = torch.rand(NUM_TOKENS, TOP_K, device="cuda")

    # Which rank and expert each token goes to; then the tokens travel.
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(topk_idx, num_experts)
    recv_x, _, recv_weights, _, handle, _ = buffer.dispatch(
        x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
        topk_idx=topk_idx, topk_weights=topk_weights, config=config)
    expert_out = recv_x  # the experts: identity here; your expert GEMMs in a model
    combined_x, _, _ = buffer.combine(expert_out, handle, topk_weights=recv_weights, config=config)

    expected = x.float() * in_rank.sum(dim=1, keepdim=True)  # each rank's copy comes back once
    return (combined_x.float() - expected).abs().max() / expected.abs().max()
# ANCHOR_END: quickstart


def main() -> None:
    import nvshmem_tutorial as nv

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    if nv.process_group_backend() == "nccl":
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    else:  # several ranks per GPU (scripts/fold_pes.sh): NCCL refuses, gloo carries the host messages
        dist.init_process_group("gloo")
    error = moe_round_trip(dist.group.WORLD)
    ok = bool(error < 1e-2)  # bf16 rows summed once in fp32, rounded once
    print(f"pe {dist.get_rank()}: combine(dispatch(x)) against torch: relative error {error:.2e}: {'ok' if ok else 'WRONG'}", flush=True)
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    failed = torch.tensor([0 if ok else 1], device=device)
    dist.all_reduce(failed)
    if dist.get_rank() == 0:
        print(f"{dist.get_world_size() - int(failed)} passed, {int(failed)} failed", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
