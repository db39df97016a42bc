"""Training and inference cost per image of every variant of a study, as ratios to a reference variant, measured in
one process.

Study runs are trained one after another (often by several processes at once, on a machine doing other work), so
their wall times do not compare. This script measures every variant of a study file on the same machine, in one
process, in two parts:

- Training: each variant is trained for a few steps with the real trainer (data loading, the objective, MIRAGE's
  extra steps, all of it) in rounds -- variant 1, 2, ..., then again -- after one untimed warm-up run of the
  reference variant, so every variant meets the same machine; the figure is the median images/s of the logged
  windows after each run's first (which holds the run's own warm-up). The runs go to a temporary folder;
  validation and the test evaluation are off.
- Inference: each variant's model, built from its resolved config as the trainer builds it (``build_model``; its
  weights do not change the time, so no checkpoint is read), embeds one batch of ``--batch`` images of the study's
  size (random RGB, held in memory) by the library's embedding pass (``embed_table``: the test transform, the model
  in eval mode under ``torch.no_grad``, its ``embedding`` -- ABE's concatenated learners, DeML's concatenation, the
  plain embedding of a run trained with HORDE, whose orders are training losses -- as ``TrainedRun.embed`` and
  ``deepmetric embed`` run it, minus reading image files). One untimed batch per variant warms up, then
  ``--inference-rounds`` rounds of one timed batch per variant, interleaved; the figure is the median. Beside it, the
  forward pass's multiply-adds per image (``torch.utils.flop_counter``: convolutions, matrix products, einsums;
  element-wise work is not counted), so a time ratio can be read against the FLOP ratio.

Ratios are time per image against the reference variant: ``--reference``, by default the study's first ``compare:``
variant that is measured, else the first measured variant. Threads and device are the trainer's
(``train.threads``, ``train.device``), for both parts.

    DEEPMETRIC_DATA=/tmp/dmdata .venv/bin/python benchmarks/study_train_speed.py configs/studies/emoji.yaml \
        [--steps 24] [--log-every 6] [--rounds 2] [--batch 64] [--inference-rounds 5] [--only gap,abe] \
        [--reference gap] [--training-only | --inference-only] [--out FILE] [key=value ...]

Prints a table and writes benchmarks/results/study_train_speed-<study>.json (both figures per variant and the
machine, ``environment``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _results import environment, forward_macs, timed, write_result

from deepmetric.config import RunConfig, build_config
from deepmetric.config.layers import parse_settings
from deepmetric.data.image_inputs import ImagesTable, image_items
from deepmetric.distributed import DistContext
from deepmetric.evaluation import EmbedSettings, embed_table
from deepmetric.models.modes import eval_mode
from deepmetric.studies import load_study
from deepmetric.studies.spec import StudyRun
from deepmetric.training import build_model, train
from deepmetric.training.session import set_up_process


def windows(run: Path) -> list[float]:
    """images/s of each logged training window after the first."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rates = [r["images_per_s"] for r in records if "images_per_s" in r]
    return rates[1:]


def training_rates(runs: list[StudyRun], reference: StudyRun, rounds: int) -> dict[str, list[float]]:
    """Each variant's images/s of its logged windows, over ``rounds`` interleaved rounds of short training runs."""
    rates: dict[str, list[float]] = {run.variant: [] for run in runs}
    with tempfile.TemporaryDirectory() as scratch:
        # an untimed run first: the process's first training (thread pools, allocator, the image table's cache) is
        # slower than any later one, and would otherwise be charged to the variant trained first
        train(build_config(*reference.layers), Path(scratch) / "warm-up", progress=False)
        for round_ in range(rounds):
            for run in runs:
                folder = Path(scratch) / f"{run.variant}-{round_}"
                train(build_config(*run.layers), folder, progress=False)
                measured = windows(folder)
                rates[run.variant] += measured
                print(f"training, round {round_ + 1}/{rounds}, {run.variant}: {statistics.median(measured):.1f} "
                      "images/s", flush=True)
    return rates


def embedding_pass(config: RunConfig, device: torch.device, batch: int) -> tuple[Callable[[], Any], float]:
    """One batch of the variant's embedding pass, as a call, and its forward multiply-adds per image."""
    model = build_model(config).to(device)
    size = config.data.image_size
    images = np.random.default_rng(0).integers(0, 256, (batch, size, size, 3), dtype=np.uint8)
    table = ImagesTable.of(image_items(images))
    # TrainedRun.embed's settings for one batch: the run's, the batch decoded in this process
    settings = dataclasses.replace(EmbedSettings.from_config(config, device, progress=False, batch_size=batch),
                                   num_workers=0)
    with eval_mode(model):
        macs = forward_macs(model, torch.rand(1, 3, size, size, device=device))
    return lambda: embed_table(model, table, settings), macs


