"""Files deepmetric reads back, crafted by a red team (issue 53 items 13, 14, 15, 21): a checkpoint whose
``model_spec`` asks for options, types or sizes no run writes; JSON and YAML nested 100,000 deep; a config with a
section or key given twice. Each is one error naming the file and what was expected, never a traceback."""

from __future__ import annotations

import json
import shutil

import pytest

from deepmetric.cli import main
from deepmetric.errors import DeepMetricError
from deepmetric.io import MAX_NESTING, MalformedFile, load_json, load_yaml
from deepmetric.training.run_dir import RunDir

DEEP = "[" * 100_000 + "]" * 100_000


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def copy_run(tiny_run, tmp_path, name="run"):
    target = tmp_path / name
    shutil.copytree(tiny_run, target)
    return target


def test_the_loaders_refuse_deep_nesting_at_any_depth_without_recursion():
    """Nesting beyond Python's recursion limit (the reader's RecursionError) and just below it (where a later
    recursive walk would fail) are both one ``MalformedFile``; what deepmetric writes (a few levels) reads."""
    for text in (DEEP, "[" * 900 + "]" * 900, '{"a": ' * 500 + "1" + "}" * 500):
        with pytest.raises(MalformedFile, match="nests too deeply"):
            load_json(text)
        with pytest.raises(MalformedFile, match="nests too deeply"):
            load_yaml(text)
    shallow = "[" * MAX_NESTING + "]" * MAX_NESTING
    assert load_json(shallow) is not None and load_yaml(shallow) is not None
    with pytest.raises(MalformedFile, match="not UTF-8"):
        load_json(b'{"a": "\xe9"}')


def test_run_files_nested_100000_deep_are_one_error_naming_them(tiny_run, tmp_path, capsys):
    """Issue 53 item 15: a checkpoint header, RUN/config.yaml, metrics.jsonl, metrics.json (and baseline.json) and
    environment.json holding 100,000 nested brackets: each was a RecursionError traceback."""
    from safetensors.torch import load_file, save_file

    from deepmetric.report.html import _read_record
    from deepmetric.training.checkpoint import FORMAT

    broken = copy_run(tiny_run, tmp_path)
    (broken / "config.yaml").write_text(DEEP)
    code, _, err = run(capsys, "evaluate", broken, "--quiet")
    assert code == 2 and "config.yaml nests too deeply" in err and "Traceback" not in err, err

    broken = copy_run(tiny_run, tmp_path, "header")
    last = broken / "checkpoints" / "last.safetensors"
    save_file(load_file(last), last, metadata={"format": FORMAT, "state": DEEP})
    code, _, err = run(capsys, "evaluate", broken, "--quiet")
    assert code == 2 and "last.safetensors has a damaged header" in err and "nests too deeply" in err, err

    broken = copy_run(tiny_run, tmp_path, "logs")
    run_dir = RunDir(broken)
    run_dir.metrics_log.write_text(DEEP + "\n" + '{"step": 1}\n')
    with pytest.raises(DeepMetricError, match=r"metrics.jsonl line 1 is not a JSON object \(it nests too deeply"):
        run_dir.read_log()
    run_dir.metrics_log.write_text('{"step": 1}\n' + DEEP + "\n")  # a last line that is whole but too deep
    with pytest.raises(DeepMetricError, match="line 2 is not a JSON object"):
        run_dir.read_log()
    run_dir.metrics_log.write_text('{"step": 1}\n[1, 2]\n{"step": 2}\n')
    with pytest.raises(DeepMetricError, match=r"line 2 is not a JSON object \(a list\)"):
        run_dir.read_log()
    for name in ("metrics.json", "baseline.json"):
        (broken / name).write_text(DEEP)
        with pytest.raises(DeepMetricError, match=f"{name} is not the JSON deepmetric writes .it nests too deeply"):
            _read_record(broken / name)

    run_dir.environment.write_text(DEEP)  # as any damaged environment.json: left aside, a new one started
    assert run_dir.sessions() == []
    run_dir.add_session({"started": "now"})
    assert (broken / "environment.json.damaged").read_text() == DEEP
    assert json.loads(run_dir.environment.read_text()) == {"sessions": [{"started": "now"}]}


def test_a_section_or_key_given_twice_is_refused_and_extends_is_read_beside_the_file(tmp_path, monkeypatch, capsys):
    """Issue 53 item 21: two ``train:`` sections (or a key twice in one section) kept the last silently; ``extends:
    base`` read ``./base.yaml`` of the working directory instead of the ``base.yaml`` beside the config."""
    from deepmetric.config import load_yaml as load_config
    from deepmetric.errors import ConfigError

    twice = tmp_path / "twice.yaml"
    twice.write_text("train:\n  steps: 10\nmodel:\n  head: gap\ntrain:\n  lr: 0.01\n")
    with pytest.raises(ConfigError, match=r"twice.yaml repeats the key 'train' in one mapping \(lines 1 and 5\)"):
        load_config(twice)
    twice.write_text("train:\n  steps: 10\n  lr: 0.1\n  steps: 20\n")
    with pytest.raises(ConfigError, match=r"repeats the key 'steps' in one mapping \(lines 2 and 4\)"):
        load_config(twice)
    code, _, err = run(capsys, "train", "--config", twice, "--out", tmp_path / "out", "--quiet")
    assert code == 2 and "repeats the key 'steps'" in err and not (tmp_path / "out").exists()
    run_config = tmp_path / "run" / "config.yaml"  # a run's own config.yaml is read with the same loader
    run_config.parent.mkdir()
    run_config.write_text("train:\n  steps: 1\ntrain:\n  steps: 2\n")
    with pytest.raises(DeepMetricError, match="config.yaml repeats the key 'train'"):
        RunDir(run_config.parent).config()
    merged = tmp_path / "merge.yaml"  # YAML's merge key is not a repeat
    merged.write_text("train: &t {steps: 3}\nmodel:\n  <<: {head: abe}\n  embedding_dim: 8\n")
    assert load_config(merged)["model"] == {"head": "abe", "embedding_dim": 8}

    configs, elsewhere = tmp_path / "configs", tmp_path / "elsewhere"
    configs.mkdir()
    elsewhere.mkdir()
    (configs / "base.yaml").write_text("train:\n  steps: 7\n")
    (configs / "child.yaml").write_text("extends: base\nmodel:\n  head: gap\n")
    (configs / "grandchild.yaml").write_text("extends: child.yaml\n")
    (elsewhere / "base.yaml").write_text("train:\n  steps: 99\n")
    monkeypatch.chdir(elsewhere)
    assert load_config(configs / "child.yaml")["train"] == {"steps": 7}
    assert load_config(configs / "grandchild.yaml")["train"] == {"steps": 7}
    (configs / "base.yaml").unlink()  # gone from beside the file: not taken from the working directory either
    with pytest.raises(ConfigError, match="extends 'base' does not exist and is not a preset"):
        load_config(configs / "child.yaml")
    (configs / "preset.yaml").write_text("extends: demo-glyphs\n")  # a preset's name still works
    assert load_config(configs / "preset.yaml")["data"]["spec"].startswith("glyphs")
