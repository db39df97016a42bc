"""Inference throughput (issue 52 item 5): the embedding pass of ``deepmetric embed`` / ``index`` / ``evaluate``
and the per-query pass of ``search`` / ``serve``, in float32, under bf16 autocast and compiled (``eval.amp``,
``eval.compile``), each against the bare forward pass of float32 eager on the same device, in one process.

What is timed, per mode (``fp32``, ``bf16``, ``compile``, ``compile+bf16``; ``fp16`` on request):

- ``forward``: ``InferenceForward`` (the embedding pass's call of the model) on one batch of ``--batch`` images
  already on the device: the bound of the pass;
- ``embed``: ``embed_table`` over ``--images`` image files (decoding, the test transform and the loader's workers
  included; for ``index`` add the faiss build, for ``evaluate`` the kNN): what ``deepmetric embed`` runs;
- ``query``: one image at a time as ``search`` and ``serve`` embed it (``Searcher.embed``: the test transform of a
  decoded image, a batch of one, the forward pass), over the first ``--queries`` images.

The modes run in interleaved rounds (every mode, then again) after one untimed warm-up pass each (a compiled
mode compiles there: its compile time is reported apart). Medians; ratios are images/s against ``forward`` of
``fp32``. The images are ``--data``'s test split (a data set spec) or, by default, ``--images`` random RGB PNGs at
64 px written to a temporary folder (decoding them is cheaper than decoding photos).

    .venv/bin/python benchmarks/inference_speed.py [--backbone lite0] [--head gap] [--size 160] [--batch 64] \\
        [--device cuda] [--modes fp32,bf16,compile,compile+bf16] [--images 1024] [--queries 64] [--rounds 3] \\
        [--data emoji] [--workers N] [--out FILE]

Prints a table and writes benchmarks/results/inference_speed[_<device>].json.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _results import environment, synchronize, timed, write_result
from PIL import Image

from deepmetric.data.transforms import TestTransform
from deepmetric.evaluation import EmbedSettings
from deepmetric.evaluation.evaluator import embed_table
from deepmetric.models import create_model
from deepmetric.models.inference import InferenceForward

MODES = {"fp32": (None, False), "bf16": ("bf16", False), "fp16": ("fp16", False), "compile": (None, True),
         "compile+bf16": ("bf16", True), "compile+fp16": ("fp16", True)}
"""Each mode's ``eval.amp`` and ``eval.compile``."""


