"""Where the ``cuda`` kNN's time goes at SOP scale, against the GPU's bare products, in one process.

On the SOP-shaped set of ``eval_speed.py`` (60,502 x 512, k = 1000, self removed), each set-up runs in turn for
``--rounds`` rounds (medians reported), all on the same tensors already on the host, as ``iter_knn`` receives them:

- ``products, a sync per block``: the bare similarity products block by block, each block waited for (what
  ``eval_speed.py``'s ``matmul-cuda`` times: the reference of the issue's ratio);
- ``products, one sync``: the same with one wait at the end (the device's own bound);
- ``block by block``: the CPU engines' loop run on the GPU (``_product_block`` then ``.cpu()`` per block, with its
  host synchronisations inside the top-k): the ``cuda`` engine until 2026-11-28, measured at 6.6x on an H200;
- ``queued``: today's ``cuda`` engine (``iter_knn``: block i + 1 queued before block i is read back, no
  synchronisation inside a block, int32 indices into pinned memory), at the CPU engines' block (256 MB for three
  matrices of similarities) and at 4 (``knn.CUDA_BLOCK_SCALE``, the engine's since the H200 run of 2026-11-28) and
  16 times it, and with one top-k over each whole row instead of the grouped selection.

Both kNN set-ups must give the same neighbours (checked). With ``--profile``, one pass of the queued engine under
``torch.profiler`` prints its 15 most expensive device kernels. On a CPU (``--device cpu``, a small ``--n``) it
checks the script itself.

    python3 benchmarks/knn_cuda.py [--device cuda] [--n 60502] [--classes 11316] [--rounds 3] [--profile]

Prints a table and writes benchmarks/results/knn_cuda.json (seconds, ratios to the products with a sync per block).
"""

# ruff: noqa: I001  (deepmetric is imported before numpy on purpose)
from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path

import deepmetric  # noqa: F401  (sets OPENBLAS_THREAD_TIMEOUT before numpy loads OpenBLAS)
import torch
from _results import environment, timed, write_result
from eval_speed import bare_products, clustered_set

from deepmetric.evaluation import knn as knn_module
from deepmetric.evaluation import topk as topk_module


def block_by_block(x: torch.Tensor, device: torch.device, k: int, block: int) -> list[torch.Tensor]:
    on, own = x.to(device), torch.arange(len(x), device=device)
    found = []
    for s in range(0, len(x), block):
        with knn_module.full_float32_products():
            found.append(knn_module._product_block(on[s:s + block], on, k, own[s:s + block])[1].cpu())
    return found


def queued(x: torch.Tensor, device: torch.device, k: int, block: int) -> list[torch.Tensor]:
    return [part[2] for part in knn_module._queued_blocks(x, x, k, torch.arange(len(x)), block, device)]


def queued_whole_rows(x: torch.Tensor, device: torch.device, k: int, block: int) -> list[torch.Tensor]:
    """The queued engine with the grouped selection switched off (``GROUP`` larger than any row): one top-k over each
    whole row, whose tie check synchronises once a block. Which selection is faster on a GPU is what it asks."""
    group, topk_module.GROUP = topk_module.GROUP, 10**12
    try:
        return queued(x, device, k, block)
    finally:
        topk_module.GROUP = group


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--n", type=int, default=60502)
    parser.add_argument("--classes", type=int, default=11316)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--k", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "knn_cuda.json"))
    args = parser.parse_args()

    device = torch.device(args.device)
    x = torch.from_numpy(clustered_set(args.n, args.classes, args.dim, 2.2)[0])
    block = knn_module.block_rows_for(args.n)

    def today(scale: int) -> str:
        return " (today's engine)" if scale == knn_module.CUDA_BLOCK_SCALE else ""

    setups: dict[str, Callable[[], object]] = {
        "products, a sync per block": lambda: bare_products(x, block, device=str(device)),
        "products, one sync": lambda: bare_products(x, block, device=str(device), sync_each=False),
        "block by block (the engine until 2026-11-28)": lambda: block_by_block(x, device, args.k, block),
        **{f"queued, {scale * block} rows a block{today(scale)}": (
            lambda scale=scale: queued(x, device, args.k, scale * block)) for scale in (1, 4, 16)},
        f"queued, {block} rows a block, whole-row top-k": lambda: queued_whole_rows(x, device, args.k, block),
    }
    reference_neighbours = torch.cat(block_by_block(x, device, args.k, block))
    same = all(torch.equal(reference_neighbours, torch.cat(found)) for found in (
        queued(x, device, args.k, block), queued(x, device, args.k, knn_module.CUDA_BLOCK_SCALE * block),
        queued_whole_rows(x, device, args.k, block)))
    seconds: dict[str, list[float]] = {name: [] for name in setups}
    for _ in range(args.rounds):  # the first round starts the GPU's kernels and the pinned allocator: kept, medians
        for name, run in setups.items():
            seconds[name].append(timed(run, device))
    median = {name: statistics.median(times) for name, times in seconds.items()}
    reference = median["products, a sync per block"]
    print(f"{'set-up':<56}{'seconds':>10}{'x products':>12}")
    for name, value in median.items():
        print(f"{name:<56}{value:>10.3f}{value / reference:>12.2f}")
    print(f"same neighbours, block by block, queued at both blocks and both selections: {same}")
    kernels = None
    if args.profile:
        activities = [torch.profiler.ProfilerActivity.CPU] + (
            [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with torch.profiler.profile(activities=activities) as profiler:
            queued(x, device, args.k, block)
        sort_by = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
        kernels = profiler.key_averages().table(sort_by=sort_by, row_limit=15)
        print(kernels)
    write_result(args.out, {"benchmark": "knn_cuda", "n": args.n, "classes": args.classes, "dim": args.dim,
                            "k": args.k, "block_rows": block, "rounds": args.rounds, **environment(device),
                            "seconds": seconds, "median_seconds": median,
                            "ratio_to_products_synced_per_block": {n: v / reference for n, v in median.items()},
                            "same_neighbours": same, "profile": kernels})


if __name__ == "__main__":
    main()
