"""Forward+backward time per image of the GAP baseline, DIABLO, ABE-8 and DeML, beside their FLOP ratios.

All models share the backbone, input size and batch; their steps are interleaved in one process and the
median over repeats is taken, so the time ratios to the baseline are comparable within the run. On a GPU
(``--device cuda``) each step is timed from an idle device to the end of its queued work; ``--amp`` runs the
forward passes under bfloat16 autocast, as ``train.amp`` does. FLOPs
of one forward pass are counted with ``torch.utils.flop_counter`` (convolutions, matrix products and
einsums; element-wise work is not counted) and reported as multiply-adds, the unit of ABE Table 1
(1-head 1.58 G, ABE-8 7.46 G: ratio 4.72).

    .venv/bin/python benchmarks/heads_step_time.py [--backbone googlenet] [--size 224] [--batch 8] [--repeats 3] \
        [--device cpu|cuda] [--amp]

Prints a table and writes benchmarks/results/heads_step_time.json.
"""

from __future__ import annotations

import argparse
import functools
import statistics
from pathlib import Path

import torch
from _results import environment, forward_macs, timed, write_result

from deepmetric import create_model

MODELS = {
    "gap (1-head)": {"head": "gap"},
    "diablo N=8 pre dimension-wise": {"head": "diablo", "num_entries": 8, "strategy": "pre", "selection": "dimension"},
    "abe-8": {"head": "abe", "num_learners": 8},
    "deml 3 scales x 3 branches": {"head": "deml", "num_scales": 3, "num_branches": 3},
}
PAPER_GMACS = {"gap (1-head)": 1.58, "abe-8": 7.46}


def step(model: torch.nn.Module, images: torch.Tensor, amp: bool) -> None:
    with torch.autocast(images.device.type, dtype=torch.bfloat16, enabled=amp):
        out = model(images).float()
    (out.embedding.sum() + sum(p.sum() for p in out.parts)).backward()
    model.zero_grad(set_to_none=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backbone", default="googlenet")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--amp", action="store_true", help="forward passes under bfloat16 autocast")
    parser.add_argument("--only", help="comma-separated models (default: all of " + ", ".join(MODELS) + ")")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "heads_step_time.json"))
    args = parser.parse_args()

    device = torch.device(args.device)
    chosen = args.only.split(",") if args.only else list(MODELS)
    if "gap (1-head)" not in chosen:
        chosen.insert(0, "gap (1-head)")  # the baseline of every ratio
    torch.manual_seed(0)
    images = torch.rand(args.batch, 3, args.size, args.size).to(device)
    models = {}
    for name in chosen:
        model = create_model(args.backbone, pretrained=False, **MODELS[name]).set_channels_last(True)
        models[name] = model.to(device).train()
    macs = {name: forward_macs(model, images[:1]) for name, model in models.items()}
    times: dict[str, list[float]] = {name: [] for name in models}
    for repeat in range(args.repeats + 1):  # the first round warms up
        for name, model in models.items():
            elapsed = timed(functools.partial(step, model, images, args.amp), device)
            if repeat:
                times[name].append(elapsed / args.batch)
    per_image = {name: statistics.median(values) for name, values in times.items()}
    base = "gap (1-head)"
    rows = []
    for name in models:
        time_ratio, flop_ratio = per_image[name] / per_image[base], macs[name] / macs[base]
        rows.append({"model": name, "gmacs_forward": macs[name] / 1e9, "seconds_per_image": per_image[name],
                     "images_per_second": 1 / per_image[name],
                     "time_ratio": time_ratio, "flop_ratio": flop_ratio,
                     "time_over_flop_ratio": time_ratio / flop_ratio,
                     "paper_gmacs": PAPER_GMACS.get(name)})
    print(f"{'model':<32}{'GMACs':>8}{'paper':>8}{'ms/image':>10}{'images/s':>10}{'time x':>9}{'FLOP x':>9}"
          f"{'time/FLOP':>11}")
    for row in rows:
        paper = f"{row['paper_gmacs']:.2f}" if row["paper_gmacs"] else "-"
        print(f"{row['model']:<32}{row['gmacs_forward']:>8.2f}{paper:>8}{1e3 * row['seconds_per_image']:>10.3f}"
              f"{row['images_per_second']:>10.1f}"
              f"{row['time_ratio']:>9.2f}{row['flop_ratio']:>9.2f}{row['time_over_flop_ratio']:>11.2f}")
    result = {"benchmark": "heads_step_time", "backbone": args.backbone, "image_size": args.size,
              "batch": args.batch, "repeats": args.repeats, "amp": args.amp, **environment(device), "rows": rows}
    write_result(args.out, result)


if __name__ == "__main__":
    main()
