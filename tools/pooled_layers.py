"""Retrieval by the untrained backbone's pooled features at each of its layers: which layer's map, averaged and
l2-normalised with no training at all, already retrieves best on a data set.

    .venv/bin/python tools/pooled_layers.py configs/demo-emoji.yaml [--layers stage4,stage5,stage6,head]
        [--splits val,test] [--out pooled-layers.json] [--threads 1]

A diagnostic, not a method: it separates what a head gains by training from what it gains by pooling another
layer (the emoji comparison's stage-5 heads skip Lite0's stages 6-7 and its 1,280-channel head convolution).
The data set, image size and backbone come from the config; nothing is trained. One pass over each split gives
every layer's features.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from deepmetric.config import build_config
from deepmetric.config.layers import load_yaml
from deepmetric.errors import ConfigError, DeepMetricError, did_you_mean
from deepmetric.evaluation.evaluator import EmbedSettings, embed_outputs, split_metrics
from deepmetric.models.backbones import Backbone, create_backbone
from deepmetric.models.embedder import Embedder
from deepmetric.models.heads.base import HeadOutput
from deepmetric.runs.table import load_table


class EveryLayerPooled(nn.Module):
    """Runs the backbone's stages in turn and keeps, in ``extras[layer]``, each named layer's map averaged over
    space and l2-normalised (the embedding is the last one kept)."""

    def __init__(self, stages: nn.Sequential, layers: list[str]):
        super().__init__()
        names = [name for name, _ in stages.named_children()]
        unknown = [layer for layer in layers if layer not in names]
        if unknown:
            raise ConfigError(f"the backbone has no layer '{unknown[0]}'{did_you_mean(unknown[0], names)}; its "
                              f"layers: {', '.join(names)}")
        self.stages, self.layers = stages, layers
        self.embedding_dim = 0

    def forward(self, x: torch.Tensor) -> HeadOutput:
        pooled = {}
        for name, stage in self.stages.named_children():
            if len(pooled) == len(self.layers):
                break  # the stages after the last layer asked for are not run
            x = stage(x)
            if name in self.layers:
                pooled[name] = F.normalize(x.mean(dim=(2, 3)), dim=1)
        embedding = pooled[self.layers[-1]]
        return HeadOutput(embedding=embedding, parts=[embedding], extras=pooled)


def pooled_layers_model(net: Backbone, layers: list[str]) -> Embedder:
    """The whole backbone ``net`` (its input normalisation included), returning every layer of ``layers`` pooled."""
    return Embedder(nn.Identity(), EveryLayerPooled(net.trunk, layers), net.mean, net.std, net.bgr,
                    {"backbone": net.name, "layers": layers})


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
    net = create_backbone(m.backbone, pretrained=m.pretrained, freeze_bn=m.freeze_bn)  # uncut: every stage
    layers = args.layers.split(",") if args.layers else [p for p in net.split_points if p != "input"]
    model = pooled_layers_model(net, layers)
    table, _ = load_table(config)
    settings = EmbedSettings.from_config(config, "cpu", progress=False)
    rows = {layer: {"layer": layer} for layer in layers}
    for split in args.splits.split(","):
        part = table.split(split)
        features = embed_outputs(model, part, settings, lambda output: output.extras, desc=f"embedding {split}")
        for layer in layers:
            rows[layer]["channels"] = features[layer].shape[1]
            metrics = split_metrics(features[layer], part, table.recall_at, nmi=False, engine=config.eval.engine)
            rows[layer][split] = {k: round(100 * v, 2) for k, v in metrics.items() if v is not None}
    for row in rows.values():
        print(json.dumps(row))
    if args.out:
        Path(args.out).write_text(json.dumps(list(rows.values()), indent=2) + "\n")


if __name__ == "__main__":
    try:
        main()
    except DeepMetricError as error:  # a bad layer name, config or data set: one line, as the CLI prints it
        raise SystemExit(f"pooled_layers.py: error: {error}") from None
