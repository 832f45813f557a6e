"""Sequence parallelism: the rows of one long micro-batch split over the ranks of a process group.

Every op of the draft except step-0 attention works per position (eagle3/draft/ttt.py), so rank r runs
the TTT steps on its own contiguous rows [start, stop) only: its activations, its [rows, Vd] log-softmax
and its attention scores are 1/world of the whole. Step 0's keys and values are all-gathered once per
micro-batch (k/v are nkv x head_dim per position, small next to H and Vd), and every later step's keys stay
local because they are attended on the diagonal only. The TTT shifts look ahead ``ttt_length + 1``
positions, so a rank reads its per-position inputs over a window that long past its rows (`window`).

Gradients: a rank's loss is its rows' share of the global sum (the trainer divides by global counts,
eagle3/train/objective.py), so the sum of the ranks' parameter gradients, which the trainer's all_reduce
already forms, is the single-process gradient. The gather's backward sums every rank's gradient for the
gathered keys and keeps its own rows: an all_reduce, because gloo (CPU) has no reduce_scatter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SeqShard:
    """This rank's rows of rows-of-length ``width``: an even split, the last ranks may hold fewer (or none)."""

    rank: int
    world: int
    width: int

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} outside a group of {self.world}")

    @property
    def chunk(self) -> int:
        return -(-self.width // self.world)

    @property
    def start(self) -> int:
        return min(self.rank * self.chunk, self.width)

    @property
    def stop(self) -> int:
        return min(self.start + self.chunk, self.width)

    def window(self, ttt_length: int) -> tuple[int, int]:
        """The positions [start, stop + ttt_length + 1) (cut at width) whose inputs this rank's TTT reads."""
        return self.start, min(self.width, self.stop + ttt_length + 1)

    @torch.compiler.disable  # a collective: compiled callers (train --compile) run it eagerly
    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """[B, h, rows, d] -> [B, h, width, d]: every rank's rows, in rank order (autograd-aware)."""
        return _GatherRows.apply(x, self)


def single(width: int) -> SeqShard:
    """The whole row on one process (no group)."""
    return SeqShard(0, 1, width)


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shard: SeqShard):
        ctx.shard = shard
        if shard.world == 1:
            return x
        import torch.distributed as dist

        pad = shard.chunk - x.shape[2]
        part = torch.nn.functional.pad(x, (0, 0, 0, pad)) if pad else x
        parts = [torch.empty_like(part) for _ in range(shard.world)]
        dist.all_gather(parts, part.contiguous())
        return torch.cat(parts, dim=2)[:, :, :shard.width]

    @staticmethod
    def backward(ctx, grad):
        shard = ctx.shard
        if shard.world == 1:
            return grad, None
        import torch.distributed as dist

        total = grad.contiguous().clone()
        dist.all_reduce(total)
        return total[:, :, shard.start:shard.stop], None
