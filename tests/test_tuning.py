"""Tuning studies (issue 51 item 2): the same number of Optuna TPE trials for every variant, scored on validation
classes only, resumable from the record in a fresh checkout, and the seeds trained with each variant's best values."""

from __future__ import annotations

import csv
import multiprocessing
import re
import shutil

import pytest
import yaml

from deepmetric.cli import main
from deepmetric.config import build_config
from deepmetric.config.layers import dotted_layer
from deepmetric.errors import ConfigError
from deepmetric.runs.folder import RunDir
from deepmetric.studies import load_study, run_study
from deepmetric.studies.search_space import Dimension
from deepmetric.studies.tuning import best_values, score_of, trials_of
from helpers import tiny_config

pytest.importorskip("optuna")

TUNE = {"trials": 3, "seed": 7, "objective": "map@r",
        "space": {"train.lr": {"low": "1e-4", "high": 1.0e-2, "log": True}},
        "variants": {"abe": {"loss.regularizers.divergence.weight": {"choices": [0.1, 1.0]}}}}


def write_study(tmp_path, name="tiny", **extra):
    base = tiny_config(train={"steps": 2}).to_dict()
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    study = {"name": name, "base": "base.yaml", "out": str(tmp_path / "out"), "record": str(tmp_path / "record"),
             "set": {"train.steps": 2, "train.eval_every": 1, "train.checkpoint_every": 1,
                     "data.val_fraction": 0.4},
             "variants": {"gap": {}, "abe": {"model.head": "abe", "model.head_options": {"num_learners": 2}}},
             "tune": TUNE, **extra}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    return tmp_path / "study.yaml"


def test_the_tune_section_is_checked_when_the_study_is_loaded(tmp_path):
    spec = load_study(write_study(tmp_path))
    assert spec.tune.trials == 3 and spec.tune.objective == "map@r"
    assert [d.key for d in spec.tune.spaces["gap"]] == ["train.lr"]
    assert [d.key for d in spec.tune.spaces["abe"]] == ["train.lr", "loss.regularizers.divergence.weight"]
    assert spec.tune.spaces["gap"][0] == Dimension("train.lr", low=1e-4, high=1e-2, log=True)  # "1e-4": a number
    bad = {
        "trials": ({**TUNE, "trials": 0}, "tune.trials must be a whole number"),
        "objective": ({**TUNE, "objective": "recall@2"}, "tune.objective must be one of recall@1, map@r"),
        "order": ({**TUNE, "space": {"train.lr": {"low": 1.0, "high": 0.1}}}, "low < high"),
        "log": ({**TUNE, "space": {"train.lr": {"low": 0.0, "high": 0.1, "log": True}}}, "log scale needs low > 0"),
        "key": ({**TUNE, "space": {"train.lr": {"low": 0.1, "hihg": 0.2}}}, "unknown key 'hihg'"),
        "variant": ({**TUNE, "variants": {"dgml": {}}}, "names no variant 'dgml'"),
        "twice": ({**TUNE, "variants": {"abe": {"train.lr": {"choices": [0.1]}}}}, "searches train.lr twice"),
        "setting": ({**TUNE, "space": {"train.lrr": {"low": 0.1, "high": 0.2}}}, "tune dimension train.lrr"),
        "value": ({**TUNE, "space": {"train.steps": {"low": -3, "high": 2}}}, "tune dimension train.steps = -3"),
        "unknown": ({**TUNE, "trails": 3}, "unknown key 'trails'"),
    }
    for name, (tune, message) in bad.items():
        with pytest.raises(ConfigError, match=message):
            load_study(write_study(tmp_path, tune=tune))
        assert not (tmp_path / "out").exists(), name


