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

The ranks may run on several machines that share no file system (docs/cli.md, "Training on several machines"):
what rank 0 alone reads or writes (the run folder) is done in ``on_main``, which hands its outcome to every rank,
and a step that may fail on one rank only (a data folder missing on one machine) in ``agreed``; either way a
failure on one rank stops every rank with one message naming that rank and its host, instead of leaving the
others waiting in their next collective. Messages travel as JSON in uint8 tensors: nothing is pickled.
"""


import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from .errors import DeepMetricError
from .models.heads import HeadOutput

T = TypeVar("T")


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


class RankFailed(DeepMetricError):
    """Another rank failed (``on_main``, ``agreed``): this one stops too, naming it, its host and its error."""


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
    with ``train.device=cpu`` on a GPU machine, are CPU tensors.

    gloo carries the CUDA tensors too where this machine runs more ranks than it has GPUs (torchrun's
    ``LOCAL_WORLD_SIZE``; ``train.device=cuda:0`` for every rank): NCCL refuses two ranks on one GPU ("Duplicate
    GPU detected"), gloo does not; or where ``DEEPMETRIC_DIST_BACKEND=gloo`` asks for it."""
    if not torch.cuda.is_available():
        return "gloo"
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if os.environ.get("DEEPMETRIC_DIST_BACKEND") == "gloo" or ranks_here > torch.cuda.device_count():
        return "gloo"
    return "cpu:gloo,cuda:nccl"


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


def broadcast_bytes(payload: bytes | None, context: DistContext) -> bytes:
    """Rank 0's ``payload`` on every rank (the others pass None), as a CPU uint8 tensor (gloo, also beside NCCL)."""
    size = torch.tensor([len(payload) if context.is_main and payload is not None else 0], dtype=torch.int64)
    dist.broadcast(size, src=0)
    if context.is_main:
        assert payload is not None
        if payload:
            dist.broadcast(torch.frombuffer(bytearray(payload), dtype=torch.uint8), src=0)
        return payload
    buffer = torch.empty(int(size), dtype=torch.uint8)
    if len(buffer):
        dist.broadcast(buffer, src=0)
    return buffer.numpy().tobytes()


def gather_bytes(payload: bytes, context: DistContext) -> list[bytes]:
    """Every rank's ``payload``, in rank order, on every rank."""
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(context.world_size)]
    dist.all_gather(sizes, torch.tensor([len(payload)], dtype=torch.int64))
    width = max(1, max(int(size) for size in sizes))
    padded = torch.zeros(width, dtype=torch.uint8)
    if payload:
        padded[:len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    pieces = [torch.empty(width, dtype=torch.uint8) for _ in range(context.world_size)]
    dist.all_gather(pieces, padded)
    return [piece[:int(size)].numpy().tobytes() for piece, size in zip(pieces, sizes, strict=True)]


def _failure(error: BaseException | None) -> bytes:
    """A rank's outcome as JSON: its host and error, or null."""
    if error is None:
        return b"null"
    text = str(error) if isinstance(error, DeepMetricError) else f"{type(error).__name__}: {error}"
    return json.dumps({"host": socket.gethostname(), "error": text}).encode()


def _rank_failed(rank: int, failure: dict[str, str], context: DistContext) -> RankFailed:
    return RankFailed(f"rank {rank} of {context.world_size} (host {failure['host']}) failed: {failure['error']}")


def on_main(context: DistContext, work: Callable[[], T]) -> T:
    """``work()`` on rank 0 alone (what touches the run folder), its outcome handed to every rank: its result (which
    must be JSON: None, numbers, strings, lists, dicts) is returned everywhere, its error raised on rank 0 and a
    ``RankFailed`` naming it on the others. Replaces "rank 0 works, every rank waits at a barrier", where the others
    waited for a rank 0 that had stopped until the process group's timeout (30 minutes)."""
    if not context.enabled:
        return work()
    if not context.is_main:
        message = json.loads(broadcast_bytes(None, context))
        if "error" in message:
            raise _rank_failed(0, message["error"], context)
        return message["result"]
    try:
        result = work()
        message = json.dumps({"result": result}).encode()
    except BaseException as error:
        broadcast_bytes(json.dumps({"error": json.loads(_failure(error))}).encode(), context)
        raise
    broadcast_bytes(message, context)
    return result


def agreed(context: DistContext, work: Callable[[], T]) -> T:
    """``work()`` on every rank; when it fails on any rank it fails on every rank: the failing rank raises its own
    error, the others a ``RankFailed`` naming the first rank that failed (a data folder missing on one machine stops
    every machine with that message, instead of leaving the others waiting in their next collective)."""
    if not context.enabled:
        return work()
    error: BaseException | None = None
    try:
        result = work()
    except BaseException as caught:  # handed to the other ranks, then raised here
        error = caught
    failures = [json.loads(outcome) for outcome in gather_bytes(_failure(error), context)]
    if error is not None:
        raise error
    failed = [(rank, failure) for rank, failure in enumerate(failures) if failure is not None]
    if failed:
        raise _rank_failed(*failed[0], context)
    return result


def same_on_every_rank(context: DistContext, digest: str, description: str, what: str) -> None:
    """Refuse, on every rank, a ``digest`` of what this rank loaded that is not rank 0's: the message names each rank
    that differs, its host and its ``description`` of what it loaded, beside rank 0's; ``what`` says what was
    compared."""
    if not context.enabled:
        return
    mine = json.dumps([digest, description, socket.gethostname()]).encode()
    loaded = [json.loads(piece) for piece in gather_bytes(mine, context)]
    differing = [rank for rank, (other, _, _) in enumerate(loaded) if other != loaded[0][0]]
    if differing:
        ranks = "; ".join(f"rank {rank} (host {loaded[rank][2]}): {loaded[rank][1]}" for rank in differing)
        raise DeepMetricError(f"{what} differs between the ranks: rank 0 (host {loaded[0][2]}): {loaded[0][1]}; "
                              f"{ranks}. Every machine must hold the same data (docs/cli.md, 'Training on several "
                              "machines')")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
