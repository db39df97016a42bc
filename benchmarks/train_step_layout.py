"""Training-step time of the default model in channels-last (NHWC) vs contiguous (NCHW) layout.

Both layouts run in the same process on the same batch, interleaved, and the ratio of their median
times is reported (machines here are noisy; only ratios within one run are compared).

    .venv/bin/python benchmarks/train_step_layout.py [--backbone lite0] [--size 64] [--batch 64] [--repeats 8]

Prints a table and writes benchmarks/results/train_step_layout.json.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from _results import environment, write_result

from deepmetric import create_model
from deepmetric.losses import BinomialDevianceLoss


def step_time(model, images, labels, loss_fn, optimizer) -> float:
    start = time.perf_counter()
    loss = loss_fn(model(images).embedding, labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backbone", default="lite0")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "train_step_layout.json"))
    args = parser.parse_args()

    torch.manual_seed(0)
    images = torch.rand(args.batch, 3, args.size, args.size)
    labels = torch.arange(args.batch // 8).repeat_interleave(8)[: args.batch]
    loss_fn = BinomialDevianceLoss()
    setups = {}
    for layout in ("contiguous", "channels_last"):
        torch.manual_seed(0)
        model = create_model(args.backbone, pretrained=args.backbone == "lite0")
        model.set_channels_last(layout == "channels_last")
        setups[layout] = (model, torch.optim.Adam(model.parameters(), 1e-5))
    times = {layout: [] for layout in setups}
    for repeat in range(args.repeats + 2):  # two warm-up rounds, interleaved layouts
        for layout, (model, optimizer) in setups.items():
            elapsed = step_time(model, images, labels, loss_fn, optimizer)
            if repeat >= 2:
                times[layout].append(elapsed)
    median = {layout: statistics.median(values) for layout, values in times.items()}
    result = {
        "benchmark": "train_step_layout", "backbone": args.backbone, "image_size": args.size, "batch": args.batch,
        "repeats": args.repeats, **environment(),
        "median_seconds": median,
        "images_per_second": {k: args.batch / v for k, v in median.items()},
        "speedup_channels_last": median["contiguous"] / median["channels_last"],
    }
    print(f"{'layout':<15}{'median s/step':>15}{'images/s':>12}")
    for layout in times:
        print(f"{layout:<15}{median[layout]:>15.3f}{args.batch / median[layout]:>12.1f}")
    print(f"channels-last speed-up: {result['speedup_channels_last']:.2f}x")
    write_result(args.out, result)


if __name__ == "__main__":
    main()