def test_every_variant_gets_the_same_trials_scored_on_validation_and_the_seeds_use_the_best(tmp_path):
    spec = load_study(write_study(tmp_path, seeds=[0, 1], seed_validation=True))
    paths = run_study(spec, progress=False)
    for variant in ("gap", "abe"):
        trials = trials_of(spec, variant)
        assert [t.number for t in trials] == [0, 1, 2]
        assert len({t.values["train.lr"] for t in trials}) == 3
        for trial in trials:  # the score is the objective at the selected validation checkpoint, never a test figure
            folder = RunDir(tmp_path / "out" / "trials" / variant / str(trial.number))
            assert not folder.test_metrics.exists()
            assert score_of(folder, "map@r") == (trial.score, trial.step, trial.validation)
            assert trial.score == trial.validation["map@r"]
            assert (tmp_path / "record" / "trials" / variant / str(trial.number) / "trial.json").is_file()
        best = max(trials, key=lambda t: (t.score, -t.number))
        assert best_values(spec, variant) == best.values
        for seed in (0, 1):  # the seeds train with the best trial's values, each drawing its validation classes
            config = yaml.safe_load((tmp_path / "out" / "runs" / variant / str(seed) / "config.yaml").read_text())
            assert config["train"]["lr"] == pytest.approx(best.values["train.lr"])
            assert config["data"]["val_seed"] == seed and config["train"]["seed"] == seed
    rows = list(csv.DictReader((tmp_path / "record" / "tuning.csv").open()))
    assert [(r["variant"], r["trial"]) for r in rows] == [(v, str(n)) for v in spec.variants for n in range(3)]
    table = (tmp_path / "record" / "tuning.md").read_text()
    assert "| gap | 3 of 3 |" in table and "| abe | 3 of 3 |" in table and "train.lr [0.0001, 0.01, log]" in table
    assert paths["md"].is_file()


def optuna_trials(tmp_path, variant):
    import optuna

    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(
        str(tmp_path / "record" / "tuning.journal")))
    return optuna.load_study(study_name=f"tiny/{variant}", storage=storage).trials


def test_a_study_cut_mid_trial_goes_on_in_a_fresh_checkout_from_its_record(tmp_path, monkeypatch):
    """A session ends during trial 1: the journal (in the record) holds it as running and nothing holds its folder.
    A fresh checkout (the runs folder gone) trains that trial again with the same values and then the rest: each
    variant ends with exactly its budget."""
    import deepmetric.studies.tuning as tuning

    spec = load_study(write_study(tmp_path))
    real = tuning._train_trial
    calls = []

    def cut_at_second(*args, **kwargs):
        calls.append(args[2])
        if len(calls) == 2:
            raise KeyboardInterrupt  # the session's end
        return real(*args, **kwargs)

    monkeypatch.setattr(tuning, "_train_trial", cut_at_second)
    with pytest.raises(KeyboardInterrupt):
        run_study(spec, progress=False, tuning_only=True)
    assert len(trials_of(spec, "abe")) == 1 and not trials_of(spec, "gap")  # abe comes first (the file's order)
    cut = {t.number: (t.state.name, t.params) for t in optuna_trials(tmp_path, "abe")}
    assert cut[1][0] == "RUNNING"  # the journal (in the record) keeps what trial 1 was given
    shutil.rmtree(tmp_path / "out")  # a fresh checkout: only the record is left
    monkeypatch.setattr(tuning, "_train_trial", real)
    spec = load_study(write_study(tmp_path))
    run_study(spec, progress=False, tuning_only=True)
    assert [t.number for t in trials_of(spec, "gap")] == [0, 1, 2]
    assert [t.number for t in trials_of(spec, "abe")] == [0, 1, 2]
    for variant in ("gap", "abe"):
        trials = optuna_trials(tmp_path, variant)
        assert [t.state.name for t in trials] == ["COMPLETE"] * 3, variant
        assert {t.number: t.params for t in trials} == {t.number: t.values for t in trials_of(spec, variant)}
    assert optuna_trials(tmp_path, "abe")[1].params == cut[1][1]  # trained again with the same values
    run_study(load_study(write_study(tmp_path)), progress=False, tuning_only=True)  # a third start: nothing to do
    journal = (tmp_path / "record" / "tuning.journal").read_text()
    assert journal.count('"op_code":0') == 2  # each variant's study created once, loaded at every later start


