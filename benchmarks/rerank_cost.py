"""Re-ranking's cost against the number of items: time and peak memory of k-reciprocal re-ranking, αQE and DBA + αQE,
as ratios to the plain exact evaluation of the same embeddings in the same process.

For each size N, a random clustered set shaped like SOP's test split (``eval_speed.clustered_set``: 512 dimensions,
classes of 2 to 12 images, N / 5.35 classes, scatter 2.2) is scored as one set (every item a query against the
others), in a child process per (N, method) so that each peak resident memory is its own: first the plain
evaluation (Recall@1/10/100, MAP@R, R-precision; no NMI, which re-ranking does not change), then the same with
``--rerank METHOD`` at its defaults. With ``--search``, also a search: 8 queries (held out of the set) each
re-ranked alone against a gallery of N items (``reranked_search``, what ``deepmetric search --rerank`` runs), as a
ratio to the plain exact search of the same queries.

    .venv/bin/python benchmarks/rerank_cost.py [--sizes 1000,2000,5000,10000,20000] [--methods k-reciprocal,qe,dba+qe]
        [--search]

Prints a table and writes benchmarks/results/rerank_cost.json (seconds, ratios, peak RSS in MB).
"""

# ruff: noqa: I001  (deepmetric is imported before numpy on purpose)
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import deepmetric  # noqa: F401  (before numpy, as in the CLI: deepmetric sets OpenBLAS idle-thread timeout)

RECALL_AT = (1, 10, 100)


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_phase(n: int, method: str, search: bool) -> dict:
    """Plain, then re-ranked, in this process (imports and the data set made before the clocks start)."""
    import torch
    from eval_speed import clustered_set

    from deepmetric.evaluation import retrieval_metrics
    from deepmetric.evaluation.knn import knn
    from deepmetric.evaluation.rerank import rerank_settings, reranked_search

    x, y = clustered_set(n + 8 if search else n, max(2, round(n / 5.35)), 512, 2.2)
    settings = rerank_settings(method, max_items=10**9)
    started = peak_mb()
    if search:  # 8 queries each alone against a gallery of n
        queries, gallery = torch.from_numpy(x[-8:]), torch.from_numpy(x[:-8])
        start = time.perf_counter()
        knn(queries, gallery, 10)
        plain = time.perf_counter() - start
        plain_peak = peak_mb()
        start = time.perf_counter()
        reranked_search(queries, gallery, 10, settings)
        reranked = time.perf_counter() - start
        return {"n": n, "method": method, "kind": "search", "queries": 8, "plain_s": plain, "reranked_s": reranked,
                "ratio": reranked / plain, "start_mb": started, "plain_peak_mb": plain_peak,
                "reranked_peak_mb": peak_mb()}
    start = time.perf_counter()
    plain_metrics = retrieval_metrics(x, y, recall_at=RECALL_AT, nmi=False)
    plain = time.perf_counter() - start
    plain_peak = peak_mb()
    start = time.perf_counter()
    metrics = retrieval_metrics(x, y, recall_at=RECALL_AT, nmi=False, rerank=settings)
    reranked = time.perf_counter() - start
    return {"n": n, "method": method, "kind": "evaluation", "plain_s": plain, "reranked_s": reranked,
            "ratio": reranked / plain, "start_mb": started, "plain_peak_mb": plain_peak,
            "reranked_peak_mb": peak_mb(), "plain_metrics": plain_metrics, "metrics": metrics}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,2000,5000,10000,20000")
    parser.add_argument("--methods", default="k-reciprocal,qe,dba+qe")
    parser.add_argument("--search", action="store_true", help="also time re-ranked searches against N items")
    parser.add_argument("--phase", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "rerank_cost.json"))
    args = parser.parse_args()
    if args.phase:
        n, method, kind = args.phase.split(":")
        print(json.dumps(run_phase(int(n), method, kind == "search")))
        return
    rows = []
    kinds = ["evaluation"] + (["search"] if args.search else [])
    print(f"{'kind':<11}{'N':>7}  {'method':<13}{'plain s':>9}{'re-ranked s':>13}{'ratio':>8}{'plain MB':>10}"
          f"{'re-ranked MB':>14}", flush=True)
    for kind in kinds:
        for n in (int(v) for v in args.sizes.split(",")):
            for method in args.methods.split(","):
                command = [sys.executable, __file__, "--phase", f"{n}:{method}:{kind}"]
                done = subprocess.run(command, capture_output=True, text=True, check=True)
                row = json.loads(done.stdout.strip().splitlines()[-1])
                rows.append(row)
                print(f"{kind:<11}{n:>7}  {method:<13}{row['plain_s']:>9.2f}{row['reranked_s']:>13.2f}"
                      f"{row['ratio']:>8.1f}{row['plain_peak_mb']:>10.0f}{row['reranked_peak_mb']:>14.0f}", flush=True)
    from _results import environment, write_result

    write_result(args.out, {"benchmark": "rerank_cost", "recall_at": list(RECALL_AT), "dim": 512, "noise": 2.2,
                            **environment(), "rows": rows})


if __name__ == "__main__":
    main()
