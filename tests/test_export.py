"""``deepmetric export``: every registered head through onnxruntime against PyTorch, refusals with their reason
and nothing written, the TorchScript fallback, the JSON beside the model, and the README's onnxruntime snippet.

Heads are built as ``tests/test_head_contract.py`` builds them (tiny trunk, random weights, default options, 64-px
images), exported with a batch of 2 and run by onnxruntime here, independently of the exporter's own check, on
batches of 1 and 5.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from deepmetric.cli import main
from deepmetric.export import TRACE_BATCH, ExportError, export_model
from deepmetric.models import Embedder, create_model
from deepmetric.models.heads import HEADS, Head, HeadOutput

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

EMBEDDING_DIM = 72  # as the head contract: splits over every default learner count
SIZE = 64
BATCHES = (1, 5)  # differ from the batch the graph is traced with
REFUSED = {"deml": "connected components"}  # heads whose default setting cannot be exported, and why
README = Path(__file__).resolve().parents[1] / "README.md"


def _model(head: str, **options) -> Embedder:
    torch.manual_seed(0)
    return create_model(backbone="tiny", head=head, embedding_dim=EMBEDDING_DIM, pretrained=False, **options).eval()


def _images(batch: int, seed: int = 3) -> torch.Tensor:
    return torch.rand(batch, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(seed + batch))


def _onnx_max_error(model: Embedder, path: Path) -> float:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["images"] and session.get_inputs()[0].shape[0] == "batch"
    worst = 0.0
    for batch in BATCHES:
        images = _images(batch)
        got = session.run(None, {"images": images.numpy()})[0]
        expected = model.embed(images).numpy()
        assert got.shape == expected.shape == (batch, model.embedding_dim)
        worst = max(worst, float(np.abs(got - expected).max()))
    return worst


@pytest.mark.parametrize("head", list(HEADS))
def test_every_head_exports_to_onnx_and_matches_pytorch_at_other_batch_sizes(head, tmp_path):
    assert TRACE_BATCH not in BATCHES
    model = _model(head)
    out = tmp_path / f"{head}.onnx"
    if head in REFUSED:
        with pytest.raises(ExportError, match=REFUSED[head]) as refused:
            export_model(model, out, image_size=SIZE)
        assert f"head '{head}'" in str(refused.value) and "\n" not in str(refused.value)
        assert not list(tmp_path.iterdir()), "a refused export left files behind"
        return
    result = export_model(model, out, image_size=SIZE)
    assert result.model == out and result.metadata == tmp_path / f"{head}.onnx.json"
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{head}.onnx", f"{head}.onnx.json"]  # no temporary left
    assert _onnx_max_error(model, out) <= 1e-4
    record = json.loads(result.metadata.read_text())
    assert record["output"]["shape"] == ["batch", model.embedding_dim] and record["model"]["head"] == head


def test_the_refused_heads_are_exactly_those_that_say_why():
    """A head refused by ``export_blocker`` is listed in REFUSED; every other default head exports (above)."""
    assert {name for name in HEADS if _model(name).head.export_blocker()} == set(REFUSED)


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:FutureWarning")
@pytest.mark.parametrize("options, operator", [({"matrix_norm": "power"}, "linalg_eigh"),
                                               ({"factorization": "tensor_sketch", "sketch_dim": 64}, "fft_rfft")])
def test_an_operator_onnx_lacks_is_named_and_torchscript_takes_the_head(options, operator, tmp_path):
    model = _model("bilinear", **options)
    with pytest.raises(ExportError, match=rf"cannot be expressed in ONNX: operator {operator}.*--format torchscript"):
        export_model(model, tmp_path / "m.onnx", image_size=SIZE)
    assert not list(tmp_path.iterdir())
    result = export_model(model, tmp_path / "m", format="torchscript", image_size=SIZE)
    assert result.model == tmp_path / "m.pt" and result.max_error <= 1e-4
    loaded = torch.jit.load(str(result.model))
    for batch in BATCHES:
        torch.testing.assert_close(loaded(_images(batch)), model.embed(_images(batch)), atol=1e-4, rtol=0)
    assert json.loads((tmp_path / "m.pt.json").read_text())["format"] == "torchscript"


def test_single_scale_deml_has_no_crop_and_exports(tmp_path):
    model = _model("deml", num_scales=1)
    export_model(model, tmp_path / "m.onnx", image_size=SIZE)
    assert _onnx_max_error(model, tmp_path / "m.onnx") <= 1e-4


def test_without_the_onnx_extra_the_install_command_is_named(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)  # import onnx now raises ImportError
    with pytest.raises(ExportError, match=r"pip install 'deepmetric\[onnx\]'"):
        export_model(_model("gap"), tmp_path / "m.onnx", image_size=SIZE)
    assert not list(tmp_path.iterdir())


def test_weights_beyond_what_one_onnx_file_holds_are_sent_to_torchscript(tmp_path, monkeypatch):
    import deepmetric.export

    monkeypatch.setattr(deepmetric.export, "ONNX_LIMIT", 1000)  # bytes: the tiny model has more
    with pytest.raises(ExportError, match=r"one ONNX file holds at most 2 GiB: export it with --format torchscript"):
        export_model(_model("gap"), tmp_path / "m.onnx", image_size=SIZE)
    assert not list(tmp_path.iterdir())


def test_exporting_leaves_the_callers_model_as_it_was(tmp_path):
    model = _model("gap").set_channels_last(True).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    export_model(model, tmp_path / "m.onnx", image_size=SIZE)
    assert model.training and model.channels_last
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


class _HostStepHead(Head):
    """A head whose embedding depends on a value computed outside torch (as DeML's boxes): a trace freezes it."""

    embedding_dim = 4

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 4)

    def forward(self, features: torch.Tensor) -> HeadOutput:
        pooled = features.mean(dim=(2, 3))
        shift = float(np.median(pooled.detach().numpy()))  # leaves torch: a constant in any trace
        embedding = torch.nn.functional.normalize(self.linear(pooled - shift), dim=1)
        return HeadOutput(embedding=embedding, parts=[embedding])


