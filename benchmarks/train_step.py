"""Training-step time of the default model by memory layout (channels-last NHWC vs contiguous NCHW) and
precision (float32 vs ``train.amp``: forward under bfloat16 autocast, as the trainer runs it).

The four set-ups run in the same process on the same batch, interleaved, and the ratios of their median
times to contiguous float32 are reported (machines here are noisy; only ratios within one run are compared).

    .venv/bin/python benchmarks/train_step.py [--backbone lite0] [--size 64] [--batch 64] [--repeats 8]

Prints a table and writes benchmarks/results/train_step.json.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from _results import environment, write_result

from deepmetric import create_model
from deepmetric.hardware import cpu_info
from deepmetric.losses import BinomialDevianceLoss

SETUPS = {  # name: (channels_last, amp)
    "contiguous fp32": (False, False),
    "channels-last fp32": (True, False),
    "contiguous bf16": (False, True),
    "channels-last bf16": (True, True),
}


def step_time(model, images, labels, loss_fn, optimizer, amp: bool) -> float:
    """One step as the trainer takes it: the forward pass under autocast when ``amp``, the loss outside."""
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        embedding = model(images).embedding
    loss = loss_fn(embedding, labels)
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
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "train_step.json"))
    args = parser.parse_args()

    torch.manual_seed(0)
    images = torch.rand(args.batch, 3, args.size, args.size)
    labels = torch.arange(args.batch // 8).repeat_interleave(8)[: args.batch]
    loss_fn = BinomialDevianceLoss()
    models = {}
    for name, (channels_last, _) in SETUPS.items():
        torch.manual_seed(0)
        model = create_model(args.backbone, pretrained=args.backbone == "lite0")
        model.set_channels_last(channels_last)
        models[name] = (model, torch.optim.Adam(model.parameters(), 1e-5))
    times: dict[str, list[float]] = {name: [] for name in SETUPS}
    for repeat in range(args.repeats + 2):  # two warm-up rounds, set-ups interleaved
        for name, (model, optimizer) in models.items():
            elapsed = step_time(model, images, labels, loss_fn, optimizer, amp=SETUPS[name][1])
            if repeat >= 2:
                times[name].append(elapsed)
    median = {name: statistics.median(values) for name, values in times.items()}
    reference = median["contiguous fp32"]
    flags = cpu_info("flags").split()
    result = {
        "benchmark": "train_step", "backbone": args.backbone, "image_size": args.size, "batch": args.batch,
        "repeats": args.repeats, **environment(),
        "cpu_bf16_instructions": [f for f in ("avx512_bf16", "amx_bf16") if f in flags],
        "median_seconds": median,
        "images_per_second": {name: args.batch / m for name, m in median.items()},
        "speedup_over_contiguous_fp32": {name: reference / m for name, m in median.items()},
    }
    print(f"{'set-up':<20}{'median s/step':>15}{'images/s':>12}{'speed-up':>10}")
    for name, m in median.items():
        print(f"{name:<20}{m:>15.3f}{args.batch / m:>12.1f}{reference / m:>9.2f}x")
    write_result(args.out, result)


if __name__ == "__main__":
    main()
