"""The command line, end to end on the tiny trunk: train -> evaluate -> embed -> metrics."""

from __future__ import annotations

import json
import logging

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
    assert code == 0 and "trained 2 steps (steps 5-6, resumed)" in out


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
    np.savetxt(tmp_path / "labels.txt", [0, 1, 0], fmt="%d")  # text, and an .npz, are not called pickled
    np.savez(tmp_path / "y.npz", y=np.zeros(1))
    for labels in ("labels.txt", "y.npz"):
        code, _, err = run(capsys, "metrics", str(tmp_path / "y.npy"), str(tmp_path / labels))
        assert code == 2 and err == (f"error: labels file {tmp_path / labels} is not a .npy file (numpy.save writes "
                                     "one; text, CSV and .npz files are not read)\n")
    code, _, err = run(capsys, "train", "--data", "nope", "--out", str(tmp_path / "r"))
    assert code == 2 and "unknown data set 'nope'" in err and "Traceback" not in err
    code, _, err = run(capsys, "train", *TINY, "--out", str(tmp_path / "r"), "train.stepz=3")
    assert code == 2 and "did you mean 'train.steps'" in err
    code, _, err = run(capsys, "evaluate", str(tmp_path / "missing"))
    assert code == 2 and "no such run directory" in err
    (tmp_path / "empty").mkdir()
    code, _, err = run(capsys, "evaluate", str(tmp_path / "empty"))
    assert code == 2 and "empty is not a run directory (no config.yaml)" in err
    assert not (tmp_path / "missing").exists() and list((tmp_path / "empty").iterdir()) == []  # nothing made