def _tune_in_process(path):
    from deepmetric.studies import load_study, run_study

    run_study(load_study(path), progress=False, tuning_only=True)


def test_two_processes_share_the_trials_and_no_variant_runs_over_its_budget(tmp_path):
    path = write_study(tmp_path, variants={"gap": {}}, tune={**TUNE, "variants": {}})
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_tune_in_process, args=(path,)) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(300)
        assert worker.exitcode == 0
    spec = load_study(path)
    trials = trials_of(spec, "gap")
    assert [t.number for t in trials] == [0, 1, 2]
    assert not (tmp_path / "out" / "trials" / "gap" / "3").exists()
    # each process holds a sampler: seeded alike, the two first trials had the same values (five GPU trials did)
    assert len({t.values["train.lr"] for t in trials}) == 3


def test_each_trial_draws_from_a_seed_of_its_own_and_a_study_repeats(tmp_path):
    import contextlib

    import deepmetric.studies.tuning as tuning

    drawn = []
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        spec = load_study(write_study(tmp_path / name, variants={"gap": {}}, tune={**TUNE, "variants": {}}))
        optuna, storage = tuning._storage(spec)
        study = tuning._study(spec, "gap", optuna, storage)
        values = []
        for _ in range(2):
            with contextlib.ExitStack() as held:
                number, suggested = tuning._take_trial(spec, "gap", study, optuna, held)
            study.tell(number, 0.5)
            values.append(suggested)
        drawn.append(values)
    assert drawn[0] == drawn[1] and drawn[0][0] != drawn[0][1]


def test_a_diverging_trial_counts_with_what_it_reached(tmp_path, monkeypatch):
    import deepmetric.studies.tuning as tuning
    from deepmetric.errors import TrainingError

    def diverge(config, out, resume=False, progress=True):
        RunDir(out).path.mkdir(parents=True, exist_ok=True)
        raise TrainingError("step 1: the loss term 'total' is nan; training stopped (…).")

    monkeypatch.setattr(tuning, "train", diverge)
    spec = load_study(write_study(tmp_path, variants={"gap": {}}, tune={**TUNE, "variants": {}}))
    paths = run_study(spec, progress=False, tuning_only=True)
    trials = trials_of(spec, "gap")
    assert [t.score for t in trials] == [0.0, 0.0, 0.0] and all("nan" in t.failed for t in trials)
    assert "3 of 3 (3 diverged)" in paths["md"].read_text()


def test_a_searched_regulariser_weight_keeps_the_variants_other_regularisers_and_options(tmp_path):
    """A layer replaces ``loss.regularizers`` whole: a trial's ``loss.regularizers.deml-hinge.weight`` once dropped the
    variant's activation decay and row norm (icons-cpu-64px's DeML trials, 2026-11-28). Each searched key sets one
    value, in the trials and in the seeds that train with the best trial's."""
    regularizers = {"divergence": {"weight": 1.0, "margin": 0.5}, "activation-decay": {"weight": 0.01}}
    spec = load_study(write_study(tmp_path, variants={
        "gap": {}, "abe": {"model.head": "abe", "model.head_options": {"num_learners": 2},
                           "loss.regularizers": regularizers}}))
    config = build_config(*spec.trial_layers("abe", {"loss.regularizers.divergence.weight": 0.1, "train.lr": 0.002}))
    assert config.loss.regularizers == {"divergence": {"weight": 0.1, "margin": 0.5},
                                        "activation-decay": {"weight": 0.01}}
    assert config.train.lr == 0.002 and config.model.head_options == {"num_learners": 2}
    spec.tuned["abe"] = spec.trial_layers("abe", {"loss.regularizers.divergence.weight": 0.1})[-1]
    seed = next(run for run in spec.runs() if run.variant == "abe")
    assert build_config(*seed.layers).loss.regularizers["activation-decay"] == {"weight": 0.01}


