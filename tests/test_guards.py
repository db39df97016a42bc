"""Guards that hand-made bugs slipped past (issue 53 item 27): each test here fails on the bug named in its docstring
(checked by making the bug; docs/testing.md lists them). Item (a), ``is_built`` ignoring the MD5 in ``meta.json``, is
``test_download.py::test_a_build_of_ours_that_is_damaged_or_of_another_archive_is_replaced``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import deepmetric
from deepmetric.cli import main
from deepmetric.errors import IndexStoreError
from deepmetric.runs.folder import RunDir
from deepmetric.training import train
from helpers import tiny_config
from serve_helpers import make_gallery


@pytest.fixture(scope="module")
def run_with_best(tmp_path_factory):
    """A tiny run with a validation split whose ``best`` (step 2) is not its ``last`` (step 4)."""
    out = tmp_path_factory.mktemp("best") / "run"
    config = tiny_config(train={"steps": 4, "eval_every": 2, "checkpoint_every": 2}, data={"val_fraction": 0.4})
    train(config, out, progress=False)
    return out


def test_load_run_takes_the_chosen_checkpoint_by_default(run_with_best):
    """(b) ``load_run``'s default checkpoint changed from ``auto`` to ``last``: the only fixture had no ``best``."""
    run = RunDir(run_with_best)
    assert run.best.is_file() and run.last.is_file()
    loaded = deepmetric.load_run(run_with_best, device="cpu")
    assert loaded.checkpoint == run.best == run.checkpoint("auto")
    assert deepmetric.load_run(run_with_best, "last", device="cpu").checkpoint == run.last
    assert loaded.step != deepmetric.load_run(run_with_best, "last", device="cpu").step


def test_an_index_opened_with_another_run_is_refused(tiny_run, run_with_best, tmp_path):
    """(c) ``Index.open(path, run=other)`` no longer checking that the run is the index's model: it would embed
    queries with another model than the gallery's."""
    make_gallery(tmp_path / "gallery", 4)
    own = deepmetric.load_run(tiny_run, device="cpu")
    deepmetric.Index.build(own, tmp_path / "gallery", tmp_path / "index")
    other = deepmetric.load_run(run_with_best, device="cpu")  # the same widths, another checkpoint
    assert other.embedding_dim == own.embedding_dim
    with pytest.raises(IndexStoreError):
        deepmetric.Index.open(tmp_path / "index", run=other)
    assert len(deepmetric.Index.open(tmp_path / "index", run=own)) == 4


def test_an_option_newly_added_to_a_finished_variant_is_a_changed_setting(tmp_path):
    """(d) the study's changed-settings check missing an option newly added to a finished variant (only a value
    changed on an existing key was tested)."""
    import yaml

    from deepmetric.errors import ConfigError
    from deepmetric.studies import load_study, run_study

    (tmp_path / "base.yaml").write_text(yaml.safe_dump(tiny_config(train={"steps": 2}).to_dict()))
    study = {"name": "tiny", "base": "base.yaml", "out": str(tmp_path / "out"), "variants": {"gap": {}}}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    run_study(load_study(tmp_path / "study.yaml"), progress=False)
    study["variants"]["gap"] = {"loss.options": {"negative_weight": 30.0}}  # an option the run never had
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    with pytest.raises(ConfigError, match=r"gap/0 \(.*loss.options.negative_weight: \(none\) -> 30.0\)"):
        run_study(load_study(tmp_path / "study.yaml"), progress=False)


def test_an_index_written_to_a_relative_folder_stays_movable(tiny_run, tmp_path, monkeypatch):
    """(e) ``create_index`` not resolving a relative folder: an index saved to a relative path kept absolute
    sources, and stopped finding its gallery once moved with it."""
    monkeypatch.chdir(tmp_path)
    make_gallery(Path("site") / "gallery", 3)
    assert main(["index", str(tiny_run), "--images", "site/gallery", "--out", "site/index", "--quiet"]) == 0
    stored = json.loads(Path("site/index/index.json").read_text())
    assert stored["sources"] == ["../gallery"]  # kept relative to the index folder
    shutil.move("site", "moved")
    index = deepmetric.Index.open("moved/index", device="cpu")
    assert index.image_path(0).is_file() and str(tmp_path / "moved") in str(index.image_path(0).resolve())


def test_the_export_json_gives_mean_and_std_each_as_the_model_applies_it(tmp_path):
    """(f) ``mean`` and ``std`` swapped in the export JSON's ``normalization``: the tiny backbone's are both 0.5, so
    a model with distinct ones is exported, and an image normalised by the JSON gives the model's embedding."""
    from deepmetric.export import export_model
    from deepmetric.models import Embedder
    from deepmetric.models.heads.gap import GAPHead

    torch.manual_seed(0)
    trunk = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU())
    head = GAPHead(torch.nn.Identity(), in_channels=8, embedding_dim=4)
    mean, std = (0.1, 0.2, 0.3), (0.6, 0.5, 0.4)
    model = Embedder(trunk, head, mean, std, False, {"head": "gap"}).eval()
    result = export_model(model, tmp_path / "m", format="torchscript", image_size=8)
    record = json.loads(result.metadata.read_text())
    normalization = record["normalization"]
    assert normalization["mean"] == pytest.approx(list(mean)) and normalization["std"] == pytest.approx(list(std))
    image = torch.rand(1, 3, 8, 8)
    expected = model.head(model.trunk((image - torch.tensor(mean).view(1, 3, 1, 1))
                                      / torch.tensor(std).view(1, 3, 1, 1))).embedding
    normalised = (image - torch.tensor(normalization["mean"]).view(1, 3, 1, 1)) / torch.tensor(
        normalization["std"]).view(1, 3, 1, 1)
    np.testing.assert_allclose(model.head(model.trunk(normalised)).embedding.detach().numpy(),
                               expected.detach().numpy(), rtol=1e-6)
