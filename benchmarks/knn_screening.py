"""Would a bfloat16 screen make the exact kNN fast enough for "3x faster than PML"? What it would cost, per query.

The exact kNN's floor is its float32 products. CPUs with AVX-512 BF16 multiply bfloat16 faster, and a screen
can stay exact: score everything in bfloat16 (ŝ), keep every candidate that could still be in the float32
top-k, re-score those in float32 and sort them by the engines' rule. For l2-normalised x, y in D dimensions,
with u = 2^-9 (bfloat16's unit round-off), rounding both inputs moves the product by at most (2u + u²), the
bfloat16 output by at most u, and float32 accumulation (here and in the reference) by D·2^-24 each, so
|ŝ - s| ≤ ε = 3u + u² + 2·D·2^-24. Every true top-k item then has ŝ ≥ t - 2ε, with t the k-th largest ŝ of its
row: that band is the candidate set, and its size is what the screen costs beyond the bfloat16 products.

On one block of queries of the benchmark's clustered set (eval_speed.py's, SOP-shaped), in one process, this
times per query row (median of the repeats; ratios to the float32 numpy product, the engine's today):
the float32 product and ``topk_stable`` (today's numpy engine); what a screen needs at the least: the bfloat16
product, the k-th bfloat16 value of each row (an unsorted ``torch.topk``; ``topk_stable`` on bfloat16 is far
slower, as bfloat16's 8-bit mantissa ties most rows), and the re-scoring of each row's candidates in float32
(a gather of their gallery rows and a dot product). The screen's mask pass and final sort are not counted.
It also reports the largest error seen against ε, and the candidates per query at several k.

    .venv/bin/python benchmarks/knn_screening.py [--n 60502] [--k 1000] [--repeats 3] [--out FILE.json]

Prints a table and writes benchmarks/results/knn_screening.json (or ``--out``).
"""

# ruff: noqa: I001  (deepmetric is imported before numpy on purpose)
from __future__ import annotations

import argparse
from pathlib import Path

import deepmetric  # noqa: F401  (sets OPENBLAS_THREAD_TIMEOUT before numpy loads OpenBLAS)
import torch
from _results import environment, per_row_ms, write_result
from eval_speed import clustered_set

from deepmetric.evaluation.knn import block_rows_for, similarities
from deepmetric.evaluation.topk import topk_stable

U = 2.0**-9  # bfloat16 unit round-off


def screening_bound(dim: int) -> float:
    """ε: the most a bfloat16 product of unit vectors can differ from their float32 product (module docstring)."""
    return 3 * U + U * U + 2 * dim * 2.0**-24


def rescore(query: torch.Tensor, gallery: torch.Tensor, candidates: list[torch.Tensor], chunk: int = 16) -> None:
    """float32 similarities of each query to its own candidates (a gather of their rows), a few queries at a time."""
    for s in range(0, len(candidates), chunk):
        for q, c in zip(query[s:s + chunk], candidates[s:s + chunk], strict=True):
            gallery[c] @ q


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=60502)
    parser.add_argument("--classes", type=int, default=11316)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--noise", type=float, default=2.2)
    parser.add_argument("--k", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "knn_screening.json"))
    args = parser.parse_args()

    x, _ = clustered_set(args.n, args.classes, args.dim, args.noise)
    gallery = torch.from_numpy(x)
    rows = block_rows_for(args.n)
    query = gallery[:rows]
    gallery_bf16, query_bf16 = gallery.bfloat16(), query.bfloat16()
    exact = similarities(query, gallery, "numpy")
    approx = (query_bf16 @ gallery_bf16.t()).float()
    eps = screening_bound(args.dim)
    own = torch.arange(rows)
    exact[own, own] = approx[own, own] = float("-inf")  # self-retrieval: the query's own row is left out
    finite = torch.isfinite(exact)
    worst_error = float((approx - exact)[finite].abs().max())

    bands = {}
    for k in sorted({1, 12, 100, args.k}):
        kth = approx.topk(k, dim=1).values[:, -1:]
        counts = (approx >= kth - 2 * eps).sum(dim=1).float()
        bands[k] = {"mean": float(counts.mean()), "max": int(counts.max())}
    kth = approx.topk(args.k, dim=1).values[:, -1:]
    candidates = [row.nonzero().squeeze(1) for row in approx >= kth - 2 * eps]

    block = approx.bfloat16()
    times = {
        "float32 product (numpy)": per_row_ms(lambda: similarities(query, gallery, "numpy"), rows, args.repeats),
        "float32 top-k (topk_stable)": per_row_ms(lambda: topk_stable(exact, args.k), rows, args.repeats),
        "bfloat16 product (torch)": per_row_ms(lambda: query_bf16 @ gallery_bf16.t(), rows, args.repeats),
        "k-th bfloat16 value (torch.topk)": per_row_ms(lambda: block.topk(args.k, dim=1, sorted=False).values.amin(1),
                                                      rows, args.repeats),
        "float32 re-scoring of the candidates": per_row_ms(lambda: rescore(query, gallery, candidates), rows,
                                                           args.repeats),
    }
    reference = times["float32 product (numpy)"]
    today = times["float32 product (numpy)"] + times["float32 top-k (topk_stable)"]
    screened = sum(v for name, v in times.items() if not name.startswith("float32 ") or "re-scoring" in name)
    print(f"{args.n:,} x {args.dim}, block of {rows} queries, k = {args.k}; ε = {eps:.5f}, "
          f"largest |bfloat16 - float32| seen {worst_error:.5f}")
    print(f"{'phase':<40}{'ms / query':>12}{'x f32 product':>15}{'full set, s':>13}")
    for name, value in times.items():
        print(f"{name:<40}{value:12.3f}{value / reference:15.2f}{value * args.n / 1e3:13.1f}")
    for name, value in (("today's kNN (product + top-k)", today), ("screened kNN, at least (bf16 + re-score)",
                                                                   screened)):
        print(f"{name:<40}{value:12.3f}{value / reference:15.2f}{value * args.n / 1e3:13.1f}")
    print("candidates per query within 2ε of the k-th: " + ", ".join(
        f"k = {k}: {v['mean']:.0f} (max {v['max']})" for k, v in bands.items()))
    write_result(args.out, {
        "n": args.n, "dim": args.dim, "k": args.k, "block_rows": rows, "repeats": args.repeats, "epsilon": eps,
        "largest_error": worst_error, "candidates": bands, "ms_per_query": times,
        "ratio_to_float32_product": {name: v / reference for name, v in times.items()},
        "today_ms_per_query": today, "screened_ms_per_query": screened, **environment(),
    })


if __name__ == "__main__":
    main()
