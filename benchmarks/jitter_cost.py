"""What ``data.color_jitter`` costs the data path: a batch made with and without the jitter, uncached (the trainer's
loader without workers: read, ``TrainTransform``, collate, in this process) and cached (``data.cache``: the decoded
images augmented by ``BatchedTrainTransform`` on ``--device``), interleaved batch by batch so that the machine's
load weighs on the four alike. No model runs; each batch is moved to the device and made floats there, as the
trainer does. Reports the median milliseconds a batch and, per path, jitter over no jitter.

    .venv/bin/python benchmarks/jitter_cost.py [--data emoji] [--size 224] [--device cpu] [--batches 20] \\
        [--color-jitter 0.4,0.4,0.4,0.1] [--out FILE]

Prints a table and writes benchmarks/results/jitter_cost[_<size>px][_<device>].json.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np
import torch
from _results import environment, timed, write_result

from deepmetric.data import load_dataset
from deepmetric.data.batched_transforms import BatchedTrainTransform
from deepmetric.data.cache import CachedBatches, ImageCache
from deepmetric.data.sampler import PKSampler
from deepmetric.data.torch_dataset import ImageDataset, training_loader, uint8_batches
from deepmetric.data.transforms import TrainTransform, as_unit_float

RESIZE_RANGE = (1.0, 1.3)  # the emoji comparison's


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="emoji")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batches", type=int, default=20, help="batches timed per set-up (after one warm-up)")
    parser.add_argument("--classes-per-batch", type=int, default=16)
    parser.add_argument("--samples-per-class", type=int, default=4)
    parser.add_argument("--color-jitter", default="0.4,0.4,0.4,0.1", metavar="B,C,S,H",
                        type=lambda text: tuple(float(x) for x in text.split(",")))
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    suffix = f"_{args.size}px" + (f"_{device.type}" if device.type != "cpu" else "")
    out = args.out or str(Path(__file__).parent / "results" / f"jitter_cost{suffix}.json")

    table = load_dataset(args.data).split("train")
    labels = np.searchsorted(np.unique(table.labels), table.labels)
    cache = ImageCache.build(table, args.size, RESIZE_RANGE, "size", device)

    def sampler() -> PKSampler:
        return PKSampler(labels, args.classes_per_batch, args.samples_per_class, seed=1, num_steps=args.batches + 1)

    sources = {}
    for jitter_name, jitter in (("no jitter", (0.0, 0.0, 0.0, 0.0)), ("jitter", args.color_jitter)):
        transform = TrainTransform(args.size, RESIZE_RANGE, True, "size", uint8=uint8_batches(device),
                                   color_jitter=jitter)
        sources[f"uncached, {jitter_name}"] = iter(training_loader(ImageDataset(table, transform, labels), sampler(),
                                                                   0, False, device))
        augment = BatchedTrainTransform(args.size, RESIZE_RANGE, True, "size", jitter)
        sources[f"cached, {jitter_name}"] = iter(CachedBatches(cache, sampler(), labels, augment, device,
                                                               prefetch=False))
    times: dict[str, list[float]] = {name: [] for name in sources}
    for step in range(args.batches + 1):
        for name, source in sources.items():
            seconds = timed(lambda source=source: as_unit_float(next(source)[0].to(device)), device)
            if step:  # the first batch warms up
                times[name].append(seconds)
    medians = {name: statistics.median(values) for name, values in times.items()}
    ratios = {path: medians[f"{path}, jitter"] / medians[f"{path}, no jitter"] for path in ("uncached", "cached")}
    batch = args.classes_per_batch * args.samples_per_class
    print(f"{args.data}, {args.size} px, batches of {batch}, data.color_jitter={list(args.color_jitter)}, {device}")
    print(f"{'set-up':<22}{'ms a batch':>12}")
    for name, value in medians.items():
        print(f"{name:<22}{1e3 * value:>12.1f}")
    for path, ratio in ratios.items():
        print(f"{path}: a batch with jitter takes {ratio:.2f} times as long")
    write_result(out, {"benchmark": "jitter_cost", "data": args.data, "image_size": args.size, "batch": batch,
                       "color_jitter": list(args.color_jitter), "batches": args.batches, **environment(device),
                       "seconds_per_batch": medians, "batch_seconds": times, "jitter_over_none": ratios})


if __name__ == "__main__":
    main()
