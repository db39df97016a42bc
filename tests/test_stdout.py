"""Issue 39: the library never writes on standard output, which belongs to the program using it (a ``--json``
answer, a pipe); its messages go to logging, progress bars and third-party chatter to standard error.
``deepmetric.cli``, whose job is standard output, is the one exception. ``test_emoji.py`` checks the npm fetch."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import numpy as np

import deepmetric
from helpers import tiny_config

LIBRARY = Path(deepmetric.__file__).parent


def _writes_to_stdout(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of each ``print(...)``, ``sys.stdout``, ``tqdm.write``/``bar.write`` without ``file=`` and
    subprocess call that leaves the child's standard output on ours."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("stdout", "__stdout__") and \
                isinstance(node.value, ast.Name) and node.value.id == "sys":
            found.append((node.lineno, "sys.stdout"))
        if not isinstance(node, ast.Call):
            continue
        keywords = {k.arg for k in node.keywords}
        function = node.func
        if isinstance(function, ast.Name) and function.id == "print" and "file" not in keywords:
            found.append((node.lineno, "print()"))
        if isinstance(function, ast.Attribute) and function.attr == "write" and isinstance(function.value, ast.Name) \
                and function.value.id in ("bar", "tqdm", "progress") and "file" not in keywords:
            found.append((node.lineno, f"{function.value.id}.write() (tqdm writes on standard output)"))
        if isinstance(function, ast.Attribute) and isinstance(function.value, ast.Name) and \
                function.value.id == "subprocess" and function.attr in ("run", "call", "check_call", "Popen") and \
                not keywords & {"capture_output", "stdout"}:
            found.append((node.lineno, f"subprocess.{function.attr} without its output captured"))
        if isinstance(function, ast.Attribute) and function.attr == "system" and \
                isinstance(function.value, ast.Name) and function.value.id == "os":
            found.append((node.lineno, "os.system"))
    return sorted(found)


def test_no_library_module_writes_on_standard_output():
    offenders = []
    for path in sorted(LIBRARY.rglob("*.py")):
        if "cli" in path.relative_to(LIBRARY).parts:
            continue
        for line, what in _writes_to_stdout(ast.parse(path.read_text(encoding="utf-8"))):
            offenders.append(f"{path.relative_to(LIBRARY)}:{line}: {what}")
    assert offenders == []


def test_the_checker_sees_each_kind_of_write():
    source = ("import subprocess, sys, os\nprint('x')\nsys.stdout.write('x')\nbar.write('x')\n"
              "subprocess.run(['npm'])\nos.system('ls')\nprint('x', file=sys.stderr)\n"
              "subprocess.run(['git'], capture_output=True)\nbar.write('x', file=bar.fp)\n")
    assert [line for line, _ in _writes_to_stdout(ast.parse(source))] == [2, 3, 4, 5, 6]


def test_building_glyphs_from_matplotlibs_fonts_logs_and_prints_nothing(tmp_path, monkeypatch, capfd, caplog):
    from deepmetric.data import glyphs

    monkeypatch.setattr(glyphs, "find_fonts", lambda chars: [])  # no system font: matplotlib's, with a warning
    caplog.set_level(logging.INFO, logger="deepmetric")
    glyphs.build_glyphs(tmp_path / "glyphs", size=16, progress=True)
    assert capfd.readouterr().out == ""
    assert "no installed font covers all 175 characters" in caplog.text and "written to" in caplog.text


def _idx(path: Path, array: np.ndarray) -> None:
    header = (0x0800 | array.ndim).to_bytes(4, "big") + b"".join(n.to_bytes(4, "big") for n in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def test_the_fashion_mnist_download_prints_nothing(tmp_path, monkeypatch, capfd, caplog):
    """torchvision's downloader prints ``Downloading ...`` on standard output: that goes to the log."""
    import torchvision.datasets

    from deepmetric.data import generic

    class FakeFashionMNIST:
        def __init__(self, root, train, download):
            raw = Path(root) / "FashionMNIST" / "raw"
            raw.mkdir(parents=True, exist_ok=True)
            prefix = "train" if train else "t10k"
            print(f"Downloading http://example.invalid/{prefix}-images-idx3-ubyte.gz")
            print()
            _idx(raw / f"{prefix}-images-idx3-ubyte", np.zeros((10, 28, 28)))
            _idx(raw / f"{prefix}-labels-idx1-ubyte", np.arange(10))

    monkeypatch.setattr(generic, "FASHION_MNIST_DIRS", (str(tmp_path / "absent"),))
    monkeypatch.setenv("DEEPMETRIC_DATA", str(tmp_path / "data"))
    monkeypatch.setattr(torchvision.datasets, "FashionMNIST", FakeFashionMNIST)
    caplog.set_level(logging.INFO, logger="deepmetric")
    table = generic.load_fashion_mnist()
    assert len(table.labels) == 20 and capfd.readouterr().out == ""
    assert "Downloading http://example.invalid/t10k-images-idx3-ubyte.gz" in caplog.text


def test_training_with_validation_prints_nothing(tmp_path, capfd):
    """The validation line beside the progress bar went through ``tqdm.write``, which writes on standard output."""
    from deepmetric.training.trainer import train

    config = tiny_config(train={"steps": 2, "eval_every": 1, "checkpoint_every": 2}, data={"val_fraction": 0.4},
                         eval={"batch_size": 64, "nmi": False, "report": False})
    train(config, tmp_path / "run", progress=True)
    captured = capfd.readouterr()
    assert captured.out == "" and "step 1: validation Recall@1" in captured.err
