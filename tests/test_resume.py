"""Exact resumption, for every head and every regulariser: N steps in one run end with the model, optimiser,
objective and generator state of k steps, a stop, and ``--resume`` to N (tiny backbone, CPU). The sampler, the
heads' data-dependent initialisation (JCF's codewords, DGML's ...), the loss's own parameters (margin's beta),
HORDE's projections, DeML's adversary and MIRAGE's generator, discriminator and noise stream must all come back
from the checkpoint for this to hold."""

from __future__ import annotations

import pytest
import torch

from deepmetric.models.heads import HEADS
from helpers import assert_resumed_exactly, train_straight_and_resumed

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
})


@pytest.mark.parametrize("case", list(CASES))
def test_resuming_ends_where_an_uninterrupted_run_ends(tmp_path, case):
    straight, resumed, interrupted = train_straight_and_resumed(tmp_path, STEPS, STOP, **CASES[case])
    assert_resumed_exactly(straight, resumed, STEPS)
    # the steps after the resume did train: the model moved from the interrupted run's
    end, stop = straight[0], interrupted[0]
    assert interrupted[1]["step"] == STOP
    assert any(not torch.equal(end[k], stop[k]) for k in end if k.startswith("model.head."))
