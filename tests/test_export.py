"""``deepmetric export``: every registered head through onnxruntime against PyTorch, refusals with their reason
and nothing written, the TorchScript fallback, the JSON beside the model, and the onnxruntime snippet of
docs/export.md (README's before the documentation site).

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
from deepmetric.data.images import read_image
from deepmetric.data.resizing import TEST_RESIZE_MODES
from deepmetric.data.transforms import TestTransform as ResizeForTest
from deepmetric.export import TRACE_BATCH, ExportError, export_model, metadata_path
from deepmetric.models import Embedder, create_model
from deepmetric.models.heads import HEADS, Head, HeadOutput

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

EMBEDDING_DIM = 72  # as the head contract: splits over every default learner count
SIZE = 64
BATCHES = (1, 5)  # differ from the batch the graph is traced with
REFUSED = {"deml": "connected components"}  # heads whose default setting cannot be exported, and why
EXPORT_PAGE = Path(__file__).resolve().parents[1] / "docs" / "export.md"
# the marker before the snippet's ```python block (tests/test_docs.py requires every block to be run or marked)
SNIPPET_MARKER = "<!-- run by tests/test_export.py"


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
    preprocessing = record["preprocessing"]  # all of it, to repeat without deepmetric (docs/export.md's snippet)
    assert preprocessing["order"] == ["rgb", "resize", "pad", "crop", "scale", "layout"]
    assert preprocessing["rgb"]["transparency"]["background"] == [255, 255, 255]
    assert {"I;16", "I", "F"} <= set(preprocessing["rgb"]["depth"]["modes"])
    assert {k: preprocessing["resize"][k] for k in ("fit", "size", "filter", "antialias")} == {
        "fit": "both", "size": 16, "filter": "bilinear", "antialias": True}
    assert preprocessing["pad"] is None and preprocessing["crop"] is None
    assert preprocessing["scale"]["divide_by"] == 255 and preprocessing["layout"]["layout"] == "NCHW"
    assert record["run"]["checkpoint"] == "last" and record["run"]["step"] == 2
    assert record["verified"]["max_abs_error"] <= record["verified"]["tolerance"] == 1e-4

    for argv, message in [(["--out", str(tmp_path / "model.json")], "its metadata goes to a .json beside it"),
                          (["--out", str(tmp_path / "m.onnx"), "--checkpoint", "best"], "does not exist")]:
        assert main(["export", str(tiny_run), *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error:") and message in err and "Traceback" not in err
    assert main(["export", str(tmp_path / "nothing"), "--out", str(tmp_path / "m.onnx")]) == 2
    assert "no such run directory" in capsys.readouterr().err
    assert not (tmp_path / "m.onnx").exists()
    (tmp_path / "models").mkdir()  # a folder: not the sibling models.onnx, nor the hidden models/.onnx
    for folder in (str(tmp_path / "models"), f"{tmp_path / 'new'}/"):
        assert main(["export", str(tiny_run), "--out", folder]) == 2
        assert capsys.readouterr().err == (f"error: {folder} is a folder; give the file to write, e.g. "
                                           f"{Path(folder) / 'model.onnx'}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deploy", "models"]
    assert not any((tmp_path / "models").iterdir())


def _readme_snippet() -> str:
    """The onnxruntime snippet of docs/export.md (README's until the documentation site): the ```python block right
    after its marker, as written; the page has exactly one."""
    blocks = re.findall(re.escape(SNIPPET_MARKER) + r"[^\n]*-->\n```python\n(.*?)```", EXPORT_PAGE.read_text(),
                        flags=re.S)
    assert len(blocks) == 1
    return blocks[0]


def _run_readme_snippet(folder: Path, monkeypatch) -> dict:
    """The export page's onnxruntime snippet executed in ``folder`` (holding model.onnx, model.onnx.json and
    photo.jpg); its namespace, whose ``preprocess(path)`` then prepares any image as the page does."""
    monkeypatch.chdir(folder)
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, size=(16, 16, 3), dtype=np.uint8)).save("photo.jpg")
    namespace: dict = {}
    exec(compile(_readme_snippet(), "docs/export.md onnxruntime snippet", "exec"), namespace)
    assert namespace["embedding"].shape[0] == 1
    return namespace


def _picture(height: int, width: int, seed: int) -> np.ndarray:
    """A smooth (H, W, 3) uint8 picture: three plane waves, so that resizing keeps its content."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width] / max(height, width)
    waves = [np.sin(2 * np.pi * (a * x + b * y) + c) for a, b, c in rng.uniform(0.3, 2.0, (3, 3))]
    return ((np.stack(waves, axis=-1) + 1) * 127.5).astype(np.uint8)


