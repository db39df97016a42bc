"""``train.amp`` (issue 55 item 3): ``fp16`` (float16 autocast with a gradient scaler) beside ``bf16`` and ``false``.

On the CPU: the setting's values and its one message; float16 autocast of the tiny trunk; the objective in float32
(a loss that overflows float16 stays finite); a step with an inf gradient skipped by the scaler, counted and logged,
not mistaken for a NaN loss; the scaler's state in ``last``, so that a resumed fp16 run ends bit for bit where an
uninterrupted one does; ``amp: true`` run folders. The CUDA runs are in ``test_cuda.py``.
"""

from __future__ import annotations

import json
import logging

import pytest
import torch

import deepmetric.training.precision as precision_module
from deepmetric.config import build_config, config_from_dict, save_config
from deepmetric.errors import ConfigError
from deepmetric.losses import LOSSES, REGULARIZERS, build_objective
from deepmetric.losses.pairs import similarity_and_masks
from deepmetric.runs.folder import RunDir
from deepmetric.training import TrainingError, train
from deepmetric.training.precision import Precision
from helpers import assert_resumed_exactly, checkpoint, tiny_config, train_straight_and_resumed

CPU = torch.device("cpu")


def training_log(run):
    return [record for record in RunDir(run).read_log() if "loss" in record]


# ----------------------------------------------------------------------------------------------- the setting
@pytest.mark.parametrize(("given", "read"), [("fp16", "fp16"), ("FP16", "fp16"), ("bf16", "bf16"), (True, "bf16"),
                                             ("true", "bf16"), (False, False), ("false", False), ("no", False)])
def test_train_amp_takes_fp16_bf16_or_false_and_true_is_bf16(tmp_path, given, read):
    config = build_config({"train": {"amp": given}})
    assert config.train.amp == read
    save_config(config, tmp_path / "config.yaml")  # a run folder's config.yaml reads back the same
    assert RunDir(tmp_path).config().train.amp == read == config_from_dict(config.to_dict()).train.amp


@pytest.mark.parametrize("given", ["fp32", "float16", "half", 16, ""])
def test_a_wrong_train_amp_is_one_message_naming_the_key_and_the_choices(given):
    with pytest.raises(ConfigError) as error:
        build_config({"train": {"amp": given}})
    message = str(error.value)
    assert message.startswith("train.amp must be one of fp16, bf16, false (true means bf16), got"), message
    with pytest.raises(ConfigError, match="config key 'train.amp'"):  # not a scalar: refused as any other key's
        build_config({"train": {"amp": [True]}})


def test_fp16_with_an_example_generator_is_refused_naming_both_settings():
    with pytest.raises(ConfigError, match=r"train.amp=fp16 does not combine with generator.name=mirage.*bf16"):
        build_config({"train": {"amp": "fp16"}, "generator": {"name": "mirage"}})
    build_config({"train": {"amp": "bf16"}, "generator": {"name": "mirage"}})


def test_a_run_folder_of_amp_true_loads_and_resumes_as_bf16(tmp_path):
    """Run folders written before fp16 hold ``amp: true``: they load and resume (as bf16)."""
    train(tiny_config(train={"steps": 2, "amp": True, "checkpoint_every": 2}), tmp_path / "run", progress=False)
    path = tmp_path / "run/config.yaml"
    path.write_text(path.read_text().replace("amp: bf16", "amp: true"))  # as such a run wrote it
    assert "amp: true" in path.read_text() and RunDir(tmp_path / "run").config().train.amp == "bf16"
    saved = RunDir(tmp_path / "run").config().to_dict()
    train(build_config(saved, {"train": {"steps": 3}}), tmp_path / "run", resume=True, progress=False)
    assert checkpoint(tmp_path / "run/checkpoints/last.safetensors")[1]["step"] == 3
    assert "amp" not in checkpoint(tmp_path / "run/checkpoints/last.safetensors")[1]  # no scaler under bf16


