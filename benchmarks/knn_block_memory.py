"""The CPU kNN with each block's similarities in new memory against one buffer reused by every block.

On the SOP-shaped set of ``eval_speed.py`` (60,502 x 512), the first ``--blocks`` blocks of queries (369 rows each),
in one process, four ways in turn for ``--rounds`` rounds (round r starting r places further along):

- ``knn, new memory``: our kNN (k = 1000, self removed) as it was before 2026-12-02, each block's product into a new
  tensor (89 MB, whose pages the kernel maps on first touch);
- ``knn, one buffer``: our kNN as it is (``similarity_blocks``: ``similarities(out=)`` into one buffer);
- ``bare, new memory`` / ``bare, one buffer``: the same blocks' products alone, the same two ways.

Each figure is the median over the rounds, beside the median of the paired ratios (one buffer over new memory, and
each kNN over the bare products of the same memory, in the same round).

    .venv/bin/python benchmarks/knn_block_memory.py [--engine torch] [--blocks 24] [--rounds 6]

Prints a table and writes benchmarks/results/knn_block_memory.json.
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

WAYS = ("knn, new memory", "knn, one buffer", "bare, new memory", "bare, one buffer")


def run(way: str, queries: torch.Tensor, gallery: torch.Tensor, block: int, engine: str) -> float:
    """Seconds of one way over the blocks of ``queries``: the new-memory ways are today's loops with
    ``similarities`` told to ignore the buffer it is given."""
    real_similarities = knn_module.similarities

    def into_new_memory(query, gallery_, engine_="torch", out=None):
        return real_similarities(query, gallery_, engine_)

    knn_module.similarities = real_similarities if way.endswith("one buffer") else into_new_memory
    try:
        start = time.perf_counter()
        if way.startswith("knn"):
            for _ in knn_module.iter_knn(queries, gallery, 1000, torch.arange(len(queries)), engine=engine):
                pass
        else:
            for _, sims in knn_module.similarity_blocks(queries, gallery, block, engine):
                float(sims[:, 0].sum())
        return time.perf_counter() - start
    finally:
        knn_module.similarities = real_similarities


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("torch", "numpy"), default="torch")
    parser.add_argument("--blocks", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "knn_block_memory.json"))
    args = parser.parse_args()
    x, _ = clustered_set(60502, 11316, 512, 2.2)
    gallery = torch.from_numpy(x)
    block = knn_module.block_rows_for(len(gallery))
    queries = gallery[:block * args.blocks]
    seconds: dict[str, list[float]] = {way: [] for way in WAYS}
    for way in WAYS:  # a first pass, not counted: the process's first products and page mappings
        run(way, queries[:block], gallery, block, args.engine)
    for turn in range(args.rounds):
        for way in rotated(WAYS, turn):
            seconds[way].append(run(way, queries, gallery, block, args.engine))

    def paired(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(seconds[a], seconds[b], strict=True))

    ratios = {"knn: one buffer / new memory": paired("knn, one buffer", "knn, new memory"),
              "bare: one buffer / new memory": paired("bare, one buffer", "bare, new memory"),
              "knn / bare, new memory": paired("knn, new memory", "bare, new memory"),
              "knn / bare, one buffer": paired("knn, one buffer", "bare, one buffer")}
    print(f"{args.engine} engine, {len(queries)} queries in blocks of {block} against {len(gallery)}")
    for way in WAYS:
        print(f"{way:<20}{statistics.median(seconds[way]):8.2f} s")
    for name, value in ratios.items():
        print(f"{name:<32}{value:6.3f}")
    write_result(args.out, {"benchmark": "knn_block_memory", "engine": args.engine, "queries": len(queries),
                            "block_rows": block, "n": len(gallery), "rounds": args.rounds, **environment("cpu"),
                            "seconds": seconds, "median_seconds": {w: statistics.median(t) for w, t in seconds.items()},
                            "paired_ratios": ratios})


if __name__ == "__main__":
    main()