def _disc(height: int, width: int) -> np.ndarray:
    """Alpha: 255 in a central disc, 0 around it (as an emoji's background), a soft edge between."""
    y, x = np.mgrid[0:height, 0:width]
    radius = 2 * np.hypot((y + 0.5 - height / 2) / height, (x + 0.5 - width / 2) / width)
    return np.clip((0.85 - radius) / 0.25 * 255, 0, 255).astype(np.uint8)


MODE_IMAGES = {  # file name -> the mode PIL opens it in (and whether it is transparent anywhere)
    "rgba.png": ("RGBA", True), "rgba-small.png": ("RGBA", True), "la.png": ("LA", True),
    "palette.png": ("P", False), "palette-key.gif": ("P", True), "palette-alphas.png": ("P", True),
    "gray.png": ("L", False), "gray-key.png": ("L", True), "rgb-key.png": ("RGB", True), "bits.png": ("1", False),
    "deep.png": ("I;16", False), "deep-key.png": ("I;16", True), "deep.tif": ("I;16", False), "int32.tif": ("I", False),
    "float.tif": ("F", False), "cmyk.jpg": ("CMYK", False), "cmyk.tif": ("CMYK", False),
    "ycbcr.tif": ("YCbCr", False), "rgb.jpg": ("RGB", False),
}


