"""Config loading and overrides; the checkpoint format."""

from __future__ import annotations

import os
import re

import pytest
import torch
import yaml

from deepmetric.config import build_config, load_yaml, parse_override
from deepmetric.errors import CheckpointError, ConfigError
from deepmetric.io.files import atomic_write_bytes
from deepmetric.runs.checkpoint import load_checkpoint, save_checkpoint


def test_overrides_are_typed_and_nested():
    config = build_config(parse_override("train.lr=1e-4"), parse_override("data.resize_range=[1.0, 1.5]"),
                          parse_override("model.head_options={}"), parse_override("eval.recall_at=1,10,100"))
    assert config.train.lr == 1e-4 and config.data.resize_range == (1.0, 1.5)
    assert config.eval.recall_at == [1, 10, 100]


def test_unknown_keys_suggest_the_nearest_valid_key(tmp_path):
    with pytest.raises(ConfigError, match="unknown config key 'train.lrr'.*did you mean 'train.lr'"):
        build_config(parse_override("train.lrr=1"))
    with pytest.raises(ConfigError, match="unknown config key 'trian'.*did you mean 'train'"):
        build_config({"trian": {"steps": 3}})
    for key, hint in (("train.batch", "a batch is data.classes_per_batch x data.samples_per_class (P x K) images"),
                      ("data.batch_size", "a batch is data.classes_per_batch"),
                      ("epochs", "training is counted in train.steps")):  # names other tools use: what ours are
        with pytest.raises(ConfigError, match=rf"^unknown config key '{key}' \({re.escape(hint)}"):
            build_config(parse_override(f"{key}=3"))
    (tmp_path / "c.yaml").write_text("data:\n  image_sise: 64\n")
    with pytest.raises(ConfigError, match="did you mean 'data.image_size'"):
        build_config(load_yaml(tmp_path / "c.yaml"))
    # a setting outside its section (or in another one) names the section it belongs to; a shared name, each
    for key, hint in (("lr", "'train.lr'"), ("model.lr", "'train.lr'"), ("image_size", "'data.image_size'"),
                      ("seed", "'data.seed' or 'train.seed'")):
        with pytest.raises(ConfigError, match=rf"^unknown config key '{key}' \(did you mean {hint}\?\)$"):
            build_config(parse_override(f"{key}=3"))
    (tmp_path / "flat.yaml").write_text("lr: 0.01\n")
    with pytest.raises(ConfigError, match=r"not a deepmetric config: .*; each setting sits under its section, e.g. "
                                          r"'train:' then '  lr: 0.001' on the next line$"):
        load_yaml(tmp_path / "flat.yaml")


def test_bad_values_name_the_key():
    with pytest.raises(ConfigError, match="train.steps.*integer"):
        build_config(parse_override("train.steps=abc"))
    modes = "resize, resize_crop, pad_crop, stretch_crop, short_crop"
    with pytest.raises(ConfigError, match=f"data.test_resize must be one of {modes}, got 'stretch'"):
        build_config(parse_override("data.test_resize=stretch"))
    with pytest.raises(ConfigError, match="data.train_pad must be one of size, square, stretch, got 'mirror'"):
        build_config(parse_override("data.train_pad=mirror"))
    with pytest.raises(ConfigError, match="lr_schedule must be one of constant, cosine, step, got 'linear'"):
        build_config(parse_override("train.lr_schedule=linear"))
    for milestones in ("[]", "[5, 5]", "[0, 3]"):
        with pytest.raises(ConfigError, match="lr_schedule=step needs train.lr_milestones: increasing steps"):
            build_config({"train": {"lr_schedule": "step", "lr_milestones": yaml.safe_load(milestones)}})
    with pytest.raises(ConfigError, match="lr_milestones is used by train.lr_schedule=step only"):
        build_config(parse_override("train.lr_milestones=[100]"))
    with pytest.raises(ConfigError, match="lr_gamma must be > 0"):
        build_config({"train": {"lr_schedule": "step", "lr_milestones": [3], "lr_gamma": 0}})
    with pytest.raises(ConfigError, match="classes_per_batch"):
        build_config(parse_override("data.classes_per_batch=1"))
    with pytest.raises(ConfigError, match="eval.engine must be one of auto, torch, numpy, faiss, cuda, got 'blas'"):
        build_config(parse_override("eval.engine=blas"))
    assert build_config(parse_override("eval.engine=numpy")).eval.engine == "numpy"
    for jitter in ("0.4", "[0.4, 0.4]", "0.4,0.4,0.4,0.1,0"):  # a list of a fixed length says how long
        with pytest.raises(ConfigError, match=r"^config key 'data.color_jitter': expected a list of 4 values, got "):
            build_config(parse_override(f"data.color_jitter={jitter}"))
    with pytest.raises(ConfigError, match=r"^config key 'data.resize_range': expected a list of 2 values, got 1.2$"):
        build_config(parse_override("data.resize_range=1.2"))
    assert build_config(parse_override("data.color_jitter=0.4,0.4,0.4,0.1")).data.color_jitter == (0.4, 0.4, 0.4, 0.1)


