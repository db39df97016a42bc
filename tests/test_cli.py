"""The command line, end to end on the tiny trunk: train -> evaluate -> embed -> metrics."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from PIL import Image

from deepmetric.cli import main
from deepmetric.evaluation import retrieval_metrics


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


TINY = ["--data", "digits", "--backbone", "tiny", "--steps", "4", "--quiet", "model.pretrained=false",
        "model.embedding_dim=16", "data.image_size=16", "data.classes_per_batch=3", "data.samples_per_class=4",
        "eval.nmi=false", "train.lr=1e-3"]


def test_train_evaluate_embed_and_metrics(tmp_path, capsys):
    out_dir = tmp_path / "run"
    code, out, _ = run(capsys, "train", *TINY, "--out", str(out_dir), "eval.baseline=true")
    assert code == 0
    assert "untrained backbone" in out and "trained (last, step 4)" in out and "R@1" in out
    record = json.loads((out_dir / "metrics.json").read_text())
    assert record["split"] == "test" and record["test_classes"] == 5 and set(record["metrics"]) >= {"recall@1"}
    assert yaml.safe_load((out_dir / "config.yaml").read_text())["train"]["steps"] == 4

    code, out, _ = run(capsys, "evaluate", str(out_dir), "--json", "--quiet")
    assert code == 0 and json.loads(out) == record["metrics"]

    images = tmp_path / "images"
    images.mkdir()
    for i in range(3):
        Image.new("L", (8, 8), 40 * i).save(images / f"{i}.png")
    code, out, _ = run(capsys, "embed", str(out_dir), "--images", str(images), "--out", str(tmp_path / "e.npy"),
                       "--quiet")
    assert code == 0
    embeddings = np.load(tmp_path / "e.npy")
    assert embeddings.shape == (3, 16) and np.allclose(np.linalg.norm(embeddings, axis=1), 1, atol=1e-5)
    assert (tmp_path / "e.paths.txt").read_text().splitlines() == [str(images / f"{i}.png") for i in range(3)]


def test_resume_extends_a_run(tmp_path, capsys):
    out_dir = tmp_path / "run"
    assert run(capsys, "train", *TINY, "--out", str(out_dir), "--no-test")[0] == 0
    code, out, _ = run(capsys, "train", "--resume", "--out", str(out_dir), "train.steps=6", "--no-test", "--quiet")
    assert code == 0 and "trained 6 steps" in out


def test_metrics_command_matches_the_library(tmp_path, capsys):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 8)).astype(np.float32)
    y = rng.integers(0, 6, size=60)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    code, out, _ = run(capsys, "metrics", str(tmp_path / "x.npy"), str(tmp_path / "y.npy"), "--recall-at", "1,5",
                       "--json")
    assert code == 0
    printed = json.loads(out)
    assert set(printed) == {"recall@1", "recall@5", "map@r", "r_precision", "nmi"}
    expected = retrieval_metrics(x, y, recall_at=(1, 5))
    assert all(printed[k] == pytest.approx(expected[k], abs=1e-9) for k in expected)

    code, out, _ = run(capsys, "metrics", str(tmp_path / "x.npy"), str(tmp_path / "y.npy"), "--gallery",
                       str(tmp_path / "x.npy"), str(tmp_path / "y.npy"), "--json", "--no-nmi")
    assert code == 0 and json.loads(out)["recall@1"] == 1.0  # each query finds itself in a separate gallery


def test_user_errors_are_one_line_with_status_2(tmp_path, capsys):
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    np.save(tmp_path / "y.npy", np.zeros(1))
    code, _, err = run(capsys, "metrics", str(tmp_path / "obj.npy"), str(tmp_path / "y.npy"))
    assert code == 2 and err.startswith("error:") and "pickled arrays are refused" in err
    code, _, err = run(capsys, "train", "--data", "nope", "--out", str(tmp_path / "r"))
    assert code == 2 and "unknown data set 'nope'" in err and "Traceback" not in err
    code, _, err = run(capsys, "train", *TINY, "--out", str(tmp_path / "r"), "train.stepz=3")
    assert code == 2 and "did you mean 'train.steps'" in err
    code, _, err = run(capsys, "evaluate", str(tmp_path / "missing"))
    assert code == 2 and "not a run directory" in err


def test_help_metrics_and_config_errors_skip_the_heavy_imports(tmp_path):
    """``--help`` imports no torch, and neither ``metrics`` of precomputed embeddings nor a ``train`` stopped by a
    bad setting imports torchvision (the data pipeline and the models): each costs seconds of start-up on a small
    machine."""
    import subprocess
    import sys

    x = np.random.default_rng(0).normal(size=(40, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", np.arange(40) % 4)
    code = ("import sys\nfrom deepmetric.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print('loaded:', *(m for m in ('torch', 'torchvision') if m in sys.modules))")

    def loaded(*args: str) -> str:
        out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True).stdout
        return out.splitlines()[-1]

    assert loaded("--help") == "loaded:"
    assert loaded("metrics", str(tmp_path / "x.npy"), str(tmp_path / "y.npy"), "--no-nmi") == "loaded: torch"
    assert loaded("train", "--data", "glyphs", "loss.name=binomal") == "loaded: torch"


def test_resume_names_a_setting_that_cannot_change_and_survives_what_a_kill_or_full_disk_leaves(tmp_path, capsys):
    out_dir = tmp_path / "run"
    assert run(capsys, "train", *TINY, "--out", str(out_dir), "--no-test")[0] == 0
    for change in ("model.embedding_dim=8", "model.head=bilinear"):
        code, _, err = run(capsys, "train", "--resume", "--out", str(out_dir), change, "--no-test")
        key = change.partition("=")[0]
        assert code == 2 and f"cannot resume {out_dir} with {key}=" in err and "Traceback" not in err
    log = out_dir / "metrics.jsonl"
    log.write_text(log.read_text() + '{"step": 5, "loss": 0.')  # a last line cut short
    (out_dir / "environment.json").write_text('{"sessions": [')  # damaged
    code, out, err = run(capsys, "train", "--resume", "--out", str(out_dir), "train.steps=6", "--no-test")
    assert code == 0 and "trained 6 steps" in out
    assert json.loads((out_dir / "environment.json").read_text())["sessions"]  # a new file, the old one kept:
    assert (out_dir / "environment.json.damaged").read_text() == '{"sessions": ['
    assert [r["step"] for r in map(json.loads, log.read_text().splitlines()) if "loss" in r][-1] == 6
    (out_dir / "config.yaml").write_text("data: [unclosed\n")
    code, _, err = run(capsys, "evaluate", str(out_dir))
    assert code == 2 and "config.yaml is not valid YAML" in err and "Traceback" not in err


@pytest.mark.parametrize("argv, message", [
    (["serve", "IDX", "--port", "99999"], "argument --port: must be >= 0 and <= 65535, got '99999'"),
    (["index", "RUN", "--images", "x", "--out", "y", "--batch-size", "-4"], "--batch-size: must be >= 1"),
    (["train", "--nproc", "-1"], "--nproc: must be >= 1"),
    (["train", "--steps", "1e400"], "--steps: expected an integer, got '1e400'"),
    (["serve", "IDX", "--timeout", "nan"], "--timeout: must be > 0, got 'nan'"),
    (["search", "IDX", "--image", "q.png", "--k", "0"], "--k: must be >= 1"),
])
def test_bad_numbers_on_the_command_line_are_refused_before_anything_runs(argv, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2 and message in capsys.readouterr().err


def test_metrics_refuses_absurd_ranks_and_errors_escape_control_characters(tmp_path, capsys):
    np.save(tmp_path / "e.npy", np.eye(4, dtype=np.float32))
    np.save(tmp_path / "l.npy", np.array([0, 0, 1, 1]))
    code, _, err = run(capsys, "metrics", str(tmp_path / "e.npy"), str(tmp_path / "l.npy"), "--recall-at",
                       "99999999999999999999")
    assert code == 2 and "--recall-at must hold ranks from 1 to 1,000,000" in err
    code, _, err = run(capsys, "train", "--head", "\x1b[31mred", "--data", "digits")
    assert code == 2 and "\x1b" not in err and "unknown head '\\x1b[31mred'" in err


def test_metrics_with_string_labels_is_one_line(tmp_path, capsys):
    np.save(tmp_path / "e.npy", np.eye(4, dtype=np.float32))
    np.save(tmp_path / "l.npy", np.array(["cat", "cat", "dog", "dog"]))
    code, _, err = run(capsys, "metrics", str(tmp_path / "e.npy"), str(tmp_path / "l.npy"))
    assert code == 2 and "must be integer class labels, got an array of <U3" in err and "Traceback" not in err


def test_embed_refuses_file_names_that_would_break_its_paths_file(tmp_path, capsys):
    out_dir = tmp_path / "run"
    assert run(capsys, "train", *TINY, "--out", str(out_dir), "--no-test")[0] == 0
    images = tmp_path / "images"
    images.mkdir()
    Image.new("L", (8, 8), 40).save(images / "a.png")
    Image.new("L", (8, 8), 90).save(images / "b\nc.png")
    code, _, err = run(capsys, "embed", str(out_dir), "--images", str(images), "--out", str(tmp_path / "e.npy"))
    assert code == 2 and "hold a line break" in err and "b\\nc.png" in err
    assert not (tmp_path / "e.npy").exists()


def strict_json(text: str):
    """Parse as RFC 8259 JSON: NaN and Infinity are refused, as jq and JSON.parse refuse them."""
    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_machine_readable_output_is_strict_json_with_null_for_an_undefined_metric(tmp_path, capsys):
    np.save(tmp_path / "e.npy", np.eye(4, dtype=np.float32)[[0, 0, 1, 1]] + 0.01 * np.arange(4)[:, None])
    np.save(tmp_path / "one.npy", np.zeros(4, dtype=np.int64))  # one class: NMI is undefined
    code, out, err = run(capsys, "metrics", str(tmp_path / "e.npy"), str(tmp_path / "one.npy"), "--json")
    assert code == 0 and strict_json(out)["nmi"] is None
    code, out, _ = run(capsys, "metrics", str(tmp_path / "e.npy"), str(tmp_path / "one.npy"))
    assert code == 0 and "—" in out.splitlines()[-1]  # the text table shows a dash
    out_dir = tmp_path / "run"
    assert run(capsys, "train", *TINY, "--out", str(out_dir), "eval.nmi=true", "eval.baseline=true")[0] == 0
    for name in ("metrics.json", "baseline.json", "environment.json"):
        strict_json((out_dir / name).read_text())
    for line in (out_dir / "metrics.jsonl").read_text().splitlines():
        strict_json(line)
    from deepmetric.io import to_json

    assert strict_json(to_json({"a": float("nan"), "b": [float("inf"), 1.5]})) == {"a": None, "b": [None, 1.5]}


def test_evaluating_last_keeps_the_chosen_checkpoints_metrics(tmp_path, capsys):
    out_dir = tmp_path / "run"
    assert run(capsys, "train", *TINY, "--out", str(out_dir), "data.val_fraction=0.4", "train.eval_every=2",
               "eval.report=false")[0] == 0
    chosen = json.loads((out_dir / "metrics.json").read_text())
    assert chosen["checkpoint"] == "best"
    assert run(capsys, "evaluate", str(out_dir), "--checkpoint", "last", "--quiet")[0] == 0
    assert json.loads((out_dir / "metrics.json").read_text()) == chosen  # not overwritten
    assert json.loads((out_dir / "metrics-last.json").read_text())["checkpoint"] == "last"
    assert run(capsys, "report", str(out_dir), "--quiet")[0] == 0
    page = (out_dir / "report.html").read_text()
    assert "trained (best, step" in page and "trained (last, step 4)" in page


def test_train_help_names_every_registered_plug_in():
    """Issue 39 item 29: --help omitted emoji, emoji-skin, contrastive-euclidean and pml:<Class>. Its lists are
    written out (--help imports no torch); this keeps them equal to the registries."""
    from deepmetric.cli import parser as cli_parser
    from deepmetric.data import DATASETS
    from deepmetric.generators import GENERATORS
    from deepmetric.losses import LOSSES, REGULARIZERS
    from deepmetric.models.backbones import BACKBONES
    from deepmetric.models.heads import HEADS

    def names(listed):
        return {n.split(" ")[0].replace(":PATH", "").replace("<Class>", "<name>") for n in listed}

    assert names(cli_parser.DATA_HELP) == set(DATASETS.names())
    assert names(cli_parser.BACKBONE_HELP) == set(BACKBONES.names())
    assert names(cli_parser.HEAD_HELP) == set(HEADS.names())
    assert names(cli_parser.LOSS_HELP) == set(LOSSES.names())
    assert names(cli_parser.REGULARIZER_HELP) == set(REGULARIZERS.names())
    assert names(cli_parser.GENERATOR_HELP) == set(GENERATORS.names())
    text = cli_parser.build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    flat = " ".join(text.split()).replace("- ", "-")  # argparse wraps at hyphens
    for listed in (cli_parser.DATA_HELP, cli_parser.HEAD_HELP, cli_parser.LOSS_HELP, cli_parser.REGULARIZER_HELP):
        assert all(name.split(" ")[0] in flat for name in listed), text


def test_file_names_with_terminal_escapes_reach_no_output_raw(tiny_run, tmp_path, capsys):
    """Issue 39, item 24: `search` printed a file name's ESC sequence raw (it could clear or recolour the terminal).
    Every result line goes through one escaping print, as error messages do; log lines are escaped as well."""
    import logging

    from deepmetric.cli import PrintableFormatter

    images = tmp_path / "images"
    images.mkdir()
    Image.new("L", (8, 8), 40).save(images / "red\x1b[31m.png")
    Image.new("L", (8, 8), 90).save(images / "clear\x1b[2J\x9b.png")
    index = tmp_path / "index"
    code, out, err = run(capsys, "index", str(tiny_run), "--images", str(images), "--out", str(index), "--quiet")
    assert code == 0, err
    for argv in (["search", str(index), "--image", str(images / "red\x1b[31m.png"), "--k", "2"],
                 ["search", str(index), "--image", str(images / "red\x1b[31m.png"), "--k", "2", "--json"]):
        code, out, err = run(capsys, *argv)
        assert code == 0 and "\x1b" not in out + err and "\x9b" not in out + err
        assert "red\\x1b[31m.png" in out or "red\\u001b[31m.png" in out  # text, or JSON's own escape
    record = logging.LogRecord("deepmetric", logging.WARNING, __file__, 1, "skipped %s", ("a\x1b[2Jb.png",), None)
    assert PrintableFormatter("%(message)s").format(record) == "skipped a\\x1b[2Jb.png"


def test_every_command_prints_its_results_through_the_escaping_print():
    """The mechanism of item 24: no bare print() in the commands, only `say` (and stderr in main, escaped)."""
    import inspect
    import re

    from deepmetric.cli import commands

    source = inspect.getsource(commands)
    calls = re.findall(r"(?<![\w.])print\(", source)
    assert len(calls) == 1 and "def say(" in source  # the one inside say itself
