"""Studies: the grid, resumption, and the aggregation (mean ± std checked against numpy)."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from deepmetric.errors import CheckpointError, ConfigError, DeepMetricError
from deepmetric.studies import aggregate, load_study, run_study
from deepmetric.studies.summary import summarise
from helpers import tiny_config


def write_study(tmp_path, **extra):
    base = tiny_config(train={"steps": 2}).to_dict()
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    study = {"name": "tiny", "base": "base.yaml", "out": str(tmp_path / "out"), "set": {"train.steps": 2},
             "variants": {"gap": {}, "abe": {"model.head": "abe", "model.head_options": {"num_learners": 2}}},
             **extra}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    return tmp_path / "study.yaml"


def test_grid_of_variants_repeats_and_splits(tmp_path):
    spec = load_study(write_study(tmp_path, grid={"loss.name": ["binomial", "triplet"]}, seeds=[0, 1]))
    assert sorted({r.variant for r in spec.runs()}) == ["abe-binomial", "abe-triplet", "gap-binomial",
                                                        "gap-triplet"]
    assert len(spec.runs()) == 8
    spec = load_study(write_study(tmp_path, splits=3, split_fraction=0.4))
    layers = [r.layers[-1] for r in spec.runs()]
    assert spec.protocol == "splits" and {l["data"]["val_seed"] for l in layers} == {0, 1, 2}
    with pytest.raises(ConfigError, match="unknown key 'seed'.*did you mean 'seeds'"):
        load_study(write_study(tmp_path, seed=[0]))
    with pytest.raises(ConfigError, match="run (abe|gap)/0.*did you mean .train.steps."):
        load_study(write_study(tmp_path, set={"train.stepz": 2}))


def test_two_run_study_aggregates_mean_and_std_and_resumes(tmp_path):
    spec = load_study(write_study(tmp_path, variants={"gap": {}}, seeds=[0, 1]))
    paths = run_study(spec, progress=False)
    rows = list(csv.DictReader(paths["csv"].open()))
    assert [(r["variant"], r["repeat"]) for r in rows] == [("gap", "0"), ("gap", "1")]
    recall = np.array([float(r["recall@1"]) for r in rows])
    _, summary = summarise(aggregate(spec))
    mean, std, count = summary["gap"]["recall@1"]
    assert count == 2 and mean == pytest.approx(recall.mean()) and std == pytest.approx(recall.std(ddof=1))
    table = paths["md"].read_text()
    assert f"{100 * recall.mean():.2f} ± {100 * recall.std(ddof=1):.2f}" in table
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    stamp = (tmp_path / "out/runs/gap/0/metrics.json").stat().st_mtime
    run_study(spec, progress=False)  # finished runs are skipped
    assert (tmp_path / "out/runs/gap/0/metrics.json").stat().st_mtime == stamp


def test_only_trains_the_named_variants_and_refuses_an_unknown_one(tmp_path):
    spec = load_study(write_study(tmp_path))
    with pytest.raises(ConfigError, match="no variant named 'gapp'.*did you mean 'gap'.*its variants: abe, gap"):
        run_study(spec, progress=False, only=["gapp"])
    assert not (tmp_path / "out").exists()  # refused before anything was written
    paths = run_study(spec, progress=False, only=["abe"])
    assert (tmp_path / "out/runs/abe/0/metrics.json").is_file() and not (tmp_path / "out/runs/gap").exists()
    assert [r["variant"] for r in csv.DictReader(paths["csv"].open())] == ["abe"]
    paths = run_study(spec, progress=False)  # the rest later; the results hold every finished run
    assert [r["variant"] for r in csv.DictReader(paths["csv"].open())] == ["abe", "gap"]


def test_each_row_carries_the_validation_figures_of_the_evaluated_checkpoint(tmp_path):
    """A tuning study reads validation columns (the test split chooses nothing): they must be the logged validation
    metrics at the step whose checkpoint was tested, not another step's."""
    spec = load_study(write_study(tmp_path, variants={"gap": {}}, set={
        "train.steps": 4, "train.eval_every": 1, "train.checkpoint_every": 1, "data.val_fraction": 0.4}))
    paths = run_study(spec, progress=False)
    row = next(csv.DictReader(paths["csv"].open()))

    run = tmp_path / "out/runs/gap/0"
    step = json.loads((run / "metrics.json").read_text())["step"]
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    chosen = next(r for r in logged if r.get("split") == "val" and r["step"] == step)
    assert float(row["val_recall@1"]) == pytest.approx(chosen["recall@1"])
    assert float(row["val_map@r"]) == pytest.approx(chosen["map@r"])
    assert "val R@1" in paths["md"].read_text() and "validation classes' figures" in paths["md"].read_text()


def test_all_embeddings_adds_every_embedding_per_variant_without_retraining(tmp_path):
    """ABE Tables 1-2 over repeats: each learner, their mean and std per run, then mean ± std over the seeds."""
    abe = {"abe": {"model.head": "abe", "model.head_options": {"num_learners": 2}}}
    spec = load_study(write_study(tmp_path, variants=abe, seeds=[0, 1]))
    assert "embeddings_md" not in run_study(spec, progress=False)
    stamp = (tmp_path / "out/runs/abe/0/metrics.json").stat().st_mtime
    spec = load_study(write_study(tmp_path, variants=abe, seeds=[0, 1], all_embeddings=True))
    paths = run_study(spec, progress=False)  # the trained runs are only evaluated again, not retrained
    assert (tmp_path / "out/runs/abe/0/metrics.json").stat().st_mtime == stamp
    rows = list(csv.DictReader(paths["embeddings_csv"].open()))
    names = ["embedding", "abe.learner1", "abe.learner2", "abe.learner1-2 mean", "abe.learner1-2 std"]
    assert [(r["variant"], r["repeat"]) for r in rows] == [(f"abe / {n}", s) for s in "01" for n in names]
    spreads = np.array([float(r["recall@1"]) for r in rows if r["variant"] == "abe / abe.learner1-2 std"])
    table = paths["embeddings_md"].read_text()
    assert f"| abe / abe.learner1-2 std | 2 | {100 * spreads.mean():.2f} ± {100 * spreads.std(ddof=1):.2f} |" in table
    assert "**" not in table  # no "best" marks in a table that mixes metrics and deviations
    first = list(csv.DictReader(paths["csv"].open()))
    assert [float(r["recall@1"]) for r in first] == [float(r["recall@1"]) for r in rows if r["variant"] ==
                                                     "abe / embedding"]
    with pytest.raises(ConfigError, match="'all_embeddings' must be true or false"):
        load_study(write_study(tmp_path, all_embeddings="yes"))


