"""Evaluation at SOP scale: our metrics (torch, numpy and faiss engines) vs pytorch-metric-learning vs bare products.

One random clustered set shaped like Stanford Online Products' test split (60,502 embeddings of 512
dimensions in 11,316 classes of 2 to 12 images) is built from a seed; each phase runs in its own child
process (so that its peak resident memory is its own) on that same set, one after the other:

- ``matmul-torch`` / ``matmul-numpy``: the bare similarity products by torch's or numpy's BLAS, block by block,
  with nothing kept: the hardware bound (the faster of the two);
- ``knn-torch`` / ``knn-numpy`` / ``knn-faiss``: our exact kNN (k = 1000, self removed, stable ties) alone;
- ``kmeans``: NMI alone (faiss k-means, 11,316 clusters, 20 iterations, as PML runs it): work that ours and
  PML share, about 3.7 times the multiply-adds of the full similarity matrix;
- ``kmeans-torch``: NMI alone by faiss' k-means written in torch (``deepmetric.evaluation.kmeans``), on the CPU:
  not faster there, run to check the copy at scale: after the clock, faiss' own k-means runs on the same set, and
  the phase reports both NMIs and the fraction of points given the same cluster (both start from the same points,
  so cluster i is the same cluster in both);
- ``ours-torch`` / ``ours-numpy`` / ``ours-faiss``: Recall@{1,10,100,1000}, MAP@R and R-precision (+ NMI with
  ``--nmi``);
- ``pml``: pytorch-metric-learning's ``AccuracyCalculator`` with precision_at_1 (= Recall@1), MAP@R and
  R-precision (+ NMI), its defaults otherwise (faiss kNN, k = the largest class: 12 neighbours besides the
  query itself): it cannot give Recall@10, @100 or @1000;
- ``pml-k1000``: the same with ours' metrics: k = 1000 and Recall@10, @100, @1000 added the way PML's
  documentation adds an accuracy (``calculate_<name>`` methods that read ``knn_labels``);
- with ``--cuda`` (a GPU machine): ``matmul-cuda``, ``knn-cuda``, ``kmeans-cuda`` and ``ours-cuda``, the bare
  products, our kNN, NMI alone (checked against faiss' as ``kmeans-torch`` is) and our metrics on the GPU (full
  float32; the embeddings start on the CPU and the copy is timed; the CUDA context and cuBLAS are started before
  the clock).

    .venv/bin/python benchmarks/eval_speed.py [--n 60502] [--classes 11316] [--dim 512] [--noise 2.2] [--nmi] [--cuda]
        [--phases knn-torch,...] [--rounds 1]

Prints a table and writes benchmarks/results/eval_speed.json (times in seconds, ratios to the faster bare
products and to PML, peak RSS in MB). With ``--rounds R`` the phases run R times in turn, round r starting r places
further along their list; each phase's figure is its median over the rounds, and beside it ("by round") the median
over the rounds of its ratio to the faster bare products of the same round, a pairing that drift over the run
(seen on a machine whose speed moved by a fifth within minutes) does not move.
"""

# ruff: noqa: I001  (deepmetric is imported before numpy on purpose)
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import deepmetric  # noqa: F401  (before numpy, as in the CLI: deepmetric sets OpenBLAS idle-thread timeout)
import numpy as np
from _results import environment, rotated, write_result

PHASES = ("matmul-torch", "matmul-numpy", "knn-torch", "knn-numpy", "knn-faiss", "kmeans", "ours-torch",
          "ours-numpy", "ours-faiss", "pml", "pml-k1000")
CHECK_PHASES = ("kmeans-torch",)  # not among the defaults (minutes on a CPU); --phases kmeans,kmeans-torch
CUDA_PHASES = ("matmul-cuda", "knn-cuda", "kmeans-cuda", "ours-cuda")


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


RECALL_AT = (1, 10, 100, 1000)


def bare_products(x, block: int, engine: str = "torch", device: str = "cpu", sync_each: bool = True) -> None:
    """The similarity products of ``x`` with itself, block by block, with nothing kept (the hardware bound of the
    kNN): by numpy's BLAS for ``engine="numpy"``, else by torch's on ``device``, in full float32, on the CPU into one
    block's memory reused (``similarity_blocks``, the kNN's loop, since 2026-12-02); ``sync_each``
    reads a value of each block, which waits for a GPU's block as the kNN's loop does."""
    import torch

    from deepmetric.evaluation.knn import similarity_blocks

    on = x.to(device)
    for _, sims in similarity_blocks(on, on, block, engine):
        if sync_each:
            float(sims[:, 0].sum())
    if not sync_each and on.device.type == "cuda":
        torch.cuda.synchronize(on.device)


