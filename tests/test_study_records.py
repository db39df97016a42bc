"""A study's record as evidence (issue 51 item 4): per-query results kept, a SHA-256 manifest, tables that
``deepmetric study FILE --verify`` recomputes from the record; and the red team's findings on records (issue 53
items 15, 18, 19). One tiny study is trained once per module; each test works on its own copy of the record."""

from __future__ import annotations

import csv
import json
import shutil

import pytest
import yaml

from deepmetric.cli import main
from deepmetric.errors import DeepMetricError
from deepmetric.studies import load_study, run_study
from helpers import tiny_config

VARIANTS = {"gap": {}, "abe": {"model.head": "abe", "model.head_options": {"num_learners": 2}}}


def write_study(folder, record=None, **extra):
    """A study of the tiny backbone in ``folder`` (its out folder ``folder/out``, its record ``record``)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "base.yaml").write_text(yaml.safe_dump(tiny_config(train={"steps": 2}).to_dict()))
    study = {"name": "tiny", "base": "base.yaml", "out": str(folder / "out"), "set": {"train.steps": 2},
             "variants": VARIANTS, "seeds": [0, 1], "compare": ["gap"],
             "record": str(record or folder / "record"), **extra}
    (folder / "study.yaml").write_text(yaml.safe_dump(study))
    return folder / "study.yaml"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The record of a finished study (gap and abe, seeds 0 and 1, compared with gap), trained once."""
    folder = tmp_path_factory.mktemp("trained")
    run_study(load_study(write_study(folder)), progress=False)
    return folder / "record"


@pytest.fixture
def study(trained, tmp_path):
    """A fresh checkout: a copy of the trained record, no runs folder; the study file that restores it."""
    shutil.copytree(trained, tmp_path / "record")
    return write_study(tmp_path)


def test_a_record_keeps_per_query_results_a_manifest_and_tables_that_verify(study, tmp_path, capsys):
    from deepmetric.evaluation.metrics import per_query_metrics
    from deepmetric.evaluation.per_query import load_per_query

    record = tmp_path / "record"
    for variant in VARIANTS:
        for seed in "01":
            metrics = json.loads((record / variant / seed / "metrics.json").read_text())
            loaded = load_per_query(record / variant / seed / "per-query.npz")
            assert per_query_metrics(loaded.per_query, [1, 2, 4, 8]) == {  # metrics.json's figures, exactly
                k: v for k, v in metrics["metrics"].items() if k != "nmi"}
            assert metrics["queries_sha256"] == loaded.identity["queries_sha256"]
    manifest = (record / "MANIFEST.sha256").read_text().splitlines()
    assert "  gap/0/per-query.npz" in "\n".join(manifest) and any(line.endswith("  results.md") for line in manifest)
    table = (record / "results.md").read_text()
    assert "## 95% intervals" in table and "### The tests" in table
    line = next(row for row in table.splitlines() if row.startswith("| abe | gap | R@1 |"))
    assert line.split(" | ")[6] == "2" and line.split(" | ")[7].startswith("[")  # 2 seeds paired, an interval
    rows = list(csv.DictReader((record / "results-statistics.csv").open()))
    compared = next(r for r in rows if r["kind"] == "comparison" and r["metric"] == "map@r")
    assert compared["variant"] == "abe" and compared["repeats_paired"] == "2" and compared["bootstrap_p"]

    assert main(["study", str(study), "--verify"]) == 0
    out = capsys.readouterr().out
    assert "study tiny, record" in out and ": verified (" in out and "note: per-query" not in out
    assert not (tmp_path / "out").exists()  # nothing trained, restored or written

    run_study(load_study(study), progress=False)  # the fresh checkout restores and aggregates: the record unchanged
    assert (record / "MANIFEST.sha256").read_text().splitlines() == manifest


def test_verify_names_every_file_a_hand_edit_touched(study, tmp_path, capsys):
    record = tmp_path / "record"
    metrics_file = record / "abe/1/metrics.json"
    data = json.loads(metrics_file.read_text())
    data["metrics"]["recall@1"] += 0.05
    metrics_file.write_text(json.dumps(data, indent=2))
    table = record / "results.md"
    table.write_text(table.read_text().replace("| abe | 2 | ", "| abe | 2 | 9", 1))
    (record / "gap/0/notes.txt").write_text("added by hand")
    assert main(["study", str(study), "--verify"]) == 1
    captured = capsys.readouterr()
    errors = captured.err.splitlines()
    assert all(line.startswith("error: ") for line in errors) and "Traceback" not in captured.err
    assert f"error: {metrics_file} does not match MANIFEST.sha256 (its SHA-256 changed since it was recorded)" in errors
    assert f"error: {table} does not match MANIFEST.sha256 (its SHA-256 changed since it was recorded)" in errors
    assert f"error: {record / 'gap/0/notes.txt'} is not listed in MANIFEST.sha256" in errors
    assert any(line.startswith(f"error: {metrics_file}: recall@1 is ") and "per-query.npz gives" in line
               for line in errors)
    assert any(line.startswith(f"error: {table} line ") for line in errors)
    assert any(line.startswith(f"error: {record / 'results.csv'} line ") and "recall@1" in line for line in errors)
    assert "1 problem" not in captured.out and "problem(s)" in captured.out


