"""Where a result came from: each training session's software and machine, and the evaluation's."""

from __future__ import annotations

import json
import subprocess
from importlib import metadata

import torch

from deepmetric.cli import main
from deepmetric.evaluation.knn import resolve_engine
from deepmetric.provenance import environment, source_revision
from test_cli import TINY


def _git(folder, *args):
    return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_source_revision_is_the_commit_and_says_when_tracked_files_changed(tmp_path):
    assert source_revision(tmp_path) is None  # not a git checkout (an installed wheel)
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    _git(tmp_path, "add", "a.py")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    commit = _git(tmp_path, "rev-parse", "HEAD")
    assert source_revision(tmp_path) == commit
    (tmp_path / "untracked.txt").write_text("not part of the source\n")
    assert source_revision(tmp_path) == commit
    (tmp_path / "a.py").write_text("x = 2\n")
    assert source_revision(tmp_path) == commit + "-dirty"
    package, record = tmp_path / "src", tmp_path / "docs"  # the source beside a record a running study writes
    for folder in (package, record):
        folder.mkdir()
        (folder / "file.txt").write_text("one\n")
    (tmp_path / "a.py").write_text("x = 1\n")
    _git(tmp_path, "add", "src", "docs")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "two")
    commit = _git(tmp_path, "rev-parse", "HEAD")
    (record / "file.txt").write_text("a run recorded\n")
    assert source_revision(package) == commit  # the record is not the source: its changes do not make it dirty
    (package / "file.txt").write_text("edited\n")
    assert source_revision(package) == commit + "-dirty"
    installed = tmp_path / ".venv" / "deepmetric"  # a package installed inside another project's checkout
    installed.mkdir(parents=True)
    (installed / "provenance.py").write_text("")
    assert source_revision(installed) is None


def test_environment_names_the_software_and_the_machine():
    record = environment("cpu", knn_engine="torch")
    assert record["torch"] == torch.__version__ and record["deepmetric"] == metadata.version("deepmetric")
    assert record["device"] == "cpu" and "gpu" not in record and record["threads"] == torch.get_num_threads()
    assert record["knn_engine"] == "torch"
    json.dumps(record)  # plain JSON


def test_every_training_session_and_every_evaluation_is_recorded(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *TINY, "--out", str(out), "--no-test", "eval.report=false"]) == 0
    assert main(["train", "--resume", "--out", str(out), "--quiet", "train.steps=6", "eval.baseline=true",
                 "eval.report=true"]) == 0
    sessions = json.loads((out / "environment.json").read_text())["sessions"]
    assert [(s["start_step"], s["steps"], s["processes"]) for s in sessions] == [(0, 4, 1), (4, 6, 1)]
    assert all(s["device"] == "cpu" and s["torch"] == torch.__version__ for s in sessions)
    expected_engine = resolve_engine("auto")
    for name in ("metrics.json", "baseline.json"):
        evaluation = json.loads((out / name).read_text())["environment"]
        assert evaluation["knn_engine"] == expected_engine and evaluation["device"] == "cpu"
    page = (out / "report.html").read_text()
    assert "<h2>Provenance</h2>" in page
    assert all(f"<th>{column}</th>" in page for column in ("training session 1", "training session 2",
                                                            "untrained backbone&#x27;s test", "test evaluation"))
    assert f"<td>{expected_engine}</td>" in page and f"<td>{torch.__version__}</td>" in page


def test_the_cpu_is_named_with_its_generation_where_the_system_gives_it(monkeypatch):
    """Two generations of AMD EPYC, six times apart in speed, both called themselves "AMD EPYC" in one study's
    runs; the family, model and stepping tell them apart (None where /proc/cpuinfo lacks them: ARM, macOS)."""
    import deepmetric.provenance as provenance

    fields = {"model name": "AMD EPYC", "cpu family": "26", "model": "2", "stepping": "1"}
    monkeypatch.setattr(provenance, "cpu_info", lambda field: fields.get(field, ""))
    record = provenance.machine("cpu")
    assert (record["cpu"], record["cpu_generation"]) == ("AMD EPYC", "family 26 model 2 stepping 1")
    fields.pop("stepping")
    assert provenance.machine("cpu")["cpu_generation"] is None
