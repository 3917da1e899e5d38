"""`import deep_ep` resolved to nvshmem_tutorial: the one change a DeepEP program needs.

benchmarks/deepep_compat.sh puts this folder first on PYTHONPATH and runs DeepEP's own
tests, unmodified, from a DeepEP checkout.
"""

from nvshmem_tutorial.buffer import Buffer, Config, EventOverlap, topk_idx_t

__all__ = ["Buffer", "Config", "EventOverlap", "topk_idx_t"]