def test_a_record_from_before_per_query_results_still_verifies_and_says_what_it_cannot(study, tmp_path, capsys):
    """The committed records (docs/studies/) hold no per-query files: their hashes and tables are verified, the
    per-query checks and the bootstrap are said to be unavailable, and that is no failure."""
    record = tmp_path / "record"
    for path in record.rglob("per-query.npz"):
        path.unlink()
    for name in ("MANIFEST.sha256", "results.md", "results.csv", "results-statistics.csv"):
        (record / name).unlink()
    assert main(["study", str(study), "--verify"]) == 1  # no manifest yet: that is a problem
    assert "MANIFEST.sha256 is missing" in capsys.readouterr().err
    run_study(load_study(study), progress=False)  # restored from the record and aggregated, nothing trained
    assert not any((tmp_path / "out/runs").rglob("*.safetensors"))
    assert "| abe | gap | R@1 | " in (record / "results.md").read_text()
    assert main(["study", str(study), "--verify"]) == 0
    captured = capsys.readouterr()
    assert ": verified (" in captured.out and captured.err == ""
    assert "note: per-query checks unavailable for 4 of 4 recorded runs" in captured.out


def test_two_processes_retraining_a_changed_run_train_it_once(study, tmp_path, monkeypatch, caplog):
    """Issue 53 item 18: the set-aside happened before the run was held, so a second ``--retrain-changed`` process
    set aside the run the first had just trained with the new settings, and trained it a second time. The set-aside
    happens under the run's lock, after looking again: the second process finds it trained and leaves it."""
    import deepmetric.studies.runner as runner
    from deepmetric.runs.folder import RunDir

    run_study(load_study(study), progress=False)  # restored: gap/0 etc. finished with train.steps 2
    other = tmp_path / "other"
    shutil.copytree(tmp_path / "record", other / "record")
    run_study(load_study(write_study(other, set={"train.steps": 3}, seeds=[0], variants={"gap": {}})),
              progress=False, retrain_changed=True)  # what the first process makes of gap/0 (steps 3)
    changed = write_study(tmp_path, set={"train.steps": 3}, seeds=[0], variants={"gap": {}})
    run = tmp_path / "out/runs/gap/0"
    looked = RunDir.holder

    def first_process_finishes_it(self):  # between this process's first look and its turn at gap/0
        if self.path == run and not (run.parent / "0.replaced-by-the-first").exists():
            (run.parent / "0.replaced-by-the-first").mkdir()
            for entry in run.iterdir():
                entry.rename(run.parent / "0.replaced-by-the-first" / entry.name)
            for entry in (other / "out/runs/gap/0").iterdir():
                if entry.name != ".lock":
                    shutil.copytree(entry, run / entry.name) if entry.is_dir() else shutil.copy2(entry, run)
        return looked(self)

    trained = []
    monkeypatch.setattr(RunDir, "holder", first_process_finishes_it)
    monkeypatch.setattr(runner, "train", lambda config, directory, **kwargs: trained.append(directory))
    with caplog.at_level("INFO", logger="deepmetric"):
        run_study(load_study(changed), progress=False, retrain_changed=True)
    assert trained == [] and "gap/0: trained again by another process" in caplog.text
    assert sorted(p.name for p in run.parent.iterdir()) == ["0", "0.replaced-by-the-first", "1"]  # not set aside twice
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["steps"] == 3


def test_recording_a_retrained_run_replaces_its_record_instead_of_merging(study, tmp_path):
    """Issue 53 item 18: the record kept the replaced run's metrics-last.json (or metrics-all-embeddings.json) beside
    the new run's config, and a fresh checkout restored that mixture. Recording a run replaces its record folder."""
    record = tmp_path / "record/gap/0"
    (record / "metrics-last.json").write_text((record / "metrics.json").read_text())  # the old run's, say
    (record / "notes.txt").write_text("mine")  # not deepmetric's: kept, never deleted
    run_study(load_study(study), progress=False)
    assert (tmp_path / "out/runs/gap/0/metrics-last.json").is_file()  # restored with the run
    changed = write_study(tmp_path, set={"train.steps": 3}, seeds=[0], variants={"gap": {}}, compare=[])
    run_study(load_study(changed), progress=False, retrain_changed=True)
    assert yaml.safe_load((record / "config.yaml").read_text())["train"]["steps"] == 3
    assert not (record / "metrics-last.json").exists()  # the new run has none: nor has its record
    assert sorted(p.name for p in record.iterdir()) == ["config.yaml", "environment.json", "metrics.json",
                                                        "metrics.jsonl", "notes.txt", "per-query.npz"]
    assert (record / "notes.txt").read_text() == "mine"
    assert not [p for p in record.parent.iterdir() if p.name.startswith(".")]  # no temporary folder left