def test_a_failing_run_is_reported_and_the_others_still_run(tmp_path):
    spec = load_study(write_study(tmp_path, variants={"gap": {}, "no-train-classes": {"data.val_fraction": 0.99}}))
    with pytest.raises(DeepMetricError, match=r"1 of 2 runs failed.*no-train-classes/0 \(.*val_fraction"):
        run_study(spec, progress=False)
    rows = list(csv.DictReader((tmp_path / "out/results.csv").open()))
    assert [r["variant"] for r in rows] == ["gap"]


def test_an_interrupted_run_stops_the_study_instead_of_counting_as_failed(tmp_path, monkeypatch):
    import deepmetric.studies.runner as runner
    from deepmetric.errors import TrainingInterrupted

    started = []

    def interrupted(config, directory, **kwargs):
        started.append(directory)
        raise TrainingInterrupted(15, "SIGTERM received: stopped after step 1")

    monkeypatch.setattr(runner, "train", interrupted)
    with pytest.raises(TrainingInterrupted):
        run_study(load_study(write_study(tmp_path)), progress=False)
    assert len(started) == 1  # the second variant was not started
    assert not (tmp_path / "out/results.md").exists()


def test_a_run_another_process_trains_is_left_to_it_and_its_folder_untouched(tmp_path, caplog):
    """Two study processes on one study (one per core): the second must neither delete nor resume a run the first
    holds, even one that has not reached its first checkpoint (it used to remove such a folder before training)."""
    import fcntl
    import os

    spec = load_study(write_study(tmp_path, record=str(tmp_path / "record")))
    held = tmp_path / "out/runs/abe/0"
    held.mkdir(parents=True)
    (held / "config.json").write_text("{}")  # a run started by the other process, before its first checkpoint
    with open(held / ".lock", "a+") as lock:  # another open file description: flock conflicts as across processes
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        with caplog.at_level("INFO", logger="deepmetric"):
            paths = run_study(spec, progress=False)
        fcntl.flock(lock, fcntl.LOCK_UN)
    assert (held / "config.json").read_text() == "{}" and not (held / "checkpoints").exists()
    assert f"abe/0: being trained by process {os.getpid()}: left to it" in caplog.text
    assert "abe/0: training" not in caplog.text  # the lock is looked at before the run is announced
    assert "lacks 1 run(s) that other processes are training (abe/0)" in caplog.text
    assert [r["variant"] for r in csv.DictReader(paths["csv"].open())] == ["gap"]
    assert (tmp_path / "record/gap/0/metrics.json").is_file()  # its run is recorded, but the record's tables are
    assert not (tmp_path / "record/results.csv").exists()  # the last process's: these would go stale with abe/0
    run_study(spec, progress=False)  # released: the stale start is begun afresh and the results are complete
    assert sorted(r["variant"] for r in csv.DictReader(paths["csv"].open())) == ["abe", "gap"]
    assert (tmp_path / "record/results.csv").read_text() == paths["csv"].read_text()


def test_the_process_that_ends_last_writes_the_records_tables_though_it_met_a_run_held_elsewhere(
        tmp_path, monkeypatch, caplog):
    """Two study processes ended a minute apart and neither wrote the record's tables: the last one had met a run
    held by the other, and still counted it as training elsewhere after the other had finished and recorded it.
    Now a run met held elsewhere is looked at again at the end: finished there, the table is complete."""
    import fcntl

    import deepmetric.studies.runner as runner
    from deepmetric.config import build_config
    from deepmetric.runs.folder import RunDir

    spec = load_study(write_study(tmp_path, record=str(tmp_path / "record"), seeds=[0, 1]))
    assert [run.name for run in spec.runs()] == ["abe/0", "gap/0", "abe/1", "gap/1"]
    other_run = spec.runs()[1]
    held = spec.run_dir(other_run)
    held.mkdir(parents=True)
    lock = open(held / ".lock", "a+")  # the other process holds gap/0 when this one meets it
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    lock.write("1\n")
    lock.flush()
    train = runner.train

    def train_while_the_other_finishes(config, directory, **kwargs):
        if Path(directory) == spec.run_dir(spec.runs()[2]) and not lock.closed:  # abe/1, after gap/0 was met held
            fcntl.flock(lock, fcntl.LOCK_UN)
            lock.close()
            train(build_config(*other_run.layers), held, progress=False)  # the other process ends gap/0
            runner.evaluate_run(held, progress=False)
            runner._record(spec, other_run, RunDir(held))  # and records it
        return train(config, directory, **kwargs)

    monkeypatch.setattr(runner, "train", train_while_the_other_finishes)
    with caplog.at_level("INFO", logger="deepmetric"):
        paths = run_study(spec, progress=False)
    assert "gap/0: being trained by process 1: left to it" in caplog.text and lock.closed
    assert "lacks" not in caplog.text
    assert sorted((r["variant"], r["repeat"]) for r in csv.DictReader(paths["csv"].open())) == [
        ("abe", "0"), ("abe", "1"), ("gap", "0"), ("gap", "1")]
    assert (tmp_path / "record/results.csv").read_text() == paths["csv"].read_text()


