"""The torch engine's CPU kNN one block at a time on every thread against blocks taken by each thread in turn.

On the SOP-shaped set of ``eval_speed.py`` (60,502 x 512, k = 1000, self removed), the first ``--blocks`` blocks of
queries (369 rows each), in one process, four ways in turn for ``--rounds`` rounds (round r starting r places
further along):

- ``bare``: the same queries' products alone, a block of 369 rows at a time on every thread (``similarity_blocks``:
  the bound of ``eval_speed.py``);
- ``knn, one block at a time``: the kNN as it was before 2026-12-03: a block's product on every thread, then its
  selection (numpy's on one thread);
- ``knn, blocks on every thread``: the kNN as it is (``_blocks_in_parallel``): each thread takes whole blocks of
  ``memory_mb / threads``, product and selection on one thread;
- ``knn, blocks on every thread, 369 rows``: the same with blocks of the serial loop's size (``threads`` times its
  memory), to show what keeping within ``memory_mb`` costs.

Each figure is the median over the rounds, beside the median of the paired ratios (each kNN over the bare products
of the same round, and the threads' kNN over one block at a time).

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/knn_threads.py [--blocks 24] [--rounds 10]

Prints a table and writes benchmarks/results/knn_threads.json.
"""

# ruff: noqa: I001  (deepmetric is imported before numpy on purpose)
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import deepmetric  # noqa: F401  (before numpy, as in the CLI: deepmetric sets OpenBLAS idle-thread timeout)
import torch
from _results import environment, rotated, write_result
from eval_speed import clustered_set

from deepmetric.evaluation import knn as knn_module

K = 1000
WAYS = ("bare", "knn, one block at a time", "knn, blocks on every thread", "knn, blocks on every thread, 369 rows")


def run(way: str, queries: torch.Tensor, gallery: torch.Tensor, block: int) -> float:
    """Seconds of one way over the blocks of ``queries``."""
    own = torch.arange(len(queries))
    threads = knn_module.knn_workers()
    real_workers = knn_module.knn_workers
    if way == "knn, one block at a time":
        knn_module.knn_workers = lambda: 1
    try:
        start = time.perf_counter()
        if way == "bare":
            for _, sims in knn_module.similarity_blocks(queries, gallery, block):
                float(sims[:, 0].sum())
        elif way.endswith("369 rows"):
            for _ in knn_module._blocks_in_parallel(queries, gallery, K, own, block, threads):
                pass
        else:
            for _ in knn_module.iter_knn(queries, gallery, K, own, engine="torch"):
                pass
        return time.perf_counter() - start
    finally:
        knn_module.knn_workers = real_workers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "knn_threads.json"))
    args = parser.parse_args()
    x, _ = clustered_set(60502, 11316, 512, 2.2)
    gallery = torch.from_numpy(x)
    block = knn_module.block_rows_for(len(gallery))
    queries = gallery[:block * args.blocks]
    seconds: dict[str, list[float]] = {way: [] for way in WAYS}
    for way in WAYS:  # a first pass, not counted: the process's first products, page mappings and threads
        run(way, queries[:4 * block], gallery, block)
    for turn in range(args.rounds):
        for way in rotated(WAYS, turn):
            seconds[way].append(run(way, queries, gallery, block))

    def paired(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(seconds[a], seconds[b], strict=True))

    ratios = {f"{way} / bare": paired(way, "bare") for way in WAYS[1:]}
    ratios["blocks on every thread / one block at a time"] = paired("knn, blocks on every thread",
                                                                    "knn, one block at a time")
    print(f"{len(queries)} queries against {len(gallery)}, {knn_module.knn_workers()} threads, blocks of {block} "
          f"rows at a time or {knn_module.block_rows_for(len(gallery), 256.0 / knn_module.knn_workers())} a thread")
    for way in WAYS:
        print(f"{way:<40}{statistics.median(seconds[way]):8.2f} s")
    for name, value in ratios.items():
        print(f"{name:<48}{value:6.3f}")
    write_result(args.out, {"benchmark": "knn_threads", "k": K, "queries": len(queries), "block_rows": block,
                            "n": len(gallery), "rounds": args.rounds, **environment("cpu"), "seconds": seconds,
                            "median_seconds": {w: statistics.median(t) for w, t in seconds.items()},
                            "paired_ratios": ratios})


if __name__ == "__main__":
    main()
