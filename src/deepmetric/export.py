"""``deepmetric export``: a run's embedder as a file that runs without deepmetric (ONNX, or TorchScript where ONNX
cannot express a head), with a JSON beside it saying what to feed it.

The exported graph is the ``Embedder`` in eval mode from the checkpoint ``deepmetric evaluate`` would use: RGB
images in [0, 1] (B, 3, H, W) -> (B, D) embeddings, with the backbone's normalisation (mean/std, channel order)
inside the graph and a free batch dimension; H x W is the run's ``data.image_size``. The JSON (``model.onnx.json``
beside ``model.onnx``, ``model.pt.json`` beside ``model.pt``: each file its own) gives that input size, everything
``deepmetric embed`` does to an image file before the graph (``preprocessing``: any PIL mode to RGB with
transparency on white, ``data.images.RGB_CONVERSION``; the resize, pad and crop of ``data.test_resize``, from the
plan ``TestTransform`` runs; / 255, NCHW), the normalisation the graph applies, the output and where the weights came
from.

Exporters. ONNX goes through torch's TorchScript-based exporter (``torch.onnx.export(..., dynamo=False)``, opset
17): it needs the ``onnx`` package only, exports every head below but DeML in about a second on the test trunk and
agrees with PyTorch to ~1e-6, where the ``torch.export``-based one also needs ``onnxscript``, took 2-5 s per head
and drifted to 6e-5 on second-order pooling. Operators ONNX has no counterpart for (``linalg_eigh`` of
``matrix_norm=power``, the FFT of ``factorization=tensor_sketch``) are refused naming the operator and pointing at
``--format torchscript``, which traces the same graph (``torch.jit.trace``) into an archive that ``torch.jit.load``
(Python or C++ libtorch) runs.

Nothing unverified is written: the exported file is first written to a temporary name, run (onnxruntime, or
``torch.jit.load``) on batches of sizes other than the one it was traced with and compared with PyTorch's
embeddings (``TOLERANCE``); only then are it and its JSON renamed into place. ``export_run`` never writes over the
run's own files (``RunDir.owns``: its checkpoints folder, config, logs, metrics, report): an ``--out`` there is
refused before the checkpoint is read. That check is what catches a
forward pass a trace silently freezes (a Python ``len(x)``, a box computed in NumPy). A head whose forward leaves
torch says so through ``Head.export_blocker`` and is refused before anything is traced.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.metadata
import re
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .data.images import RGB_CONVERSION
from .data.resizing import test_resize_plan
from .errors import DeepMetricError
from .io.files import atomic_path, check_writable, refuse_folder
from .io.strict import to_json
from .models import Embedder
from .provenance import software
from .runs.checkpoint import checkpoint_state
from .runs.folder import RunDir
from .runs.model import load_run_model

EXPORT_FORMATS = {"onnx": ".onnx", "torchscript": ".pt"}
"""``--format`` choices and the suffix each file gets."""
ONNX_OPSET = 17
"""ONNX operator set of the exported graph (onnxruntime >= 1.14 runs it)."""
TRACE_BATCH = 2
"""Batch size the graph is traced with; ``VERIFY_BATCHES`` differ from it, so a frozen batch size shows."""
VERIFY_BATCHES = (1, 3)
TOLERANCE = 1e-4
"""Largest absolute difference allowed between the exported model's embeddings and PyTorch's."""
INPUT_NAME, OUTPUT_NAME = "images", "embedding"
ONNX_LIMIT = 2**31 - 2**26
"""Weights (bytes) an ONNX file can hold: protobuf's 2 GiB, less room for the graph (larger models would need
external data files beside the .onnx, which the atomic write does not move)."""

RESIZE_POLICIES = {
    "resize": "resize the image to H x W (the aspect ratio is not kept)",
    "resize_crop": "resize to ceil(1.144 H) x ceil(1.144 W), then crop the centre H x W",
    "pad_crop": "scale the longer side to round(256/224 H) keeping the aspect ratio, pad the shorter side with "
                "black to a square, crop the centre H x W",
    "stretch_crop": "resize to round(256/224 H) x round(256/224 W) (the aspect ratio is not kept), crop the "
                    "centre H x W",
    "short_crop": "scale the shorter side to round(256/224 H) keeping the aspect ratio, crop the centre H x W",
}
"""What each ``data.test_resize`` does to an image before the model, in words (``data/transforms.py``)."""


class ExportError(DeepMetricError):
    """A model that cannot be exported in the format asked for; the message says why and what to do."""


@dataclass
class ExportResult:
    """What ``export_run`` wrote and how well the file agrees with PyTorch."""

    model: Path
    metadata: Path
    format: str
    embedding_dim: int
    image_size: int
    max_error: float
    seconds: float


class EmbeddingGraph(nn.Module):
    """The graph that is exported: (B, 3, H, W) RGB in [0, 1] -> (B, D), the ``Embedder``'s ``embedding`` only
    (its attention maps and extras are left out, and with them the work only they need)."""

    def __init__(self, model: Embedder):
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model(images).embedding


def metadata_path(model_file: str | Path) -> Path:
    """The JSON that describes ``model_file``: its whole name plus ``.json`` (``m.onnx`` -> ``m.onnx.json``), so an
    ONNX and a TorchScript export of the same stem each keep their own."""
    path = Path(model_file)
    return path.with_name(path.name + ".json")


def output_paths(out: str | Path, format: str) -> tuple[Path, Path]:
    """The model file and its JSON beside it. The model file always ends with the format's suffix: ``out`` with
    another ending gets the suffix added (``m`` -> ``m.onnx``, ``m.v2`` -> ``m.v2.onnx``, ``notes.txt`` ->
    ``notes.txt.onnx``), so an export never replaces a file that is not a model of that format (another run's
    checkpoint, an index's faiss file, a text: each was overwritten)."""
    if format not in EXPORT_FORMATS:
        raise ExportError(f"export format must be one of {', '.join(EXPORT_FORMATS)}, got '{format}'")
    suffix = EXPORT_FORMATS[format]
    if not str(out).strip():
        raise ExportError(f"--out is empty; give the file to write, e.g. model{suffix}")
    refuse_folder(out, f"model{suffix}")
    path = Path(out)
    if path.suffix == ".json":
        model_file = path.with_suffix("")
        model_file = model_file if model_file.suffix == suffix else model_file.with_name(model_file.name + suffix)
        raise ExportError(f"--out {path} would be the model file; its metadata goes to a .json beside it, so give "
                          f"e.g. {model_file} (its metadata: {metadata_path(model_file).name})")
    other = {suffix: name for name, suffix in EXPORT_FORMATS.items() if name != format}
    if path.suffix in other:
        raise ExportError(f"--out {path} names a {other[path.suffix]} file but --format {format} was asked for; give "
                          f"{path.with_suffix(suffix)} or --format {other[path.suffix]}")
    if path.suffix != suffix:
        path = path.with_name(path.name + suffix)
    return path, metadata_path(path)


def check_outside_run(run_dir: str | Path, out: str | Path, format: str) -> None:
    """Refuse an ``--out`` that names one of the run's own files (``RunDir.owns``), or whose model or metadata file
    would be one (``RUN/config.yaml`` is refused, not turned into ``RUN/config.yaml.onnx``)."""
    run = RunDir(run_dir)
    written = output_paths(out, format)  # an empty or folder --out is refused first, as such
    for path in (Path(out), *written):
        if run.owns(path):
            raise ExportError(f"--out {path} is one of the run's own files (inside {run.path}: its checkpoints/, "
                              "config, logs, metrics or report); exporting there would destroy or be overwritten by "
                              f"the run: give a path elsewhere, e.g. {run.path / ('model' + EXPORT_FORMATS[format])}")


def _describe(model: Embedder) -> str:
    """``head 'bilinear' (matrix_norm=power, ...)``: the head and its options, for messages."""
    options = ", ".join(f"{k}={v}" for k, v in sorted(model.spec.get("head_options", {}).items()))
    return f"head '{model.spec.get('head')}'" + (f" ({options})" if options else "")


@contextlib.contextmanager
def _quiet_tracing() -> Iterator[None]:
    """torch's TorchScript-based exporters warn that they are deprecated (and tracer warnings about Python values);
    the export checks its own result, so those warnings would only be noise to a user."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export.*")
        yield


def _unsupported_operator(error: Exception) -> str | None:
    """The ``aten::`` operator an ONNX export error names, if it names one."""
    found = re.search(r"aten::(\w+)", str(error))
    return found.group(1) if found else None


def _trace_onnx(graph: EmbeddingGraph, example: torch.Tensor, path: Path, what: str) -> None:
    try:
        import onnx  # noqa: F401  (torch's exporter writes the file through it)
    except ImportError:
        raise ExportError("ONNX export needs the onnx and onnxruntime packages: pip install 'deepmetric[onnx]'"
                          ) from None
    try:
        with _quiet_tracing(), torch.no_grad():
            torch.onnx.export(graph, (example,), str(path), dynamo=False, opset_version=ONNX_OPSET,
                              input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                              dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}})
    except Exception as error:  # torch.onnx raises several types (UnsupportedOperatorError, OnnxExporterError, ...)
        operator = _unsupported_operator(error)
        reason = (f"operator {operator} has no ONNX counterpart in opset {ONNX_OPSET}" if operator
                  else f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
        raise ExportError(f"{what} cannot be expressed in ONNX: {reason}; export it with --format torchscript "
                          "(a TorchScript archive for torch.jit.load in Python or C++)") from None


Runner = Callable[[torch.Tensor], np.ndarray]
"""An exported model loaded back: images (B, 3, H, W) -> embeddings (B, D)."""


def _onnx_runner(path: Path) -> Runner:
    try:
        import onnxruntime
    except ImportError:
        raise ExportError("checking the exported ONNX model needs onnxruntime: pip install 'deepmetric[onnx]'"
                          ) from None
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # errors only
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return lambda images: session.run(None, {INPUT_NAME: images.numpy()})[0]


def _trace_torchscript(graph: EmbeddingGraph, example: torch.Tensor, path: Path, what: str) -> None:
    try:
        with _quiet_tracing(), torch.no_grad():
            traced = torch.jit.trace(graph, (example,), check_trace=False)  # checked below, on other batch sizes
            traced.save(str(path))
    except Exception as error:
        raise ExportError(f"{what} cannot be traced to TorchScript: {type(error).__name__}: "
                          f"{str(error).splitlines()[0] if str(error) else ''}") from None


def _torchscript_runner(path: Path) -> Runner:
    with _quiet_tracing():
        loaded = torch.jit.load(str(path), map_location="cpu").eval()

    def run(images: torch.Tensor) -> np.ndarray:
        with torch.no_grad():
            return loaded(images).numpy()

    return run


def _check(runner: Runner, graph: EmbeddingGraph, image_size: int, what: str, format: str) -> float:
    """The largest difference between the exported model's embeddings and PyTorch's over ``VERIFY_BATCHES``."""
    worst = 0.0
    generator = torch.Generator().manual_seed(0)
    for batch in VERIFY_BATCHES:
        images = torch.rand(batch, 3, image_size, image_size, generator=generator)
        with torch.no_grad():
            expected = graph(images).numpy()
        try:
            got = np.asarray(runner(images))
        except Exception as error:  # onnxruntime's and TorchScript's own errors
            raise ExportError(f"the {format} export of {what} fails at batch size {batch} (traced at {TRACE_BATCH}): "
                              f"{str(error).splitlines()[0] if str(error) else type(error).__name__}; its forward "
                              "pass depends on the batch size in a way a trace freezes") from None
        if got.shape != expected.shape:
            raise ExportError(f"the {format} export of {what} gives embeddings of shape {got.shape} at batch size "
                              f"{batch}, PyTorch {expected.shape}")
        worst = max(worst, float(np.abs(got - expected).max()))
    if not worst <= TOLERANCE:
        raise ExportError(f"the {format} export of {what} differs from PyTorch by {worst:.2e} (> {TOLERANCE:g}) on "
                          f"batches of {', '.join(map(str, VERIFY_BATCHES))}: its forward pass does something a trace "
                          "freezes (a value computed outside torch)")
    return worst


def _installed(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def preprocessing(image_size: int, test_resize: str) -> dict[str, Any]:
    """What ``deepmetric embed`` does to an image file before the model, precisely enough to repeat without deepmetric
    (README's onnxruntime snippet does, from these values): ``rgb`` (``data.images.to_rgb``: decode, any PIL mode to
    8-bit RGB, transparency on white), then ``resize``, ``pad`` and ``crop`` (``data.resizing.test_resize_plan``,
    the steps ``TestTransform`` runs), then ``scale`` and ``layout``; ``order`` names them in turn."""
    plan = test_resize_plan(image_size, test_resize)
    fitted = {"both": "both sides resized to size (the aspect ratio is not kept)",
              "longer": "the longer side scaled to size keeping the aspect ratio: each side max(min_side, "
                        "round(side * size / longer side))",
              "shorter": "the shorter side scaled to size keeping the aspect ratio: each side max(min_side, "
                         "round(side * size / shorter side))"}[plan["resize"]["fit"]]
    resize = {**plan["resize"], "how": fitted, "filter": "bilinear", "antialias": True,
              "rounding": "Python's round (halves to even); the result is 8-bit",
              "pil": "image.resize((width, height), PIL.Image.Resampling.BILINEAR): a triangle filter widened by the "
                     "shrink factor (antialiased); the library's torchvision resize(antialias=True) on uint8 agrees "
                     "with it to 1/255",
              "torchvision": "torchvision.transforms.v2.functional.resize(uint8 (3, H, W), [height, width], "
                             "antialias=True), skipped when the image already has that size"}
    pad = plan["pad"] and {**plan["pad"], "how": "centre the image on a black canvas max(size, height) x max(size, "
                                                 "width): top = (canvas height - height) // 2, left likewise"}
    crop = plan["crop"] and {**plan["crop"], "how": "the centre size x size: top = round((height - size) / 2), left "
                                                    "= round((width - size) / 2), Python's round (halves to even), as "
                                                    "torchvision's center_crop"}
    return {"test_resize": test_resize, "image_size": image_size, "how": RESIZE_POLICIES[test_resize],
            "then": "RGB channels, values / 255 (floats in [0, 1]), NCHW",
            "library": "deepmetric.data.images.read_image, then deepmetric.data.transforms.TestTransform",
            "order": ["rgb", "resize", "pad", "crop", "scale", "layout"],
            "rgb": RGB_CONVERSION, "resize": resize, "pad": pad, "crop": crop,
            "scale": {"divide_by": 255.0, "dtype": "float32", "range": [0.0, 1.0],
                      "normalization": "none here: the model applies mean/std itself (see normalization)"},
            "layout": {"layout": "NCHW", "channels": "RGB", "shape": [1, 3, image_size, image_size],
                       "batch": "images stacked on the first axis"}}


def metadata(model: Embedder, format: str, file: Path, image_size: int, test_resize: str, run: dict[str, Any],
             max_error: float) -> dict[str, Any]:
    """The JSON beside the exported file: input, preprocessing, normalisation, output, origin and check."""
    runtime = "onnxruntime" if format == "onnx" else "torch.jit"
    return {
        "format": format,
        "file": file.name,
        **({"opset": ONNX_OPSET} if format == "onnx" else {}),
        "input": {"name": INPUT_NAME, "shape": ["batch", 3, image_size, image_size], "height": image_size,
                  "width": image_size, "dtype": "float32", "layout": "NCHW", "channels": "RGB", "range": [0.0, 1.0]},
        "preprocessing": preprocessing(image_size, test_resize),
        "normalization": {"mean": [float(v) for v in model.mean.flatten()],
                          "std": [float(v) for v in model.std.flatten()], "bgr": bool(model.bgr),
                          "inside_model": True,
                          "note": "the model computes (x - mean) / std itself (after reversing the channels when "
                                  "bgr is true): feed RGB in [0, 1]"},
        "output": {"name": OUTPUT_NAME, "shape": ["batch", model.embedding_dim],
                   "l2_normalized": bool(model.head.normalized)},
        "model": model.spec,
        "run": run,
        "verified": {"runtime": runtime, "batch_sizes": list(VERIFY_BATCHES), "max_abs_error": max_error,
                     "tolerance": TOLERANCE},
        "software": {**software(), **({name: _installed(name) for name in ("onnx", "onnxruntime")}
                                      if format == "onnx" else {})},
    }


def export_model(model: Embedder, out: str | Path, format: str = "onnx", image_size: int = 224,
                 test_resize: str = "resize", run: dict[str, Any] | None = None) -> ExportResult:
    """Export ``model`` (any ``Embedder``) for ``image_size`` x ``image_size`` inputs; see the module docstring.

    Writes ``out`` and its JSON atomically, only once the file's embeddings agree with PyTorch's; a head that
    cannot be exported in ``format`` raises ``ExportError`` with the reason, and nothing is written. ``model`` itself
    is left as it was (a copy is moved to the CPU, contiguous layout, eval mode, and traced).
    """
    started = time.perf_counter()
    path, meta_path = output_paths(out, format)
    what = _describe(model)
    blocker = model.head.export_blocker()
    if blocker:
        raise ExportError(f"{what} cannot be exported to ONNX or TorchScript: {blocker}")
    weight_bytes = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    if format == "onnx" and weight_bytes >= ONNX_LIMIT:
        raise ExportError(f"{what} holds {weight_bytes / 2**30:.1f} GiB of weights; one ONNX file holds at most 2 GiB: "
                          "export it with --format torchscript")
    for file in (path, meta_path):
        check_writable(file)
    model = copy.deepcopy(model).cpu().set_channels_last(False).eval()
    graph = EmbeddingGraph(model).eval()
    example = torch.rand(TRACE_BATCH, 3, image_size, image_size, generator=torch.Generator().manual_seed(1))
    with atomic_path(path) as tmp, atomic_path(meta_path) as tmp_meta:
        if format == "onnx":
            _trace_onnx(graph, example, tmp, what)
            runner = _onnx_runner(tmp)
        else:
            _trace_torchscript(graph, example, tmp, what)
            runner = _torchscript_runner(tmp)
        error = _check(runner, graph, image_size, what, format)
        record = metadata(model, format, path, image_size, test_resize, run or {}, error)
        tmp_meta.write_text(to_json(record, indent=2) + "\n")
    return ExportResult(path, meta_path, format, model.embedding_dim, image_size, error,
                        time.perf_counter() - started)


def export_run(run_dir: str | Path, out: str | Path, format: str = "onnx", which: str = "auto") -> ExportResult:
    """Export a run's model from its checkpoint ``which`` (``auto``: best when the run has one, as ``evaluate``),
    at the run's ``data.image_size``, with its ``data.test_resize`` in the JSON."""
    check_outside_run(run_dir, out, format)  # a bad --out or format before the checkpoint is read
    model, config, checkpoint = load_run_model(run_dir, which, "cpu")
    run = {"path": str(Path(run_dir)), "checkpoint": checkpoint.stem,
           "step": checkpoint_state(checkpoint).get("step")}
    return export_model(model, out, format, config.data.image_size, config.data.test_resize, run)