def test_a_study_holds_each_run_from_its_training_through_its_evaluation(tmp_path, monkeypatch, caplog):
    """Issue 39, item 19: the run folder was free between training and evaluation, and a second study process
    resumed the run there (a bogus session) and evaluated it again. Now the folder is held while it is evaluated,
    and a run that another process finished while this one looked is not trained or evaluated again."""
    import os

    import deepmetric.studies.runner as runner
    from deepmetric.runs.folder import RunDir

    held_while_evaluated = []
    evaluate = runner.evaluate_run

    def evaluate_and_look(directory, **kwargs):
        held_while_evaluated.append(RunDir(directory).holder())
        return evaluate(directory, **kwargs)

    monkeypatch.setattr(runner, "evaluate_run", evaluate_and_look)
    spec = load_study(write_study(tmp_path))
    run_study(spec, progress=False)
    assert held_while_evaluated == [str(os.getpid())] * 2
    for run in spec.runs():
        assert RunDir(spec.run_dir(run)).holder() is None  # released after
        assert len(RunDir(spec.run_dir(run)).sessions()) == 1

    first = spec.run_dir(spec.runs()[0])  # "another process" finishes it after this one's two looks before holding
    looked, stale = runner.finished, [2]

    def finished_later(folder, **kwargs):
        if folder.path == first and not kwargs and stale[0]:
            stale[0] -= 1
            return False
        return looked(folder, **kwargs)

    monkeypatch.setattr(runner, "finished", finished_later)
    trained = []
    monkeypatch.setattr(runner, "train", lambda config, directory, **kw: trained.append(directory))
    with caplog.at_level("INFO", logger="deepmetric"):
        run_study(spec, progress=False)
    assert f"{spec.runs()[0].name}: finished by another process" in caplog.text
    assert trained == [] and len(held_while_evaluated) == 2


def test_best_mean_of_each_column_is_bold(tmp_path):
    from deepmetric.studies.summary import markdown

    spec = load_study(write_study(tmp_path))
    rows = [{"variant": "a", "repeat": 0, "recall@1": 0.5, "map@r": 0.2},
            {"variant": "b", "repeat": 0, "recall@1": 0.4, "map@r": 0.3}]
    table = markdown(spec, rows)
    assert "| a | 1 | **50.00** | 20.00 |" in table
    assert "| b | 1 | 40.00 | **30.00** |" in table


def test_best_is_marked_per_data_set_and_missing_metrics_show_a_dash(tmp_path):
    from deepmetric.studies.summary import markdown

    spec = load_study(write_study(tmp_path))
    rows = [{"variant": "a", "repeat": 0, "data": "glyphs", "recall@1": 0.5, "recall@32": 0.9},
            {"variant": "b", "repeat": 0, "data": "glyphs", "recall@1": 0.4, "recall@32": 0.95},
            {"variant": "c", "repeat": 0, "data": "fashion-mnist", "recall@1": 0.8}]
    table = markdown(spec, rows)
    assert "| a | glyphs | 1 | **50.00** | 90.00 |" in table
    assert "| b | glyphs | 1 | 40.00 | **95.00** |" in table
    assert "| c | fashion-mnist | 1 | **80.00** | — |" in table


def test_marks_follow_welchs_test_after_holm_and_never_a_single_run(tmp_path):
    """Issue 51 item 4: ▲ / ▼ no longer mean "the ±1 std intervals do not overlap" but "Welch's t-test across the
    repeats is significant at 0.05 after Holm's correction over every comparison of the table"."""
    from scipy import stats

    from deepmetric.studies.comparison import comparisons

    spec = load_study(write_study(tmp_path, variants={"gap": {}, "abe": {}, "one": {}, "close": {}}, compare=["gap"]))
    values = {"gap": [0.70, 0.71, 0.72], "abe": [0.80, 0.81, 0.82], "one": [0.90], "close": [0.705, 0.72, 0.73]}
    rows = [{"variant": v, "repeat": i, "data": "emoji", "recall@1": x} for v, xs in values.items()
            for i, x in enumerate(xs)]
    found = {c.variant: c for c in comparisons(spec, rows)}
    assert set(found) == {"abe", "one", "close"} and found["one"].welch is None and found["one"].mark == ""
    welch = {v: stats.ttest_ind(values[v], values["gap"], equal_var=False).pvalue for v in ("abe", "close")}
    assert found["abe"].welch == pytest.approx(welch["abe"]) and found["close"].welch == pytest.approx(welch["close"])
    low, high = sorted(welch.values())  # Holm over the two defined tests: 2 p_(1), max(that, p_(2))
    assert found["abe"].welch_holm == pytest.approx(2 * low) and found["close"].welch_holm == pytest.approx(high)
    assert found["abe"].mark == "▲" and found["close"].mark == ""  # 0.73 ± … overlaps gap's range: not significant
    assert found["abe"].bootstrap is None  # no per-query results given: no bootstrap, said as "—"


def test_compare_sets_each_variant_against_the_references_in_results_md(tmp_path):
    from deepmetric.studies.aggregate import write_results
    from deepmetric.studies.comparison import comparison

    spec = load_study(write_study(tmp_path, variants={"gap": {}, "abe": {}, "other": {}}, compare=["gap"]))
    rows = [{"variant": v, "repeat": i, "data": d, "recall@1": r1, "map@r": mapr}
            for v, d, values in (("gap", "emoji", [(0.70, 0.50), (0.72, 0.52)]),
                                 ("abe", "emoji", [(0.80, 0.51), (0.82, 0.55)]),
                                 ("other", "glyphs", [(0.90, 0.90), (0.91, 0.91)]))
            for i, (r1, mapr) in enumerate(values)]
    table = comparison(spec, rows)
    assert "| variant | R@1 − gap | MAP@R − gap |" in table
    assert "| gap | (reference) | (reference) |" in table
    assert "| abe | +10.00 ▲ | +2.00 |" in table  # R@1 intervals apart; MAP@R's overlap (0.51 ± 0.014 vs 0.53 ± 0.028)
    assert "| other | — | — |" in table  # another data set: not comparable
    assert table in (write_results(spec, rows)["md"]).read_text()  # below the table of means
    assert "Holm's correction over the 2 Welch tests of the table" in table
    assert comparison(load_study(write_study(tmp_path)), rows) == ""  # no references, no section
    first_seeds = [row for row in rows if row["repeat"] == 0]  # a partial table (--tables) of one seed each
    assert "(none here: a Welch test needs two repeats of each side)" in comparison(spec, first_seeds)
    with pytest.raises(ConfigError, match="'compare' names no variant 'gpa'.*did you mean 'gap'"):
        load_study(write_study(tmp_path, compare="gpa"))
    with pytest.raises(ConfigError, match="'compare' must be a variant's name or a list"):
        load_study(write_study(tmp_path, compare={"gap": 1}))


def test_command_line_overrides_reach_every_run_after_the_studys_settings(tmp_path):
    from deepmetric.config import build_config, parse_override

    spec = load_study(write_study(tmp_path, seeds=[0, 1]), [parse_override("train.steps=7"),
                                                            parse_override("data.image_size=40")])
    for run in spec.runs():
        config = build_config(*run.layers)
        assert (config.train.steps, config.data.image_size, config.train.seed) == (7, 40, run.repeat)
    assert {build_config(*r.layers).model.head for r in spec.runs()} == {"gap", "abe"}  # variants still differ