def image_table(args: argparse.Namespace, root: Path) -> Any:
    """The images to embed: ``--data``'s test split, or ``--images`` random 64-px PNGs written under ``root``."""
    from deepmetric.data import load_dataset
    from deepmetric.data.image_inputs import ImagesTable

    if args.data:
        table = load_dataset(args.data).split("test")
        return table.subset(np.arange(min(args.images, len(table))))
    rng = np.random.default_rng(0)
    files = []
    for i in range(args.images):
        file = root / f"{i:05d}.png"
        Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(file)
        files.append(file)
    return ImagesTable.of(files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backbone", default="lite0")
    parser.add_argument("--head", default="gap")
    parser.add_argument("--size", type=int, default=160)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--modes", default="fp32,bf16,compile,compile+bf16",
                        help=f"comma-separated, of {', '.join(MODES)}; fp32 is always measured (the reference)")
    parser.add_argument("--images", type=int, default=1024, help="images of each embedding pass")
    parser.add_argument("--queries", type=int, default=64, help="single-image queries of each query pass")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--forward-batches", type=int, default=10, help="timed forward batches a round")
    parser.add_argument("--data", help="embed this data set's test split instead of random PNGs")
    parser.add_argument("--workers", type=int,
                        help="DataLoader workers of the embedding pass (default: the library's choice for the device, "
                        "as deepmetric embed makes it)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--out")
    args = parser.parse_args()
    modes = ["fp32"] + [m for m in args.modes.split(",") if m and m != "fp32"]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"unknown modes {unknown}; choose from {', '.join(MODES)}")
    if args.threads:
        torch.set_num_threads(args.threads)

    device = torch.device(args.device)
    model = create_model(backbone=args.backbone, head=args.head, pretrained=args.backbone == "lite0").to(device)
    model.eval()
    if hasattr(model, "set_channels_last"):
        model.set_channels_last(True)
    batch = torch.rand(args.batch, 3, args.size, args.size, device=device)
    forwards = {m: InferenceForward(model, device, *MODES[m]) for m in modes}
    times: dict[str, dict[str, list[float]]] = {m: {"forward": [], "embed": [], "query": []} for m in modes}
    compile_s: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as root:
        table = image_table(args, Path(root))
        settings = {m: EmbedSettings(args.size, "resize", args.batch, device, args.workers, False, None, *MODES[m])
                    for m in modes}
        transform = TestTransform(args.size, "resize")
        queries = [table.image(i) for i in range(min(args.queries, len(table)))]  # decoded, as serve has them

        def query_pass(forward: InferenceForward) -> None:
            for image in queries:  # as Searcher.embed
                forward(transform(image).unsqueeze(0).to(device)).embedding[0].float().cpu()

        for m in modes:  # warm-up: a compiled mode compiles here, for each shape it meets
            start = time.perf_counter()
            forwards[m](batch)
            query_pass(forwards[m])
            synchronize(device)
            if MODES[m][1]:
                compile_s[m] = time.perf_counter() - start
            embed_table(model, table, settings[m])
        for _ in range(args.rounds):
            for m in modes:
                times[m]["forward"] += [timed(lambda m=m: forwards[m](batch), device)
                                        for _ in range(args.forward_batches)]
                times[m]["embed"].append(timed(lambda m=m: embed_table(model, table, settings[m]), device))
                times[m]["query"].append(timed(lambda m=m: query_pass(forwards[m]), device))
    rate = {m: {"forward": args.batch / statistics.median(times[m]["forward"]),
                "embed": len(table) / statistics.median(times[m]["embed"]),
                "query": len(queries) / statistics.median(times[m]["query"])} for m in modes}
    bound = rate["fp32"]["forward"]
    rows = [{"mode": m, "amp": MODES[m][0], "compile": MODES[m][1],
             **{f"{k}_images_per_s": v for k, v in rate[m].items()},
             **{f"{k}_ratio": v / bound for k, v in rate[m].items()},
             "compile_s": compile_s.get(m)} for m in modes]
    print(f"{args.backbone} + {args.head}, {args.size} px, batch {args.batch}, {device}, "
          f"{torch.get_num_threads()} threads, {len(table)} images ({args.data or 'random 64-px PNGs'}), "
          f"{'default' if args.workers is None else args.workers} workers; images/s and x the float32 forward pass "
          f"({bound:.1f} images/s)")
    print(f"{'mode':<14}{'forward':>16}{'embed':>16}{'query (batch 1)':>20}{'compile s':>11}")
    for row in rows:
        cells = "".join(f"{row[f'{k}_images_per_s']:>9.1f} ({row[f'{k}_ratio']:.2f})" for k in ("forward", "embed"))
        query = f"{row['query_images_per_s']:>9.1f} ({row['query_ratio']:.3f})"
        spent = f"{row['compile_s']:.0f}" if row["compile_s"] is not None else "-"
        print(f"{row['mode']:<14}{cells}{query:>20}{spent:>11}")
    suffix = "" if device.type == "cpu" else "_" + torch.cuda.get_device_name(device).split()[1].lower()
    out = args.out or Path(__file__).parent / "results" / f"inference_speed{suffix}.json"
    write_result(out, {"benchmark": "inference_speed", "backbone": args.backbone, "head": args.head,
                       "image_size": args.size, "batch": args.batch, "images": len(table), "queries": len(queries),
                       "data": args.data or "random 64-px PNGs", "workers": args.workers, "rounds": args.rounds,
                       **environment(device), "rows": rows})
    print(f"written: {out}")


if __name__ == "__main__":
    main()