def test_a_record_cannot_rename_a_variant_nor_write_markdown_into_the_tables(study, tmp_path, capsys):
    """Issue 53 item 19: a record's metrics.json with ``"variant": 7`` among its metrics renamed the run's row, and
    its ``data`` (or an embedding's name) went into results.md and the CSV as written: a cell, a link, HTML. Metric
    names are checked (a file that breaks them is a damaged record, named), and every text is escaped."""
    record = tmp_path / "record"
    renamed = record / "abe/0/metrics.json"
    data = json.loads(renamed.read_text())
    data["metrics"]["variant"] = 7
    renamed.write_text(json.dumps(data))
    for seed in "01":
        injected = record / f"gap/{seed}/metrics.json"
        data = json.loads(injected.read_text())
        data["data"] = "=HYPERLINK(\"http://x\")<img src=x onerror=alert(1)>|[a](http://evil)"
        injected.write_text(json.dumps(data))
    assert main(["study", str(study), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{renamed} is damaged (its 'metrics' holds a metric named 'variant'" in err and "abe/0" in err
    rows = list(csv.DictReader((tmp_path / "out/results.csv").open()))
    assert sorted({(r["variant"], r["repeat"]) for r in rows}) == [("abe", "1"), ("gap", "0"), ("gap", "1")]
    assert rows[0]["data"].startswith("'=HYPERLINK")  # a spreadsheet formula, neutralised
    table = (tmp_path / "out/results.md").read_text()
    assert "<img" not in table and "[a](" not in table  # no HTML, no link
    assert "&lt;img src=x onerror=alert(1)&gt;\\|\\[a\\](http://evil)" in table  # the text itself, escaped
    lines = table.splitlines()
    header, row = lines[line_index(table, "| variant |")], lines[line_index(table, "| gap |")]
    assert row.count(" | ") == header.count(" | ")  # the main table's row keeps its columns

    data["data"] = {"nested": 1}  # not a data set's name
    injected.write_text(json.dumps(data))
    from deepmetric.studies.record import problem

    assert problem(injected) == "its 'data' is not a data set's name"


def line_index(text, start):
    return next(i for i, line in enumerate(text.splitlines()) if line.startswith(start))


def test_an_embedding_name_from_a_record_is_escaped(tmp_path):
    from deepmetric.studies.record import problem
    from deepmetric.studies.summary import markdown

    spec = load_study(write_study(tmp_path))
    rows = [{"variant": "abe / <b>x</b> | *y*", "repeat": 0, "data": "d", "recall@1": 0.5}]
    assert "| abe / &lt;b&gt;x&lt;/b&gt; \\| \\*y\\* | 1 | **50.00** |" in markdown(spec, rows)
    damaged = tmp_path / "metrics-all-embeddings.json"
    damaged.write_text(json.dumps({"embeddings": {"a\nb": {"recall@1": 0.5}}}))
    assert "an embedding named 'a\\nb'" in problem(damaged)


def test_a_linked_folder_in_the_record_is_refused_before_anything_is_written_through_it(study, tmp_path, capsys):
    """Issue 53 item 19: a variant folder of the record that is a symbolic link made record_run write the run's files
    wherever it pointed. A link anywhere in the record is refused with one line naming it, before any run."""
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.rmtree(tmp_path / "record/gap")
    (tmp_path / "record/gap").symlink_to(outside, target_is_directory=True)
    assert main(["study", str(study), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{tmp_path / 'record/gap'} is a symbolic link" in err and "Traceback" not in err
    assert list(outside.iterdir()) == [] and not (tmp_path / "out/runs").exists()
    assert main(["study", str(study), "--verify"]) == 1
    assert "is a symbolic link" in capsys.readouterr().err

    from deepmetric.runs.folder import RunDir
    from deepmetric.studies.record import record_run

    shutil.copytree(tmp_path / "record/abe/0", tmp_path / "run")
    with pytest.raises(DeepMetricError, match="is a symbolic link"):
        record_run(RunDir(tmp_path / "run"), tmp_path / "record/gap/0", tmp_path / "record")
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("name", ["metrics.json", "environment.json", "metrics.jsonl", "config.yaml"])
def test_a_record_file_nested_100000_deep_fails_its_run_not_the_study(study, tmp_path, capsys, name):
    """Issue 53 item 15: JSON nested 100,000 deep in a record file raised RecursionError out of the parser and
    killed the whole study (a traceback). That run is a damaged record, named; the others are aggregated."""
    deep = tmp_path / "record/abe/1" / name
    deep.write_text("[" * 100_000 + "]" * 100_000 if name != "config.yaml" else "a: " + "[" * 100_000
                    + "]" * 100_000)
    assert main(["study", str(study), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "RecursionError" not in err
    assert f"{deep} is damaged (it nests too deeply to be a file deepmetric writes)" in err and "abe/1" in err
    rows = list(csv.DictReader((tmp_path / "out/results.csv").open()))
    assert len(rows) == 3  # the three other runs