def test_a_key_inside_a_regulariser_sets_one_value_in_set_variants_grid_and_the_command_line(tmp_path):
    """``loss.regularizers.NAME.KEY`` sets that value over what the layers below built, wherever a study gives it: the
    variant's other regularisers and this one's other options stay (a layer replaces ``loss.regularizers`` whole)."""
    from deepmetric.cli import main
    from deepmetric.config import build_config
    from deepmetric.config.layers import parse_settings

    regularizers = {"divergence": {"weight": 1.0, "margin": 0.5}, "activation-decay": {"weight": 0.01}}
    path = write_study(tmp_path, variants={"abe": {"model.head": "abe", "model.head_options": {"num_learners": 2},
                                                   "loss.regularizers": regularizers,
                                                   "loss.regularizers.activation-decay.weight": 0.02}},
                       grid={"loss.regularizers.divergence.margin": [0.25, 0.75]})
    spec = load_study(path, settings=parse_settings(["loss.regularizers.divergence.weight=0.3", "train.steps=3"]))
    built = {run.variant: build_config(*run.layers) for run in spec.runs()}
    for margin in (0.25, 0.75):
        config = built[f"abe-{margin}"]
        assert config.loss.regularizers == {"divergence": {"weight": 0.3, "margin": margin},
                                            "activation-decay": {"weight": 0.02}}
        assert config.train.steps == 3
    assert main(["study", str(path), "--dry-run", "loss.regularizers.divergence.weight=0.3"]) == 0


def test_an_inline_base_is_a_config_and_a_bad_base_one_line(tmp_path):
    base = tiny_config(train={"steps": 2}).to_dict()
    spec = load_study(write_study(tmp_path, base=base))
    assert len(spec.runs()) == 2 and spec.base["model"]["backbone"] == "tiny"
    with pytest.raises(ConfigError, match="'base' must be a config file name or a mapping"):
        load_study(write_study(tmp_path, base=[1, 2]))


@pytest.mark.parametrize("name", ["../../../escaped", "/abs/path", "a/b", "..", "bell\x07", "tab\there"])
def test_a_variant_name_cannot_leave_the_study_folder(tmp_path, name):
    with pytest.raises(ConfigError, match="cannot name a run folder"):
        load_study(write_study(tmp_path, variants={name: {}}))


@pytest.mark.parametrize("name", ["../../../../escaped", "/abs/path", "a/b", "..", ".", "..hidden", "back\\slash",
                                  "bell\x07", "tab\there", "", None])
def test_a_study_name_cannot_leave_the_studies_folder(tmp_path, monkeypatch, capsys, name):
    """Issue 39: ``name: ../../../../escaped`` without ``out:`` put the study's runs and results above the working
    directory (``runs/studies/<name>``). The study's name is checked as a variant's name is, ``out:`` or not."""
    from deepmetric.cli import main

    work = tmp_path / "a" / "b" / "c" / "work"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    study = write_study(tmp_path, name=name)
    data = yaml.safe_load(study.read_text())
    del data["out"]
    study.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="study name .* cannot name a folder"):
        load_study(study)
    assert main(["study", str(study), "--dry-run"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error:") and "cannot name a folder" in captured.err
    assert "Traceback" not in captured.err and captured.err.count("\n") == 1
    data["out"] = str(tmp_path / "out")  # with an explicit out: the name is still a title and a folder's name
    study.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="cannot name a folder"):
        load_study(study)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "base.yaml", "study.yaml"]


