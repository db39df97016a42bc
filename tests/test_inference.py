"""``eval.amp`` and ``eval.compile`` (issue 52 item 5): every embedding pass (``evaluate``, ``embed``, ``index``,
``search``, ``serve``, ``TrainedRun.embed``) may run under bf16/fp16 autocast and through ``torch.compile``; the
embeddings stay float32 and l2-normalised, float32-eager is the default, and a model that cannot be compiled embeds
eagerly after one warning. Compiled with the ``aot_eager`` backend (the graphs inductor compiles, without minutes of
code generation); the speed is measured by ``benchmarks/inference_speed.py``."""

from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

import deepmetric
import deepmetric.models.compiled as compiled
from deepmetric.cli import main
from deepmetric.config import RunConfig
from deepmetric.config.validate import validate as validate_config
from deepmetric.errors import ConfigError
from deepmetric.evaluation import EmbedSettings
from deepmetric.evaluation.evaluator import embed_table
from deepmetric.models import create_model
from deepmetric.models.inference import InferenceForward

pytestmark = pytest.mark.usefixtures("aot_eager_compile")


@pytest.fixture
def tiny_model():
    return create_model(backbone="tiny", head="gap", embedding_dim=16, pretrained=False).eval()


def embed(model, table, **settings):
    return embed_table(model, table, EmbedSettings(image_size=24, progress=False, **settings))


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_autocast_embeddings_are_float32_unit_rows_near_float32s_but_not_float32s(tiny_model, blob_table, amp):
    plain = embed(tiny_model, blob_table)
    low = embed(tiny_model, blob_table, amp=amp)
    assert low.dtype == np.float32 and low.shape == plain.shape
    np.testing.assert_allclose(np.linalg.norm(low, axis=1), 1.0, atol=1e-5)
    assert np.abs(low - plain).max() < 0.05  # bf16 keeps 8 bits of mantissa, fp16 11
    assert not np.array_equal(low, plain)  # the autocast did act


def test_autocast_reaches_the_convolutions(tiny_model):
    seen = []
    handle = next(m for m in tiny_model.modules() if isinstance(m, torch.nn.Conv2d)).register_forward_hook(
        lambda module, inputs, output: seen.append(output.dtype))
    InferenceForward(tiny_model, "cpu", "bf16")(torch.rand(2, 3, 24, 24))
    InferenceForward(tiny_model, "cpu")(torch.rand(2, 3, 24, 24))
    handle.remove()
    assert seen == [torch.bfloat16, torch.float32]


def test_compiled_embeddings_are_the_eager_ones(tiny_model, blob_table, caplog):
    from torch._dynamo.utils import counters

    caplog.set_level(logging.WARNING, logger="deepmetric")
    eager = embed(tiny_model, blob_table, batch_size=20)
    counters.clear()
    compiled_rows = embed(tiny_model, blob_table, batch_size=20, compile=True)
    assert counters["stats"]["unique_graphs"] >= 1 and "cannot be compiled" not in caplog.text
    np.testing.assert_allclose(compiled_rows, eager, atol=1e-5)
    assert not any(name.startswith("_orig_mod") for name in tiny_model.state_dict())  # the model left as it was


