"""Evaluation at SOP scale: our metrics (torch and faiss engines) vs pytorch-metric-learning vs bare matmul.

One random clustered set shaped like Stanford Online Products' test split (60,502 embeddings of 512
dimensions in 11,316 classes of 2 to 12 images) is built from a seed; each phase runs in its own child
process (so that its peak resident memory is its own) on that same set, one after the other:

- ``matmul``: the bare similarity products, block by block, with nothing kept: the hardware bound;
- ``knn-torch`` / ``knn-faiss``: our exact kNN (k = 1000, self removed, stable ties) alone;
- ``kmeans``: NMI alone (faiss k-means, 11,316 clusters, 20 iterations, as PML runs it): work that ours and
  PML share, about 3.7 times the multiply-adds of the full similarity matrix;
- ``ours-torch`` / ``ours-faiss``: Recall@{1,10,100,1000}, MAP@R and R-precision (+ NMI with ``--nmi``);
- ``pml``: pytorch-metric-learning's ``AccuracyCalculator`` with precision_at_1 (= Recall@1), MAP@R and
  R-precision (+ NMI), its defaults otherwise (faiss kNN).

    .venv/bin/python benchmarks/eval_speed.py [--n 60502] [--classes 11316] [--dim 512] [--noise 2.2] [--nmi]

Prints a table and writes benchmarks/results/eval_speed.json (times in seconds, ratios to matmul and to PML,
peak RSS in MB).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

PHASES = ("matmul", "knn-torch", "knn-faiss", "kmeans", "ours-torch", "ours-faiss", "pml")


def clustered_set(n: int, classes: int, dim: int, noise: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Class sizes 2..12 (mean n / classes), Gaussian class centres, images scattered around them with ``noise``
    times the centres' scale (the expected cosine of two images of a class is about 1 / (1 + noise^2))."""
    rng = np.random.default_rng(seed)
    sizes = np.full(classes, 2)
    extra = rng.multinomial(n - 2 * classes, np.ones(classes) / classes)
    sizes = np.minimum(sizes + extra, 12)
    while sizes.sum() < n:  # top up classes below the cap until the count is exact
        room = np.flatnonzero(sizes < 12)
        sizes[rng.choice(room, min(len(room), n - sizes.sum()), replace=False)] += 1
    labels = np.repeat(np.arange(classes), sizes)
    centres = rng.normal(size=(classes, dim)).astype(np.float32)
    x = centres[labels] + noise * rng.normal(size=(n, dim)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x, labels


def run_phase(phase: str, n: int, classes: int, dim: int, noise: float, nmi: bool) -> dict:
    import torch

    x, y = clustered_set(n, classes, dim, noise)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    start = time.perf_counter()
    result: dict = {}
    if phase == "matmul":
        from deepmetric.evaluation.knn import block_rows_for

        block = block_rows_for(n)
        checksum = 0.0
        for s in range(0, n, block):
            checksum += float((xt[s:s + block] @ xt.t())[:, 0].sum())
    elif phase.startswith("knn-"):
        from deepmetric.evaluation.knn import iter_knn

        for _ in iter_knn(xt, xt, 1000, torch.arange(n), engine=phase.split("-")[1]):
            pass
    elif phase == "kmeans":
        from deepmetric.evaluation.metrics import nmi_score

        result = {"nmi": nmi_score(x, y)}
    elif phase.startswith("ours-"):
        from deepmetric.evaluation import retrieval_metrics

        result = retrieval_metrics(x, y, recall_at=(1, 10, 100, 1000), nmi=nmi, engine=phase.split("-")[1])
    elif phase == "pml":
        from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

        include = ("precision_at_1", "mean_average_precision_at_r", "r_precision") + (("NMI",) if nmi else ())
        pml = AccuracyCalculator(include=include, k="max_bin_count")
        result = {k: float(v) for k, v in pml.get_accuracy(xt, yt).items()}
    seconds = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"phase": phase, "seconds": seconds, "peak_rss_mb": peak_mb, "metrics": result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=60502)
    parser.add_argument("--classes", type=int, default=11316)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--noise", type=float, default=2.2,
                        help="scatter around the class centres (2.2: Recall@1 0.78, MAP@R 0.43, far from saturation)")
    parser.add_argument("--nmi", action="store_true", help="include NMI (faiss k-means) in ours and PML")
    parser.add_argument("--phase", choices=PHASES, help=argparse.SUPPRESS)
    parser.add_argument("--phases", default=",".join(PHASES))
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "eval_speed.json"))
    args = parser.parse_args()
    if args.phase:
        print(json.dumps(run_phase(args.phase, args.n, args.classes, args.dim, args.noise, args.nmi)))
        return
    rows = {}
    for phase in args.phases.split(","):
        command = [sys.executable, __file__, "--phase", phase, "--n", str(args.n), "--classes", str(args.classes),
                   "--dim", str(args.dim), "--noise", str(args.noise)] + (["--nmi"] if args.nmi else [])
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        rows[phase] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{phase:<12}{rows[phase]['seconds']:>10.1f} s {rows[phase]['peak_rss_mb']:>10.0f} MB", flush=True)
    base = rows.get("matmul", {}).get("seconds")
    pml = rows.get("pml", {}).get("seconds")
    print(f"\n{'phase':<12}{'seconds':>10}{'x matmul':>10}{'PML / this':>12}{'peak MB':>10}")
    for phase, row in rows.items():
        row["ratio_to_matmul"] = row["seconds"] / base if base else None
        row["pml_over_this"] = pml / row["seconds"] if pml else None
        ratio = f"{row['ratio_to_matmul']:.2f}" if base else "-"
        speedup = f"{row['pml_over_this']:.2f}" if pml else "-"
        print(f"{phase:<12}{row['seconds']:>10.1f}{ratio:>10}{speedup:>12}{row['peak_rss_mb']:>10.0f}")
    for phase, row in rows.items():
        if row["metrics"]:
            print(f"{phase:<12}" + "  ".join(f"{key} {value:.5f}" for key, value in row["metrics"].items()))
    from _results import environment, write_result

    write_result(args.out, {"benchmark": "eval_speed", "n": args.n, "classes": args.classes, "dim": args.dim,
                            "noise": args.noise, "nmi": args.nmi, **environment(), "phases": rows})


if __name__ == "__main__":
    main()