# ----------------------------------------------------------------------------------------------- float32 objective
class ExpSum(torch.nn.Module):
    """A metric loss written without care for range: ``mean_q log sum_n exp(35 s_qn)``. exp(35) = 1.6e15 is
    finite in float32 and infinite in float16 (whose range ends at 65,504)."""

    def forward(self, embeddings, labels):
        sims, _, neg = similarity_and_masks(embeddings, labels)
        return (torch.exp(35 * sims) * neg).sum(dim=1).log().mean()


@pytest.fixture
def exp_sum():
    LOSSES.register("exp-sum", ExpSum)
    yield "exp-sum"
    LOSSES.unregister("exp-sum")


def test_the_objective_runs_in_float32_where_float16_overflows(exp_sum):
    from deepmetric import create_model

    torch.manual_seed(0)
    model = create_model("tiny", pretrained=False, embedding_dim=16)
    objective = build_objective(tiny_config(loss={"name": exp_sum}).loss, model.head)
    labels = torch.arange(3).repeat_interleave(4)
    precision = Precision("fp16", CPU)
    with precision.autocast():
        output = model(torch.rand(12, 3, 16, 16))
    assert output.embedding.dtype == torch.float16  # the forward pass did run in float16
    # the same loss computed as written, in float16 or under float16 autocast, overflows
    assert not torch.isfinite(objective(output, labels)[0])
    with torch.autocast("cpu", dtype=torch.float16):
        assert not torch.isfinite(objective(output.float(), labels)[0])
        # the trainer's one place for it: the output cast and autocast off, also inside a caller's own autocast
        loss, terms = precision.objective(objective, output, labels)
    assert loss.dtype == torch.float32 and torch.isfinite(loss) and all(torch.isfinite(v) for v in terms.values())
    loss.backward()
    assert model.head.embed.weight.grad is not None


def test_an_fp16_run_with_a_loss_that_overflows_float16_trains_with_finite_losses(tmp_path, exp_sum):
    train(tiny_config(loss={"name": exp_sum}, train={"steps": 3, "amp": "fp16"}), tmp_path / "run", progress=False)
    losses = [record["loss"] for record in training_log(tmp_path / "run")]
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))


# ----------------------------------------------------------------------------------------------- skipped steps
class InfGradient(torch.autograd.Function):
    """Zero forward; an infinite gradient back (what an overflowing float16 backward pass gives)."""

    @staticmethod
    def forward(ctx, x):
        ctx.shape = x.shape
        return x.sum() * 0

    @staticmethod
    def backward(ctx, grad):
        return torch.full(ctx.shape, float("inf"), dtype=grad.dtype, device=grad.device)


class InfAtSteps(torch.nn.Module):
    """A regulariser of value 0 whose gradient to the embedding is infinite at the 0-based steps ``at``."""

    at: tuple[int, ...] = ()

    def __init__(self):
        super().__init__()
        self.step = 0

    def set_step(self, step):
        self.step = step

    def forward(self, output, labels):
        if self.step not in self.at:
            return output.embedding.sum() * 0
        return InfGradient.apply(output.embedding)


def test_a_step_with_an_inf_gradient_is_skipped_counted_and_the_next_one_taken():
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    precision = Precision("fp16", CPU)
    assert not precision.backward_and_step(InfGradient.apply(model(torch.ones(3, 4))), optimizer, 1)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # not stepped
    assert not optimizer.state  # Adam's moments and step count untouched
    assert precision.skipped == precision.in_a_row == 1 and precision.scaler.get_scale() == 2.0**15
    assert precision.log_fields() == {"skipped_steps": 1, "loss_scale": 2.0**15}
    optimizer.zero_grad()
    assert precision.backward_and_step(model(torch.ones(3, 4)).sum(), optimizer, 2)
    assert not torch.equal(before["weight"], model.weight) and precision.skipped == 1 and precision.in_a_row == 0
    assert precision.scaler.get_scale() == 2.0**15  # 2,000 good steps before it grows
    # float32 and bf16 have no scaler: nothing is skipped, nothing is logged
    assert Precision("bf16", CPU).log_fields() == {} and Precision(False, CPU).state() is None