def pml_with_recall_at(ranks: tuple[int, ...]):
    """PML's AccuracyCalculator with ``recall_at_<K>`` accuracies (a query counts when one of its first K
    neighbours shares its label), added as PML documents custom accuracies."""
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator, try_getting_not_lone_labels

    def recall_at(rank: int):
        def calculate(self, knn_labels, query_labels, not_lone_query_mask, **kwargs):
            knn_labels, query_labels = try_getting_not_lone_labels(knn_labels, query_labels, not_lone_query_mask)
            return float((knn_labels[:, :rank] == query_labels[:, None]).any(dim=1).float().mean())
        return calculate

    methods = {f"calculate_recall_at_{rank}": recall_at(rank) for rank in ranks}
    methods["requires_knn"] = lambda self: AccuracyCalculator.requires_knn(self) + [f"recall_at_{r}" for r in ranks]
    return type("AccuracyCalculatorWithRecall", (AccuracyCalculator,), methods)


def run_phase(phase: str, n: int, classes: int, dim: int, noise: float, nmi: bool) -> dict:
    """Time one phase (imports and the data set are made before the clock starts)."""
    import torch
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

    from deepmetric.evaluation import retrieval_metrics
    from deepmetric.evaluation.knn import block_rows_for, iter_knn
    from deepmetric.evaluation.metrics import kmeans_labels
    from sklearn.metrics import normalized_mutual_info_score

    x, y = clustered_set(n, classes, dim, noise)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    kind, _, engine = phase.partition("-")
    if engine == "cuda":  # the CUDA context and cuBLAS start before the clock, as a served or training process has
        warm = torch.ones(64, 64, device="cuda")
        float((warm @ warm).sum())
    start = time.perf_counter()
    result: dict = {}
    if kind == "matmul":
        bare_products(xt, block_rows_for(n), engine, "cuda" if engine == "cuda" else "cpu")
    elif kind == "knn":
        for _ in iter_knn(xt, xt, max(RECALL_AT), torch.arange(n), engine=engine):
            pass
    elif kind == "kmeans":  # faiss; -torch: faiss' rule in torch on the CPU; -cuda: the same on the GPU
        device = {"": None, "torch": torch.device("cpu"), "cuda": torch.device("cuda")}[engine]
        found = kmeans_labels(x, len(np.unique(y)), device=device)
        result = {"nmi": normalized_mutual_info_score(y, found)}
    elif kind == "ours":
        result = retrieval_metrics(x, y, recall_at=RECALL_AT, nmi=nmi, engine=engine)
    elif kind == "pml":
        include = ("precision_at_1", "mean_average_precision_at_r", "r_precision") + (("NMI",) if nmi else ())
        if phase == "pml":
            pml = AccuracyCalculator(include=include, k="max_bin_count")
        else:
            include += tuple(f"recall_at_{k}" for k in RECALL_AT[1:])
            pml = pml_with_recall_at(RECALL_AT[1:])(include=include, k=max(RECALL_AT))
        result = {k: float(v) for k, v in pml.get_accuracy(xt, yt).items()}
    seconds = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if kind == "kmeans" and engine:  # after the clock: the torch copy against faiss' own on the same set
        by_faiss = kmeans_labels(x, len(np.unique(y)))
        result.update({"nmi_faiss": normalized_mutual_info_score(y, by_faiss),
                       "same_cluster": float((found == by_faiss).mean())})
    return {"phase": phase, "seconds": seconds, "peak_rss_mb": peak_mb, "metrics": result}


def summary(measured: list[dict]) -> dict:
    """A phase's row over its rounds: the median seconds, each round's seconds, the highest peak RSS, its metrics
    (the same set every round)."""
    return {"phase": measured[0]["phase"], "seconds": statistics.median(m["seconds"] for m in measured),
            "round_seconds": [m["seconds"] for m in measured],
            "peak_rss_mb": max(m["peak_rss_mb"] for m in measured), "metrics": measured[-1]["metrics"]}


