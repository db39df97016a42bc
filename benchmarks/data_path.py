"""Does the real data path keep the device fed? The GAP run's training throughput with its batches decoded and
augmented in DataLoader workers, against the same run fed one batch already on the device.

Each set-up is a real run of the trainer (``deepmetric.training.train``: the P x K sampler, the training
transform, the forward and backward passes, the per-step loss check and logging) on the same data and
config; only the loader that the trainer asks for (``training_loader``) is swapped:

- ``on-device``: one batch from the real loader, moved to the device once and handed out at every step: the
  bound that the data path can at best reach;
- ``workers=W[,pinned]``: the trainer's loader with W worker processes (0: decoding in the training process)
  and, with ``pinned``, page-locked batches (``pin_memory``: the copy to a GPU can then overlap the step).
- ``cache``: ``data.cache=true``: the training split decoded once before the run, each batch augmented on the
  device by ``BatchedTrainTransform`` (``deepmetric.data.cache``); its decoding is not in the figures. On a GPU
  each batch is made one ahead by a thread (``data/prefetch.py``); ``cache,when-asked`` is the same run with each
  batch made only when the loop asks for it (no thread): the two in one process say whether the thread helps a
  step whose host is busy launching kernels (both threads share Python's lock).

Images per second are read from the run's own log (``images_per_s``, one figure per ``log_every`` steps),
leaving out the first ``--warmup`` steps (workers starting, cuDNN choosing its kernels); the ratio of each
set-up to ``on-device`` is reported. The goal on a GPU is a ratio of at least 0.9 (0.95 with the cache, and on
the CPU with the cache). With ``--rounds R`` the set-ups run R times in turn, round r starting r places further
along their list (so that no set-up always runs first or last in a round), and each one's figure is the median over
all its windows (other processes on the machine then weigh on every set-up alike); beside it, the median over the
rounds of its ratio to ``on-device`` in the same round (a pairing that drift over the run does not move).

    .venv/bin/python benchmarks/data_path.py --data folder:PATH [--size 224] [--device cuda] [--amp] \\
        [--workers 0,4,8] [--no-cache] [--steps 60] [--warmup 20] [--rounds 1] [--color-jitter 0.4,0.4,0.4,0.1]

Prints a table and writes benchmarks/results/data_path.json.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch
from _results import environment, rotated, timed, write_result

import deepmetric.training.trainer as trainer
from deepmetric.config import build_config


def run_config(args: argparse.Namespace, workers: int, cache: bool = False) -> Any:
    """The emoji comparison's GAP run (Lite0, binomial deviance, P x K = 16 x 4) at ``--size``, for ``--steps``
    steps, with no validation, baseline or image audit (they are not the data path)."""
    return build_config({
        "data": {"spec": args.data, "image_size": args.size, "resize_range": [1.0, 1.3], "flip": False,
                 "classes_per_batch": args.classes_per_batch, "samples_per_class": args.samples_per_class,
                 "check_images": False, "check_counts": False, "num_workers": workers, "cache": cache,
                 "color_jitter": args.color_jitter},
        "model": {"backbone": args.backbone, "pretrained": args.backbone == "lite0", "head": "gap"},
        "loss": {"name": "binomial"},
        "train": {"steps": args.steps, "log_every": args.log_every, "eval_every": 10**6,
                  "checkpoint_every": 10**6, "device": args.device, "amp": args.amp,
                  "channels_last": not args.contiguous},
        "eval": {"baseline": False},
    })


def on_device_loader(device: torch.device):
    """A ``training_loader`` that draws one batch from the real loader, moves it to ``device`` once and hands it
    out for ever."""
    real = trainer.training_loader

    def loader(dataset, sampler, *args):
        images, labels, rows = next(iter(real(dataset, sampler, 0)))
        return itertools.repeat((images.to(device), labels.to(device), rows))

    return loader


def pinned_loader(pin: bool):
    """The trainer's loader with ``pin_memory`` set as asked (its workers are the config's)."""
    real = trainer.training_loader

    def loader(dataset, sampler, num_workers, pin_memory, device):
        return real(dataset, sampler, num_workers, pin, device)

    return loader


def images_per_second(run: Path, log_every: int, warmup: int) -> list[float]:
    """The run's logged training rates over the windows of ``log_every`` steps that start after ``warmup``."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r["images_per_s"] for r in records if "images_per_s" in r and r["step"] - log_every >= warmup]