@pytest.mark.parametrize(("values", "message"), [
    ({"model": {"backbone": "lite00"}}, r"unknown backbone 'lite00' \(did you mean 'lite0'\?\)"),
    ({"model": {"head": "abee"}}, r"unknown head 'abee' \(did you mean 'abe'\?\)"),
    ({"model": {"head": "abe", "head_options": {"num_learner": 4}}}, r"no option 'num_learner'.*'num_learners'"),
    ({"loss": {"name": "binomal"}}, r"unknown loss 'binomal' \(did you mean 'binomial'\?\)"),
    ({"loss": {"options": {"negative_weigth": 25}}}, r"loss 'binomial' has no option.*'negative_weight'"),
    ({"loss": {"regularizers": {"hord": {}}}}, r"unknown regularizer 'hord' \(did you mean 'horde'\?\)"),
    ({"loss": {"regularizers": {"horde": {"weight": 1, "order": 3}}}}, r"regularizer 'horde' has no option 'order'"),
    ({"model": {"head": "abe", "head_options": {"num_learners:4": None}}},  # what YAML makes of {num_learners:4}
     r"^head 'abe': option 'num_learners:4' reads as one name; YAML needs a space after the colon: "
     r"\{num_learners: 4\}$"),
])
def test_names_and_options_of_the_model_and_loss_are_checked_with_the_config(values, message):
    """A typo stops ``build_config``, before any data is read (the image audit of a large set takes minutes)."""
    with pytest.raises(ConfigError, match=message):
        build_config(values)


def test_resolved_config_round_trips(tmp_path):
    from deepmetric.config import config_from_dict, save_config

    config = build_config({"model": {"head": "abe", "head_options": {"num_learners": 4}}, "loss": {"name": "triplet"}})
    save_config(config, tmp_path / "config.yaml")
    again = config_from_dict(yaml.safe_load((tmp_path / "config.yaml").read_text()))
    assert again == config


def test_presets_are_valid_configs():
    from pathlib import Path

    from deepmetric.losses import LOSSES, REGULARIZERS
    from deepmetric.models.heads import head_class

    configs = Path(__file__).parent.parent.joinpath("configs")
    presets = sorted(p for p in configs.rglob("*.yaml") if configs / "studies" not in p.parents)  # studies: below
    assert len(presets) > 20
    for preset in presets:
        config = build_config(load_yaml(preset))
        assert set(config.model.head_options) <= set(head_class(config.model.head).option_names()), preset
        assert config.loss.name in LOSSES and set(config.loss.regularizers or {}) <= set(REGULARIZERS), preset



def test_preset_studies_load_and_every_run_builds():
    from pathlib import Path

    from deepmetric.losses import LOSSES, REGULARIZERS
    from deepmetric.models.heads import head_class
    from deepmetric.studies import load_study

    studies = sorted(Path(__file__).parent.parent.joinpath("configs", "studies").glob("*.yaml"))
    assert studies
    for path in studies:
        spec = load_study(path)
        runs = spec.runs()
        assert runs, path
        for run in runs:
            config = build_config(*run.layers)
            assert set(config.model.head_options) <= set(head_class(config.model.head).option_names()), run.name
            assert config.loss.name in LOSSES and set(config.loss.regularizers or {}) <= set(REGULARIZERS), run.name

def test_extends_merges_a_parent_file_and_refuses_cycles(tmp_path):
    (tmp_path / "base.yaml").write_text("data:\n  image_size: 64\n  flip: false\nmodel:\n  head: gap\n")
    (tmp_path / "child.yaml").write_text("extends: base.yaml\ndata:\n  image_size: 96\nmodel:\n  head: abe\n")
    config = build_config(load_yaml(tmp_path / "child.yaml"))
    assert (config.data.image_size, config.data.flip, config.model.head) == (96, False, "abe")
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(ConfigError, match="extends itself"):
        load_yaml(tmp_path / "a.yaml")