def add_ratios(rows: dict[str, dict], rounds: int) -> None:
    """Each row's ratios: to the faster bare products (the CPU's, or the GPU's for a GPU phase) by the medians, and
    the median over the rounds of its ratio to the faster bare products of the same round (a pairing that drift over
    the run does not move); and PML's time over its own."""
    def bound(cuda: bool, turn: int | None) -> float | None:
        bare = [row["seconds"] if turn is None else row["round_seconds"][turn] for phase, row in rows.items()
                if phase.startswith("matmul-") and (phase in CUDA_PHASES) == cuda]
        return min(bare) if bare else None

    pml = rows.get("pml", {}).get("seconds")
    for phase, row in rows.items():
        cuda = phase in CUDA_PHASES
        base, by_round = bound(cuda, None), [bound(cuda, turn) for turn in range(rounds)]
        row["ratio_to_bare_products"] = row["seconds"] / base if base else None
        paired = [seconds / b for seconds, b in zip(row["round_seconds"], by_round, strict=True) if b]
        row["round_ratios"] = paired
        row["median_round_ratio"] = statistics.median(paired) if paired else None
        row["pml_over_this"] = pml / row["seconds"] if pml else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=60502)
    parser.add_argument("--classes", type=int, default=11316)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--noise", type=float, default=2.2,
                        help="scatter around the class centres (2.2: Recall@1 0.78, MAP@R 0.43, far from saturation)")
    parser.add_argument("--nmi", action="store_true", help="include NMI (faiss k-means) in ours and PML")
    parser.add_argument("--cuda", action="store_true", help="add the GPU phases (" + ", ".join(CUDA_PHASES) + ")")
    parser.add_argument("--phase", choices=PHASES + CHECK_PHASES + CUDA_PHASES, help=argparse.SUPPRESS)
    parser.add_argument("--phases", default=",".join(PHASES))
    parser.add_argument("--rounds", type=int, default=1,
                        help="run the phases this many times in turn, round r starting r places further along")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "eval_speed.json"))
    args = parser.parse_args()
    if args.phase:
        print(json.dumps(run_phase(args.phase, args.n, args.classes, args.dim, args.noise, args.nmi)))
        return
    phases = args.phases.split(",") + (list(CUDA_PHASES) if args.cuda else [])
    runs: dict[str, list[dict]] = {phase: [] for phase in phases}
    for turn in range(args.rounds):
        for phase in rotated(phases, turn):
            command = [sys.executable, __file__, "--phase", phase, "--n", str(args.n), "--classes", str(args.classes),
                       "--dim", str(args.dim), "--noise", str(args.noise)] + (["--nmi"] if args.nmi else [])
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            measured = json.loads(done.stdout.strip().splitlines()[-1])
            runs[phase].append(measured)
            print(("" if args.rounds == 1 else f"round {turn + 1}  ")
                  + f"{phase:<12}{measured['seconds']:>10.1f} s {measured['peak_rss_mb']:>10.0f} MB", flush=True)
    rows = {phase: summary(measured) for phase, measured in runs.items()}
    add_ratios(rows, args.rounds)
    by_round = args.rounds > 1
    print(f"\n{'phase':<12}{'seconds':>10}{'x bare':>10}" + (f"{'by round':>10}" if by_round else "")
          + f"{'PML / this':>12}{'peak MB':>10}"
          + ("  (GPU phases: x the GPU's bare products)" if any(p in CUDA_PHASES for p in rows) else ""))
    for phase, row in rows.items():
        ratio = "-" if row["ratio_to_bare_products"] is None else f"{row['ratio_to_bare_products']:.2f}"
        paired = "-" if row["median_round_ratio"] is None else f"{row['median_round_ratio']:.2f}"
        speedup = "-" if row["pml_over_this"] is None else f"{row['pml_over_this']:.2f}"
        print(f"{phase:<12}{row['seconds']:>10.1f}{ratio:>10}" + (f"{paired:>10}" if by_round else "")
              + f"{speedup:>12}{row['peak_rss_mb']:>10.0f}")
    for phase, row in rows.items():
        if row["metrics"]:
            print(f"{phase:<14}" + "  ".join(f"{key} {value:.5f}" for key, value in row["metrics"].items()))
    from deepmetric.evaluation.knn import resolve_engine

    write_result(args.out, {"benchmark": "eval_speed", "n": args.n, "classes": args.classes, "dim": args.dim,
                            "noise": args.noise, "nmi": args.nmi, "rounds": args.rounds,
                            "auto_engine": resolve_engine("auto"), **environment("cuda" if args.cuda else "cpu"),
                            "phases": rows})


if __name__ == "__main__":
    main()