def test_a_finished_trial_trained_with_other_settings_is_refused_and_a_default_written_out_is_not(tmp_path, capsys):
    """A trial's score counts for its variant only while the study builds the trial's config as it was trained: a
    changed variant stops the tuning, naming the trial and the setting (as a changed run stops the seeds); writing a
    regulariser's default out changes nothing it trained."""
    tune = {**TUNE, "trials": 1, "variants": {}}
    abe = {"model.head": "abe", "model.head_options": {"num_learners": 2},
           "loss.regularizers": {"divergence": {"weight": 0.5}}}
    run_study(load_study(write_study(tmp_path, variants={"abe": abe}, tune=tune)), progress=False, tuning_only=True)
    same = {**abe, "loss.regularizers": {"divergence": {"weight": 0.5, "margin": 1.0}}}  # margin's default
    run_study(load_study(write_study(tmp_path, variants={"abe": same}, tune=tune)), progress=False, tuning_only=True)
    changed = {**abe, "loss.regularizers": {"divergence": {"weight": 0.5, "margin": 0.25}}}
    message = (r"1 finished trial\(s\) were trained with other settings than the study now gives them: abe/0 in "
               r".*loss.regularizers.divergence.margin: 1.0 -> 0.25")
    with pytest.raises(ConfigError, match=message):
        run_study(load_study(write_study(tmp_path, variants={"abe": changed}, tune=tune)), progress=False,
                  tuning_only=True)
    assert main(["study", str(tmp_path / "study.yaml"), "--dry-run"]) == 2  # the dry run says it first
    assert re.search(message, capsys.readouterr().err)


def test_a_regularisers_options_read_with_their_defaults():
    from deepmetric.losses import REGULARIZERS, regularizer_options

    assert regularizer_options("divergence", {"weight": 0.5}) == {"weight": 0.5, "margin": 1.0, "reduction": "mean"}
    assert regularizer_options("horde", None)["orders"] == 5 and regularizer_options("horde", None)["weight"] == 1.0
    assert "head" not in REGULARIZERS.defaults("horde") and "metric_loss" not in REGULARIZERS.defaults("horde")


def test_dotted_keys_set_one_value_each_over_the_resolved_config():
    resolved = {"loss": {"regularizers": {"horde": {"orders": 5, "weight": 1.0}, "divergence": {"weight": 1.0}}},
                "model": {"head_options": {"alpha": 10.0, "num_entries": 8}}}
    layer = dotted_layer({"loss.regularizers.horde.weight": 0.3, "loss.regularizers.divergence.weight": 0.2,
                          "model.head_options.alpha": 2.0, "train.lr": 0.1, "data.spec": "icons"}, resolved)
    assert layer == {"loss": {"regularizers": {"horde": {"orders": 5, "weight": 0.3}, "divergence": {"weight": 0.2}}},
                     "model": {"head_options": {"alpha": 2.0, "num_entries": 8}},
                     "train": {"lr": 0.1}, "data": {"spec": "icons"}}
    assert dotted_layer({"loss.regularizers.horde.weight": 0.3}, {"loss": {"regularizers": None}}) == {
        "loss": {"regularizers": {"horde": {"weight": 0.3}}}}  # nothing to keep: the key alone
    assert resolved["loss"]["regularizers"]["horde"]["weight"] == 1.0  # the resolved config is left as it was


def test_the_seeds_of_a_variant_wait_for_its_tuning(tmp_path):
    spec = load_study(write_study(tmp_path, variants={"gap": {}}, tune={**TUNE, "variants": {}}))
    with pytest.raises(ConfigError, match=r"variant 'gap' has 0 of its 3 trials: finish them first"):
        best_values(spec, "gap")


def test_the_dry_run_says_how_far_the_tuning_is_and_builds_tuned_variants_with_their_best_values(tmp_path):
    from deepmetric.studies.dry_run import dry_run, format_dry_run

    spec = load_study(write_study(tmp_path, variants={"gap": {}}, tune={**TUNE, "variants": {}}))
    assert "tuned first, 3 trials a variant (gap 0 of 3)" in format_dry_run(spec, dry_run(spec))
    run_study(spec, progress=False, tuning_only=True)
    spec = load_study(write_study(tmp_path, variants={"gap": {}}, tune={**TUNE, "variants": {}}))
    text = format_dry_run(spec, dry_run(spec))
    assert "(gap 3 of 3)" in text and f"train.lr={best_values(spec, 'gap')['train.lr']}" in text.replace(" ", "")