def test_train_says_which_flag_takes_a_preset_a_study_a_run_or_a_data_folder(tmp_path, capsys, monkeypatch):
    """A careless user's ``deepmetric train cub-googlenet-binomial`` (a preset where a key=value goes), ``train
    demo`` (a study), ``train runs/x`` (a run) were all "override ... is not of the form key=value"; a preset whose
    data folder is missing said only "cub: no such folder: data/CUB_200_2011"."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "train", "cub-googlenet-binomial")
    assert code == 2 and out == "" and err == ("error: 'cub-googlenet-binomial' is a config; train it with deepmetric "
                                               "train --config cub-googlenet-binomial (then key=value overrides, e.g. "
                                               "train.steps=2000)\n")
    code, out, err = run(capsys, "train", "demo")
    assert code == 2 and "is a study, not a run config: run it with deepmetric study demo" in err
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "config.yaml").write_text("{}")
    code, out, err = run(capsys, "train", "old")
    assert code == 2 and "'old' is a run; continue it with deepmetric train --resume --out old" in err
    code, out, err = run(capsys, "train", "steps")
    assert code == 2 and err == "error: override 'steps' is not of the form key=value\n"
    code, out, err = run(capsys, "train", "--config", "cub-googlenet-binomial")
    assert code == 2 and err == ("error: cub: no such folder: data/CUB_200_2011 (give where it is with --data "
                                 "cub:PATH; docs/data.md has each data set's layout and download)\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old"]  # nothing written


def test_help_metrics_and_config_errors_skip_the_heavy_imports(tmp_path):
    """``--help`` imports no torch, and neither ``metrics`` of precomputed embeddings nor a ``train`` stopped by a
    bad setting imports torchvision (the data pipeline and the models): each costs seconds of start-up on a small
    machine. A mistyped run or index folder, image path or ``--data`` path stops the command that reads it before
    torch is imported."""
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
    missing = str(tmp_path / "typo")  # a mistyped run, index, image or data path is named before the models load
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("{}\n")  # what makes a folder a run, to the check before any loading
    run_dir, out = str(run_dir), str(tmp_path / "out")  # nothing is written there
    for command, named in (
            (["report", missing], "no such run directory"), (["evaluate", missing], "no such run directory"),
            (["export", missing, "--out", out], "no such run directory"),
            (["search", missing, "--image", "q.png"], "is not a deepmetric index"),
            (["serve", run_dir], "is a training run, not an index"),
            (["embed", run_dir, "--images", run_dir, missing, "--out", out], f"{missing} does not exist"),
            (["index", run_dir, "--images", missing, "--out", out], f"{missing} does not exist"),
            (["explain", run_dir, "--images", missing, "--out", out], f"{missing} does not exist"),
            (["evaluate", run_dir, "--data", f"cub:{missing}"], f"cub: no such folder: {missing}"),
            (["explain", run_dir, "--data", f"sop:{missing}", "--out", out], f"sop: no such folder: {missing}")):
        result = subprocess.run([sys.executable, "-c", code, *command], capture_output=True, text=True, check=True)
        assert result.stdout.splitlines()[-1] == "loaded:" and named in result.stderr, (command, result.stderr)


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
    assert code == 0 and "trained 2 steps (steps 5-6, resumed)" in out
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
    (["search", "IDX", "--image", "q.png", "--k", "0"], "--k/-k: must be >= 1"),
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


@pytest.mark.parametrize("name", ["b\nc.png", "b\rc.png", "b\x1cc.png", "b\x85c.png", "b\u2028c.png", "b\x0bc.png"])
def test_a_name_with_any_line_break_is_refused_however_the_image_is_given(tiny_run, tmp_path, capsys, name):
    """Issue 53 item 16: names were checked on folder listings only, for \\n and \\r only: an image given directly
    (or in a list) with a line break, or with one of the other characters ``str.splitlines`` breaks at (U+001C, U+0085,
    U+2028, ...), shifted every later row of ``OUT.paths.txt``."""
    images = tmp_path / "images"
    images.mkdir()
    Image.new("L", (8, 8), 40).save(images / "a.png")
    Image.new("L", (8, 8), 90).save(images / name)
    (tmp_path / "list.txt").write_text(f"images/a.png\nimages/{name}\n")
    listed = [[str(tmp_path / "list.txt")]] if "\n" not in name else []  # a list cannot hold a name with \\n
    for given in ([str(images / "a.png"), str(images / name)], [str(images)], *listed):
        code, _, err = run(capsys, "embed", str(tiny_run), "--images", *given, "--out", str(tmp_path / "e.npy"))
        assert code == 2 and "1 image file name(s) hold a line break" in err and "Traceback" not in err, (given, err)
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
    from deepmetric.io.strict import to_json

    assert strict_json(to_json({"a": float("nan"), "b": [float("inf"), 1.5]})) == {"a": None, "b": [None, 1.5]}


def test_no_test_evaluates_nothing_on_the_test_split_and_a_resume_says_its_steps_once(tmp_path, capsys, caplog):
    """Issue 53 items 4 and 10: ``--no-test`` with ``eval.baseline: true`` (demo-emoji) still evaluated the untrained
    backbone on the test split (23 s, never shown); a resumed run said its step twice and "trained 320 steps" after
    20."""
    out_dir = tmp_path / "run"
    caplog.set_level(logging.INFO, logger="deepmetric")
    code, out, _ = run(capsys, "train", *TINY, "--out", str(out_dir), "eval.baseline=true", "--no-test")
    assert code == 0 and not (out_dir / "baseline.json").exists() and not (out_dir / "metrics.json").exists()
    assert "evaluating the untrained backbone" not in caplog.text and "trained 4 steps in" in out
    caplog.clear()
    code, out, _ = run(capsys, "train", "--resume", "--out", str(out_dir), "train.steps=6", "--no-test")
    assert code == 0 and "trained 2 steps (steps 5-6, resumed) in" in out
    assert caplog.text.count("step 4") == 1  # "run directory … (resuming after step 4)", once
    code, out, _ = run(capsys, "train", "--resume", "--out", str(out_dir), "--no-test")
    assert code == 0 and f"nothing to train: {out_dir} had reached step 6 of 6" in out


def test_evaluating_a_run_on_another_data_set_keeps_the_runs_own_record(tmp_path, capsys, caplog):
    """Issue 53 item 5: ``evaluate RUN --data OTHER`` overwrote ``RUN/metrics.json``, the run's own test figures,
    with the other data set's. They go to ``RUN/metrics-on-<data>.json``; the run's own spec still writes
    ``metrics.json``."""
    from PIL import Image

    out_dir = tmp_path / "run"
    assert run(capsys, "train", *TINY, "--out", str(out_dir), "eval.report=false")[0] == 0
    own = (out_dir / "metrics.json").read_bytes()
    other = tmp_path / "my icons"
    rng = np.random.default_rng(0)
    for label in range(4):
        for number in range(3):
            (other / f"c{label}").mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 255, (12, 12, 3), dtype=np.uint8)).save(other / f"c{label}/{number}.png")
    spec = f"folder:{other}"
    caplog.set_level(logging.INFO, logger="deepmetric")
    code, out, err = run(capsys, "evaluate", str(out_dir), "--data", spec, "--quiet")
    assert code == 0 and (out_dir / "metrics.json").read_bytes() == own
    written = [p for p in out_dir.iterdir() if p.name.startswith("metrics-on-")]
    assert len(written) == 1 and " " not in written[0].name and written[0].name.startswith("metrics-on-folder-")
    assert json.loads(written[0].read_text())["data"] == spec and written[0].name in caplog.text
    assert run(capsys, "evaluate", str(out_dir), "--data", "digits", "--quiet")[0] == 0  # its own: metrics.json
    assert json.loads((out_dir / "metrics.json").read_text())["data"] == "digits"
    assert len([p for p in out_dir.iterdir() if p.name.startswith("metrics-on-")]) == 1


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


def test_item_names_with_line_breaks_cannot_forge_lines_of_search_output(tiny_run, tmp_path, capsys):
    """Issue 53 item 26: an index item named with a line break (``Index.build(..., names=...)``, or ``index.json``
    edited) printed a line of its own in ``search``'s table, which read as one more hit. Each name is one field of
    one line now, its line breaks escaped as the other control characters are."""
    import deepmetric

    query = tmp_path / "q.png"
    Image.new("L", (8, 8), 40).save(query)
    forged = "a.png\n   2   1.0000        9  forged.png"
    images = [np.full((8, 8, 3), v, np.uint8) for v in (40, 200)]
    deepmetric.Index.build(deepmetric.load_run(tiny_run), images, tmp_path / "index", names=[forged, "b\u2028c.png"])
    code, out, err = run(capsys, "search", str(tmp_path / "index"), "--image", str(query), "--k", "2")
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 3 and "forged.png" in lines[1] and "a.png\\n" in lines[1] and "b\\u2028c.png" in lines[2]
    assert not any(line.lstrip().startswith("2   1.0000        9") for line in lines)


def test_every_command_prints_its_results_through_the_escaping_print():
    """The mechanism of item 24: no bare print() in the commands, only `say` (and stderr in main, escaped)."""
    import inspect
    import re

    from deepmetric.cli import commands

    source = inspect.getsource(commands)
    calls = re.findall(r"(?<![\w.])print\(", source)
    assert len(calls) == 1 and "def say(" in source  # the one inside say itself


def test_a_run_name_never_leaves_runs_and_a_failed_start_removes_only_what_it_made(tmp_path, capsys, monkeypatch):
    """Issue 39, item 3: the default run name was built from the unchecked --data and --backbone text: `timm:../../..`
    named a folder outside runs/ and the failed start's clean-up removed folders it had not made, then a second
    traceback. Unknown names are refused before anything is made; every generated name part is cut to safe
    characters; the clean-up removes only the folders this start created."""
    from types import SimpleNamespace

    from deepmetric.cli.train_command import default_run_name
    from deepmetric.runs.folder import RunDir

    work = tmp_path / "a" / "b" / "c"
    work.mkdir(parents=True)
    keep = tmp_path / "keepme"
    keep.mkdir()
    monkeypatch.chdir(work)
    for argv in (["--data", "evil/../../../../keepme/z", "--backbone", "tiny"],
                 ["--data", "digits", "--backbone", "timm:../../.."],
                 ["--data", "digits", "--backbone", "timm:../../../keepme"]):
        code, out, err = run(capsys, "train", *argv, "--steps", "1", "--quiet", "model.pretrained=false")
        assert code == 2 and "Traceback" not in err and err.count("\n") == 1, err
        assert not (work / "runs").exists() and keep.is_dir() and sorted(tmp_path.iterdir()) == [tmp_path / "a", keep]
    assert "timm has no model '../../..'" in err or "timm has no model '../../../keepme'" in err
    config = SimpleNamespace(data=SimpleNamespace(spec="folder:/x/../../y"),
                             model=SimpleNamespace(backbone="timm:../../..", head="g/../\x1b"))
    name = default_run_name(config, now=0)
    assert "/" not in name and ".." not in name and "\x1b" not in name and name.endswith("-folder-timm-g")
    deep = RunDir(work / "new" / ".." / "made" / "run")  # a '..' in the path: what exists is resolved first
    with deep.claimed():
        assert (work / "made" / "run").is_dir()
    assert not (work / "made").exists() and work.is_dir() and keep.is_dir()  # nothing written: only its own folders


@pytest.fixture
def no_weights(monkeypatch):
    """Record every call of the weight downloaders (torch.hub's and torchvision's GoogLeNet) instead of making it."""
    import torch.hub
    import torchvision.models

    called = []
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", lambda *a, **k: called.append(("weights", a)))
    monkeypatch.setattr(torchvision.models, "googlenet", lambda *a, **k: called.append(("googlenet", k)))
    return called


@pytest.mark.parametrize("spec", ["cub:{missing}", "cub-cropped:{missing}", "cars:{missing}", "sop:{missing}",
                                  "inshop:{missing}", "folder:{missing}", "csv:{missing}/table.csv", "emoji:{missing}",
                                  "emoji-skin:{missing}", "fashion-mnist:{missing}"])
def test_train_refuses_a_missing_data_path_before_the_weights_or_the_model(tmp_path, capsys, monkeypatch, no_weights,
                                                                           spec):
    """Issue item 28: ``train --config abe/cub-abe8 --data cub:/nonexistent`` fetched GoogLeNet's weights first (16 s,
    then failed offline), then said "expected images.txt". The data path is checked before anything slow, for every
    spec that takes a path."""
    import deepmetric.training.session as session

    monkeypatch.setenv("DEEPMETRIC_DATA", str(tmp_path / "data"))
    built = []
    monkeypatch.setattr(session, "build_model", lambda config: built.append(config))
    missing = tmp_path / "nonexistent"
    spec = spec.format(missing=missing)
    name, _, path = spec.partition(":")
    code, out, err = run(capsys, "train", "--config", "abe/cub-abe8", "--data", spec, "--out", str(tmp_path / "run"))
    assert (code, out) == (2, "")
    assert err == (f"error: {name}: no such {'file' if name == 'csv' else 'folder'}: {path} (give where it is with "
                   f"--data {name}:PATH; docs/data.md has each data set's layout and download)\n")
    assert no_weights == [] and built == [] and not (tmp_path / "run").exists() and not (tmp_path / "data").exists()


def test_train_from_python_checks_the_data_path_before_the_run_folder_or_the_model(tmp_path, monkeypatch,
                                                                                   no_weights):
    import deepmetric.training.session as session
    from deepmetric.errors import DataError
    from deepmetric.training import train
    from helpers import tiny_config

    built = []
    monkeypatch.setattr(session, "build_model", lambda config: built.append(config))
    config = tiny_config(data={"spec": f"cub:{tmp_path / 'nonexistent'}"}, model={"backbone": "googlenet",
                                                                                   "pretrained": True})
    with pytest.raises(DataError, match=f"^cub: no such folder: {tmp_path / 'nonexistent'}$"):
        train(config, tmp_path / "run", progress=False)
    assert built == [] and no_weights == [] and not (tmp_path / "run").exists()


def test_a_missing_data_path_stops_train_before_the_model_code_is_imported(tmp_path):
    """The same from a fresh process: refused before torchvision (the models, the weights) is imported."""
    import subprocess
    import sys

    code = ("import sys\nfrom deepmetric.cli import main\nstatus = main(sys.argv[1:])\n"
            "print('exit', status, 'loaded:', *(m for m in ('torchvision', 'timm') if m in sys.modules))")
    missing = tmp_path / "nonexistent"
    result = subprocess.run([sys.executable, "-c", code, "train", "--config", "abe/cub-abe8", "--data",
                             f"cub:{missing}", "--out", str(tmp_path / "run")], capture_output=True, text=True,
                            check=True)
    assert result.stdout.splitlines()[-1] == "exit 2 loaded:"
    assert result.stderr == (f"error: cub: no such folder: {missing} (give where it is with --data cub:PATH; "
                             "docs/data.md has each data set's layout and download)\n")


def test_evaluate_report_explain_and_a_study_dry_run_check_the_data_path_before_the_model(tiny_run, tmp_path, capsys,
                                                                                       monkeypatch):
    import shutil

    import deepmetric.report.html as report
    import deepmetric.studies.dry_run as dry_run
    import deepmetric.viz.explain as explain
    import deepmetric.workflows as workflows

    loaded = []
    record = lambda *a, **k: loaded.append(a)  # noqa: E731
    for module, name in ((workflows, "load_run_model"), (workflows, "load_run_checkpoint"), (report, "load_run_model"),
                         (explain, "_load"), (dry_run, "_build")):
        monkeypatch.setattr(module, name, record)
    missing = tmp_path / "nonexistent"
    message = f"error: cub: no such folder: {missing}\n"
    assert run(capsys, "evaluate", str(tiny_run), "--data", f"cub:{missing}")[1:] == ("", message)
    assert run(capsys, "explain", str(tiny_run), "--data", f"cub:{missing}", "--out", str(tmp_path / "x"))[2] == message
    moved = tmp_path / "moved-run"  # a run whose data folder has gone since it trained
    shutil.copytree(tiny_run, moved)
    saved = yaml.safe_load((moved / "config.yaml").read_text())
    saved["data"]["spec"] = f"cub:{missing}"
    (moved / "config.yaml").write_text(yaml.safe_dump(saved))
    for argv in (["evaluate", str(moved)], ["evaluate", str(moved), "--all-embeddings"], ["report", str(moved)]):
        assert run(capsys, *argv) == (2, "", message)
    base = tmp_path / "base.yaml"
    base.write_text((moved / "config.yaml").read_text())
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump({"name": "missing-data", "base": str(base), "out": str(tmp_path / "study"),
                                     "variants": {"gap": {}}}))
    code, out, err = run(capsys, "study", str(study), "--dry-run")
    assert code == 2 and f"FAILS: cub: no such folder: {missing}" in out and "1 of 1 runs would fail" in err
    assert loaded == [] and not (tmp_path / "study").exists() and not (tmp_path / "x").exists()


def test_odd_inputs_of_embed_metrics_study_and_resume_are_one_line_each(tiny_run, tmp_path, capsys, monkeypatch):
    """Issue 39, item 27: `embed --out feat.v2` wrote feat.npy; `metrics` tracebacked on text or complex arrays and
    scored boolean embeddings and (N, 2) labels; `--only ','` ran every variant; a file at RUN/tensorboard was a
    traceback on --resume; `--only gap` must not be refused for another variant's missing extra."""
    import importlib.util
    import shutil

    images = tmp_path / "images"
    images.mkdir()
    Image.new("L", (8, 8), 40).save(images / "a.png")
    code, out, err = run(capsys, "embed", str(tiny_run), "--images", str(images), "--out", str(tmp_path / "feat.v2"),
                         "--quiet")
    assert code == 0, err
    assert (tmp_path / "feat.v2.npy").is_file() and (tmp_path / "feat.v2.paths.txt").is_file()
    assert not (tmp_path / "feat.npy").exists() and "feat.v2.npy" in out
    Image.new("L", (8, 8), 200).save(images / "b.png")  # a .txt list, as index takes it: embed read it as an image
    (tmp_path / "list.txt").write_text("# two images, in this order\nimages/b.png\n\nimages/a.png\n")
    code, out, err = run(capsys, "embed", str(tiny_run), "--images", str(tmp_path / "list.txt"), "--out",
                         str(tmp_path / "listed.npy"), "--quiet")
    assert code == 0, err
    listed, whole = np.load(tmp_path / "listed.npy"), np.load(tmp_path / "feat.v2.npy")
    assert listed.shape[0] == 2 and np.allclose(listed[1], whole[0], atol=1e-6)  # a.png, second in the list
    folder = images.resolve()
    assert (tmp_path / "listed.paths.txt").read_text() == f"{folder / 'b.png'}\n{folder / 'a.png'}\n"
    for folder in (str(tmp_path), f"{tmp_path / 'new'}/"):  # a folder, or a name ending in '/': no hidden '.npy'
        code, out, err = run(capsys, "embed", str(tiny_run), "--images", str(images), "--out", folder, "--quiet")
        example = tmp_path / ("new" if folder.endswith("/") else "") / "embeddings.npy"
        assert code == 2 and out == ""
        assert err == f"error: {folder} is a folder; give the file to write, e.g. {example}\n"
    assert not (tmp_path / ".npy").exists() and not (tmp_path / "new").exists()

    good, labels = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32), np.array([0, 0, 1, 1, 2, 2])
    arrays = {"text": np.array([["a", "b"]] * 6), "complex": good.astype(np.complex64), "bool": good > 0,
              "good": good, "labels": labels, "labels2": np.zeros((6, 2), dtype=int)}
    for name, array in arrays.items():
        np.save(tmp_path / f"{name}.npy", array)
    for embeddings, labels_file, message in (("text", "labels", "must be real numbers (float or integer), got an "
                                              "array of <U1"),
                                             ("complex", "labels", "got an array of complex64"),
                                             ("bool", "labels", "got an array of bool"),
                                             ("good", "labels2", "must be a 1-D array of one label per embedding, "
                                              "got shape (6, 2)")):
        code, out, err = run(capsys, "metrics", str(tmp_path / f"{embeddings}.npy"), str(tmp_path / f"{labels_file}"
                                                                                           ".npy"))
        assert code == 2 and message in err and "Traceback" not in err and out == ""

    base = {"data": {"spec": "digits", "image_size": 16, "classes_per_batch": 3, "samples_per_class": 4},
            "model": {"backbone": "tiny", "pretrained": False, "embedding_dim": 16}, "eval": {"nmi": False}}
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    study = {"name": "odd", "base": "base.yaml", "out": str(tmp_path / "study"), "set": {"train.steps": 1},
             "variants": {"gap": {}, "tb": {"train.tensorboard": True}}}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    code, out, err = run(capsys, "study", str(tmp_path / "study.yaml"), "--only", " , ", "--quiet")
    assert code == 2 and "--only names no variant (' , ')" in err and not (tmp_path / "study").exists()
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: None if name == "tensorboard" else
                        find_spec(name, *a, **k))
    code, out, err = run(capsys, "study", str(tmp_path / "study.yaml"), "--only", "gap", "--quiet")
    assert code == 0, err  # tb's missing tensorboard is its own run's problem, and tb is not asked for
    monkeypatch.undo()

    (tmp_path / "a.onnx").write_text("a file")  # export --out a.onnx/m.onnx: its folder would be a file
    for argv in (["export", str(tiny_run), "--out", str(tmp_path / "a.onnx" / "m.onnx")],
                 ["embed", str(tiny_run), "--images", str(images), "--out", str(tmp_path / "a.onnx" / "x" / "e.npy")]):
        code, out, err = run(capsys, *argv)
        assert code == 2 and f"{tmp_path / 'a.onnx'} is a file, not a folder" in err and "File exists" not in err
    assert (tmp_path / "a.onnx").read_text() == "a file"

    run_dir = tmp_path / "run"
    shutil.copytree(tiny_run, run_dir)
    (run_dir / "tensorboard").write_text("not a folder")
    code, out, err = run(capsys, "train", "--resume", "--out", str(run_dir), "--steps", "3", "--quiet",
                         "train.tensorboard=true")
    assert code == 2 and "tensorboard is not a folder (a file or a link is there)" in err and "Traceback" not in err


