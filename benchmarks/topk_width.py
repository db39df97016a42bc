"""Would halving the products by symmetry speed up the self-retrieval kNN? Time per query row of the two
costs it trades, at SOP's shape (n = 60,502, D = 512, k = 1000, the numpy engine's product).

For self-retrieval (query = gallery) the similarity matrix is symmetric, so only its upper triangle needs
products: each block of rows would be multiplied by the columns from its own position on (half the width on
average), and its columns handed to the later rows as candidates. Each row then gets its top-k from two
pieces (its own half-width row and the candidates other blocks gave it) instead of one full-width top-k.
This times, in one process, the product and ``topk_stable`` of one block of queries at full width and at half
width, and the top-k of one square tile (the column side of a symmetric scheme), per query row; ratios are
to the full-width block.

    .venv/bin/python benchmarks/topk_width.py [--n 60502] [--k 1000] [--repeats 5]

Prints a table and writes benchmarks/results/topk_width.json.
"""

# ruff: noqa: I001  (deepmetric is imported before numpy on purpose)
from __future__ import annotations

import argparse
from pathlib import Path

import deepmetric  # noqa: F401  (sets OPENBLAS_THREAD_TIMEOUT before numpy loads OpenBLAS)
import torch
from _results import environment, per_row_ms, write_result

from deepmetric.evaluation.knn import block_rows_for, similarities
from deepmetric.evaluation.topk import topk_stable


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=60502)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--k", type=int, default=1000)
    parser.add_argument("--tile", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "topk_width.json"))
    args = parser.parse_args()

    torch.manual_seed(0)
    x = torch.nn.functional.normalize(torch.randn(args.n, args.dim), dim=1)
    rows = block_rows_for(args.n)
    query, half = x[:rows], args.n // 2
    full_sims = similarities(query, x, "numpy")
    half_sims = full_sims[:, :half].contiguous()
    tile = similarities(x[:args.tile], x[:args.tile], "numpy")
    ms = {
        "product, full width": per_row_ms(lambda: similarities(query, x, "numpy"), rows, args.repeats),
        "product, half width": per_row_ms(lambda: similarities(query, x[:half], "numpy"), rows, args.repeats),
        "top-k, full width": per_row_ms(lambda: topk_stable(full_sims, args.k), rows, args.repeats),
        "top-k, half width": per_row_ms(lambda: topk_stable(half_sims, args.k), rows, args.repeats),
        f"top-k, {args.tile} x {args.tile} tile": per_row_ms(lambda: topk_stable(tile, args.k), args.tile,
                                                             args.repeats),
    }
    reference = {"product": ms["product, full width"], "top-k": ms["top-k, full width"]}
    ratios = {name: value / reference[name.split(",")[0]] for name, value in ms.items()}
    result = {"benchmark": "topk_width", "n": args.n, "dim": args.dim, "k": args.k, "block_rows": rows,
              "tile": args.tile, **environment(), "ms_per_query_row": ms, "ratio_to_full_width": ratios}
    print(f"{'cost per query row':<34}{'ms':>8}{'x full width':>14}")
    for name, value in ms.items():
        print(f"{name:<34}{value:>8.3f}{ratios[name]:>14.2f}")
    write_result(args.out, result)


if __name__ == "__main__":
    main()