def _write_mode_images(folder: Path, height: int = 23, width: int = 37) -> list[Path]:
    """One file per PIL mode a decoder gives (``MODE_IMAGES``), transparent ones with real transparency: fully
    transparent pixels (their hidden colour black, as in the emoji PNGs), half-transparent ones, colour keys."""
    folder.mkdir(parents=True, exist_ok=True)
    rgb, alpha = _picture(height, width, 1), _disc(height, width)
    hidden = np.where(alpha[..., None] > 0, rgb, 0).astype(np.uint8)
    gray = np.asarray(Image.fromarray(rgb).convert("L"))
    keyed = np.where(alpha > 0, gray, 7).astype(np.uint8)  # 7: the transparent gray
    deep = np.minimum(gray.astype(np.uint32) * 257 + np.arange(width, dtype=np.uint32) * 3, 65535).astype(np.uint16)
    palette = Image.fromarray(rgb).quantize(31)  # indices 0-30; 31 is the transparent one
    index = np.where(alpha > 0, np.asarray(palette), 31).astype(np.uint8)
    keyed_palette = Image.fromarray(index, mode="P")
    keyed_palette.putpalette(palette.getpalette()[:93] + [0, 0, 0])
    Image.fromarray(np.dstack([hidden, alpha])).save(folder / "rgba.png")
    Image.fromarray(np.dstack([hidden, alpha])[:6, :9].copy()).save(folder / "rgba-small.png")  # enlarged
    Image.fromarray(np.dstack([gray, alpha])).save(folder / "la.png")
    palette.save(folder / "palette.png")
    keyed_palette.save(folder / "palette-key.gif", transparency=31)
    keyed_palette.save(folder / "palette-alphas.png", transparency=bytes([255] * 16 + [128] * 15 + [0]))
    Image.fromarray(gray).save(folder / "gray.png")
    Image.fromarray(keyed).save(folder / "gray-key.png", transparency=7)
    Image.fromarray(np.where(alpha[..., None] > 0, rgb, [1, 2, 3]).astype(np.uint8)).save(
        folder / "rgb-key.png", transparency=(1, 2, 3))
    Image.fromarray(gray).convert("1").save(folder / "bits.png")
    Image.fromarray(deep).save(folder / "deep.png")
    Image.fromarray(np.where(alpha > 0, deep, 5).astype(np.uint16)).save(folder / "deep-key.png", transparency=5)
    Image.fromarray(deep).save(folder / "deep.tif")
    Image.fromarray(deep.astype(np.int32) // 2).save(folder / "int32.tif")
    Image.fromarray(gray.astype(np.float32) / 7 - 3).save(folder / "float.tif")
    Image.fromarray(rgb).convert("CMYK").save(folder / "cmyk.jpg", quality=95)
    Image.fromarray(rgb).convert("CMYK").save(folder / "cmyk.tif")
    Image.fromarray(rgb).convert("YCbCr").save(folder / "ycbcr.tif")
    Image.fromarray(rgb).save(folder / "rgb.jpg", quality=95)
    paths = [folder / name for name in MODE_IMAGES]
    for path in paths:
        with Image.open(path) as image:
            transparent = image.mode in ("RGBA", "LA") or "transparency" in image.info
            assert (image.mode, transparent) == MODE_IMAGES[path.name], path.name
    return paths


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_the_readme_onnxruntime_snippet_embeds_every_image_mode_as_deepmetric_embed_does(tiny_run, tmp_path,
                                                                                         monkeypatch):
    """Issue 39 item 5: README's snippet (``convert("RGB")``, PIL's default bicubic resize) embedded the emoji PNGs
    at cosine 0.18-1 (mean 0.70) to ``deepmetric embed``, which composites transparency on white and resizes
    bilinearly with antialiasing. The snippet now repeats the JSON's ``preprocessing``: on a file of every mode PIL
    decodes (RGBA, LA, palette with and without transparency, gray with and without a key, 1-bit, 16-bit with and
    without a key, 32-bit, float, CMYK, YCbCr, RGB), run as docs/export.md writes it and fed to onnxruntime, it gives
    ``deepmetric embed``'s embedding (cosine >= 0.9999), where the old recipe does not."""
    assert main(["export", str(tiny_run), "--out", str(tmp_path / "model.onnx")]) == 0
    paths = _write_mode_images(tmp_path / "images")
    snippet = _run_readme_snippet(tmp_path, monkeypatch)
    assert main(["embed", str(tiny_run), "--images", "images", "--out", "library.npy", "--quiet"]) == 0
    order = [Path(line).name for line in Path("library.paths.txt").read_text().splitlines()]
    library = dict(zip(order, np.load("library.npy"), strict=True))
    assert sorted(library) == sorted(MODE_IMAGES)
    session = ort.InferenceSession("model.onnx", providers=["CPUExecutionProvider"])
    readme = np.concatenate([session.run(None, {"images": snippet["preprocess"](path)})[0] for path in paths])
    cosines = _cosines(readme, np.stack([library[path.name] for path in paths]))
    assert cosines.min() >= 0.9999, dict(zip(MODE_IMAGES, cosines.round(6), strict=True))

    # the recipe the README gave before (convert("RGB"), PIL's default bicubic resize) fails this test
    side = snippet["meta"]["input"]["width"]
    for name in ("rgba.png", "la.png", "palette-key.gif"):
        with Image.open(tmp_path / "images" / name) as image:
            x = np.asarray(image.convert("RGB").resize((side, side)), np.float32).transpose(2, 0, 1)[None] / 255
        assert _cosines(session.run(None, {"images": x})[0], library[name][None])[0] < 0.999, name


@pytest.mark.parametrize("test_resize", TEST_RESIZE_MODES)
def test_the_readme_preprocessing_is_the_librarys_pixel_for_pixel_under_every_test_resize(test_resize, tmp_path,
                                                                                          monkeypatch):
    """The JSON's ``preprocessing`` comes from the plan ``TestTransform`` runs (``test_resize_plan``); the snippet's
    ``preprocess`` reading it gives the pixels ``read_image`` + ``TestTransform`` give (to 1/255: PIL's bilinear
    and torchvision's antialiased resize round apart) for every mode, on wide, tall, small and square images whose
    centre crops fall on a half pixel, and the exported model embeds them as the library does."""
    size = 24
    model = _model("gap")
    result = export_model(model, tmp_path / "model.onnx", image_size=size, test_resize=test_resize)
    record = json.loads(result.metadata.read_text())["preprocessing"]
    transform = ResizeForTest(size, test_resize)
    assert {k: record[k] and {key: record[k][key] for key in transform.plan[k]}
            for k in ("resize", "pad", "crop")} == transform.plan
    paths = [*_write_mode_images(tmp_path / "wide"), *_write_mode_images(tmp_path / "tall", 41, 19)[:4],
             *_write_mode_images(tmp_path / "square", 29, 29)[:2], *_write_mode_images(tmp_path / "tiny", 5, 8)[:2]]
    snippet = _run_readme_snippet(tmp_path, monkeypatch)
    session = ort.InferenceSession("model.onnx", providers=["CPUExecutionProvider"])
    for path in paths:
        expected = transform(read_image(path))[None]
        got = snippet["preprocess"](path)
        assert got.dtype == np.float32 and got.shape == tuple(expected.shape) == (1, 3, size, size), path
        assert np.abs(got - expected.numpy()).max() <= 1 / 255 + 1e-6, path
        cosine = _cosines(session.run(None, {"images": got})[0], model.embed(expected).numpy())
        assert cosine.min() >= 0.9999, (path, cosine)


def test_every_transparent_pixel_becomes_white_whatever_the_mode(tmp_path):
    """One path for every mode (``to_rgb``): an alpha band, a palette's transparent index or alpha table, a gray,
    16-bit or RGB colour key are all composited on white (a colour-keyed gray, RGB or 16-bit PNG kept its key
    colour before, while a keyed palette image was composited)."""
    for path in _write_mode_images(tmp_path):
        if MODE_IMAGES[path.name][1] and path.name != "rgba-small.png":
            rgb = read_image(path)
            transparent = _disc(*rgb.shape[:2]) == 0
            assert (rgb[transparent] == 255).all(), path.name
            assert (rgb[~transparent] < 255).any(), path.name


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


def test_export_never_replaces_a_file_that_is_not_a_model_of_its_format(tiny_run, tmp_path, capsys):
    """Issue 53 items 20 and 26: ``--out`` without the format's suffix overwrote any file there (another run's
    checkpoint, an index's faiss file, which then failed to load, ``notes.txt``) and wrote ``X.json`` beside it;
    ``--out ''`` said ``  is a folder``; ``--out m.onnx.json`` suggested ``m.onnx.onnx``."""
    other_run = tmp_path / "other" / "checkpoints"
    other_run.mkdir(parents=True)
    kept = {other_run / "last.safetensors": b"another run's checkpoint", tmp_path / "faiss-1.index": b"IxF2 faiss",
            tmp_path / "notes.txt": b"my notes", tmp_path / "model.v2": b"an older export of mine"}
    for file, data in kept.items():
        file.write_bytes(data)
    for file in kept:
        assert main(["export", str(tiny_run), "--out", str(file)]) == 0
        written = file.with_name(file.name + ".onnx")
        assert f"exported onnx to {written}" in capsys.readouterr().out
        assert written.is_file() and metadata_path(written).is_file() and not metadata_path(file).exists()
    assert all(file.read_bytes() == data for file, data in kept.items())
    for out, message in (("", r"^error: --out is empty; give the file to write, e.g. model.onnx$"),
                         (str(tmp_path / "m.onnx.json"), rf"give e.g. {tmp_path / 'm.onnx'} \(its metadata: "
                                                         r"m.onnx.json\)$"),
                         (str(tmp_path / "m.json"), rf"give e.g. {tmp_path / 'm.onnx'} ")):
        assert main(["export", str(tiny_run), "--out", out]) == 2
        assert re.search(message, capsys.readouterr().err.strip()), out