def test_output_cut_by_a_closed_pipe_ends_quietly():
    """`deepmetric presets | head -1` ended with a BrokenPipeError traceback: it now stops quietly (status 141)."""
    import subprocess
    import sys

    shell = f"{sys.executable} -m deepmetric presets | head -c 10"
    done = subprocess.run(["bash", "-c", f"set -o pipefail; {shell}"], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert len(done.stdout) == 10


def test_a_key_value_inside_a_regulariser_sets_that_value_and_keeps_the_others(tmp_path, monkeypatch):
    """``loss.regularizers.NAME.weight=...`` (what ``--regularizer``'s help advises) sets one value: the config's other
    regularisers and this one's other options stay (a layer replaces ``loss.regularizers`` whole: nested alone, the
    override once dropped them)."""
    import deepmetric.training.session as session
    from helpers import tiny_config

    class Built(Exception):
        pass

    def build_model(config):
        raise Built(config)

    monkeypatch.setattr(session, "build_model", build_model)
    config = tiny_config(model={"head": "abe", "head_options": {"num_learners": 2}},
                         loss={"regularizers": {"divergence": {"weight": 1.0, "margin": 0.5},
                                                "activation-decay": {"weight": 0.01}}})
    (tmp_path / "abe.yaml").write_text(yaml.safe_dump(config.to_dict()))
    with pytest.raises(Built) as built:
        main(["train", "--config", str(tmp_path / "abe.yaml"), "--out", str(tmp_path / "run"), "--quiet",
              "loss.regularizers.divergence.weight=0.25", "model.head_options.num_learners=3"])
    trained = built.value.args[0]
    assert trained.loss.regularizers == {"divergence": {"weight": 0.25, "margin": 0.5},
                                         "activation-decay": {"weight": 0.01}}
    assert trained.model.head_options == {"num_learners": 3}
    with pytest.raises(Built) as built:  # a whole mapping still replaces the setting, as in a config file
        main(["train", "--config", str(tmp_path / "abe.yaml"), "--out", str(tmp_path / "run2"), "--quiet",
              "loss.regularizers={divergence: {weight: 0.5}}"])
    assert built.value.args[0].loss.regularizers == {"divergence": {"weight": 0.5}}