def test_checkpoint_round_trip_and_refusals(tmp_path):
    tensors = {"model.w": torch.arange(6.0).view(2, 3), "rng.torch": torch.get_rng_state()}
    save_checkpoint(tmp_path / "c.safetensors", tensors, {"step": 7, "nested": {"a": [1, 2]}})
    loaded, state = load_checkpoint(tmp_path / "c.safetensors")
    assert state == {"step": 7, "nested": {"a": [1, 2]}}
    assert all(torch.equal(loaded[k], v) for k, v in tensors.items())

    torch.save({"w": torch.zeros(2)}, tmp_path / "legacy.pt")
    with pytest.raises(CheckpointError, match="pickled torch file"):
        load_checkpoint(tmp_path / "legacy.pt")
    (tmp_path / "junk.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        load_checkpoint(tmp_path / "junk.safetensors")
    whole = (tmp_path / "c.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(whole[:-8])  # a checkpoint cut short: header fine, data not
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        load_checkpoint(tmp_path / "cut.safetensors")
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(1)}, tmp_path / "foreign.safetensors")
    with pytest.raises(CheckpointError, match="not a deepmetric checkpoint"):
        load_checkpoint(tmp_path / "foreign.safetensors")


def test_checkpoint_with_tensors_sharing_memory_round_trips(tmp_path):
    """Tied weights and views (which safetensors refuses as they are) are saved as copies."""
    tied = torch.arange(12.0).view(3, 4)
    tensors = {"model.a": tied, "model.b": tied, "model.row": tied[1], "model.t": tied.t()}
    save_checkpoint(tmp_path / "c.safetensors", tensors, {})
    loaded, _ = load_checkpoint(tmp_path / "c.safetensors")
    assert loaded.keys() == tensors.keys() and all(torch.equal(loaded[k], v) for k, v in tensors.items())


def test_atomic_write_leaves_the_old_file_when_writing_fails(tmp_path, monkeypatch):
    target = tmp_path / "last.safetensors"
    atomic_write_bytes(target, b"old")

    def broken_fsync(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    from deepmetric.errors import WriteError

    with pytest.raises(WriteError, match="could not write .*last.safetensors: disk full; the previous file is intact"):
        atomic_write_bytes(target, b"new content")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["last.safetensors"]  # no temporary file left behind
    with pytest.raises(WriteError):  # a checkpoint is streamed to the temporary file by safetensors, then fsynced
        save_checkpoint(target, {"w": torch.ones(1000)}, {"step": 1})
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["last.safetensors"]


def test_an_unknown_head_option_names_the_nearest_and_lists_the_valid_ones():
    from deepmetric.models import create_model

    with pytest.raises(ConfigError, match=r"head 'diablo' has no option 'entries' \(did you mean 'num_entries'\?\); "
                                          r"its options are: .*alpha"):
        create_model("tiny", head="diablo", pretrained=False, embedding_dim=16, entries=3)


def test_a_checkpoint_whose_header_length_starts_with_the_pickle_opcode_loads(tmp_path):
    """Regression: a safetensors header of length 0x..80 starts the file with 0x80, pickle's protocol opcode."""
    path = tmp_path / "c.safetensors"
    for pad in range(300):
        save_checkpoint(path, {"w": torch.ones(3)}, {"note": "x" * pad})
        if path.read_bytes()[:1] == b"\x80":
            break
    assert path.read_bytes()[:1] == b"\x80"
    tensors, state = load_checkpoint(path)
    assert torch.equal(tensors["w"], torch.ones(3)) and state["note"].startswith("x")


def test_atomic_writes_give_the_mode_a_plain_open_gives(tmp_path):
    """With umask 022 a report or index must be readable by a web server's account (mkstemp made them 0600)."""
    import os
    import stat

    from deepmetric.io.files import atomic_write_text

    previous = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "report.html", "<html></html>")
        os.umask(0o077)
        atomic_write_text(tmp_path / "private.json", "{}")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "report.html").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "private.json").stat().st_mode) == 0o600


@pytest.mark.parametrize(("override", "message"), [
    ({"train": {"steps": "1e400"}}, "train.steps': expected an integer, got '1e400'"),
    ({"data": {"image_size": 1e400}}, "data.image_size': expected an integer"),
    ({"train": {"steps": float("nan")}}, "train.steps': expected an integer"),
    ({"train": {"lr": float("inf")}}, "train.lr': expected a finite number"),
    ({"model": {"embedding_dim": -5}}, "model.embedding_dim must be at least 0, got -5"),
    ({"train": {"lr": -1}}, "train.lr must be at least 0, got -1"),
    ({"data": {"num_workers": -1}}, "data.num_workers must be at least 0, got -1"),
    ({"data": {"image_size": 100000}}, "data.image_size must be from 8 to 8192"),
    ({"train": {"groups": {"new": {"lr_scale": [1, 2]}}}}, "train.groups.new.lr_scale': expected a number"),
    ({"eval": {"batch_size": 0}}, "eval.batch_size must be at least 1"),
])
def test_bad_values_are_refused_by_the_typed_config(override, message):
    """Each was a traceback (OverflowError, ValueError) or silently accepted; now one ConfigError naming the key."""
    with pytest.raises(ConfigError, match=message):
        build_config(override)


