"""Retrieval by the untrained backbone's pooled features at each of its layers: which layer's map, averaged and
l2-normalised with no training at all, already retrieves best on a data set.

    .venv/bin/python tools/pooled_layers.py configs/demo-emoji.yaml [--layers stage4,stage5,stage6,head]
        [--splits val,test] [--out pooled-layers.json] [--threads 1]

A diagnostic, not a method: it separates what a head gains by training from what it gains by pooling another
layer (the emoji comparison's stage-5 heads skip Lite0's stages 6-7 and its 1,280-channel head convolution).
The data set, image size and backbone come from the config; nothing is trained.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from deepmetric.config import build_config
from deepmetric.config.layers import load_yaml
from deepmetric.errors import DeepMetricError
from deepmetric.evaluation.evaluator import EmbedSettings, evaluate
from deepmetric.models.backbones import create_backbone
from deepmetric.models.embedder import Embedder
from deepmetric.models.heads.gap import GAPHead
from deepmetric.training.setup import load_table


def pooled_model(backbone: str, layer: str, pretrained: bool, freeze_bn: bool | str) -> Embedder:
    """The backbone cut after ``layer``, its map averaged over space (no tail, no embedding layer)."""
    net = create_backbone(backbone, pretrained=pretrained, split=layer, freeze_bn=freeze_bn)
    head = GAPHead.from_backbone(net, embedding_dim=0, use_tail=False)
    return Embedder(net.trunk, head, net.mean, net.std, net.bgr, {"backbone": backbone, "split": layer})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="a run config: its data and model sections are used")
    parser.add_argument("--layers", default=None, help="comma-separated split points (default: all but 'input')")
    parser.add_argument("--splits", default="val,test")
    parser.add_argument("--out", default=None, help="also write the figures to this JSON file")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()

    config = build_config(load_yaml(args.config))
    if args.threads:
        torch.set_num_threads(args.threads)
    m = config.model
    points = create_backbone(m.backbone, pretrained=False).split_points
    layers = args.layers.split(",") if args.layers else [p for p in points if p != "input"]
    table, _ = load_table(config)
    settings = EmbedSettings.from_config(config, "cpu", progress=False)
    rows = []
    for layer in layers:
        model = pooled_model(m.backbone, layer, m.pretrained, m.freeze_bn).eval()
        row = {"layer": layer, "channels": model.head.embedding_dim}
        for split in args.splits.split(","):
            metrics = evaluate(model, table, split, settings, nmi=False, engine=config.eval.engine)
            row[split] = {k: round(100 * v, 2) for k, v in metrics.items() if v is not None}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    try:
        main()
    except DeepMetricError as error:  # a bad layer name, config or data set: one line, as the CLI prints it
        raise SystemExit(f"pooled_layers.py: error: {error}") from None