def measure(args: argparse.Namespace, name: str, loader, workers: int, root: Path) -> list[float]:
    """The logged rates of one run of set-up ``name`` (``loader`` None: the trainer's own, with ``data.cache``)."""
    original, batches = trainer.training_loader, trainer.CachedBatches
    trainer.training_loader = loader or original
    if name == "cache,when-asked":
        trainer.CachedBatches = functools.partial(batches, prefetch=False)
    try:
        out = Path(tempfile.mkdtemp(dir=root, prefix=name.replace("=", "-").replace(",", "-")))
        trainer.train(run_config(args, workers, cache=name.startswith("cache")), out, progress=False)
    finally:
        trainer.training_loader, trainer.CachedBatches = original, batches
    return images_per_second(out, args.log_every, args.warmup)


def batch_seconds(args: argparse.Namespace, device: torch.device, batches: int) -> dict[str, float]:
    """Median seconds to produce one batch on ``device``, uncached (the trainer's loader without workers: read,
    ``TrainTransform`` and collate in this process) and cached (``CachedBatches`` made when asked: with its thread
    the batch would be ready and the figure say nothing), interleaved batch by batch so that the machine's load
    weighs on both alike; the cache's one-off decoding is timed too."""
    import time

    import numpy as np

    from deepmetric.data.batched_transforms import BatchedTrainTransform
    from deepmetric.data.cache import CachedBatches, ImageCache
    from deepmetric.data.sampler import PKSampler
    from deepmetric.data.torch_dataset import ImageDataset, uint8_batches
    from deepmetric.data.transforms import TrainTransform, as_unit_float
    from deepmetric.runs.table import load_table

    config = run_config(args, 0)
    d = config.data
    table = load_table(config, False)[0].split("train")
    labels = np.searchsorted(np.unique(table.labels), table.labels)

    def sampler():
        return PKSampler(labels, d.classes_per_batch, d.samples_per_class, seed=1, num_steps=batches + 1)

    start = time.perf_counter()
    cache = ImageCache.build(table, d.image_size, d.resize_range, d.train_pad, device)
    decoding = time.perf_counter() - start
    augment = BatchedTrainTransform(d.image_size, d.resize_range, d.flip, d.train_pad, d.color_jitter)
    cached = iter(CachedBatches(cache, sampler(), labels, augment, device, prefetch=False))
    transform = TrainTransform(d.image_size, d.resize_range, d.flip, d.train_pad, uint8=uint8_batches(device),
                               color_jitter=d.color_jitter)
    dataset = ImageDataset(table, transform, labels)  # as the trainer makes it: uint8 batches on a GPU
    uncached = iter(trainer.training_loader(dataset, sampler(), 0, False, device))
    times: dict[str, list[float]] = {"uncached": [], "cached": []}
    for step in range(batches + 1):
        for name, source in (("uncached", uncached), ("cached", cached)):
            seconds = timed(lambda source=source: as_unit_float(next(source)[0].to(device)), device)
            if step:  # the first batch warms up
                times[name].append(seconds)
    return {"uncached": statistics.median(times["uncached"]), "cached": statistics.median(times["cached"]),
            "cache_decoding": decoding, "cache_bytes": cache.nbytes, "cache_images": len(cache.images)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="data set spec, e.g. folder:PATH or emoji")
    parser.add_argument("--backbone", default="lite0")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--classes-per-batch", type=int, default=16)
    parser.add_argument("--samples-per-class", type=int, default=4)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--amp", action="store_true", help="forward passes under bfloat16 autocast")
    parser.add_argument("--contiguous", action="store_true", help="NCHW instead of channels-last")
    parser.add_argument("--workers", default=f"0,4,{min(8, os.cpu_count() or 1)}")
    parser.add_argument("--unpinned", action="store_true", help="also run each worker count without pin_memory")
    parser.add_argument("--no-cache", action="store_true", help="leave out the data.cache set-up")
    parser.add_argument("--rounds", type=int, default=1, help="run the set-ups this many times in turn")
    parser.add_argument("--batch-timing", type=int, default=20, metavar="N",
                        help="also time N batches of the data path alone, uncached and cached (0: not)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--log-every", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=20, help="steps left out of the figures")
    parser.add_argument("--color-jitter", default="0,0,0,0", metavar="B,C,S,H",
                        type=lambda text: [float(x) for x in text.split(",")],
                        help="data.color_jitter of every set-up (brightness, contrast, saturation, hue)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "data_path.json"))
    args = parser.parse_args()
    if args.steps - args.warmup < 2 * args.log_every:
        parser.error("--steps must leave at least two --log-every windows after --warmup")

    device = torch.device(args.device)
    setups = [("on-device", on_device_loader(device), 0)]
    for workers in map(int, args.workers.split(",")):
        pins = (True, False) if args.unpinned else (device.type == "cuda",)
        setups += [(f"workers={workers}" + (",pinned" if pin else ""), pinned_loader(pin), workers) for pin in pins]
    if not args.no_cache:
        setups.append(("cache", None, 0))
        if device.type == "cuda":  # where the thread is on
            setups.append(("cache,when-asked", None, 0))
    by_round: dict[str, list[list[float]]] = {name: [] for name, _, _ in setups}  # each round's windows
    with tempfile.TemporaryDirectory() as root:
        for turn in range(args.rounds):
            for name, loader, workers in rotated(setups, turn):
                by_round[name].append(measure(args, name, loader, workers, Path(root)))
    round_medians = {name: [statistics.median(windows) for windows in rounds] for name, rounds in by_round.items()}
    rows = []
    for name, _, workers in setups:
        windows = [rate for measured in by_round[name] for rate in measured]
        rows.append({"setup": name, "workers": workers, "images_per_second": statistics.median(windows),
                     "windows": windows, "round_medians": round_medians[name]})
    alone = batch_seconds(args, device, args.batch_timing) if args.batch_timing else None
    bound = rows[0]["images_per_second"]
    for row in rows:
        row["ratio_to_on_device"] = row["images_per_second"] / bound
        row["round_ratios"] = [a / b for a, b in zip(row["round_medians"], round_medians["on-device"], strict=True)]
        row["median_round_ratio"] = statistics.median(row["round_ratios"])
    print(f"{args.backbone} + GAP, {args.size} px, batch {args.classes_per_batch * args.samples_per_class}, "
          f"{'bf16 autocast' if args.amp else 'float32'}, {device}, {os.cpu_count()} CPUs")
    print(f"{'set-up':<22}{'images/s':>10}{'ratio':>8}{'by round':>10}")
    for row in rows:
        print(f"{row['setup']:<22}{row['images_per_second']:>10.1f}{row['ratio_to_on_device']:>8.2f}"
              f"{row['median_round_ratio']:>10.2f}")
    if alone:
        step = args.classes_per_batch * args.samples_per_class / bound  # seconds of a bare step, on-device
        for name in ("uncached", "cached"):
            alone[f"{name}_step_fraction"] = step / (step + alone[name])
            print(f"data path alone, {name}: {1e3 * alone[name]:.1f} ms a batch; a step fed by it would run at "
                  f"{alone[f'{name}_step_fraction']:.3f} of the bare step")
        print(f"the cache: {alone['cache_images']} images, {alone['cache_bytes'] / 2**20:.0f} MiB, decoded in "
              f"{alone['cache_decoding']:.1f} s")
    write_result(args.out, {"benchmark": "data_path", "data": args.data, "backbone": args.backbone,
                            "image_size": args.size, "batch": args.classes_per_batch * args.samples_per_class,
                            "amp": args.amp, "channels_last": not args.contiguous, "steps": args.steps,
                            "color_jitter": args.color_jitter,
                            "warmup_steps": args.warmup, "rounds": args.rounds, **environment(device), "rows": rows,
                            "data_path_alone": alone})


if __name__ == "__main__":
    main()