def inference_times(configs: dict[str, RunConfig], device: torch.device, batch: int,
                    rounds: int) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Each variant's seconds per image of its timed batches, over ``rounds`` interleaved rounds after an untimed
    batch each, and its forward multiply-adds per image."""
    passes, macs = {}, {}
    for name, config in configs.items():
        passes[name], macs[name] = embedding_pass(config, device, batch)
    for embed in passes.values():  # warm-up
        embed()
    times: dict[str, list[float]] = {name: [] for name in passes}
    for round_ in range(rounds):
        for name, embed in passes.items():
            times[name].append(timed(embed, device) / batch)
        print(f"inference, round {round_ + 1}/{rounds}: " + ", ".join(
            f"{name} {1 / times[name][-1]:.1f}" for name in passes) + " images/s", flush=True)
    return times, macs


def cost_rows(variants: list[str], reference: str, train_rates: dict[str, list[float]] | None,
              inference_seconds: dict[str, list[float]] | None, macs: dict[str, float] | None) -> list[dict[str, Any]]:
    """Per variant, the medians of its measurements and their ratios to ``reference``'s (time per image, FLOPs)."""
    rows = []
    for name in variants:
        row: dict[str, Any] = {"variant": name, "train": None, "inference": None}
        if train_rates is not None:
            rate = statistics.median(train_rates[name])
            row["train"] = {"images_per_s": rate, "windows": len(train_rates[name]),
                            "time_ratio": statistics.median(train_rates[reference]) / rate}
        if inference_seconds is not None and macs is not None:
            seconds = statistics.median(inference_seconds[name])
            time_ratio = seconds / statistics.median(inference_seconds[reference])
            flop_ratio = macs[name] / macs[reference]
            row["inference"] = {"images_per_s": 1 / seconds, "seconds_per_image": seconds,
                                "rounds": len(inference_seconds[name]), "time_ratio": time_ratio,
                                "gmacs_forward": macs[name] / 1e9, "flop_ratio": flop_ratio,
                                "time_over_flop_ratio": time_ratio / flop_ratio}
        rows.append(row)
    return rows


def print_table(rows: list[dict[str, Any]], reference: str) -> None:
    print(f"\n| variant | training images/s | training time per image, × {reference} | inference images/s "
          f"| inference ms/image | inference time per image, × {reference} | forward GMACs/image "
          f"| forward FLOPs, × {reference} |\n|---|---|---|---|---|---|---|---|")
    for row in rows:
        t, i = row["train"], row["inference"]
        cells = [f"{t['images_per_s']:.1f}", f"{t['time_ratio']:.2f}"] if t else ["—", "—"]
        cells += ([f"{i['images_per_s']:.1f}", f"{1e3 * i['seconds_per_image']:.2f}", f"{i['time_ratio']:.2f}",
                   f"{i['gmacs_forward']:.3f}", f"{i['flop_ratio']:.2f}"] if i else ["—"] * 5)
        print(f"| {row['variant']} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    parser.add_argument("--steps", type=int, default=24, help="training steps of each run (default 24)")
    parser.add_argument("--log-every", type=int, default=6, help="steps per logged training window (default 6)")
    parser.add_argument("--rounds", type=int, default=2, help="training rounds (default 2)")
    parser.add_argument("--batch", type=int, default=64, help="images per inference batch (default 64)")
    parser.add_argument("--inference-rounds", type=int, default=5, help="timed inference batches each (default 5)")
    parser.add_argument("--only", help="comma-separated variants (default: every variant of the first repeat)")
    parser.add_argument("--reference", help="the variant of the ratios (default: the study's first compare: "
                                            "variant measured, else the first)")
    parts = parser.add_mutually_exclusive_group()
    parts.add_argument("--training-only", action="store_true")
    parts.add_argument("--inference-only", action="store_true", help="no training: needs no data set")
    parser.add_argument("--out")
    args = parser.parse_intermixed_args()

    timing = {"train": {"steps": args.steps, "log_every": args.log_every, "eval_every": 10**9,
                        "checkpoint_every": 10**9}, "eval": {"baseline": False}, "data": {"val_fraction": 0.0}}
    spec = load_study(args.study, [timing], settings=parse_settings(args.overrides))
    runs = [run for run in spec.runs(args.only.split(",") if args.only else ()) if run.repeat == spec.repeats[0]]
    variants = [run.variant for run in runs]
    reference = args.reference or next((name for name in spec.compare if name in variants), variants[0])
    if reference not in variants:
        parser.error(f"--reference {reference} is not among the measured variants ({', '.join(variants)})")
    reference_run = runs[variants.index(reference)]

    train_rates = None if args.inference_only else training_rates(runs, reference_run, args.rounds)
    configs = {run.variant: build_config(*run.layers) for run in runs}
    # the trainer's threads and device (training set them already; an inference-only process has not)
    device = set_up_process(configs[reference].train, DistContext())
    inference_seconds, macs = (None, None) if args.training_only else inference_times(
        configs, device, args.batch, args.inference_rounds)

    rows = cost_rows(variants, reference, train_rates, inference_seconds, macs)
    print_table(rows, reference)
    out = args.out or Path(__file__).parent / "results" / f"study_train_speed-{spec.name}.json"
    write_result(out, {"study": spec.name, "reference": reference, "overrides": args.overrides,
                       "train": None if args.inference_only else {"steps": args.steps, "log_every": args.log_every,
                                                                  "rounds": args.rounds},
                       "inference": None if args.training_only else {"batch": args.batch,
                                                                     "rounds": args.inference_rounds},
                       "rows": rows, "environment": environment(device)})
    print(f"written: {out}")


if __name__ == "__main__":
    main()
