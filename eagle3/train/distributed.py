"""Data parallelism without DDP wrappers: ranks from torchrun's environment,
gloo on CPU / nccl on CUDA, one all_reduce of the flattened gradients per step.

Manual all_reduce (instead of DistributedDataParallel) because the ranks may
run different numbers of micro-batches in a step: each cuts its own token-
balanced slice of the global batch by the micro-batch budget.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: str = "cpu"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_reduce(self, t, op: str = "sum"):
        """In-place all_reduce (no-op for one process); returns ``t``."""
        if self.world > 1:
            import torch.distributed as dist

            op_ = dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM
            if self.device.startswith("cuda") and t.device.type != "cuda":  # nccl reduces GPU tensors only
                moved = t.to(self.device)
                dist.all_reduce(moved, op=op_)
                t.copy_(moved.cpu())
            else:
                dist.all_reduce(t, op=op_)
        return t

    def all_reduce_grads(self, params) -> None:
        if self.world == 1:
            return
        import torch

        # A rank whose share of a global batch is empty (one sample for two ranks) has no gradients: it adds
        # zeros, so that every rank reduces the same flat vector.
        params = [p for p in params if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        self.all_reduce(flat)
        offset = 0
        for g in grads:
            g.copy_(flat[offset: offset + g.numel()].view_as(g))
            offset += g.numel()

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def close(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def setup(device: str = "auto") -> Dist:
    """Read RANK/WORLD_SIZE/LOCAL_RANK (set by torchrun) and join the process group."""
    import torch

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    from eagle3.devices import resolve_device

    use_cuda = resolve_device(device).startswith("cuda")
    dev = f"cuda:{local}" if use_cuda else "cpu"
    if use_cuda:
        torch.cuda.set_device(local)
    if world > 1:
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return Dist(rank=rank, world=world, local_rank=local, device=dev)