def test_skipped_steps_are_logged_and_do_not_stop_the_run_until_too_many_in_a_row(tmp_path, monkeypatch):
    """Steps 1-3 get an infinite gradient: the scaler skips them (the loss is finite: not the trainer's NaN stop),
    the model after step 3 is the model as built, the log counts them; the run then trains on."""
    REGULARIZERS.register("inf-at-steps", InfAtSteps)
    monkeypatch.setattr(InfAtSteps, "at", (0, 1, 2))
    try:
        config = tiny_config(loss={"regularizers": {"inf-at-steps": {"weight": 1.0}}},
                             train={"steps": 12, "amp": "fp16", "checkpoint_every": 3})
        train(config, tmp_path / "run", progress=False)
        train(tiny_config(train={"steps": 0}), tmp_path / "built", progress=False)  # the model as built
        log = training_log(tmp_path / "run")
        assert [r["skipped_steps"] for r in log][:3] == [1, 2, 3]
        assert [r["loss_scale"] for r in log][:3] == [2.0**15, 2.0**14, 2.0**13]
        assert all(b["skipped_steps"] - a["skipped_steps"] == (b["loss_scale"] < a["loss_scale"])
                   for a, b in zip(log, log[1:], strict=False))  # a skipped step is one whose scale fell
        assert log[-1]["skipped_steps"] < 12  # it did train
        end, state = checkpoint(tmp_path / "run/checkpoints/last.safetensors")
        built, _ = checkpoint(tmp_path / "built/checkpoints/last.safetensors")
        assert state["amp"]["skipped_steps"] == log[-1]["skipped_steps"]
        assert any(not torch.equal(end[k], built[k]) for k in built if k.startswith("model."))

        monkeypatch.setattr(InfAtSteps, "at", tuple(range(100)))  # every step: the gradients overflow at any scale
        monkeypatch.setattr(precision_module, "MAX_SKIPPED_IN_A_ROW", 4)
        with pytest.raises(TrainingError, match=r"step 4: train.amp=fp16 skipped 4 steps in a row .* nothing is "
                                                r"training; use train.amp=bf16 or false \(the last good checkpoint"):
            train(config, tmp_path / "stuck", progress=False)
    finally:
        REGULARIZERS.unregister("inf-at-steps")


def test_an_infinite_loss_under_fp16_says_the_forward_pass_may_have_overflowed(tmp_path, monkeypatch):
    import deepmetric.training.precision as precision

    monkeypatch.setattr(precision.Precision, "objective",
                        lambda self, objective, output, labels, generated=None: (
                            torch.tensor(float("inf")), {"metric": torch.tensor(float("inf"))}))
    with pytest.raises(TrainingError, match=r"step 1: the loss term 'metric' is inf \(train.amp=fp16: the forward "
                                            r"pass may have overflowed float16"):
        train(tiny_config(train={"steps": 2, "amp": "fp16"}), tmp_path / "run", progress=False)


