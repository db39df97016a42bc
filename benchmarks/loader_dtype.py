"""What the loaders deliver with uint8 batches against float32 ones: the trainer's loader (``TrainTransform``, the
P x K sampler) and the embedding pass's (``TestTransform``), each with its batches made by ``--workers`` worker
processes, moved to ``--device`` (pinned on a GPU) and made floats there, as the trainer and ``embed_outputs`` do.

On a GPU the loaders carry uint8 pixels (``deepmetric.data.torch_dataset.uint8_batches``): a batch of 64 images at
224 px is 9.6 MB instead of 38.5, each time it crosses from a worker to the training process (shared memory), into
pinned memory and onto the GPU. No model runs: the figure is the rate at which the loader alone hands the loop
ready batches, the bound of a step fed by it. The two kinds run in interleaved rounds (each loader's workers started
and the batches they had made ahead taken before the clock, then stopped before the next loader starts), medians over
the rounds; the ratio is uint8 over float32.

    .venv/bin/python benchmarks/loader_dtype.py [--data emoji|small-png] [--size 224] [--workers 2] \\
        [--device cpu] [--batches 20] [--rounds 3] [--out FILE]

``--data small-png`` writes 48 classes of 32 random 64-px RGB PNGs to a temporary folder (``folder:`` layout): images
so cheap to decode that the batches' bytes weigh most, as for ``inference_speed.py``'s default images.

Prints a table and writes benchmarks/results/loader_dtype[_<device>].json.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _results import environment, synchronize, write_result
from PIL import Image

from deepmetric.data import load_dataset
from deepmetric.data.sampler import PKSampler
from deepmetric.data.torch_dataset import ImageDataset, inference_loader, training_loader
from deepmetric.data.transforms import TestTransform, TrainTransform, as_unit_float


def small_pngs(root: Path, classes: int = 48, per_class: int = 32) -> str:
    """A ``folder:`` data set of random 64-px RGB PNGs under ``root``; its spec."""
    rng = np.random.default_rng(0)
    for c in range(classes):
        (root / f"class{c:03d}").mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(root / f"class{c:03d}/{i:03d}.png")
    return f"folder:{root}"


def loaders(args: argparse.Namespace, spec: str, device: torch.device) -> dict[str, Callable[[], Any]]:
    """The four loaders, by name: (training or embedding) x (float32 or uint8), each a function that starts it anew
    (its workers then start), long enough for one measurement."""
    table = load_dataset(spec)
    train_part, test_part = table.split("train"), table.split("test")
    labels = np.searchsorted(np.unique(train_part.labels), train_part.labels)
    steps = settling_batches(args.workers) + args.batches + 1
    made: dict[str, Callable[[], Any]] = {}
    for kind, uint8 in (("float32", False), ("uint8", True)):
        train_set = ImageDataset(train_part, TrainTransform(args.size, (1.0, 1.3), True, "size", uint8=uint8), labels)
        rows = np.resize(np.arange(len(test_part)), 64 * steps)  # the test split, again and again
        test_set = torch.utils.data.Subset(ImageDataset(test_part, TestTransform(args.size, uint8=uint8)), rows)
        made[f"training, {kind}"] = functools.partial(
            training_loader, train_set, PKSampler(labels, 16, 4, seed=0, num_steps=steps), args.workers, None, device)
        made[f"embedding, {kind}"] = functools.partial(inference_loader, test_set, 64, args.workers, None, device)
    return made


def settling_batches(workers: int) -> int:
    """Batches taken before the clock: the first, then as many as the workers had made ahead meanwhile (a
    DataLoader keeps 2 a worker ready), so that the clock sees the rate at which they make batches, not a queue."""
    return 1 + 2 * workers


def measure(start: Callable[[], Any], count: int, workers: int, device: torch.device) -> float:
    """Images per second of ``count`` batches of a loader started anew, after ``settling_batches``; its workers
    stop afterwards (the other loaders' workers do not run while one is timed)."""
    batches = iter(start())
    for _ in range(settling_batches(workers)):
        as_unit_float(next(batches)[0].to(device))
    rate = images_per_second(batches, count, device)
    del batches
    return rate


def images_per_second(batches: Any, count: int, device: torch.device) -> float:
    """Images per second of ``count`` batches taken from ``batches``, moved to ``device`` and made floats there."""
    synchronize(device)
    start, images = time.perf_counter(), 0
    for _ in range(count):
        batch = as_unit_float(next(batches)[0].to(device, non_blocking=True))
        images += len(batch)
    synchronize(device)
    return images / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="emoji")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batches", type=int, default=20, help="batches timed per loader and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    name = "loader_dtype" + (f"_{args.data}" if args.data == "small-png" else "") + (
        f"_{device.type}" if device.type != "cpu" else "")
    out = args.out or str(Path(__file__).parent / "results" / f"{name}.json")

    scratch = tempfile.TemporaryDirectory()
    spec = small_pngs(Path(scratch.name)) if args.data == "small-png" else args.data
    starts = loaders(args, spec, device)
    rates: dict[str, list[float]] = {name: [] for name in starts}
    for _ in range(args.rounds):
        for name, start in starts.items():
            rates[name].append(measure(start, args.batches, args.workers, device))
    medians = {name: statistics.median(values) for name, values in rates.items()}
    ratios = {loader: medians[f"{loader}, uint8"] / medians[f"{loader}, float32"]
              for loader in ("training", "embedding")}
    print(f"{args.data}, {args.size} px, batches of 64, {args.workers} workers, {device}")
    print(f"{'loader':<22}{'images/s':>10}")
    for name, value in medians.items():
        print(f"{name:<22}{value:>10.0f}")
    for loader, ratio in ratios.items():
        print(f"{loader}: uint8 batches {ratio:.2f} times as fast as float32 ones")
    write_result(out, {"benchmark": "loader_dtype", "data": args.data, "image_size": args.size, "batch": 64,
                       "workers": args.workers, "batches_per_round": args.batches, "rounds": args.rounds,
                       **environment(device), "images_per_second": medians, "rounds_images_per_second": rates,
                       "uint8_over_float32": ratios})


if __name__ == "__main__":
    main()