def test_dry_run_lists_and_builds_every_run_and_writes_nothing(tmp_path, capsys):
    from deepmetric.cli import main

    study = write_study(tmp_path, seeds=[0, 1])
    assert main(["study", str(study), "--dry-run", "data.image_size=40"]) == 0
    out = capsys.readouterr().out
    assert "4 runs" in out and out.count("ok: ") == 4 and "gap / seed 1" in out and "data.image_size=40" in out
    assert "groups pretrained, new" in out
    assert not (tmp_path / "out").exists()  # nothing read, nothing written
    assert main(["study", str(study), "--dry-run", "model.embedding_dim=1"]) == 2  # too small for 2 learners
    captured = capsys.readouterr()
    assert "FAILS: ABEHead: model.embedding_dim=1 is too small for 2 learners" in captured.out
    assert "2 of 4 runs would fail: abe / seed 0, abe / seed 1" in captured.err
    # --only with --dry-run lists what --only would train, and refuses a misspelt variant as the study itself does
    assert main(["study", str(study), "--dry-run", "--only", "abe"]) == 0
    out = capsys.readouterr().out
    assert "2 runs" in out and "abe / seed 1" in out and "gap / seed" not in out
    assert main(["study", str(study), "--dry-run", "--only", "aeb"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "no variant named 'aeb' (did you mean 'abe'?)" in captured.err


def test_the_dry_run_prints_each_run_as_soon_as_it_is_checked(tmp_path, capsys, monkeypatch, caplog):
    """Issue 53 item 8: ``study demo --dry-run`` printed nothing for 35 s, then its 66 lines at once. A line on
    stderr comes before the study is read (which imports torch and the models: most of the wait), the first line of
    the list before anything is built, each run's lines as soon as that run is checked, the counts last."""
    import logging

    import deepmetric.studies as studies
    import deepmetric.studies.dry_run as dry_run
    from deepmetric.cli import main

    caplog.set_level(logging.INFO, logger="deepmetric.cli.commands")
    study = write_study(tmp_path, seeds=[0, 1])
    logged_before_reading, read = [], studies.load_study
    monkeypatch.setattr(studies, "load_study", lambda *args, **kwargs: logged_before_reading.extend(caplog.messages)
                        or read(*args, **kwargs))
    printed_before_build, build = [], dry_run._build

    def watched(config):
        printed_before_build.append(capsys.readouterr().out)
        return build(config)

    monkeypatch.setattr(dry_run, "_build", watched)
    assert main(["study", str(study), "--dry-run"]) == 0
    rest = capsys.readouterr().out
    assert len(printed_before_build) == 4  # each run builds its own model (the seed differs)
    first, *between = printed_before_build
    assert first == f"study tiny: checking 4 runs into {tmp_path / 'out'}, each built as training builds it (no " \
                    "image is read, nothing written)\n"
    runs = ["abe / seed 0", "gap / seed 0", "abe / seed 1"]  # the study file lists abe first
    for run, text in zip(runs, between, strict=True):  # the run checked before this build, and only it
        assert text.startswith(f"  {run} [to train]: ") and text.count("\n") == 2 and "      ok: " in text
    assert rest.startswith("  gap / seed 1 [to train]: ")
    assert rest.endswith(f"\nstudy tiny: 4 runs into {tmp_path / 'out'} (4 to train)\n")
    assert logged_before_reading == [f"study {study}: loading the models' code, then each run is checked in turn"]


def test_results_csv_cells_cannot_run_as_spreadsheet_formulas():
    from deepmetric.studies.aggregate import _csv

    text = _csv([{"variant": '=HYPERLINK("http://evil.example/","click")', "data": "@SUM(1)", "recall@1": -0.5,
                  "note": "+1", "ok": "gap"}])
    row = next(csv.DictReader(text.splitlines()))
    assert row["variant"].startswith("'=HYPERLINK") and row["data"] == "'@SUM(1)" and row["note"] == "'+1"
    assert row["recall@1"] == "-0.5" and row["ok"] == "gap"  # numbers stay numbers


def test_a_record_survives_the_loss_of_the_runs_folder_and_nothing_is_retrained(tmp_path, monkeypatch, caplog):
    """A study longer than one session on a machine whose runs folder does not survive: each finished run's small
    files go to the committed record, and a fresh checkout restores them instead of training again."""
    import shutil

    import deepmetric.studies.runner as runner

    spec = load_study(write_study(tmp_path, variants={"gap": {}, "no-train-classes": {"data.val_fraction": 0.99}},
                                  set={"train.steps": 2, "train.eval_every": 1, "data.val_fraction": 0.4},
                                  record=str(tmp_path / "record")))
    with pytest.raises(DeepMetricError, match="1 of 2 runs failed"):
        run_study(spec, progress=False)
    first = (tmp_path / "out/results.csv").read_text()
    assert "val_recall@1" in first.splitlines()[0]
    recorded = {p.name for p in (tmp_path / "record/gap/0").iterdir()}
    assert {"config.yaml", "environment.json", "metrics.json", "metrics.jsonl"} <= recorded
    assert not (tmp_path / "record/no-train-classes").exists()  # a failed run is not recorded
    assert not any((tmp_path / "record").rglob("*.safetensors"))  # no checkpoint

    shutil.rmtree(tmp_path / "out")  # the fresh checkout
    trained = []
    monkeypatch.setattr(runner, "train", lambda config, directory, **kwargs: trained.append(directory))
    with caplog.at_level("INFO", logger="deepmetric"), pytest.raises(DeepMetricError, match="1 of 2 runs failed"):
        run_study(load_study(tmp_path / "study.yaml"), progress=False)
    assert "gap/0: restored from" in caplog.text and "gap/0: done already" in caplog.text
    assert [str(d) for d in trained] == [str(tmp_path / "out/runs/no-train-classes/0")]  # only the unfinished one
    assert (tmp_path / "out/results.csv").read_text() == first  # the same rows, validation figures included


def test_tables_writes_the_finished_runs_table_and_trains_nothing(tmp_path, monkeypatch, capsys, caplog):
    """``--tables`` while a long study is under way: the table of the runs finished so far (restored from the
    record in a fresh checkout), each row's runs column counting its repeats, the missing runs named; nothing
    trains and the record is left as it was. It refuses a study with no finished run, and another mode beside it."""
    import shutil

    import deepmetric.studies.runner as runner
    from deepmetric.cli import main

    study = write_study(tmp_path, seeds=[0, 1], record=str(tmp_path / "record"))
    assert main(["study", str(study), "--tables"]) == 2  # a user-facing error
    assert "no run has finished yet" in capsys.readouterr().err and not (tmp_path / "record").exists()
    run_study(load_study(study), progress=False, only=["gap"])
    shutil.rmtree(tmp_path / "out")  # a fresh checkout: only the record is left
    (tmp_path / "record" / "results.md").unlink()  # (the study's process wrote the record's tables as it ended)
    monkeypatch.setattr(runner, "train", lambda *args, **kwargs: pytest.fail("--tables trained a run"))
    with caplog.at_level("WARNING", logger="deepmetric"):
        assert main(["study", str(study), "--tables"]) == 0
    out = capsys.readouterr().out
    assert "| gap | 2 |" in out and "| abe |" not in out  # gap's two seeds; abe has none
    assert "**2 of the study's 4 runs have finished**" in out
    assert "holds 2 of 4 runs; not finished yet: abe/0, abe/1" in caplog.text
    rows = list(csv.DictReader((tmp_path / "out" / "results.csv").open()))
    assert [(r["variant"], r["repeat"]) for r in rows] == [("gap", "0"), ("gap", "1")]
    assert not (tmp_path / "record" / "results.md").exists()  # the record's tables are the study's to write
    assert main(["study", str(study), "--tables", "--dry-run"]) == 2
    assert "--dry-run and --tables do different things" in capsys.readouterr().err


def test_only_finished_runs_are_recorded_and_a_restore_replaces_a_partial_attempt(tmp_path):
    from deepmetric.runs.folder import RunDir
    from deepmetric.studies.record import record_run, restore_run

    record = tmp_path / "record"
    unfinished = RunDir(tmp_path / "unfinished")
    unfinished.path.mkdir()
    unfinished.metrics_log.write_text('{"step": 1}\n')
    assert record_run(unfinished, record) == 0 and not record.exists()  # no test metrics: nothing to record
    finished = RunDir(tmp_path / "finished")
    finished.path.mkdir()
    finished.metrics_log.write_text('{"step": 1}\n{"step": 2}\n')
    finished.test_metrics.write_text('{"metrics": {"recall@1": 0.5}}')
    assert record_run(finished, record) == 2 and record_run(finished, record) == 0  # unchanged files: no copy
    assert restore_run(record, unfinished)
    assert unfinished.metrics_log.read_text() == finished.metrics_log.read_text()  # the partial log gave way
    assert not restore_run(record, finished)  # a folder with its own finished run is left alone
    with pytest.raises(CheckpointError, match="finished run without its checkpoints.*train it again"):
        unfinished.checkpoint()  # restored: its metrics, not its weights
    for bad in (["a"], str(finished.test_metrics)):  # not a path; a file, not a folder
        with pytest.raises(ConfigError, match="'record' must be a folder"):
            load_study(write_study(tmp_path, record=bad))


MALFORMED_STUDIES = [  # (the keys that replace a valid study's, or the whole file; what the one error line names)
    ("name: [tiny\n", "not valid YAML"),
    (b"name: caf\xe9\n", "not text"),
    ("- a\n- b\n", "must hold a mapping"),
    ({1: "x"}, "unknown key '1'"),
    ({"name": {"a": 1}}, "study name"),
    ({"base": 3}, "'base'"),
    ({"base": "missing.yaml"}, "missing.yaml"),
    ({"out": ["a"]}, "'out'"),
    ({"out": ""}, "'out'"),
    ({"record": 3}, "'record'"),
    ({"set": ["a"]}, "'set'"),
    ({"set": 3}, "'set'"),
    ({"variants": ["a", "b"]}, "'variants'"),
    ({"variants": "gap"}, "'variants'"),
    ({"variants": {"gap": 3}}, "variants.gap"),
    ({"grid": ["a"]}, "'grid'"),
    ({"grid": {"loss.name": "binomial"}}, "'grid'"),
    ({"seeds": 3}, "'seeds'"),
    ({"seeds": ["x"]}, "'seeds'"),
    ({"seeds": [float("inf")]}, "'seeds'"),
    ({"seeds": [float("nan")]}, "'seeds'"),
    ({"seeds": []}, "'seeds'"),
    ({"seeds": [-1]}, "'seeds'"),
    ({"seeds": [True]}, "'seeds'"),
    ({"seeds": [0.9]}, "'seeds'"),
    ({"seeds": {"a": 1}}, "'seeds'"),
    ({"splits": "many"}, "'splits'"),
    ({"splits": -3}, "'splits'"),
    ({"splits": 0}, "'splits'"),
    ({"splits": 2.5}, "'splits'"),
    ({"splits": True}, "'splits'"),
    ({"splits": float("inf")}, "'splits'"),
    ({"splits": [1, 2]}, "'splits'"),
    ({"splits": 2, "split_fraction": "half"}, "'split_fraction'"),
    ({"splits": 2, "split_fraction": [0.5]}, "'split_fraction'"),
    ({"splits": 2, "split_fraction": 1.5}, "'split_fraction'"),
    ({"splits": 2, "split_fraction": float("nan")}, "'split_fraction'"),
    ({"splits": 2, "split_fraction": True}, "'split_fraction'"),
    ({"seeds": [0], "splits": 2}, "not both"),
    ({"all_embeddings": "yes please"}, "'all_embeddings'"),
    ({"compare": 3}, "'compare'"),
    ({"compare": ["nope"]}, "'compare'"),
]


@pytest.mark.parametrize("content,named", MALFORMED_STUDIES, ids=[str(c)[:40] for c, _ in MALFORMED_STUDIES])
def test_a_malformed_study_file_is_one_line_naming_the_bad_key(tmp_path, capsys, content, named):
    """Issue 39 item 14: top-level keys with a wrong type (and files that are not YAML, or not text) gave a
    traceback; ``seeds: []`` and ``splits: -3`` printed "0 runs" and exited 0. Each is one line, exit 2."""
    from deepmetric.cli import main

    study = write_study(tmp_path, variants={"gap": {}})
    if isinstance(content, dict):  # the valid study with these keys replaced
        study.write_text(yaml.safe_dump({**yaml.safe_load(study.read_text()), **content}, sort_keys=False))
    elif isinstance(content, bytes):
        study.write_bytes(content)
    else:
        study.write_text(content)
    assert main(["study", str(study), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1 and "Traceback" not in err, err
    assert named in err, err
    assert not (tmp_path / "out").exists()


def test_seeds_are_distinct_integers_never_truncated_nor_counted_twice(tmp_path):
    """Issue 39 item 11: ``seeds: [0, 0, 0.9]`` trained seed 0 once and counted it three times (± 0.00), 0.9
    truncated to 0. Seeds are integers (no bools, no floats), each once."""
    with pytest.raises(ConfigError, match=r"'seeds' must be a non-empty list of integers >= 0.*0\.9"):
        load_study(write_study(tmp_path, seeds=[0, 0, 0.9]))
    with pytest.raises(ConfigError, match=r"'seeds' repeats 0: each seed is one run"):
        load_study(write_study(tmp_path, seeds=[0, 1, 0]))
    for bad in ([False, 1], [1.0], ["1"]):
        with pytest.raises(ConfigError, match="'seeds' must be"):
            load_study(write_study(tmp_path, seeds=bad))
    assert load_study(write_study(tmp_path, seeds=[2, 0, 1])).repeats == [2, 0, 1]


def test_a_variant_whose_config_fails_is_reported_and_skipped_and_the_others_finish(tmp_path, capsys, caplog):
    """Issue 39 item 10: one variant with a bad setting (an unknown head option) stopped the whole study before any
    run, with no results. That run is reported (its variant and the error) and skipped, the others train and are
    aggregated, and the study exits non-zero at the end."""
    from deepmetric.cli import main

    study = write_study(tmp_path, variants={
        "gap": {}, "abe": {"model.head": "abe", "model.head_options": {"num_learnerz": 2}}})
    with caplog.at_level("INFO", logger="deepmetric"):
        assert main(["study", str(study), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1 and "Traceback" not in err
    assert "1 of 2 runs failed" in err and "abe/0 (head 'abe' has no option 'num_learnerz'" in err
    assert "abe/0 failed: head 'abe' has no option 'num_learnerz' (did you mean 'num_learners'?)" in caplog.text
    assert [r["variant"] for r in csv.DictReader((tmp_path / "out/results.csv").open())] == ["gap"]
    assert not (tmp_path / "out/runs/abe").exists()  # nothing half-written for the run that could not start
    with pytest.raises(ConfigError, match="run (abe|gap)/0.*did you mean .train.steps."):  # every run: refused early
        load_study(write_study(tmp_path, set={"train.stepz": 2}))


def test_a_finished_run_whose_settings_changed_is_not_reused_silently(tmp_path, capsys):
    """Issue 39 item 12: a finished variant whose settings changed in the study file was "done already" with its
    old numbers. Reused only when its saved config.yaml is the config the study builds now; otherwise the study
    stops naming the run and the differing keys, and ``--retrain-changed`` trains it again."""
    from deepmetric.cli import main

    study = write_study(tmp_path, variants={"gap": {}})
    assert main(["study", str(study), "--quiet"]) == 0
    metrics = tmp_path / "out/runs/gap/0/metrics.json"
    before = metrics.read_bytes()
    study = write_study(tmp_path, variants={"gap": {}}, set={"train.steps": 3})
    capsys.readouterr()
    assert main(["study", str(study), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1 and "Traceback" not in err
    assert "gap/0 (train.steps: 2 -> 3)" in err and "--retrain-changed" in err
    assert metrics.read_bytes() == before  # nothing trained, nothing replaced
    assert main(["study", str(study), "--quiet", "--retrain-changed"]) == 0
    assert yaml.safe_load((tmp_path / "out/runs/gap/0/config.yaml").read_text())["train"]["steps"] == 3
    kept = [p for p in (tmp_path / "out/runs/gap").iterdir() if p.name != "0"]
    assert len(kept) == 1 and (kept[0] / "metrics.json").read_bytes() == before  # the old run is set aside
    assert main(["study", str(study), "--quiet"]) == 0  # now it matches: reused
    after = (tmp_path / "out/runs/gap/0/metrics.json").read_bytes()
    for setting in ("train.device=cpu", "train.threads=1", "data.num_workers=0"):  # where, not what, it measures
        assert main(["study", str(study), "--quiet", setting]) == 0
    assert (tmp_path / "out/runs/gap/0/metrics.json").read_bytes() == after  # reused, not trained again


def test_a_damaged_record_is_named_never_restored_and_a_fixed_one_is_used(tmp_path, monkeypatch, capsys):
    """Issue 39 item 13: a committed record whose metrics.json holds merge-conflict markers was restored, then
    aggregating it gave a traceback, and after the record was fixed the bad copy still counted as finished. A
    record's files are checked before anything is restored; the damaged file is named; a bad copy never counts."""
    import shutil

    import deepmetric.studies.runner as runner
    from deepmetric.cli import main

    study = write_study(tmp_path, variants={"gap": {}}, record=str(tmp_path / "record"))
    assert main(["study", str(study), "--quiet"]) == 0
    first = (tmp_path / "out/results.csv").read_text()
    recorded = tmp_path / "record/gap/0/metrics.json"
    good = recorded.read_text()
    damaged = f"<<<<<<< HEAD\n{good}=======\n{good}>>>>>>> other-machine\n"
    shutil.rmtree(tmp_path / "out")  # the fresh checkout, after a bad merge
    recorded.write_text(damaged)
    trained = []
    monkeypatch.setattr(runner, "train", lambda config, directory, **kwargs: trained.append(directory))
    capsys.readouterr()
    assert main(["study", str(study), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"{recorded} is damaged" in err and "gap/0" in err
    assert not (tmp_path / "out/runs/gap/0/metrics.json").exists() and not trained  # not restored, not retrained
    assert recorded.read_text() == damaged  # the user's file is left for them to fix

    (tmp_path / "out/runs/gap/0").mkdir(parents=True, exist_ok=True)
    (tmp_path / "out/runs/gap/0/metrics.json").write_text(damaged)  # a bad copy an older version restored
    recorded.write_text(good)  # the record fixed: the bad copy gives way to it
    assert main(["study", str(study), "--quiet"]) == 0 and not trained
    assert (tmp_path / "out/results.csv").read_text() == first
    assert (tmp_path / "out/runs/gap/0/metrics.json").read_text() == good


def test_dry_run_says_where_each_run_stands(tmp_path, capsys):
    """A study trained over several sessions: ``--dry-run`` names each run's state (finished, recorded, training
    now with its step, stopped with the step it resumes at, trained but not evaluated, to train) and counts them."""
    import shutil

    from deepmetric.cli import main
    from deepmetric.config import build_config
    from deepmetric.runs.folder import RunDir
    from deepmetric.studies.dry_run import dry_run
    from deepmetric.training import train

    study = write_study(tmp_path, variants={"gap": {}}, seeds=[0], record=str(tmp_path / "record"))
    run_study(load_study(study), progress=False)  # seed 0: finished (and recorded)
    study = write_study(tmp_path, variants={"gap": {}}, seeds=[0, 1, 2, 3, 4, 5], record=str(tmp_path / "record"))
    spec = load_study(study)
    runs = {run.repeat: run for run in spec.runs()}
    shutil.copytree(tmp_path / "record/gap/0", tmp_path / "record/gap/1")  # seed 1: in the record only
    stopped = build_config(*runs[2].layers, {"train": {"steps": 1}})
    train(stopped, spec.run_dir(runs[2]), progress=False)  # seed 2: its last checkpoint at step 1 of 2
    train(build_config(*runs[3].layers), spec.run_dir(runs[3]), progress=False)  # seed 3: trained, not evaluated
    busy = RunDir(spec.run_dir(runs[4]))
    busy.path.mkdir(parents=True)
    with busy.holding():  # seed 4: another process trains it
        busy.metrics_log.write_text('{"step": 1, "loss": 0.5}\n{"step": 1, "val_recall@1": 0.5}\n')
        states = [(row.repeat, row.state, row.progress) for row in dry_run(spec)]
        assert main(["study", str(study), "--dry-run"]) == 0
    assert states == [("seed 0", "finished", ""),
                      ("seed 1", "recorded", "restored from the record when the study runs"),
                      ("seed 2", "stopped", "step 1 of 2 (resumes there)"),
                      ("seed 3", "trained", "step 2 (its test evaluation is left)"),
                      ("seed 4", "training now", f"step 1 of 2 (process {os.getpid()})"),
                      ("seed 5", "to train", "")]
    out = capsys.readouterr().out
    assert out.startswith(f"study tiny: checking 6 runs into {tmp_path / 'out'}, each built as training builds it")
    assert out.endswith(f"study tiny: 6 runs into {tmp_path / 'out'} (1 finished, 1 recorded, 1 training now, "
                        "1 stopped, 1 trained, 1 to train)\n")
    assert "  gap / seed 2 [stopped: step 1 of 2 (resumes there)]: train.steps=2" in out
    assert "  gap / seed 5 [to train]: " in out


def test_a_tilde_in_a_study_files_folders_or_a_weights_path_is_the_home_folder(tmp_path, monkeypatch):
    """``out: ~/studies/x`` and ``record: ~/records`` in a study file, and ``model.weights: ~/w.safetensors`` in a
    config (no shell expands ``~`` in a file), were folders and files named "~" in the working directory."""
    import torch
    from safetensors.torch import save_file

    from deepmetric.models.backbones import BACKBONES
    from deepmetric.models.weights import load_weights

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    spec = load_study(write_study(tmp_path, out="~/studies/x", record="~/records"))
    assert spec.out == tmp_path / "home/studies/x" and spec.record == tmp_path / "home/records"
    state = {name: value + 1 for name, value in BACKBONES.get("tiny")(False).model.state_dict().items()
             if value.is_floating_point()}
    (tmp_path / "home").mkdir()
    save_file(state, tmp_path / "home/w.safetensors")
    network = BACKBONES.get("tiny")(False)
    load_weights(network.model, "~/w.safetensors")
    loaded = network.model.state_dict()
    assert state and all(torch.equal(loaded[name], value) for name, value in state.items())
    assert not (tmp_path / "~").exists()


def test_results_md_lists_each_seed_and_what_each_variant_cost_to_train(tmp_path):
    """Issue 36 asks the comparison's table for per-seed R@1 and cost beside mean ± std: both are sections of the
    study's own ``results.md``, read from the runs' files (so a restored record gives them again)."""
    paths = run_study(load_study(write_study(tmp_path, variants={"gap": {}}, seeds=[0, 1, 2])), progress=False)
    rows = {int(r["repeat"]): r for r in csv.DictReader(paths["csv"].open())}
    table = paths["md"].read_text()
    r1 = " / ".join(f"{100 * float(rows[s]['recall@1']):.2f}" for s in (0, 1, 2))
    mapr = " / ".join(f"{100 * float(rows[s]['map@r']):.2f}" for s in (0, 1, 2))
    assert "## Each seed\n\nTest figures in %, seed 0 / 1 / 2.\n" in table and f"| gap | {r1} | {mapr} |" in table
    cost = table[table.index("## Training cost"):]
    assert "| variant | runs | images/s | training time per run | machine |" in cost
    assert cost.count("| gap | 3 | ") == 1 and ("thread |" in cost or "threads |" in cost)
    (tmp_path / "one").mkdir()
    single = load_study(write_study(tmp_path / "one", variants={"gap": {}}, seeds=[0]))
    assert "## Each seed" not in run_study(single, progress=False)["md"].read_text()  # one seed: nothing to list


def test_a_variant_trained_on_two_machines_gets_a_cost_row_for_each(tmp_path):
    """A median over a CPU's runs and a GPU's describes neither machine: each machine has its own row, with its
    own runs' count, rate and time, and the variant's rows stay together in the study's order."""
    from deepmetric.runs.folder import RunDir
    from deepmetric.studies.cost import training_cost

    spec = load_study(write_study(tmp_path, variants={"gap": {}, "other": {"train.lr": 2e-4}}, seeds=[0, 1, 2]))
    run_study(spec, progress=False)
    gpu_run = RunDir(spec.run_dir(next(r for r in spec.runs() if r.name == "gap/2")))
    gpu_run.environment.write_text(json.dumps({"sessions": [{"gpu": "NVIDIA H200", "threads": 1}]}))
    log = [json.loads(line) for line in gpu_run.metrics_log.read_text().splitlines()]
    gpu_run.metrics_log.write_text("".join(json.dumps({**r, "images_per_s": 1000.0} if "images_per_s" in r else r)
                                           + "\n" for r in log))
    rows = [line for line in training_cost(spec).splitlines() if line.startswith(("| gap |", "| other |"))]
    assert [row.split(" | ")[:2] for row in rows] == [["| gap", "2"], ["| gap", "1"], ["| other", "3"]]
    assert rows[1].split(" | ")[2] == "1000" and rows[1].endswith("| NVIDIA H200 |")
    assert "NVIDIA H200" not in rows[0] and "NVIDIA H200" not in rows[2]


def test_a_runs_training_time_is_its_logged_windows_at_their_rates(tmp_path):
    """The cost section's arithmetic on a hand-written run: windows of 10 steps of 6 images at 6 and 3 images/s
    took 10 + 20 s; validation records and a damaged environment are no obstacle."""
    from deepmetric.runs.folder import RunDir
    from deepmetric.studies.cost import duration, machine_of, run_cost

    folder = RunDir(tmp_path / "run")
    folder.path.mkdir()
    folder.config_path.write_text("data: {classes_per_batch: 2, samples_per_class: 3}\n")
    folder.metrics_log.write_text('{"step": 10, "loss": 1, "images_per_s": 6.0}\n{"step": 10, "split": "val", '
                                  '"recall@1": 0.5}\n{"step": 20, "loss": 1, "images_per_s": 3.0}\n')
    folder.environment.write_text(json.dumps({"sessions": [{"gpu": "NVIDIA H200", "threads": 1},
                                                           {"cpu": "AMD EPYC", "threads": 2}]}))
    assert run_cost(folder) == {"images_per_s": 4.5, "seconds": 30.0, "machine": "NVIDIA H200 + AMD EPYC, 2 threads"}
    folder.environment.write_text(json.dumps({"sessions": [  # one name, two generations: two machines
        {"cpu": "AMD EPYC", "cpu_generation": "family 23 model 49 stepping 0", "threads": 1},
        {"cpu": "AMD EPYC", "cpu_generation": "family 26 model 2 stepping 1", "threads": 1}]}))
    assert machine_of(folder) == ("AMD EPYC (family 23 model 49 stepping 0), 1 thread + "
                                  "AMD EPYC (family 26 model 2 stepping 1), 1 thread")
    assert [duration(s) for s in (30.0, 750.0, 8280.0)] == ["30 s", "12.5 min", "2.3 h"]
    folder.environment.write_text("{")
    assert machine_of(folder) == "?"
    folder.config_path.write_text("data: [1]\n")
    assert run_cost(folder) is None  # no batch size: no time