# ----------------------------------------------------------------------------------------------- the log's views
def test_the_scalers_figures_are_tensorboard_scalars_of_their_own_and_no_loss_curve(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from deepmetric.report import figures

    train(tiny_config(train={"steps": 3, "amp": "fp16", "tensorboard": True}), tmp_path / "run", progress=False)
    log = training_log(tmp_path / "run")
    events = EventAccumulator(str(tmp_path / "run/tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"amp/skipped_steps", "amp/loss_scale", "loss/total", "loss/metric"} <= tags
    assert not any(tag.startswith("loss/") and ("scale" in tag or "skipped" in tag) for tag in tags)
    assert [e.value for e in events.Scalars("amp/skipped_steps")] == [r["skipped_steps"] for r in log]
    assert "skipped_steps" in log[0] and figures.loss_terms(log) == ["loss"]  # the report plots no scale


# ----------------------------------------------------------------------------------------------- resume
def test_a_resumed_fp16_run_ends_where_an_uninterrupted_one_ends(tmp_path):
    """10 steps straight against 5 + ``--resume``: the scaler's scale and growth tracker and the count of skipped
    steps come back from ``last``, so the steps after the resume are skipped or taken as in the straight run."""
    straight, resumed, interrupted = train_straight_and_resumed(tmp_path, 10, 5, train={"amp": "fp16"})
    assert_resumed_exactly(straight, resumed, 10)  # the JSON state (the scaler's in it) and every tensor
    assert 0 < interrupted[1]["amp"]["skipped_steps"] <= straight[1]["amp"]["skipped_steps"] < 10
    assert interrupted[1]["amp"]["scaler"]["scale"] < 2.0**16
    stop, end = interrupted[0], straight[0]
    assert any(not torch.equal(end[k], stop[k]) for k in end if k.startswith("model."))  # trained after the stop
    logs = [[json.dumps(r, sort_keys=True) for r in training_log(tmp_path / run)] for run in ("straight", "resumed")]
    strip = [[{k: v for k, v in json.loads(r).items() if k != "images_per_s"} for r in log] for log in logs]
    assert strip[0] == strip[1]  # losses, skipped steps and scales, step by step


def test_fp16_may_start_or_stop_at_a_resume(tmp_path, caplog):
    """``train.amp`` may change between sessions: a run resumed with fp16 starts the scaler afresh, a run of fp16
    resumed with another setting leaves the checkpoint's scaler unused."""
    caplog.set_level(logging.INFO, logger="deepmetric")
    train(tiny_config(train={"steps": 2, "checkpoint_every": 2}), tmp_path / "run", progress=False)
    train(tiny_config(train={"steps": 4, "checkpoint_every": 2, "amp": "fp16"}), tmp_path / "run", resume=True,
          progress=False)
    assert "train.amp=fp16 from this session on: the gradient scaler starts at scale 65536" in caplog.text
    state = checkpoint(tmp_path / "run/checkpoints/last.safetensors")[1]
    assert state["amp"]["skipped_steps"] == training_log(tmp_path / "run")[-1]["skipped_steps"]
    train(tiny_config(train={"steps": 6, "checkpoint_every": 2, "amp": "bf16"}), tmp_path / "run", resume=True,
          progress=False)
    assert "the checkpoint's fp16 gradient scaler is not used: this session trains with train.amp=bf16" in caplog.text
    assert "amp" not in checkpoint(tmp_path / "run/checkpoints/last.safetensors")[1]
    assert "skipped_steps" not in training_log(tmp_path / "run")[-1]


def test_two_fp16_processes_skip_the_steps_one_process_skips(tmp_path):
    """Under torch.distributed every rank's scaler sees the summed gradients, so the ranks skip the same steps (a
    rank stepping alone would leave the replicas apart, and rank 0's losses, computed on the gathered batch, with
    them) and the run is the one-process run's, up to float16 rounding: the weights' difference is a small fraction
    of what training moved them (Adam turns the rounding noise of near-zero gradients into steps of lr)."""
    from deepmetric.training.launch import launch

    config = tiny_config(train={"steps": 10, "threads": 1, "amp": "fp16"}, loss={"name": "margin"})
    train(config, tmp_path / "one", progress=False)
    launch(config, tmp_path / "two", nproc=2, progress=False)
    train(tiny_config(train={"steps": 0}, loss={"name": "margin"}), tmp_path / "built", progress=False)
    (a, a_state), (b, b_state), (built, _) = (checkpoint(tmp_path / run / "checkpoints/last.safetensors")
                                              for run in ("one", "two", "built"))
    assert a_state["amp"] == b_state["amp"] and 0 < a_state["amp"]["skipped_steps"] < 10
    one, two = training_log(tmp_path / "one"), training_log(tmp_path / "two")
    assert [r["skipped_steps"] for r in one] == [r["skipped_steps"] for r in two]
    assert [r["loss"] for r in two] == pytest.approx([r["loss"] for r in one], rel=1e-2)
    for key in (k for k in a if k.startswith("model.") and a[k].is_floating_point()):
        assert (a[key] - b[key]).norm() <= 0.05 * (a[key] - built[key]).norm(), key
