"""The emoji protocol's image size, chosen on validation classes only (issue 36, item 2).

The untrained backbone (ImageNet EfficientNet-Lite0, l2-normalised pooled features, no embedding layer: what
``eval.baseline`` evaluates) retrieves among the emoji validation classes (``val_fraction`` 0.1 of the training
emoji, ``val_seed`` 0: the 82 classes the comparison selects checkpoints on; the test split is never read) at
each size. The 64-px drawings are upsampled by the library's test transform (``resize``: bilinear, with
antialiasing, which does nothing when enlarging); ``--interpolations`` adds the same resize with other filters,
to see whether the filter matters.

    .venv/bin/python tools/emoji_size_probe.py [--sizes 64,96,128,160,224] [--interpolations bilinear,bicubic,nearest]
    .venv/bin/python tools/emoji_size_probe.py --data icons --val-fraction 0.2    # the icons protocol's size

Prints a Markdown table and writes docs/studies/<data>-size-probe.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torchvision.transforms.v2.functional as F

from deepmetric import create_model
from deepmetric.data import load_dataset
from deepmetric.data.transforms import TestTransform, to_tensor
from deepmetric.evaluation import retrieval_metrics
from deepmetric.progress import progress_bar

FILTERS = {"bilinear": F.InterpolationMode.BILINEAR, "bicubic": F.InterpolationMode.BICUBIC,
           "nearest": F.InterpolationMode.NEAREST}


def resized(image, size: int, interpolation: str) -> torch.Tensor:
    """The test transform's ``resize`` with the filter named (bilinear is the library's own)."""
    tensor = to_tensor(image)
    if tuple(tensor.shape[-2:]) != (size, size):
        tensor = F.resize(tensor, [size, size], interpolation=FILTERS[interpolation], antialias=True)
    return tensor.float().div_(255.0)


@torch.no_grad()
def probe(model, part, size: int, interpolation: str, batch: int = 64) -> dict[str, float]:
    images = [part.image(row) for row in range(len(part))]
    library = TestTransform(size)
    assert torch.equal(library(images[0]), resized(images[0], size, "bilinear"))  # the library's own path
    embeddings = []
    for start in progress_bar(range(0, len(images), batch), desc=f"{size} px {interpolation}", leave=False):
        x = torch.stack([resized(image, size, interpolation) for image in images[start:start + batch]])
        embeddings.append(model.embed(x.contiguous(memory_format=torch.channels_last)))
    metrics = retrieval_metrics(torch.cat(embeddings).numpy(), part.labels, recall_at=(1, 2, 4, 8), nmi=False)
    return {k: float(v) for k, v in metrics.items() if v is not None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="emoji")
    parser.add_argument("--sizes", default="64,96,128,160,224")
    parser.add_argument("--interpolations", default="bilinear", help="filters: " + ", ".join(FILTERS))
    parser.add_argument("--val-fraction", type=float, default=0.1, help="the share of training classes that "
                        "validate (0.1: emoji's 82; the study's own share for another data set)")
    parser.add_argument("--out", default=None, help="default docs/studies/<data>-size-probe.json")
    args = parser.parse_args()
    args.out = args.out or str(Path(__file__).parents[1] / f"docs/studies/{args.data}-size-probe.json")
    table = load_dataset(args.data, val_fraction=args.val_fraction, val_seed=0)
    part = table.split("val")
    torch.manual_seed(0)
    model = create_model("lite0", head="gap", embedding_dim=0, pretrained=True).set_channels_last(True).eval()
    rows = []
    for interpolation in args.interpolations.split(","):
        for size in map(int, args.sizes.split(",")):
            rows.append({"size": size, "interpolation": interpolation, **probe(model, part, size, interpolation)})
    print(f"validation: {len(set(part.labels))} classes, {len(part)} images; untrained Lite0, pooled features")
    print("| size | upsampling | R@1 | R@2 | R@4 | R@8 | MAP@R |\n|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['size']} | {r['interpolation']} | {100 * r['recall@1']:.1f} | {100 * r['recall@2']:.1f} | "
              f"{100 * r['recall@4']:.1f} | {100 * r['recall@8']:.1f} | {100 * r['map@r']:.1f} |")
    Path(args.out).write_text(json.dumps({"data": args.data, "val_classes": len(set(part.labels)),
                                          "val_images": len(part), "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
