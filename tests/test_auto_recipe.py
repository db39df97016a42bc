"""``deepmetric train --data folder:X`` without a config (issue 53 item 1): settings chosen from the data and said,
early stopping on validation, and a plain sentence when training does not beat the untrained backbone."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import yaml
from PIL import Image

from deepmetric.cli import main
from deepmetric.data.table import RetrievalTable
from deepmetric.training import train
from deepmetric.training.auto_recipe import as_layer, auto_recipe, image_size, validation_classes
from deepmetric.training.selection import beats_backbone
from deepmetric.training.trainer import TrainResult
from helpers import tiny_config


def write_folder(root, classes: int, per_class: int, side: int = 48):
    rng = np.random.default_rng(0)
    for c in range(classes):
        folder = root / f"class{c:03d}"
        folder.mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 255, size=(side, side + 10, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{i}.png")
    return root


def table_of(counts: list[int], side: int = 40) -> RetrievalTable:
    labels = np.repeat(np.arange(len(counts)), counts)
    images = np.zeros((len(labels), side, side + 5, 3), dtype=np.uint8)
    ones = np.ones(len(labels), dtype=bool)
    return RetrievalTable(name="t", images=images, labels=labels, splits=np.full(len(labels), "train", dtype=object),
                          is_query=ones, is_gallery=ones)


def test_the_image_size_is_the_images_median_shorter_side_to_a_multiple_of_32_within_64_224(tmp_path):
    sizes = {}
    for side in (100, 130, 20, 600):
        path = tmp_path / f"{side}.png"
        Image.new("RGB", (side + 30, side)).save(path)
        sizes[side] = path
    assert image_size([str(sizes[100])] * 3 + [str(sizes[600])]) == (96, 100)
    assert image_size([str(sizes[130])]) == (128, 130)
    assert image_size([str(sizes[20])]) == (64, 20) and image_size([str(sizes[600])]) == (224, 600)
    (tmp_path / "broken.png").write_bytes(b"not a png")
    assert image_size([str(tmp_path / "broken.png"), str(sizes[130])]) == (128, 130)  # unreadable: skipped
    assert image_size([np.zeros((70, 90, 3), np.uint8)]) == (64, 70)  # a table held in memory


def test_validation_holds_out_a_fifth_of_the_classes_when_enough_are_left_to_train():
    assert validation_classes(29) == 0  # 10 held out would leave 19
    assert validation_classes(30) == 10 and validation_classes(45) == 10 and validation_classes(100) == 20
    assert validation_classes(817) == 163


def test_the_recipe_follows_the_data_and_its_choices_are_a_config_layer():
    small = {c.key: c for c in auto_recipe(table_of([3] * 20))}
    assert small["data.val_fraction"].value == 0.0 and "no validation" in small["data.val_fraction"].why
    assert "train.patience" not in small and "train.eval_every" not in small
    assert small["data.samples_per_class"].value == 3 and small["data.classes_per_batch"].value == 20
    assert small["train.steps"].value == 100  # 20 passes over 60 images is fewer steps than the floor
    assert small["data.image_size"].value == 64
    assert small["model.embedding_dim"].value == 0  # the gap head trains the backbone's pooled features
    assert "model.embedding_dim" not in {c.key for c in auto_recipe(table_of([3] * 20), head="dgml")}

    big = {c.key: c for c in auto_recipe(table_of([8] * 60 + [2] * 40))}
    assert big["data.val_fraction"].value == pytest.approx(0.2)
    assert big["data.samples_per_class"].value == 4 and big["data.classes_per_batch"].value == 16
    assert big["train.steps"].value == int(np.ceil(20 * round(560 * 0.8) / 64))
    assert big["train.select_by"].value == "map@r" and "validation images moves in steps" in big["train.select_by"].why
    assert big["train.patience"].value == 5 and big["train.eval_every"].value == big["train.steps"].value // 20
    layer = as_layer(list(big.values()))
    assert layer["data"]["classes_per_batch"] == 16 and layer["train"]["lr_backbone"] == 1e-4
    assert layer["eval"] == {"baseline": True}


def test_train_on_a_folder_without_a_config_says_each_choice_and_overrides_win(tmp_path, caplog, capsys):
    caplog.set_level(logging.INFO)
    folder = write_folder(tmp_path / "images", classes=60, per_class=3)
    code = main(["train", "--data", f"folder:{folder}", "--backbone", "tiny", "--steps", "3", "--quiet",
                 "--out", str(tmp_path / "run"), "model.pretrained=false", "model.embedding_dim=16", "train.device=cpu",
                 "eval.nmi=false"])
    assert code == 0
    text = caplog.text
    assert "no --config: settings chosen from folder:" in text
    assert "data.image_size=64: the training images' median shorter side is 48 px; the recipe trains at 64-224" in text
    assert "data.val_fraction=0.333: 10 of the 30 training classes select the checkpoint, 20 train" in text
    assert "train.steps=100" in text and "(your train.steps=3 wins)" in text
    config = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert config["data"]["image_size"] == 64 and config["train"]["steps"] == 3 and config["train"]["patience"] == 5
    assert (tmp_path / "run" / "baseline-val.json").is_file()  # what the trained model is compared with


def test_the_recipe_trains_the_pooled_features_of_the_gap_head_and_leaves_other_heads_their_dimension(tmp_path):
    folder = write_folder(tmp_path / "images", classes=8, per_class=3)
    common = ["--data", f"folder:{folder}", "--backbone", "tiny", "--steps", "1", "--no-test", "--quiet",
              "model.pretrained=false", "train.device=cpu", "eval.baseline=false"]
    assert main(["train", *common, "--out", str(tmp_path / "gap")]) == 0
    assert main(["train", *common, "--out", str(tmp_path / "dgml"), "model.head=dgml", "model.split=stage3"]) == 0
    dims = {name: yaml.safe_load((tmp_path / name / "config.yaml").read_text())["model"]["embedding_dim"]
            for name in ("gap", "dgml")}
    assert dims == {"gap": 0, "dgml": 512}


def test_a_preset_or_a_named_data_set_gets_no_recipe(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    code = main(["train", "--data", "digits", "--backbone", "tiny", "--steps", "1", "--no-test", "--quiet",
                 "--out", str(tmp_path / "run"), "model.pretrained=false", "model.embedding_dim=16",
                 "data.image_size=16", "data.classes_per_batch=3", "data.samples_per_class=4"])
    assert code == 0 and "settings chosen" not in caplog.text


def test_the_run_says_plainly_when_training_does_not_beat_the_backbone(tmp_path, monkeypatch, capsys):
    import deepmetric.training as training

    backbone = {"recall@1": 0.60, "map@r": 0.30, "r_precision": 0.40}

    def fake_train(config, out, resume=False, progress=True):
        best = {"recall@1": 0.55, "map@r": 0.25, "r_precision": 0.35}
        return TrainResult(out, 10, 5, 0.55, 1.0, 0, None, best, backbone, False)

    monkeypatch.setattr(training, "train", fake_train)
    assert main(["train", "--data", "digits", "--backbone", "tiny", "--no-test", "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert ("training did not beat the untrained backbone on validation (Recall@1 55.00%, MAP@R 25.00% at the "
            "selected step against 60.00% and 30.00% for the backbone)") in out
    assert "When training does not help" in out
    best = {"key": [0.60, 0.30, 0.41]}
    assert beats_backbone(best, backbone) is True and beats_backbone({"key": [0.60, 0.30, 0.40]}, backbone) is False
    assert beats_backbone({"key": None}, backbone) is None and beats_backbone(best, None) is None


def test_patience_stops_a_run_that_no_longer_improves_and_it_stays_stopped_when_resumed(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="deepmetric")
    sections = {"data": {"val_fraction": 0.4}, "eval": {"baseline": True},
                "train": {"steps": 30, "lr": 0.0, "lr_backbone": 0.0, "eval_every": 2, "checkpoint_every": 100,
                          "patience": 3}}
    result = train(tiny_config(**sections), tmp_path / "run", progress=False)
    # at rate 0 the model never changes: step 2 stays the best, and 3 validations later (step 8) the run stops
    assert (result.best_step, result.stopped_early, result.steps) == (2, 8, 8)
    assert "3 validations without a better one (best at step 2); stopped at step 8 of 30" in caplog.text
    assert result.beats_backbone is not None and result.backbone_val is not None
    again = train(tiny_config(**sections), tmp_path / "run", resume=True, progress=False)
    assert (again.start_step, again.steps, again.stopped_early) == (8, 8, 8)
    go_on = {**sections, "train": {**sections["train"], "patience": 0, "steps": 10}}
    assert train(tiny_config(**go_on), tmp_path / "run", resume=True, progress=False).steps == 10


def test_select_by_map_at_r_ranks_checkpoints_by_map_at_r_first():
    from deepmetric.config import build_config
    from deepmetric.errors import ConfigError
    from deepmetric.training.selection import selection_key

    coarse, smooth = {"recall@1": 0.70, "map@r": 0.33, "r_precision": 0.40}, {"recall@1": 0.65, "map@r": 0.38,
                                                                                "r_precision": 0.41}
    assert selection_key(coarse) > selection_key(smooth)
    assert selection_key(smooth, "map@r") > selection_key(coarse, "map@r")
    assert beats_backbone({"key": selection_key(smooth, "map@r")}, coarse, "map@r") is True
    with pytest.raises(ConfigError, match="train.select_by must be one of recall@1, map@r, got 'r@1'"):
        build_config({"train": {"select_by": "r@1"}})


def test_a_run_of_no_steps_is_the_model_as_built_and_says_so(tmp_path, capsys):
    code = main(["train", "--data", "digits", "--backbone", "tiny", "--out", str(tmp_path / "run"), "--quiet",
                 "train.steps=0", "model.embedding_dim=0", "model.pretrained=false", "data.image_size=16",
                 "data.classes_per_batch=3", "eval.nmi=false", "eval.baseline=true"])
    out = capsys.readouterr().out
    assert code == 0 and f"train.steps=0: nothing trained; {tmp_path / 'run'} holds the model as built" in out
    rows = [line.split()[-6:] for line in out.splitlines() if line.startswith(("untrained backbone", "trained (last"))]
    assert len(rows) == 2 and rows[0] == rows[1]  # with model.embedding_dim=0 it is the untrained backbone