def test_a_binary_config_file_is_one_line(tmp_path):
    (tmp_path / "model.yaml").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    with pytest.raises(ConfigError, match="is not text"):
        load_yaml(tmp_path / "model.yaml")


@pytest.mark.parametrize(("override", "message"), [
    ("loss.options.m=.nan", r"loss.options.m': expected a finite number, got nan"),
    ("loss.options.gamma=-.inf", r"loss.options.gamma': expected a finite number"),
    ("loss.options.m=nan", r"loss.options.m': expected a finite number, got 'nan'"),
    ("loss.options.m=1e999", r"loss.options.m': expected a finite number, got '1e999'"),
    ("loss.regularizers.divergence.weight=.inf", r"loss.regularizers.divergence.weight': expected a finite"),
    ("loss.miner_options.epsilon=.nan", r"loss.miner_options.epsilon': expected a finite number"),
    ("generator.options.batch_ratio=.nan", r"generator.options.batch_ratio': expected a finite number"),
    ("model.head_options.temperature=.nan", r"model.head_options.temperature': expected a finite number"),
    ("loss.options.margins=[0.1,.nan]", r"loss.options.margins\[1\]': expected a finite number"),
])
def test_non_finite_plug_in_options_are_refused_like_train_lr(override, message):
    """``loss.options.m=.nan`` (CircleLoss) trained to the end with a loss of exactly 0: a NaN or infinite number
    anywhere under a plug-in's options is refused, naming the key, as ``train.lr=.nan`` is."""
    with pytest.raises(ConfigError, match=message):
        build_config({"loss": {"name": "pml:CircleLoss", "miner": "pml:MultiSimilarityMiner"}},
                     parse_override(override))


@pytest.mark.parametrize(("override", "message"), [
    ("train.seed=-1", r"train.seed must be at least 0, got -1"),
    ("train.seed=1180591620717411303424", r"train.seed must be at most 4,294,967,295 \(2\*\*32 - 1"),
    ("data.seed=-3", r"data.seed must be at least 0"),
    ("data.val_seed=4294967296", r"data.val_seed must be at most 4,294,967,295"),
    ("model.embedding_dim=1000000000000", r"model.embedding_dim must be at most 65,536 \(the papers use 64 to 8,192"),
    ("data.num_workers=1000000", r"data.num_workers must be at most 128 \(each is a process decoding images"),
    ("model.head_options.codewords=many", r"'model.head_options.codewords': expected an integer, got 'many'"),
    ("model.head_options.codewords=2.5", r"'model.head_options.codewords': expected an integer, got 2.5"),
])
def test_values_torch_or_numpy_refuse_are_bounded_by_the_typed_config(override, message):
    """Issue 53 item 23: a seed of -1 or 2**70 was a traceback from numpy or torch, ``model.embedding_dim=10**12`` an
    attempt to allocate 128 TB, ``data.num_workers=1000000`` was accepted and torch started the workers; a head option
    of the wrong type (``codewords: many``) was a TypeError from inside the head. Each is one ConfigError."""
    with pytest.raises(ConfigError, match=message):
        build_config({"model": {"backbone": "tiny", "head": "jcf"}}, parse_override(override))


def test_a_head_option_is_typed_as_the_head_declares_it_and_a_model_too_large_is_refused_before_it_is_built():
    """The edges still pass (seed 2**32 - 1, 65,536 dimensions, 128 workers, ``codewords: '8'`` read as 8); a model
    above ``MAX_MODEL_VALUES`` is refused from its plan on the meta device, before any memory is allocated."""
    from deepmetric.models import create_model
    from deepmetric.models.embedder import MAX_MODEL_VALUES, plan_model

    config = build_config({"model": {"backbone": "tiny", "head": "jcf", "embedding_dim": 65_536,
                                     "head_options": {"codewords": "8", "alpha": 1}},
                           "train": {"seed": 2**32 - 1}, "data": {"num_workers": 128}})
    assert config.model.head_options == {"codewords": 8, "alpha": 1.0}
    plan = plan_model("tiny", "jcf", 16, codewords=8)
    assert next(plan.parameters()).device.type == "meta"
    with pytest.raises(ConfigError, match=rf"would hold [\d,]+ parameters and buffers .* at most {MAX_MODEL_VALUES:,}"):
        create_model(backbone="tiny", head="jcf", embedding_dim=16, pretrained=False, codewords=10**7)
