"""The kNN's selection on a CPU: one block of SOP-shaped similarities, its top-k by torch's grouped selection and by
the host one (numpy's SIMD selections, ``deepmetric.evaluation.topk``), each as a ratio to the block's product.

The set is ``eval_speed.py``'s (60,502 clustered embeddings of 512 dimensions); the block is the CPU engines' (rows
for 256 MB of similarities), its product by numpy's BLAS (the ``numpy`` engine's). Rows, all in one process:

- ``product``: the block's similarities, the reference;
- ``grouped, torch`` / ``grouped, host``: ``grouped_topk`` and ``grouped_topk_on_host`` alone;
- ``topk_stable, torch`` / ``topk_stable, host``: the whole selection the engines run (unsure rows redone, ties
  ordered by index), with the host path switched off or on.

The two selections' neighbours are checked equal. ``numpy_selects_fast`` says which one ``topk_stable`` takes here.

    .venv/bin/python benchmarks/topk_selection.py [--n 60502] [--k 1000] [--repeats 7]

Prints a table and writes benchmarks/results/topk_selection.json.
"""

# ruff: noqa: I001  (deepmetric is imported before numpy on purpose)
from __future__ import annotations

import argparse
from pathlib import Path

import deepmetric  # noqa: F401  (sets OPENBLAS_THREAD_TIMEOUT before numpy loads OpenBLAS)
import numpy as np
import torch
from _results import environment, per_row_ms, write_result
from eval_speed import clustered_set

from deepmetric.evaluation import topk
from deepmetric.evaluation.knn import block_rows_for, similarities


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=60502)
    parser.add_argument("--classes", type=int, default=11316)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--k", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "topk_selection.json"))
    args = parser.parse_args()

    x = torch.from_numpy(np.ascontiguousarray(clustered_set(args.n, args.classes, args.dim, 2.2)[0], np.float32))
    rows = block_rows_for(args.n)
    query = x[:rows]
    sims = similarities(query, x, "numpy")
    sims[torch.arange(rows), torch.arange(rows)] = float("-inf")  # each query's own row, as the engines mask it

    def stable(on_host: bool):
        def run():
            chosen, topk.numpy_selects_fast = topk.numpy_selects_fast, lambda: on_host
            try:
                return topk.topk_stable(sims, args.k)
            finally:
                topk.numpy_selects_fast = chosen
        return run

    assert all(torch.equal(a, b) for a, b in zip(stable(True)(), stable(False)(), strict=True)), "selections differ"
    ms = {
        "product": per_row_ms(lambda: similarities(query, x, "numpy"), rows, args.repeats),
        "grouped, torch": per_row_ms(lambda: topk.grouped_topk(sims, args.k), rows, args.repeats),
        "grouped, host": per_row_ms(lambda: topk.grouped_topk_on_host(sims, args.k), rows, args.repeats),
        "topk_stable, torch": per_row_ms(stable(False), rows, args.repeats),
        "topk_stable, host": per_row_ms(stable(True), rows, args.repeats),
    }
    ratios = {name: value / ms["product"] for name, value in ms.items()}
    result = {"benchmark": "topk_selection", "n": args.n, "dim": args.dim, "k": args.k, "block_rows": rows,
              "numpy": np.__version__, "numpy_selects_fast": topk.numpy_selects_fast(), **environment(),
              "ms_per_query_row": ms, "ratio_to_product": ratios}
    print(f"{rows} rows of {args.n}, k = {args.k}; numpy {np.__version__}, "
          f"host selection {'taken' if topk.numpy_selects_fast() else 'not taken'} here")
    print(f"{'cost per query row':<22}{'ms':>8}{'x product':>11}")
    for name, value in ms.items():
        print(f"{name:<22}{value:>8.3f}{ratios[name]:>11.3f}")
    write_result(args.out, result)


if __name__ == "__main__":
    main()
