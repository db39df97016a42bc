"""Training-step time of the default model by memory layout (channels-last NHWC vs contiguous NCHW) and
precision (float32 vs ``train.amp``: forward under bfloat16 autocast, as the trainer runs it), on the CPU or a GPU.

The set-ups run in the same process on the same batch (already on the device), interleaved, and the ratios of
their median times to contiguous float32 are reported (machines here are noisy; only ratios within one run are
compared). On a GPU each step is timed from an idle device to the end of its queued work. ``--compile`` adds
the channels-last set-ups compiled as ``train.compile`` compiles them (``training.compiled.CompiledForward``; its
compilation happens in the warm-up rounds, and a fallback to eager is reported as a failure). ``--head`` measures
another head with its default options (``--head-options`` as JSON), to decide ``train.compile`` head by head.

    .venv/bin/python benchmarks/train_step.py [--backbone lite0] [--head gap] [--size 64] [--batch 64] \
        [--repeats 8] [--device cpu|cuda] [--compile]

Prints a table and writes benchmarks/results/train_step.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
from pathlib import Path

import torch
from _results import environment, timed, write_result

from deepmetric import create_model
from deepmetric.hardware import cpu_info
from deepmetric.losses import BinomialDevianceLoss
from deepmetric.training.compiled import CompiledForward

SETUPS = {  # name: (channels_last, amp, compiled)
    "contiguous fp32": (False, False, False),
    "channels-last fp32": (True, False, False),
    "contiguous bf16": (False, True, False),
    "channels-last bf16": (True, True, False),
}
COMPILED = {
    "channels-last fp32 compiled": (True, False, True),
    "channels-last bf16 compiled": (True, True, True),
}


def train_step(model, images, labels, loss_fn, optimizer, amp: bool) -> None:
    """One step as the trainer takes it: the forward pass under autocast when ``amp``, the loss outside."""
    with torch.autocast(images.device.type, dtype=torch.bfloat16, enabled=amp):
        embedding = model(images).embedding
    loss = loss_fn(embedding.float(), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backbone", default="lite0")
    parser.add_argument("--head", default="gap")
    parser.add_argument("--head-options", default="{}", help="the head's options as JSON, e.g. '{\"num_learners\": 8}'")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--compile", action="store_true", help="add torch.compile'd channels-last set-ups")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "train_step.json"))
    args = parser.parse_args()

    device = torch.device(args.device)
    setups = {**SETUPS, **(COMPILED if args.compile else {})}
    torch.manual_seed(0)
    images = torch.rand(args.batch, 3, args.size, args.size).to(device)
    labels = torch.arange(args.batch // 8).repeat_interleave(8)[: args.batch].to(device)
    loss_fn = BinomialDevianceLoss()
    models, failed = {}, {}
    for name, (channels_last, _, compiled) in setups.items():
        torch.manual_seed(0)
        model = create_model(args.backbone, head=args.head, pretrained=args.backbone == "lite0",
                             **json.loads(args.head_options)).to(device)
        model.set_channels_last(channels_last)
        models[name] = (CompiledForward(model) if compiled else model, torch.optim.Adam(model.parameters(), 1e-5))
    times: dict[str, list[float]] = {name: [] for name in setups}
    for repeat in range(args.repeats + 2):  # two warm-up rounds, set-ups interleaved
        for name, (model, optimizer) in list(models.items()):
            try:
                step = functools.partial(train_step, model, images, labels, loss_fn, optimizer, amp=setups[name][1])
                elapsed = timed(step, device)
                if isinstance(model, CompiledForward) and not model.active:
                    raise RuntimeError("torch.compile failed: train.compile fell back to eager (see the warning)")
            except Exception as error:  # noqa: BLE001  (torch.compile may fail on a machine: record why, go on)
                failed[name] = f"{type(error).__name__}: {str(error)[:300]}"
                del models[name], times[name]
                continue
            if repeat >= 2:
                times[name].append(elapsed)
    median = {name: statistics.median(values) for name, values in times.items()}
    reference = median["contiguous fp32"]
    flags = cpu_info("flags").split()
    result = {
        "benchmark": "train_step", "backbone": args.backbone, "head": args.head,
        "head_options": json.loads(args.head_options), "image_size": args.size, "batch": args.batch,
        "repeats": args.repeats, **environment(device), "failed": failed,
        "cpu_bf16_instructions": [f for f in ("avx512_bf16", "amx_bf16") if f in flags],
        "median_seconds": median,
        "images_per_second": {name: args.batch / m for name, m in median.items()},
        "speedup_over_contiguous_fp32": {name: reference / m for name, m in median.items()},
    }
    print(f"{'set-up':<28}{'median s/step':>15}{'images/s':>12}{'speed-up':>10}")
    for name, m in median.items():
        print(f"{name:<28}{m:>15.4f}{args.batch / m:>12.1f}{reference / m:>9.2f}x")
    for name, why in failed.items():
        print(f"{name:<28} failed: {why}")
    write_result(args.out, result)


if __name__ == "__main__":
    main()
