"""Bad data is named before training, signals and kills lose nothing, untrusted files are refused."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from deepmetric.data.audit import audit_table, check_table, image_problem
from deepmetric.errors import CheckpointError, DataError
from deepmetric.io.tensors import unprefixed
from deepmetric.runs.checkpoint import load_checkpoint
from deepmetric.runs.folder import RunDir
from deepmetric.training import train
from helpers import tiny_config

ROOT = Path(__file__).resolve().parent.parent


def save(path: Path, mode: str = "RGB", size=(16, 12), value=90, fmt=None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    colour = value if mode in ("L", "I;16", "P") else tuple([value] * len(mode))
    Image.new(mode, size, colour).save(path, format=fmt)
    return path


def folder_with_problems(root: Path) -> dict[str, str]:
    """Five classes of three images each, with every kind of bad and unusual file; returns bad name -> problem."""
    for c in range(5):
        for k in range(3):
            save(root / f"class{c}" / f"{k}.png", value=30 * c + k)
    noise = np.random.default_rng(0).integers(0, 255, size=(64, 64, 3), dtype=np.uint8)
    Image.fromarray(noise).save(root / "noise.png")
    png = (root / "noise.png").read_bytes()
    (root / "noise.png").unlink()
    jpeg = save(root / "tmp.jpg", fmt="JPEG", size=(64, 64)).read_bytes()
    (root / "tmp.jpg").unlink()
    (root / "class1" / "truncated.jpg").write_bytes(jpeg[: len(jpeg) // 2])
    middle = len(png) // 2  # inside the compressed pixel data: the header is fine, the data is not
    (root / "class1" / "corrupt.png").write_bytes(png[:middle] + bytes(b ^ 0xFF for b in png[middle:middle + 64])
                                                  + png[middle + 64:])
    (root / "class2" / "text.jpg").write_text("hello, I am not a picture")
    (root / "class2" / "empty.png").write_bytes(b"")
    save(root / "class3" / "cmyk.jpg", mode="CMYK", fmt="JPEG")  # unusual but valid: converted
    save(root / "class3" / "deep.png", mode="I;16")
    save(root / "class3" / "palette.png", mode="P")
    save(root / "class3" / "alpha.png", mode="RGBA")
    save(root / "class3" / "gray.jpg", mode="L", fmt="JPEG")
    return {"truncated.jpg": "corrupt or truncated", "corrupt.png": "corrupt or truncated",
            "text.jpg": "not an image", "empty.png": "empty file"}


def test_audit_names_every_bad_file_and_accepts_unusual_valid_ones(tmp_path):
    from deepmetric.data import load_dataset

    expected = folder_with_problems(tmp_path / "data")
    table = load_dataset(f"folder:{tmp_path / 'data'}")
    problems = {Path(p.item).name: p.problem for p in audit_table(table, progress=False)}
    assert set(problems) == set(expected)
    for name, text in expected.items():
        assert text in problems[name]
    assert image_problem(str(tmp_path / "nowhere.jpg")) == "missing file"
    assert image_problem(str(tmp_path / "data")) == "not a regular file"


def test_unreadable_file_is_named(tmp_path, monkeypatch):
    path = save(tmp_path / "secret.png")
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == path else real_access(p, mode))
    assert "permission denied" in image_problem(str(path))  # root reads anything: simulate the refusal


def test_training_stops_with_one_message_or_skips_and_lists(tmp_path):
    folder_with_problems(tmp_path / "data")
    config = tiny_config(data={"spec": f"folder:{tmp_path / 'data'}", "classes_per_batch": 2,
                               "samples_per_class": 2}, train={"steps": 1})
    with pytest.raises(DataError) as error:
        train(config, tmp_path / "run", progress=False)
    message = str(error.value)
    assert "4 problem(s)" in message and "--skip-bad-images" in message
    assert all(name in message for name in ("truncated.jpg", "corrupt.png", "text.jpg", "empty.png"))
    assert not (tmp_path / "run" / "checkpoints").exists()  # nothing half-written

    config.data.skip_bad_images = True
    train(config, tmp_path / "run2", progress=False)
    listed = (tmp_path / "run2" / "bad_images.txt").read_text().splitlines()
    assert len(listed) == 4 and all(": " in line for line in listed)


def test_a_test_image_left_out_of_a_benchmark_stops_unless_told_and_is_recorded(tmp_path, monkeypatch):
    """--skip-bad-images must not quietly evaluate on fewer test images than the protocol's: the published test
    sizes are checked again once bad items are left out (data.check_counts=false goes on, and the test
    record's published_test_sizes says false). A bad *training* image leaves the test protocol whole."""
    from deepmetric.data import benchmarks
    from deepmetric.data.table import test_sizes_match
    from deepmetric.runs.table import load_table
    from test_loaders import make_cub

    base = make_cub(tmp_path, per_class=3)  # 9 training and 9 test images
    monkeypatch.setitem(benchmarks.PUBLISHED, "cub", {"train": 9, "test": 9})
    test_image = base / "images" / "150.Bird_150" / "Bird_150_0000.jpg"
    good = test_image.read_bytes()
    test_image.write_bytes(b"not a jpeg")
    config = tiny_config(data={"spec": f"cub:{tmp_path}", "skip_bad_images": True})
    with pytest.raises(DataError, match=r"once its bad images were left out .*test: expected 9, found 8"):
        load_table(config, only_split="test")
    config.data.check_counts = False
    table, bad = load_table(config, only_split="test")
    assert table.count("test") == 8 and len(bad) == 1 and test_sizes_match(table) is False

    test_image.write_bytes(good)
    (base / "images" / "002.Bird_2" / "Bird_2_0001.jpg").write_bytes(b"")
    config.data.check_counts = True
    table, bad = load_table(config)
    assert table.count("train") == 8 and table.count("test") == 9 and test_sizes_match(table) is True


def test_missing_files_duplicates_and_single_image_classes(tmp_path):
    from deepmetric.data.table import RetrievalTable

    a, b = save(tmp_path / "a.png"), save(tmp_path / "b.png", value=10)
    paths = [str(a), str(b), str(a), str(tmp_path / "gone.png"), str(b)]
    table = RetrievalTable(name="t", images=paths, labels=np.array([0, 0, 1, 1, 2]),
                             splits=np.array(["train"] * 5, dtype=object), is_query=np.ones(5, bool),
                             is_gallery=np.ones(5, bool))
    problems = [(p.row, p.problem) for p in audit_table(table, progress=False)]
    assert (2, "listed more than once") in problems and (3, "missing file") in problems
    assert (4, "listed more than once") in problems
    assert any(row == 4 and "single image" in text for row, text in problems)  # class 2
    kept, dropped = check_table(table, skip_bad=True, progress=False)
    assert kept.labels.tolist() == [0, 0]  # class 1 lost its images; class 2 had one
    assert len(dropped) >= 4


def wait_for_step(log: Path, step: int, process: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"training exited early: {process.stderr.read().decode()[-2000:]}")
        if log.is_file():
            steps = [json.loads(line).get("step", 0) for line in log.read_text().splitlines() if line.strip()]
            if steps and max(steps) >= step:
                return
        time.sleep(0.05)
    raise AssertionError(f"step {step} not reached in {timeout} s")


def cli(*args: str, **popen) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.Popen([sys.executable, "-m", "deepmetric", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, **popen)


TRAIN = ["train", "--data", "digits", "--backbone", "tiny", "--quiet", "--no-test", "model.pretrained=false",
         "model.embedding_dim=16", "data.image_size=16", "data.classes_per_batch=3", "data.samples_per_class=4",
         "train.lr=1e-3", "train.checkpoint_every=1", "train.log_every=1", "train.deterministic=true",
         "train.threads=1", "eval.nmi=false"]


def final_state(run: Path):
    tensors, state = load_checkpoint(run / "checkpoints" / "last.safetensors")
    return unprefixed("model", tensors), state["step"]


def test_sigterm_writes_a_checkpoint_and_exits_cleanly(tmp_path):
    run = tmp_path / "run"
    process = cli(*TRAIN, "--steps", "100000", "--out", str(run))
    wait_for_step(run / "metrics.jsonl", 3, process)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM
    assert "SIGTERM received: stopped after step" in err.decode()
    _, step = final_state(run)
    assert step >= 3 and max(r["step"] for r in RunDir(run).read_log()) == step


def test_a_run_killed_at_a_random_step_resumes_to_the_same_weights(tmp_path):
    # The kill lands wherever the victim is when the signal arrives (possibly mid-write). It must land before
    # the last step: on a fast machine a dozen tiny steps can finish between seeing step k and the kill, so
    # the run is long (30 steps) and the kill comes early in it (step 2..8).
    steps = 30
    straight = cli(*TRAIN, "--steps", str(steps), "--out", str(tmp_path / "straight"))
    assert straight.wait(timeout=300) == 0, straight.stderr.read().decode()[-2000:]

    killed = tmp_path / "killed"
    victim = cli(*TRAIN, "--steps", str(steps), "--out", str(killed))
    wait_for_step(killed / "metrics.jsonl", random.Random(0).randint(2, 8), victim)
    victim.kill()  # SIGKILL: no handler runs, the checkpoint on disk is whatever was last renamed into place
    victim.wait(timeout=60)
    _, at_kill = final_state(killed)  # the last checkpoint loads: written atomically
    assert at_kill < steps
    resumed = cli("train", "--resume", "--out", str(killed), "--quiet", "--no-test")
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read().decode()[-2000:]

    a, a_step = final_state(tmp_path / "straight")
    b, b_step = final_state(killed)
    assert a_step == b_step == steps and all(torch.equal(a[k], b[k]) for k in a)
    losses = lambda run: [r["loss"] for r in RunDir(run).read_log() if "loss" in r]  # noqa: E731
    assert losses(tmp_path / "straight") == losses(killed)  # the log has each step once, same values


def test_legacy_pickled_weights_need_trust(tmp_path):
    from deepmetric.models import create_backbone

    source = create_backbone("tiny", pretrained=False, freeze_bn=False)
    torch.save(source.trunk.state_dict(), tmp_path / "legacy.pth")
    with pytest.raises(CheckpointError, match="--trust-pickle"):
        create_backbone("tiny", pretrained=False, weights=str(tmp_path / "legacy.pth"))
    loaded = create_backbone("tiny", pretrained=False, freeze_bn=False, weights=str(tmp_path / "legacy.pth"),
                             trust_pickle=True)
    assert all(torch.equal(v, loaded.trunk.state_dict()[k]) for k, v in source.trunk.state_dict().items())
