"""Multi-process training on torch.distributed (gloo for CPU tensors, NCCL for CUDA tensors).

What N processes compute is what one process computes on the same global P x K batch:

- the sampler gives each rank a contiguous slice of the global batch (``PKSampler(rank, world_size)``),
  with the same augmentation seeds as in a single process;
- each rank gathers every rank's ``HeadOutput`` with ``gather_with_grad`` (forward: all-gather; backward:
  the slice of the gradient that belongs to the local rows), so the objective sees the whole global
  batch, identically on every rank;
- gradients of the model are then **summed** across ranks (a DDP communication hook) instead of
  averaged: rank r holds dL/dθ through its own rows only, and the single-process gradient is the sum;
  parameters of the objective (margin's beta, a regulariser's layers) already get the full gradient on
  every rank, since every rank computes the same loss.

BatchNorm must be frozen (``model.freeze_bn``, the default) for the equality to hold: running BatchNorm
statistics would be computed on each rank's slice. Evaluation embeds ``rows[rank::world]`` on each rank
and ``gather_rows`` puts the rows back in order, none twice, none dropped.
"""


import os
import socket
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from .models.heads import HeadOutput


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()


def rank_from_env() -> int:
    """This process's rank in torchrun's (or ``launch``'s) environment; 0 outside one."""
    return int(os.environ.get("RANK", "0"))


def context_from_env() -> DistContext:
    """The process group described by torchrun's (or ``launch``'s) environment, initialised if needed."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext()
    rank = rank_from_env()
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if not dist.is_initialized():
        dist.init_process_group(backend=process_group_backend(), rank=rank, world_size=world)
    return DistContext(rank=rank, world_size=world, local_rank=local_rank)


def process_group_backend() -> str:
    """gloo for CPU tensors and, where torch sees a GPU, NCCL for CUDA tensors. NCCL alone refuses CPU tensors
    ("No backend type associated with device type cpu"): the ranks' stop flag, and every collective of a run
    with ``train.device=cpu`` on a GPU machine, are CPU tensors."""
    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


class _GatherWithGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor) -> torch.Tensor:
        ctx.rank, ctx.rows = dist.get_rank(), tensor.shape[0]
        pieces = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
        dist.all_gather(pieces, tensor.contiguous())
        return torch.cat(pieces, dim=0)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad[ctx.rank * ctx.rows:(ctx.rank + 1) * ctx.rows]


def gather_with_grad(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` (equal sizes) in rank order; the local rows keep their gradient."""
    return _GatherWithGrad.apply(tensor)


def gather_labels(labels: torch.Tensor) -> torch.Tensor:
    pieces = [torch.empty_like(labels) for _ in range(dist.get_world_size())]
    dist.all_gather(pieces, labels.contiguous())
    return torch.cat(pieces)


def gather_output(output: HeadOutput, rows: int) -> HeadOutput:
    """Every tensor of ``output`` with ``rows`` rows, gathered across ranks (others are left as they are)."""
    return output.map_tensors(lambda t: gather_with_grad(t) if t.dim() > 0 and t.shape[0] == rows else t)


def sum_gradients(process_group: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: all-reduce (sum) without dividing by the world size."""
    work = dist.all_reduce(bucket.buffer(), async_op=True)
    return work.get_future().then(lambda future: future.value()[0])


def shard_rows(n: int, context: DistContext) -> np.ndarray:
    return np.arange(n)[context.rank::context.world_size]


def gather_rows(local: torch.Tensor, n: int, context: DistContext) -> torch.Tensor:
    """Rebuild the (n, D) matrix whose rows ``rank::world`` each rank computed, in the original order."""
    if not context.enabled:
        return local
    width = -(-n // context.world_size)
    padded = torch.zeros(width, *local.shape[1:], dtype=local.dtype, device=local.device)
    padded[:len(local)] = local
    pieces = [torch.empty_like(padded) for _ in range(context.world_size)]
    dist.all_gather(pieces, padded)
    out = torch.empty(n, *local.shape[1:], dtype=local.dtype, device=local.device)
    for rank, piece in enumerate(pieces):
        count = len(range(rank, n, context.world_size))
        out[rank::context.world_size] = piece[:count]
    return out


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
