"""Files deepmetric reads back, crafted by a red team (issue 53 items 13, 14, 15, 21): a checkpoint whose
``model_spec`` asks for options, types or sizes no run writes; JSON and YAML nested 100,000 deep; a config with a
section or key given twice. Each is one error naming the file and what was expected, never a traceback."""

from __future__ import annotations

import json
import shutil

import pytest

from deepmetric.cli import main
from deepmetric.errors import DeepMetricError
from deepmetric.io.strict import MAX_NESTING, MalformedFile, load_json, load_yaml
from deepmetric.runs.folder import RunDir

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
    from deepmetric.runs.checkpoint import FORMAT

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


def test_a_checkpoint_spec_asks_for_nothing_the_config_would_refuse(tiny_run, tmp_path, capsys, monkeypatch):
    """Issue 53 items 13, 14 (and 26's ``freeze_bn: banana``): ``model_spec`` is checked as the config's ``model``
    section is, and its size planned on the meta device, before anything is built. ``head_options: {weights: x.pth,
    trust_pickle: true}`` reached ``create_model`` as its own keywords and loaded a torch pickle without
    --trust-pickle; a repeated key was a TypeError; -5, 16.5 tracebacks from torch; 3 x 10**9 dimensions asked for
    384 GB and JCF with 10**7 codewords for 10 GB; ``banana`` loaded."""
    from safetensors.torch import load_file, save_file

    from deepmetric.errors import CheckpointError
    from deepmetric.runs.checkpoint import FORMAT, checkpoint_state
    from deepmetric.runs.model import model_from_tensors

    last = tiny_run / "checkpoints" / "last.safetensors"
    tensors, state = load_file(last), checkpoint_state(last)
    spec = state["model_spec"]
    monkeypatch.chdir(tmp_path)
    torch = pytest.importorskip("torch")
    torch.save({"weight": torch.zeros(1)}, tmp_path / "x.pth")  # a pickle the header points at
    opened = []
    monkeypatch.setattr(torch, "load", lambda *a, **k: opened.append(a) or {})
    cases = {
        "pickle": ({"head_options": {"weights": "x.pth", "trust_pickle": True}},
                   "head 'gap' has no option 'weights'; its options are: use_tail, l2"),
        "repeated key": ({"head_options": {"embedding_dim": 4}}, "head 'gap' has no option 'embedding_dim'"),
        "negative": ({"embedding_dim": -5}, "model.embedding_dim must be at least 0, got -5"),
        "fraction": ({"embedding_dim": 16.5}, "'model.embedding_dim': expected an integer, got 16.5"),
        "huge": ({"embedding_dim": 3 * 10**9}, "model.embedding_dim must be at most 65,536"),
        "jcf": ({"head": "jcf", "head_options": {"codewords": 10**7}},
                r"the model tiny \+ jcf \(embedding_dim=16, codewords=10000000\) would hold [\d,]+ parameters"),
        "option type": ({"head": "jcf", "head_options": {"codewords": "many"}},
                        "'model.head_options.codewords': expected an integer, got 'many'"),
        "freeze_bn": ({"freeze_bn": "banana"}, "model.freeze_bn must be true, false or stats, got 'banana'"),
        "backbone": ({"backbone": "../../x"}, "unknown backbone"),
    }
    for edit, message in cases.values():
        with pytest.raises(CheckpointError, match=f"last.safetensors: its model_spec describes no model deepmetric "
                                                  f"builds: .*{message}"):
            model_from_tensors(tensors, {**state, "model_spec": {**spec, **edit}}, last)
    assert opened == []
    with pytest.raises(CheckpointError, match="does not fit the model it describes: missing .*head.dictionary"):
        model_from_tensors(tensors, {**state, "model_spec": {**spec, "head": "jcf", "head_options": {"codewords": 4}}},
                           last)
    wider = {**spec, "embedding_dim": 4096}  # a plan's shapes are compared before the model is allocated
    with pytest.raises(CheckpointError, match=r"1 tensor\(s\) of another shape, e.g. head.embed.weight \(16, 32\) "
                                              r"\(expected \(4096, 32\)\)"):
        model_from_tensors(tensors, {**state, "model_spec": wider}, last)
    as_text = {**spec, "embedding_dim": "16"}  # read as the config reads it
    assert model_from_tensors(tensors, {**state, "model_spec": as_text}, last).embedding_dim == 16

    broken = copy_run(tiny_run, tmp_path)
    target = broken / "checkpoints" / "last.safetensors"
    save_file(tensors, target, metadata={"format": FORMAT, "state": json.dumps(
        {**state, "model_spec": {**spec, "head_options": {"weights": "x.pth", "trust_pickle": True}}})})
    code, _, err = run(capsys, "evaluate", broken, "--quiet")
    assert code == 2 and "has no option 'weights'" in err and "Traceback" not in err and opened == [], err
