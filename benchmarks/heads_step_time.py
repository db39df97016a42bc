"""Forward+backward time per image of the GAP baseline, DIABLO and ABE-8, beside their FLOP ratios.

All models share the backbone, input size and batch; their steps are interleaved in one process and the
median over repeats is taken, so the time ratios to the baseline are comparable within the run. FLOPs
of one forward pass are counted with ``torch.utils.flop_counter`` (convolutions, matrix products and
einsums; element-wise work is not counted) and reported as multiply-adds, the unit of ABE Table 1
(1-head 1.58 G, ABE-8 7.46 G: ratio 4.72).

    .venv/bin/python benchmarks/heads_step_time.py [--backbone googlenet] [--size 224] [--batch 8] [--repeats 3]

Prints a table and writes benchmarks/results/heads_step_time.json.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from _results import environment, write_result
from torch.utils.flop_counter import FlopCounterMode

from deepmetric import create_model

MODELS = {
    "gap (1-head)": {"head": "gap"},
    "diablo N=8 pre dimension-wise": {"head": "diablo", "num_entries": 8, "strategy": "pre", "selection": "dimension"},
    "abe-8": {"head": "abe", "num_learners": 8},
}
PAPER_GMACS = {"gap (1-head)": 1.58, "abe-8": 7.46}


def forward_macs(model: torch.nn.Module, images: torch.Tensor) -> float:
    """Multiply-adds of one forward pass per image."""
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(images)
    return counter.get_total_flops() / 2 / images.shape[0]


def step_seconds(model: torch.nn.Module, images: torch.Tensor) -> float:
    start = time.perf_counter()
    out = model(images)
    (out.embedding.sum() + sum(p.sum() for p in out.parts)).backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backbone", default="googlenet")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "heads_step_time.json"))
    args = parser.parse_args()

    torch.manual_seed(0)
    images = torch.rand(args.batch, 3, args.size, args.size)
    models = {}
    for name, options in MODELS.items():
        model = create_model(args.backbone, pretrained=False, **options).set_channels_last(True)
        models[name] = model.train()
    macs = {name: forward_macs(model, images[:1]) for name, model in models.items()}
    times: dict[str, list[float]] = {name: [] for name in models}
    for repeat in range(args.repeats + 1):  # the first round warms up
        for name, model in models.items():
            elapsed = step_seconds(model, images)
            if repeat:
                times[name].append(elapsed / args.batch)
    per_image = {name: statistics.median(values) for name, values in times.items()}
    base = "gap (1-head)"
    rows = []
    for name in models:
        time_ratio, flop_ratio = per_image[name] / per_image[base], macs[name] / macs[base]
        rows.append({"model": name, "gmacs_forward": macs[name] / 1e9, "seconds_per_image": per_image[name],
                     "time_ratio": time_ratio, "flop_ratio": flop_ratio,
                     "time_over_flop_ratio": time_ratio / flop_ratio,
                     "paper_gmacs": PAPER_GMACS.get(name)})
    print(f"{'model':<32}{'GMACs':>8}{'paper':>8}{'s/image':>10}{'time x':>9}{'FLOP x':>9}{'time/FLOP':>11}")
    for row in rows:
        paper = f"{row['paper_gmacs']:.2f}" if row["paper_gmacs"] else "-"
        print(f"{row['model']:<32}{row['gmacs_forward']:>8.2f}{paper:>8}{row['seconds_per_image']:>10.3f}"
              f"{row['time_ratio']:>9.2f}{row['flop_ratio']:>9.2f}{row['time_over_flop_ratio']:>11.2f}")
    result = {"benchmark": "heads_step_time", "backbone": args.backbone, "image_size": args.size,
              "batch": args.batch, "repeats": args.repeats, **environment(), "rows": rows}
    write_result(args.out, result)


if __name__ == "__main__":
    main()