def test_a_model_that_cannot_be_compiled_warns_once_and_embeds_eagerly_from_then_on(tiny_model, blob_table,
                                                                                     monkeypatch, caplog):
    backend_calls = {"n": 0}

    def failing_backend(graph, example_inputs):
        backend_calls["n"] += 1
        raise RuntimeError("no C++ compiler here")

    monkeypatch.setattr(compiled, "BACKEND", failing_backend)
    caplog.set_level(logging.WARNING, logger="deepmetric")
    rows = embed(tiny_model, blob_table, batch_size=10, compile=True)
    tries = backend_calls["n"]
    again = embed(tiny_model, blob_table, batch_size=10, compile=True)  # a second pass, as the next validation
    assert tries >= 1 and backend_calls["n"] == tries  # the model is not compiled (and failed) again
    np.testing.assert_array_equal(again, rows)
    warnings = [r.getMessage() for r in caplog.records if "cannot be compiled" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("eval.compile:") and "embedding eagerly" in warnings[0]
    assert "no C++ compiler here" in warnings[0]
    np.testing.assert_array_equal(rows, embed(tiny_model, blob_table, batch_size=10))


def test_the_settings_come_from_eval_amp_and_eval_compile_and_bad_values_name_the_key():
    config = RunConfig()
    assert (EmbedSettings.from_config(config, "cpu").amp, EmbedSettings.from_config(config, "cpu").compile) == (
        None, False)  # float32, eager: the default
    config.eval.amp, config.eval.compile = True, True  # ``true`` means bf16, as for train.amp
    validate_config(config)
    assert config.eval.amp == "bf16"
    settings = EmbedSettings.from_config(config, "cpu")
    assert (settings.amp, settings.compile) == ("bf16", True)
    config.eval.amp = "fp8"
    with pytest.raises(ConfigError, match=r"eval\.amp must be one of fp16, bf16.*'fp8'"):
        validate_config(config)
    with pytest.raises(ValueError, match="amp must be one of"):
        InferenceForward(torch.nn.Identity(), "cpu", "float16")


def test_embed_index_search_and_evaluate_take_amp_and_compile(tiny_run, tmp_path, capsys):
    images = tmp_path / "images"
    images.mkdir()
    rng = np.random.default_rng(0)
    for i in range(6):
        Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(images / f"{i}.png")
    assert main(["embed", str(tiny_run), "--images", str(images), "--out", str(tmp_path / "f32.npy"), "--quiet"]) == 0
    assert main(["embed", str(tiny_run), "--images", str(images), "--out", str(tmp_path / "bf16.npy"), "--quiet",
                 "--amp", "bf16", "--compile"]) == 0
    plain, low = np.load(tmp_path / "f32.npy"), np.load(tmp_path / "bf16.npy")
    assert low.dtype == np.float32 and np.abs(low - plain).max() < 0.05 and not np.array_equal(low, plain)

    index = tmp_path / "index"
    assert main(["index", str(tiny_run), "--images", str(images), "--out", str(index), "--quiet", "--amp", "bf16"]) == 0
    capsys.readouterr()
    assert main(["search", str(index), "--image", str(images / "3.png"), "--k", "1", "--json", "--device", "cpu",
                 "--amp", "bf16", "--compile"]) == 0
    assert json.loads(capsys.readouterr().out)["results"][0]["name"] == "3.png"  # the query finds itself

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    assert main(["evaluate", str(run), "--quiet"]) == 0
    before = {name: (run / name).read_bytes() for name in ("config.yaml", "metrics.json")}
    assert "embedding" not in json.loads(before["metrics.json"])  # float32 eager, the default: as before
    assert main(["evaluate", str(run), "--quiet", "--amp", "fp16"]) == 0
    record = json.loads((run / "metrics-fp16.json").read_text())  # another precision: a file of its own
    assert record["embedding"] == {"amp": "fp16", "compile": False}  # the record says how it was embedded
    assert (run / "per-query-fp16.npz").is_file() and (run / "metrics.json").read_bytes() == before["metrics.json"]
    assert main(["evaluate", str(run), "--quiet", "--compile"]) == 0  # the run's precision: its own record
    assert json.loads((run / "metrics.json").read_text())["embedding"] == {"amp": None, "compile": True}
    assert (run / "config.yaml").read_bytes() == before["config.yaml"]  # the run's own setting is not changed


def test_a_trained_run_embeds_with_its_inference_settings(tiny_run, blob_table):
    run = deepmetric.load_run(tiny_run, device="cpu")
    batch = torch.rand(3, 3, 16, 16)
    plain = run.forward(batch).embedding
    assert run.set_inference(amp="bf16") is run and run.forward is run.forward  # one forward while nothing changes
    low = run.forward(batch).embedding
    assert low.dtype == torch.float32 and torch.allclose(low, plain, atol=0.05) and not torch.equal(low, plain)
    torch.testing.assert_close(low.norm(dim=1), torch.ones(3))  # normalised again in float32
    files = [np.full((16, 16, 3), 60 * i, np.uint8) for i in range(3)]
    assert not np.array_equal(run.embed(files), run.set_inference(amp=False).embed(files))
    with pytest.raises(ConfigError, match="amp must be one of"):
        run.set_inference(amp="half")
    with pytest.raises(ConfigError, match="compile must be True or False"):
        run.set_inference(compile="yes")