def test_the_trials_in_the_record_verify_and_a_hand_edited_score_is_named(tmp_path):
    import json

    from deepmetric.studies.verify import verify

    spec = load_study(write_study(tmp_path, variants={"gap": {}}, tune={**TUNE, "variants": {}}))
    run_study(spec, progress=False, tuning_only=True)
    found = verify(spec)
    assert found.problems == [] and found.checked["trials"] == 3
    trial = tmp_path / "record" / "trials" / "gap" / "1" / "trial.json"
    data = json.loads(trial.read_text())
    trial.write_text(json.dumps({**data, "score": data["score"] + 0.25}))
    problems = verify(spec).problems
    assert any(f"{trial}: it says score" in p for p in problems)  # the score against its log
    assert any(f"{trial} does not match MANIFEST.sha256" in p for p in problems)
    assert any("tuning.csv line 3 (gap, 1), score" in p for p in problems)  # the tables follow the trials


def test_the_process_that_ends_last_writes_the_records_tables_though_a_variant_was_being_tuned_elsewhere(
        tmp_path, monkeypatch, caplog):
    """At the end of the emoji CPU study neither process wrote the record's tables: the last one had started while
    the other still tuned a variant, and counted that variant as pending at its end, after the other had tuned it,
    trained its seeds and recorded them. Now a pending variant is looked at again at the end, as a run met held is."""
    import deepmetric.studies.runner as runner

    path = write_study(tmp_path, seeds=[0], tune={**TUNE, "trials": 2})
    spec = load_study(path)
    run_study(spec, progress=False, tuning_only=True)
    run_study(load_study(path), progress=False, only=["abe"])  # the other process: abe's seeds, recorded
    real = runner.apply_best_values
    calls = []

    def abe_still_tuned_elsewhere_when_this_process_starts(spec, variants):
        calls.append(list(variants))
        pending = real(spec, variants)
        if len(calls) == 1:
            spec.tuned.pop("abe")
            pending.append("abe")
        return pending

    monkeypatch.setattr(runner, "apply_best_values", abe_still_tuned_elsewhere_when_this_process_starts)
    with caplog.at_level("INFO", logger="deepmetric"):
        paths = run_study(spec, progress=False)
    assert "abe: its seeds wait until its tuning ends" in caplog.text and len(calls) == 2
    assert "lacks" not in caplog.text
    assert sorted(r["variant"] for r in csv.DictReader(paths["csv"].open())) == ["abe", "gap"]
    assert (tmp_path / "record" / "results.csv").read_text() == paths["csv"].read_text()


def test_the_journals_lock_is_never_inside_the_record(tmp_path, monkeypatch):
    """Optuna's file lock made a symbolic link beside the journal, in the record, while another process appended to
    it; a study process starting then (``refuse_links``), or a manifest written then, met it: "is a symbolic link", or
    "No such file" once it was renamed away (test_two_processes_share_the_trials..., about one run in seven). The
    lock now lives in the study's output folder, beside the record's own lock; the record is walked while the
    journal is held here, as another process would."""
    from optuna.storages.journal import JournalFileOpenLock, JournalFileSymlinkLock

    from deepmetric.studies.record import record_files

    seen = []
    for kind in (JournalFileOpenLock, JournalFileSymlinkLock):
        acquire = kind.acquire

        def acquire_then_walk_the_record(self, acquire=acquire):
            taken = acquire(self)
            seen.append([p.name for p in record_files(tmp_path / "record")])
            return taken

        monkeypatch.setattr(kind, "acquire", acquire_then_walk_the_record)
    spec = load_study(write_study(tmp_path, variants={"gap": {}}, tune={**TUNE, "variants": {}, "trials": 1}))
    run_study(spec, progress=False, tuning_only=True)
    assert seen and not any(".lock" in name for names in seen for name in names)
