"""Exact resumption, for every head and every regulariser: N steps in one run end with the model, optimiser,
objective and generator state of k steps, a stop, and ``--resume`` to N (tiny backbone, CPU). The sampler, the
heads' data-dependent initialisation (JCF's codewords, DGML's ...), the loss's own parameters (margin's beta),
HORDE's projections, DeML's adversary, MIRAGE's generator, discriminator and noise stream, and the cross-batch
memory must all come back from the checkpoint for this to hold."""

from __future__ import annotations

import json

import pytest
import torch

from deepmetric.models.heads import HEADS
from deepmetric.training.selection import selection_key
from helpers import assert_resumed_exactly, checkpoint, train_straight_and_resumed

STEPS, STOP = 4, 2

# every registered head with its default options and default regularisers (ABE's divergence, DGML's diversity,
# DeML's adversary, activation decay and learner row norm); then the regularisers and generators not tied to a head
CASES = {name: {"model": {"head": name}} for name in HEADS}
CASES["jcf"]["model"]["head_options"] = {"init_images": 24}  # k-means codewords from 24 training images
DEML = {"head": "deml", "head_options": {"num_scales": 2, "num_branches": 2}}  # 4 learners of 4 dimensions
CASES["deml"]["model"] = DEML  # (its default 9 learners of 16 / 9 -> 1 dimension: l2 of a scalar is its sign)
CASES.update({
    "horde": {"loss": {"regularizers": {"horde": {"weight": 1.0, "orders": 3, "dim": 32}}}},
    "deml-hinge": {"model": DEML, "loss": {"regularizers": {"deml-hinge": {"weight": 0.2}}}},
    "margin-per-class": {"loss": {"name": "margin", "options": {"per_class": True}}},
    "mirage": {"generator": {"name": "mirage", "options": {"diagnostic_images": 0}}},
    "memory": {"loss": {"memory": {"size": 30, "warmup_steps": 1}}},  # XBM: its rows and counters (test_memory.py)
})


@pytest.mark.parametrize("case", list(CASES))
def test_resuming_ends_where_an_uninterrupted_run_ends(tmp_path, case):
    straight, resumed, interrupted = train_straight_and_resumed(tmp_path, STEPS, STOP, **CASES[case])
    assert_resumed_exactly(straight, resumed, STEPS)
    # the steps after the resume did train: the model moved from the interrupted run's
    end, stop = straight[0], interrupted[0]
    assert interrupted[1]["step"] == STOP
    assert any(not torch.equal(end[k], stop[k]) for k in end if k.startswith("model.head."))


def test_a_resumed_run_keeps_its_best_validation_score(tmp_path):
    """With a validation split, the resumed run's ``best`` (its step, score and tie-break key in ``last``'s state,
    and the ``best`` checkpoint itself) is the uninterrupted run's. The validation after the resume is worse than
    the one before it: a resumed run that forgot its best score would let that worse model overwrite ``best``."""
    straight, resumed, interrupted = train_straight_and_resumed(tmp_path, STEPS, STOP, data={"val_fraction": 0.4},
                                                                train={"eval_every": STOP})
    assert_resumed_exactly(straight, resumed, STEPS)  # the whole state, "best" included
    logs = {}
    for run in ("straight", "resumed"):
        lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        logs[run] = [record for record in map(json.loads, lines) if record.get("split") == "val"]
    assert logs["straight"] == logs["resumed"] and [r["step"] for r in logs["straight"]] == [STOP, STEPS]
    # the case this test is about: the later validation does not beat the earlier one (the run is deterministic)
    assert selection_key(logs["straight"][1]) <= selection_key(logs["straight"][0])
    assert interrupted[1]["best"]["step"] == straight[1]["best"]["step"] == STOP
    assert straight[1]["best"]["score"] == logs["straight"][0]["recall@1"]
    (a, a_state), (b, b_state) = (checkpoint(tmp_path / run / "checkpoints/best.safetensors")
                                  for run in ("straight", "resumed"))
    assert a_state == b_state and a_state["step"] == STOP
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
