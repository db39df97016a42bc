"""The training loop on the tiny trunk: model selection, schedules, logs, failures (resumption: test_resume.py)."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
import torch

from deepmetric.io.tensors import unprefixed
from deepmetric.losses import LOSSES
from deepmetric.runs.checkpoint import load_checkpoint
from deepmetric.runs.folder import RunDir
from deepmetric.runs.model import load_run_model
from deepmetric.training import TrainingError, train
from helpers import assert_resumed_exactly, checkpoint, make_table, reads_made_by_deepmetric, tiny_config
from test_resume import CASES as RESUME_CASES


def weights(path):
    tensors, state = load_checkpoint(path)
    return unprefixed("model", tensors), unprefixed("optim", tensors), state


# Exact resumption (model, optimiser, objective, generator) is tested for every head and regulariser, GAP included,
# in test_resume.py.


def test_best_checkpoint_follows_validation_recall_then_map_at_r(tmp_path):
    config = tiny_config(data={"val_fraction": 0.4}, train={"steps": 6, "eval_every": 2})
    result = train(config, tmp_path / "run", progress=False)
    run = RunDir(tmp_path / "run")
    validations = [r for r in run.read_log() if r.get("split") == "val"]
    assert [r["step"] for r in validations] == [2, 4, 6]
    def rank(r: dict) -> tuple:  # Recall@1, ties broken by MAP@R, then R-precision; the earliest of exact ties
        return r["recall@1"], r["map@r"], r["r_precision"]

    best = max(validations, key=rank)
    assert result.best_step == min(r["step"] for r in validations if rank(r) == rank(best))
    _, _, state = weights(run.best)
    assert state["step"] == result.best_step and state["val_recall@1"] == pytest.approx(best["recall@1"])
    model, _, path = load_run_model(run.path)
    assert path == run.best
    losses = [r for r in run.read_log() if "loss" in r]
    assert len(losses) == 6 and all("metric" in r and r["images_per_s"] > 0 for r in losses)
    assert json.loads(json.dumps(run.config().to_dict())) == config.to_dict()


def test_validation_ranks_with_the_runs_knn_engine(tmp_path, monkeypatch):
    from deepmetric.evaluation import metrics

    engines = []

    def recording_iter_knn(*args, **kwargs):
        engines.append(args[5] if len(args) > 5 else kwargs.get("engine"))
        return iter_knn(*args, **kwargs)

    iter_knn = metrics.iter_knn
    monkeypatch.setattr(metrics, "iter_knn", recording_iter_knn)
    config = tiny_config(data={"val_fraction": 0.4}, train={"steps": 4, "eval_every": 2}, eval={"engine": "numpy"})
    train(config, tmp_path / "run", progress=False)
    assert engines == ["numpy", "numpy"]  # validation at steps 2 and 4


@pytest.mark.parametrize("schedule", ["step", "cosine"])
def test_learning_rate_schedules(tmp_path, schedule):
    """``step``: x0.5 from step 2 and again from step 4 (0-based, as MultiStepLR's milestones), also when the
    run is extended from 3 to 6 steps by a resume; ``cosine``: (1 + cos(pi s / 6)) / 2 over 6 steps."""
    if schedule == "step":
        options = {"lr_schedule": "step", "lr_milestones": [2, 4], "lr_gamma": 0.5}
        expected = [1e-3 * 0.5 ** ((s >= 2) + (s >= 4)) for s in range(6)]
        train(tiny_config(train={"steps": 3, **options}), tmp_path / "run", progress=False)
        train(tiny_config(train={"steps": 6, **options}), tmp_path / "run", resume=True, progress=False)
    else:
        expected = [1e-3 * (1 + np.cos(np.pi * s / 6)) / 2 for s in range(6)]
        train(tiny_config(train={"steps": 6, "lr_schedule": "cosine"}), tmp_path / "run", progress=False)
    logged = {r["step"]: r["lr"] for r in RunDir(tmp_path / "run").read_log() if "loss" in r}
    assert sorted(logged) == [1, 2, 3, 4, 5, 6]
    assert [logged[s + 1] for s in range(6)] == pytest.approx(expected, rel=1e-6)


def test_non_finite_loss_stops_with_the_step_and_the_term(tmp_path):
    config = tiny_config(loss={"name": "contrastive"})
    config.loss.options["margin"] = float("nan")  # past validation, which refuses it (a loss can still diverge)
    with pytest.raises(TrainingError, match="step 1: the loss term 'metric' is nan"):
        train(config, tmp_path / "run", progress=False)
    assert not RunDir(tmp_path / "run").last.exists()


PLUG_INS = {**RESUME_CASES, **{f"loss {name}": {"loss": {"name": name}} for name in LOSSES},
            "divergence": {"model": {"head": "abe", "head_options": {"num_learners": 2}},
                           "loss": {"regularizers": {"divergence": {"weight": 1.0}}}}}


@pytest.mark.parametrize("case", list(PLUG_INS))
def test_a_training_step_reads_one_value_from_its_device_the_loss(tmp_path, monkeypatch, case):
    """The finite check and the logged loss share one read, made before the backward pass is queued: on a GPU the
    host then waits for the forward pass only and prepares the next batch while the backward pass runs (until
    2026-11-28 the loss was read a second time after the optimiser's step, which waits for the whole step). Three more
    steps, three more reads (what a run reads once, at its start and end, cancels out), for every head, loss and
    regulariser, the cross-batch memory included. MIRAGE reads three a step: the loss, its own step's terms (checked in
    one read) and the number of its batch's largest class (from labels it copies to the host to choose virtual
    classes with its CPU noise stream)."""

    def reads(steps: int) -> int:
        config = tiny_config(**{**PLUG_INS[case], "train": {"steps": steps, "eval_every": 1000,
                                                            "checkpoint_every": 1000, "log_every": 1000}})
        return reads_made_by_deepmetric(monkeypatch, lambda: train(config, tmp_path / f"run{steps}", progress=False))

    assert reads(6) - reads(3) == 3 * (3 if case == "mirage" else 1)


def test_a_gpus_uint8_batches_train_and_validate_as_float_batches_bit_for_bit(tmp_path, monkeypatch):
    """On a GPU the loaders carry uint8 pixels, made floats on the device (``uint8_batches``); forced on the CPU, a
    run trains and validates to the same checkpoint, bit for bit, and the loop did receive uint8 batches."""
    import deepmetric.evaluation.evaluator as evaluator_module
    import deepmetric.training.trainer as trainer_module

    config = tiny_config(data={"val_fraction": 0.4}, train={"steps": 4, "eval_every": 2, "checkpoint_every": 4})
    train(config, tmp_path / "float", progress=False)
    received = []
    for module in (trainer_module, evaluator_module):
        monkeypatch.setattr(module, "uint8_batches", lambda device: True)
        convert = module.as_unit_float
        monkeypatch.setattr(module, "as_unit_float", lambda images, convert=convert: received.append(images.dtype)
                            or convert(images))
    train(config, tmp_path / "uint8", progress=False)
    assert set(received) == {torch.uint8} and len(received) > 4  # the training steps and the validation batches
    assert_resumed_exactly(checkpoint(RunDir(tmp_path / "float").last),
                           checkpoint(RunDir(tmp_path / "uint8").last), steps=4)
    best = [RunDir(tmp_path / name).read_log() for name in ("float", "uint8")]
    assert [r for r in best[0] if "split" in r] == [r for r in best[1] if "split" in r] != []


def test_a_non_finite_term_of_the_generators_own_step_stops_the_run_naming_it(tmp_path, monkeypatch):
    """MIRAGE's step adds its adversaries' terms after the backward pass; one that is NaN stops the run, named, and
    the finite ones pass (they are all checked in one read from the device)."""
    from deepmetric.generators.mirage import MirageGenerator

    step = MirageGenerator.step

    def with_nan(self, output, labels):
        return {**step(self, output, labels), "fine": torch.tensor(1.0), "generator_nan": torch.tensor(float("nan"))}

    monkeypatch.setattr(MirageGenerator, "step", with_nan)
    config = tiny_config(generator={"name": "mirage", "options": {"diagnostic_images": 0}})
    with pytest.raises(TrainingError, match="step 1: the loss term 'generator_nan' is nan"):
        train(config, tmp_path / "run", progress=False)
    assert not RunDir(tmp_path / "run").last.exists()


def test_an_existing_run_is_not_overwritten(tmp_path):
    from deepmetric.errors import DeepMetricError

    train(tiny_config(train={"steps": 1}), tmp_path / "run", progress=False)
    with pytest.raises(DeepMetricError, match="already holds a run; pass --resume"):
        train(tiny_config(train={"steps": 1}), tmp_path / "run", progress=False)


@pytest.mark.parametrize(("sections", "message"), [
    ({"data": {"spec": "folder:/nonexistent/photos"}}, "/nonexistent/photos"),
    ({"model": {"head": "abe", "head_options": {"num_learner": 2}}}, "num_learners"),
])
def test_a_run_that_fails_its_set_up_leaves_no_directory(tmp_path, sections, message):
    """Bad data or a bad head option stops the run before anything is written: no empty run directory is left
    to block the corrected command (``already holds a run``) or to litter ``runs/``."""
    from deepmetric.errors import DeepMetricError

    with pytest.raises(DeepMetricError, match=message):
        train(tiny_config(train={"steps": 1}, **sections), tmp_path / "runs" / "new", progress=False)
    assert not (tmp_path / "runs").exists()


def test_baseline_is_recorded_before_training(tmp_path):
    """``eval.baseline``: the test metrics of the run's untrained backbone (its pooled features, l2-normalised) are
    what ``evaluate`` gives for the trunk of the run at step 0 (a 0-step run's checkpoint) under a GAP head without
    an embedding layer; another seed's untrained trunk scores otherwise, so the comparison can fail."""
    from deepmetric.evaluation.evaluator import EmbedSettings, evaluate
    from deepmetric.models import create_model
    from deepmetric.runs.table import load_table

    config = tiny_config(eval={"baseline": True}, train={"steps": 1})
    train(config, tmp_path / "run", progress=False)
    baseline = json.loads(RunDir(tmp_path / "run").baseline.read_text())
    assert "no training" in baseline["model"]
    table, _ = load_table(config)

    def pooled_metrics(seed: int) -> dict:
        train(tiny_config(train={"steps": 0, "seed": seed}), tmp_path / f"untrained-{seed}", progress=False)
        trunk = unprefixed("trunk", weights(tmp_path / f"untrained-{seed}/checkpoints/last.safetensors")[0])
        model = create_model("tiny", head="gap", embedding_dim=0, pretrained=False)
        model.trunk.load_state_dict(trunk)
        # in the run's memory format, as the baseline is embedded: the claim is one computation, so the metrics are
        # compared with ==. In the other format the convolutions sum in another order (oneDNN without AVX-512: the
        # embeddings differ by up to 1.5e-7), which flips near-tied rankings: r_precision 0.5456052 against 0.5455990
        model.set_channels_last(config.train.channels_last)
        return evaluate(model, table, "test", EmbedSettings.from_config(config, "cpu", progress=False),
                        config.eval.recall_at, config.eval.nmi, config.eval.engine)

    assert baseline["metrics"] == pooled_metrics(config.train.seed)
    assert baseline["metrics"] != pooled_metrics(config.train.seed + 1)


def fixed_batch_losses(config, steps: int) -> list[float]:
    """The run's model, objective and optimiser (as the trainer builds them) stepped ``steps`` times on one fixed
    P x K batch (3 classes x 4 random 16-px images); the objective's value before each step."""
    from deepmetric.losses import build_objective
    from deepmetric.training.optim import build_optimizer
    from deepmetric.training.setup import build_model

    torch.manual_seed(0)
    model = build_model(config).train()
    objective = build_objective(config.loss, model.head, num_classes=3)
    optimizer = build_optimizer(model, objective, config.train)
    images = torch.rand(12, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    labels = torch.arange(3).repeat_interleave(4)
    values = []
    for _ in range(steps):
        loss, _ = objective(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        values.append(float(loss.detach()))
    return values


@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_every_loss_trains(tmp_path, loss):
    """Each registered metric loss, minimised by the trainer's optimiser on a fixed batch, falls within a few steps
    (a loss with a wrong sign or a dead gradient would not); and a run trains with it end to end."""
    values = fixed_batch_losses(tiny_config(loss={"name": loss}, train={"lr": 1e-2, "lr_loss": 1e-2}), steps=8)
    assert values[0] > 0 and values[-1] < 0.8 * values[0], values
    train(tiny_config(loss={"name": loss}, train={"steps": 2}), tmp_path / loss, progress=False)
    assert [r["step"] for r in RunDir(tmp_path / loss).read_log() if "loss" in r] == [1, 2]


@pytest.mark.integration
def test_lite0_trains_and_evaluates_on_a_small_glyphs_set(tmp_path):
    """The real offline backbone end to end: a 3-font glyphs set at 32 px, two steps, then the test split."""
    from deepmetric.data import GLYPH_CHARS, build_glyphs
    from deepmetric.data.glyphs import matplotlib_fonts
    from deepmetric.workflows import evaluate_run

    root = build_glyphs(tmp_path / "glyphs", size=32, fonts=matplotlib_fonts(GLYPH_CHARS)[:3], progress=False)
    config = tiny_config(data={"spec": f"glyphs:{root}", "image_size": 32, "flip": False},
                         model={"backbone": "lite0", "pretrained": True, "embedding_dim": 32},
                         train={"steps": 2, "lr": 1e-3, "lr_backbone": 1e-4})
    train(config, tmp_path / "run", progress=False)
    record = evaluate_run(tmp_path / "run", progress=False)
    assert record["test_classes"] == 87 and record["test_images"] == 87 * 3
    assert 0.0 < record["metrics"]["recall@1"] <= 1.0


def test_two_processes_compute_what_one_process_computes_on_the_same_global_batch(tmp_path):
    """gloo on CPU: 2 ranks x 6 images vs 1 process x 12 images, 3 steps, then the weights are compared."""
    from deepmetric.training.launch import launch

    config = tiny_config(train={"steps": 3, "threads": 1}, loss={"name": "margin"},
                         model={"head": "abe", "head_options": {"num_learners": 2}})
    train(config, tmp_path / "one", progress=False)
    launch(config, tmp_path / "two", nproc=2, progress=False)
    a, _, a_state = weights(tmp_path / "one/checkpoints/last.safetensors")
    b, _, b_state = weights(tmp_path / "two/checkpoints/last.safetensors")
    assert a_state["step"] == b_state["step"] == 3
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    log_one = [r["loss"] for r in RunDir(tmp_path / "one").read_log() if "loss" in r]
    log_two = [r["loss"] for r in RunDir(tmp_path / "two").read_log() if "loss" in r]
    assert log_one == pytest.approx(log_two, abs=1e-6)  # the objective saw the same global batch


def test_amp_runs_the_forward_in_bfloat16_and_hands_the_objective_float32(tmp_path):
    from deepmetric import create_model

    model = create_model("tiny", pretrained=False, embedding_dim=16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        output = model(torch.rand(4, 3, 16, 16))
    assert output.embedding.dtype == torch.bfloat16  # autocast did take the forward pass
    full = output.float()
    assert full.embedding.dtype == torch.float32 and all(p.dtype == torch.float32 for p in full.parts)
    full.embedding.sum().backward()
    assert model.head.embed.weight.grad is not None and model.head.embed.weight.dtype == torch.float32

    train(tiny_config(train={"steps": 2, "amp": True}), tmp_path / "amp", progress=False)
    train(tiny_config(train={"steps": 2}), tmp_path / "fp32", progress=False)
    amp_loss, fp32_loss = ([r["loss"] for r in RunDir(tmp_path / run).read_log() if "loss" in r][0]
                           for run in ("amp", "fp32"))
    assert amp_loss != fp32_loss and amp_loss == pytest.approx(fp32_loss, rel=0.05)
    # a loss computed in bfloat16 would have 8 significant bits; this one was computed in float32
    assert torch.tensor(amp_loss).bfloat16().float().item() != pytest.approx(amp_loss, rel=1e-5)
    amp_weights, _, _ = weights(tmp_path / "amp/checkpoints/last.safetensors")
    assert all(w.dtype == torch.float32 for w in amp_weights.values() if w.is_floating_point())


def record_conv_layouts(monkeypatch) -> list[tuple[str, bool]]:
    """Make the trainer's model record, at every convolution it runs, whether its input and its weight are stored
    channels-last (NHWC); tensors whose two layouts coincide (one channel, or 1 x 1 maps) are not recorded."""
    import deepmetric.training.session as session

    seen, build = [], session.build_model

    def layout(kind: str, t: torch.Tensor) -> None:
        nhwc, nchw = t.is_contiguous(memory_format=torch.channels_last), t.is_contiguous()
        if nhwc != nchw:
            seen.append((kind, nhwc))

    def recording_build(config):
        model = build(config)
        for module in model.modules():
            if isinstance(module, torch.nn.Conv2d):
                module.register_forward_pre_hook(lambda m, args: (layout("input", args[0]),
                                                                  layout("weight", m.weight)) and None)
        return model

    monkeypatch.setattr(session, "build_model", recording_build)
    return seen


def test_channels_last_trains_as_the_contiguous_layout_up_to_float_rounding(tmp_path, monkeypatch):
    """``train.channels_last``: the convolutions of the training run see NHWC weights and activations (and NCHW
    when off), and the weights it ends with equal the NCHW run's up to float rounding."""
    seen = record_conv_layouts(monkeypatch)
    train(tiny_config(train={"steps": 3, "channels_last": True}), tmp_path / "nhwc", progress=False)
    nhwc_layouts, seen[:] = list(seen), []
    train(tiny_config(train={"steps": 3, "channels_last": False}), tmp_path / "nchw", progress=False)
    for kind in ("input", "weight"):
        assert sum(k == kind for k, _ in nhwc_layouts) >= 3 and sum(k == kind for k, _ in seen) >= 3, kind
    assert all(nhwc for _, nhwc in nhwc_layouts) and not any(nhwc for _, nhwc in seen)
    nhwc, _, _ = weights(tmp_path / "nhwc/checkpoints/last.safetensors")
    nchw, _, _ = weights(tmp_path / "nchw/checkpoints/last.safetensors")
    assert nhwc.keys() == nchw.keys()
    assert all(torch.allclose(nhwc[k], nchw[k], atol=1e-5) for k in nhwc)


def _embed_on_rank(rank: int, world: int, port: int, out: str) -> None:
    """One rank of the sharded-evaluation test: embed the whole table under torch.distributed, save what it got."""
    from deepmetric import create_model
    from deepmetric.distributed import context_from_env, shutdown
    from deepmetric.evaluation.evaluator import EmbedSettings, embed_table

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    context = context_from_env()
    try:
        torch.manual_seed(0)
        model = create_model("tiny", pretrained=False, embedding_dim=8)
        embeddings = embed_table(model, make_table(n_classes=3, per_class=5),
                                 EmbedSettings(16, batch_size=4, progress=False), context=context)
        np.save(os.path.join(out, f"rank{rank}.npy"), embeddings)
    finally:
        shutdown()


def test_process_groups_take_cpu_tensors_also_where_torch_sees_a_gpu(monkeypatch):
    """NCCL alone refuses CPU tensors (the ranks' stop flag is one): on a GPU machine CPU tensors go to gloo."""
    from deepmetric.distributed import process_group_backend

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert process_group_backend() == "gloo"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("DEEPMETRIC_DIST_BACKEND", raising=False)
    for ranks_here in ("1", "2"):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", ranks_here)
        assert process_group_backend() == "cpu:gloo,cuda:nccl"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")  # more ranks than GPUs: NCCL refuses two ranks on one GPU
    assert process_group_backend() == "gloo"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("DEEPMETRIC_DIST_BACKEND", "gloo")
    assert process_group_backend() == "gloo"


def test_sharded_evaluation_gives_every_rank_all_rows_in_order(tmp_path):
    """15 rows on 2 ranks (8 + 7, so the gather pads one shard): each rank ends with the single-process matrix,
    no row missing, none twice."""
    import torch.multiprocessing as mp

    from deepmetric import create_model
    from deepmetric.distributed import free_port
    from deepmetric.evaluation.evaluator import EmbedSettings, embed_table

    mp.spawn(_embed_on_rank, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    torch.manual_seed(0)
    model = create_model("tiny", pretrained=False, embedding_dim=8)
    single = embed_table(model, make_table(n_classes=3, per_class=5), EmbedSettings(16, batch_size=4, progress=False))
    assert single.shape == (15, 8) and len(np.unique(single.round(5), axis=0)) == 15  # rows tell images apart
    for rank in range(2):
        np.testing.assert_allclose(np.load(tmp_path / f"rank{rank}.npy"), single, atol=1e-6)


def test_a_run_folder_is_held_by_one_training_at_a_time(tmp_path):
    """Two trainings into one --out both ran and interleaved their logs and checkpoints; now the second is refused,
    naming the holder's PID, and the lock goes with the process that held it."""
    from deepmetric.errors import DeepMetricError

    run = RunDir(tmp_path / "run")
    assert run.holder() is None  # no folder yet
    with run.claimed():
        assert run.holder() == str(os.getpid())
        with pytest.raises(DeepMetricError, match=rf"in use by another training \(process {os.getpid()}\)"):
            train(tiny_config(train={"steps": 1}), run.path, progress=False)
    assert run.holder() is None  # released: the folder is free again
    train(tiny_config(train={"steps": 1}), run.path, progress=False)
    assert run.last.is_file()


def test_a_small_data_set_is_refused_once_naming_every_setting_to_change(tmp_path):
    """Issue 53 item 3: a small folder was refused one setting at a time (first the validation share, then the
    batch), and the second message named no key. One message names both keys, each with a value that fits."""
    from deepmetric.errors import DeepMetricError

    # digits: 5 training classes; 40% validate (2), leaving 3 for a batch of 4 classes
    both = tiny_config(train={"steps": 1}, data={"classes_per_batch": 4, "val_fraction": 0.1})
    with pytest.raises(DeepMetricError) as caught:
        train(both, tmp_path / "a", progress=False)
    message = str(caught.value)
    assert "data.val_fraction=0.1 of its 5 training classes leaves 0 validation" in message
    assert "set data.val_fraction=0 (no validation: the last step is kept) or at least 0.4" in message
    assert "data.classes_per_batch=4" not in message  # 5 training classes hold a batch of 4 without validation
    batch = tiny_config(train={"steps": 1}, data={"classes_per_batch": 4, "val_fraction": 0.4})
    with pytest.raises(DeepMetricError, match=r"data.classes_per_batch=4 \(P of a P x K batch\) needs 4 classes with "
                                              r"at least 2 images, 3 are left for training: set "
                                              r"data.classes_per_batch=3 or fewer or a smaller data.val_fraction$"):
        train(batch, tmp_path / "b", progress=False)
    both = tiny_config(train={"steps": 1}, data={"classes_per_batch": 6, "val_fraction": 0.9})
    with pytest.raises(DeepMetricError, match=r"val_fraction=0.9 .*; data.classes_per_batch=6 .* 5 are in the "
                                              r"training split: set data.classes_per_batch=5 or fewer$"):
        train(both, tmp_path / "c", progress=False)
    assert not any(tmp_path.iterdir())


def test_a_failed_start_is_refused_before_any_write_and_a_folder_without_checkpoint_starts_afresh(tmp_path):
    from deepmetric.errors import DeepMetricError

    too_few = tiny_config(train={"steps": 1}, data={"classes_per_batch": 50})  # more classes than the data has
    with pytest.raises(DeepMetricError, match="data.classes_per_batch=50 .P of a P x K batch. needs 50 classes"):
        train(too_few, tmp_path / "runs" / "new", progress=False)
    assert not (tmp_path / "runs").exists()  # the sampler is checked before the first write
    run = RunDir(tmp_path / "stopped")
    run.path.mkdir()
    run.config_path.write_text("train: {steps: 1}\n")  # what a run killed before its first checkpoint leaves
    run.metrics_log.write_text('{"step": 1, "loss": 9.0}\n')
    with pytest.raises(DeepMetricError, match="holds no checkpoint .* start it again without --resume"):
        train(tiny_config(train={"steps": 1}), run.path, resume=True, progress=False)
    train(tiny_config(train={"steps": 2}), run.path, progress=False)
    assert run.last.is_file() and [r["step"] for r in run.read_log() if "loss" in r] == [1, 2]


def test_the_run_folder_is_named_before_the_first_step_and_again_on_resume(tmp_path, caplog):
    """`deepmetric train` without --out picks runs/<time>-…: it is said when training starts, not only at the end."""
    run = tmp_path / "run"
    with caplog.at_level("INFO", logger="deepmetric"):
        train(tiny_config(train={"steps": 1}), run, progress=False)
        train(tiny_config(train={"steps": 2}), run, resume=True, progress=False)
    named = [m for m in caplog.messages if m.startswith("run directory")]
    assert named == [f"run directory {run}", f"run directory {run} (resuming after step 1)"]


def test_temporaries_left_by_a_killed_write_are_removed_on_the_next_start(tmp_path):
    run = RunDir(tmp_path / "run")
    train(tiny_config(train={"steps": 1}), run.path, progress=False)
    leftovers = [run.path / "checkpoints" / ".last.safetensors.a1b2c3.tmp", run.path / "checkpoints" / ".tmpXy12Zq",
                 run.path / ".config.yaml.q9w8e7.tmp"]
    for file in leftovers:
        file.write_bytes(b"\0" * 1024)
    train(tiny_config(train={"steps": 2}), run.path, resume=True, progress=False)
    assert not any(file.exists() for file in leftovers)


def test_the_model_and_its_weights_are_checked_before_any_image_is_read(tmp_path, monkeypatch):
    """A missing weight file was found only after the whole image audit (minutes on SOP); it names its source."""
    import deepmetric.training.session as session
    from deepmetric.errors import CheckpointError

    def no_data(*args, **kwargs):
        raise AssertionError("the data was read before the model was built")

    monkeypatch.setattr(session, "load_table", no_data)
    config = tiny_config(train={"steps": 1}, model={"backbone": "bn-inception", "pretrained": False,
                                                    "weights": str(tmp_path / "bn_inception.pth"), "head": "gap"})
    with pytest.raises(CheckpointError, match="bn_inception.pth .model.weights. do not exist; it is the BN-Inception "
                                              "converted from Caffe that pretrainedmodels"):
        train(config, tmp_path / "run", progress=False)


def test_a_full_disk_during_a_checkpoint_is_one_error_and_the_old_checkpoint_survives(tmp_path, monkeypatch):
    import errno

    import deepmetric.runs.checkpoint as checkpoint
    from deepmetric.errors import WriteError

    run = RunDir(tmp_path / "run")
    train(tiny_config(train={"steps": 1}), run.path, progress=False)
    before = run.last.read_bytes()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "save_safetensors_file", full)
    with pytest.raises(WriteError, match=r"could not write .*last.safetensors: No space left on device; the "
                                         r"previous file is intact"):
        train(tiny_config(train={"steps": 2}), run.path, resume=True, progress=False)
    assert run.last.read_bytes() == before
    assert not [f for f in (run.path / "checkpoints").iterdir() if f.name.endswith(".tmp")]


def test_embed_checks_that_it_can_write_before_it_embeds(tmp_path, monkeypatch):
    import deepmetric.io.files as io_files
    import deepmetric.workflows as workflows
    from deepmetric.errors import WriteError

    run = RunDir(tmp_path / "run")
    train(tiny_config(train={"steps": 1}), run.path, progress=False)
    images = tmp_path / "images"
    images.mkdir()
    from PIL import Image

    Image.new("RGB", (8, 8)).save(images / "a.png")

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(io_files.tempfile, "mkstemp", read_only)
    monkeypatch.setattr(workflows, "embed_table", lambda *a, **k: pytest.fail("embedded before checking the output"))
    with pytest.raises(WriteError, match="cannot write .*out/e.npy: Permission denied"):
        workflows.embed_images(run.path, images, tmp_path / "out" / "e.npy", progress=False)


def test_run_files_planted_as_links_are_refused_and_what_they_point_to_is_untouched(tmp_path):
    """A ``RUN/.lock`` planted as a symbolic link to another file: that file was truncated and overwritten with the
    PID; a planted ``metrics.jsonl`` had the log appended to the file it points to. The files a run writes in place
    (not by an atomic rename) are opened without following links, and a link or a FIFO is refused, naming the
    path."""
    import re

    from deepmetric.errors import DeepMetricError

    victim, elsewhere = tmp_path / "victim.txt", tmp_path / "not-there.txt"
    victim.write_text("precious\n")
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    one_step = tiny_config(train={"steps": 1})
    for target in (victim, elsewhere):
        run.lock_path.symlink_to(target)
        assert run.holder() is None  # a look does not follow it either
        with pytest.raises(DeepMetricError, match=rf"{re.escape(str(run.lock_path))} is a symbolic link"):
            train(one_step, run.path, progress=False)
        run.lock_path.unlink()
    assert victim.read_text() == "precious\n" and not elsewhere.exists()
    os.mkfifo(run.lock_path)
    with pytest.raises(DeepMetricError, match=rf"{re.escape(str(run.lock_path))} is not a regular file"):
        train(one_step, run.path, progress=False)
    run.lock_path.unlink()
    run.metrics_log.symlink_to(victim)  # in a folder that holds no run yet: the first log line is appended to it
    with pytest.raises(DeepMetricError, match=rf"{re.escape(str(run.metrics_log))} is a symbolic link"):
        train(one_step, run.path, progress=False)
    assert victim.read_text() == "precious\n" and not run.config_path.exists()  # refused before any write
    with pytest.raises(DeepMetricError, match="metrics.jsonl is a symbolic link"):  # a link planted during a run
        run.append_log({"step": 1, "loss": 0.5})
    assert victim.read_text() == "precious\n"


def test_a_loss_that_stays_exactly_constant_is_reported_once(tmp_path, monkeypatch, caplog):
    """Margins every pair satisfies (or a NaN that turned every term to 0) trained to the end at exactly 0, with
    nothing said: after ``CONSTANT_LOSS_STEPS`` steps at exactly the same loss, one warning names the value and the
    steps; a loss that moves says nothing."""
    import logging

    from deepmetric.training import trainer

    monkeypatch.setattr(trainer, "CONSTANT_LOSS_STEPS", 3)
    caplog.set_level(logging.WARNING, logger="deepmetric")
    flat = {"name": "pml:ContrastiveLoss", "options": {"pos_margin": 2.0, "neg_margin": 0.0}, "regularizers": {}}
    train(tiny_config(loss=flat, train={"steps": 8, "eval_every": 100}), tmp_path / "flat", progress=False)
    warnings = [r.getMessage() for r in caplog.records if "exactly" in r.getMessage()]
    assert len(warnings) == 1 and "the training loss has been exactly 0 for 3 steps (steps 1-3)" in warnings[0]
    caplog.clear()
    train(tiny_config(train={"steps": 8, "eval_every": 100}), tmp_path / "moving", progress=False)
    assert not [r for r in caplog.records if "exactly" in r.getMessage()]


def test_the_constant_loss_watch_counts_consecutive_equal_values_only():
    from deepmetric.training.monitor import ConstantLoss

    watch = ConstantLoss(steps=3)
    said = [watch.update(step, value) for step, value in enumerate([1.0, 0.5, 0.5, 0.4, 0.0, 0.0, 0.0, 0.0, 0.0], 1)]
    assert said == [None, None, None, None, None, None, (5, 7), None, None]


def test_a_run_being_trained_is_not_evaluated_into_its_folder(tiny_run, tmp_path, capsys):
    """``deepmetric evaluate RUN`` while a study trained RUN wrote ``RUN/metrics.json`` mid-training: had the
    training then stopped, the study would have counted the run as finished at that step and never resumed it.
    Now evaluating a held run is refused, naming the process, and writes nothing; a free run is evaluated."""
    import shutil

    from deepmetric.cli import main
    from deepmetric.errors import RunInUse
    from deepmetric.workflows import evaluate_all_embeddings, evaluate_run

    copy_of_run = tmp_path / "run"
    shutil.copytree(tiny_run, copy_of_run)
    run = RunDir(copy_of_run)
    before = sorted(p.name for p in copy_of_run.iterdir())
    with run.claimed():  # the training process
        for evaluate in (evaluate_run, evaluate_all_embeddings):
            with pytest.raises(RunInUse, match=rf"^{re.escape(str(copy_of_run))} is in use by process "
                                               rf"{os.getpid()} \(training or evaluating it\): evaluate it once"):
                evaluate(copy_of_run, progress=False)
        assert main(["evaluate", str(copy_of_run), "--quiet"]) == 2
        assert "is in use by process" in capsys.readouterr().err
        assert sorted(p.name for p in copy_of_run.iterdir()) == before  # no metrics.json
    assert evaluate_run(copy_of_run, progress=False)["split"] == "test"  # free again
    assert run.test_metrics.is_file()