def test_a_forward_pass_a_trace_freezes_is_caught_by_the_check_and_nothing_is_written(tmp_path):
    trunk = torch.nn.Conv2d(3, 8, 3)
    model = Embedder(trunk, _HostStepHead(), (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), False, {"head": "host-step"}).eval()
    for format in ("onnx", "torchscript"):
        with pytest.raises(ExportError, match=r"differs from PyTorch by .* a trace freezes"):
            export_model(model, tmp_path / "m", format=format, image_size=16)
    assert not list(tmp_path.iterdir())


def test_the_cli_exports_a_run_and_writes_its_json(tiny_run, tmp_path, capsys):
    out = tmp_path / "deploy" / "model.onnx"
    assert main(["export", str(tiny_run), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"exported onnx to {out}" in printed and "differ from PyTorch's by at most" in printed
    record = json.loads(out.with_name("model.onnx.json").read_text())
    assert record["input"] == {"name": "images", "shape": ["batch", 3, 16, 16], "height": 16, "width": 16,
                               "dtype": "float32", "layout": "NCHW", "channels": "RGB", "range": [0.0, 1.0]}
    assert record["preprocessing"]["test_resize"] == "resize" and record["normalization"]["inside_model"]
    assert record["run"]["checkpoint"] == "last" and record["run"]["step"] == 2
    assert record["verified"]["max_abs_error"] <= record["verified"]["tolerance"] == 1e-4

    for argv, message in [(["--out", str(tmp_path / "model.json")], "its metadata goes to a .json beside it"),
                          (["--out", str(tmp_path / "m.onnx"), "--checkpoint", "best"], "does not exist")]:
        assert main(["export", str(tiny_run), *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error:") and message in err and "Traceback" not in err
    assert main(["export", str(tmp_path / "nothing"), "--out", str(tmp_path / "m.onnx")]) == 2
    assert "not a run directory" in capsys.readouterr().err
    assert not (tmp_path / "m.onnx").exists()


def test_the_readme_onnxruntime_snippet_embeds_an_image_as_deepmetric_embed_does(tiny_run, tmp_path, monkeypatch,
                                                                                 capsys):
    """README's ```python onnx block, run as written in a folder holding model.onnx, model.onnx.json and photo.jpg."""
    blocks = re.findall(r"```python onnx\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) == 1 and len(blocks[0].strip().splitlines()) <= 5
    monkeypatch.chdir(tmp_path)
    assert main(["export", str(tiny_run), "--out", "model.onnx"]) == 0
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, size=(16, 16, 3), dtype=np.uint8)).save("photo.jpg")
    namespace: dict = {}
    exec(compile(blocks[0], "README.md onnxruntime snippet", "exec"), namespace)
    assert main(["embed", str(tiny_run), "--images", "photo.jpg", "--out", "photo.npy", "--quiet"]) == 0
    np.testing.assert_allclose(namespace["embedding"], np.load("photo.npy"), atol=1e-4, rtol=0)


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_export_refuses_to_overwrite_the_runs_own_files(tiny_run, tmp_path, capsys):
    """Issue 39: ``export RUN --out RUN/checkpoints/last.safetensors`` exited 0 and replaced the run's only checkpoint
    with the ONNX file. Nothing the run owns (its checkpoints folder, config, logs, metrics, report, ...) may be an
    export's model or metadata file, however the path is spelled; a file of one's own beside the run is fine."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    (tmp_path / "link").symlink_to(run)
    before = _files(run)
    refused = [(run / "checkpoints" / "last.safetensors", "onnx"), (run / "checkpoints" / "last.safetensors",
               "torchscript"), (run / "checkpoints" / "best", "onnx"), (run / "checkpoints" / "model.onnx", "onnx"),
               (run / "config.yaml", "onnx"), (run / "metrics.jsonl", "torchscript"), (run / "report.html", "onnx"),
               (run / "mirage-latent2d.png", "onnx"), (run / "environment.json.damaged", "onnx"),
               (run / "nothing" / ".." / "checkpoints" / "last.safetensors", "onnx"),
               (tmp_path / "link" / "checkpoints" / "last.safetensors", "onnx"), (tmp_path / "link" / "config.yaml",
                                                                                  "torchscript")]
    for out, format in refused:
        assert main(["export", str(run), "--out", str(out), "--format", format]) == 2, out
        err = capsys.readouterr().err
        assert err.startswith("error:") and "Traceback" not in err and "the run's own" in err, err
        assert _files(run) == before, f"--out {out} changed the run"
    assert main(["export", str(run), "--out", str(run / "deploy.onnx")]) == 0  # beside the run's files: fine
    # metrics.pt's metadata is metrics.pt.json (with one shared stem it was metrics.json, the run's test metrics)
    assert main(["export", str(run), "--out", str(run / "metrics"), "--format", "torchscript"]) == 0
    after = _files(run)
    assert {name: after[name] for name in before} == before
    assert set(after) - set(before) == {"deploy.onnx", "deploy.onnx.json", "metrics.pt", "metrics.pt.json"}


def test_each_exported_file_has_its_own_metadata(tmp_path):
    """Issue 39: ``m.onnx`` then ``m.pt`` shared one ``m.json``, which then described the TorchScript file. Each file's
    metadata is ``<file>.json``; a suffix of the other format is refused."""
    model = _model("gap")
    onnx = export_model(model, tmp_path / "m.onnx", image_size=SIZE)
    script = export_model(model, tmp_path / "m.pt", format="torchscript", image_size=SIZE)
    assert (onnx.metadata, script.metadata) == (tmp_path / "m.onnx.json", tmp_path / "m.pt.json")
    for result, format in ((onnx, "onnx"), (script, "torchscript")):
        record = json.loads(result.metadata.read_text())
        assert record["format"] == format and record["file"] == result.model.name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.json", "m.pt", "m.pt.json"]
    for out, format in (("x.pt", "onnx"), ("x.onnx", "torchscript")):
        with pytest.raises(ExportError, match=rf"--out .*{out}.*--format {format}"):
            export_model(model, tmp_path / out, format=format, image_size=SIZE)
    assert not list(tmp_path.glob("x*"))
