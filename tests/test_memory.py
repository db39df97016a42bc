"""The cross-batch memory (XBM, Wang et al. 2020; ``deepmetric.losses.memory``): every loss against a slow loop over
query x reference pairs, the FIFO queue, the warm-up, no self-pairs, one memory per learner, the config's refusals,
distributed training (two processes hold what one holds) and exact resumption (the memory is in ``last``)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from deepmetric.config import LossConfig, build_config
from deepmetric.errors import CheckpointError, ConfigError
from deepmetric.losses import (
    LOSSES,
    BinomialDevianceLoss,
    ContrastiveLoss,
    CrossBatchMemory,
    EuclideanContrastiveLoss,
    MarginLoss,
    MultiSimilarityLoss,
    Objective,
    TripletLoss,
    build_objective,
    create_objective,
)
from deepmetric.models import create_model
from deepmetric.models.heads import HeadOutput
from deepmetric.runs.checkpoint import load_checkpoint
from deepmetric.runs.folder import RunDir
from deepmetric.training import train
from helpers import assert_resumed_exactly, tiny_config, train_straight_and_resumed


def unit_rows(n, dim=8, seed=0, dtype=torch.float64):
    return F.normalize(torch.randn(n, dim, generator=torch.Generator().manual_seed(seed), dtype=dtype), dim=1)


def queries_and_memory(seed=0, dim=8):
    """A batch of 4 classes x 3 and a memory of 20 rows whose classes overlap the batch's (0-3) and do not (4-6)."""
    x, y = unit_rows(12, dim, seed), torch.arange(4).repeat_interleave(3)
    r = unit_rows(20, dim, seed + 100)
    ry = torch.randint(0, 7, (20,), generator=torch.Generator().manual_seed(seed + 200))
    return x, y, r, ry


# --- slow explicit loops over every (query, reference) pair -------------------------------------------------------

def cross_pairs(x, y, r, ry):
    for i in range(len(x)):
        for j in range(len(r)):
            yield i, j, float(x[i] @ r[j]), bool(y[i] == ry[j])


def mean(values):
    return sum(values) / len(values) if values else 0.0


def slow_contrastive(x, y, r, ry, margin=0.5):
    pos = [(1 - s) ** 2 for _, _, s, same in cross_pairs(x, y, r, ry) if same]
    neg = [s - margin for _, _, s, same in cross_pairs(x, y, r, ry) if not same and s - margin > 0]
    return 0.5 * mean(pos) + 0.5 * mean(neg)


def slow_binomial(x, y, r, ry, alpha=2.0, beta=0.5, c=25.0):
    per_anchor = []
    for i in range(len(x)):
        pos, neg = [], []
        for j in range(len(r)):
            s = float(x[i] @ r[j])
            if y[i] == ry[j]:
                pos.append(math.log1p(math.exp(-alpha * (s - beta))))
            else:
                neg.append(math.log1p(math.exp(alpha * c * (s - beta))))
        per_anchor.append(mean(pos) + mean(neg))
    return mean(per_anchor)


def slow_triplet(x, y, r, ry, margin=0.1):
    losses = []
    for q in range(len(x)):
        for p in range(len(r)):
            if ry[p] != y[q]:
                continue
            for n in range(len(r)):
                value = float(x[q] @ r[n] - x[q] @ r[p] + margin)
                if ry[n] != y[q] and value > 0:
                    losses.append(value)
    return mean(losses)


def slow_multi_similarity(x, y, r, ry, alpha=2.0, beta=50.0, base=0.5, mining=True, eps=0.1):
    total = []
    for i in range(len(x)):
        pos = [float(x[i] @ r[j]) for j in range(len(r)) if ry[j] == y[i]]
        neg = [float(x[i] @ r[j]) for j in range(len(r)) if ry[j] != y[i]]
        if mining:
            min_pos, max_neg = min(pos, default=math.inf), max(neg, default=-math.inf)
            neg, pos = [s for s in neg if s + eps > min_pos], [s for s in pos if s - eps < max_neg]
        total.append(math.log1p(sum(math.exp(-alpha * (s - base)) for s in pos)) / alpha
                     + math.log1p(sum(math.exp(beta * (s - base)) for s in neg)) / beta)
    return mean(total)


def slow_margin(x, y, r, ry, margin=0.2, beta=1.2):
    active, total = 0, 0.0
    for _, _, s, same in cross_pairs(x, y, r, ry):
        d = math.sqrt(max(2 - 2 * s, 1e-12))
        value = max(0.0, margin + d - beta) if same else max(0.0, margin + beta - d)
        total, active = total + value, active + (value > 0)
    return total / max(active, 1)


def slow_euclidean_contrastive(x, y, r, ry, margin=1.0):
    values = []
    for _, _, s, same in cross_pairs(x, y, r, ry):
        d2 = max(2 - 2 * s, 0.0)
        values.append(d2 if same else max(0.0, margin - math.sqrt(max(d2, 1e-12))))
    return mean(values)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_loss_against_a_reference_set_matches_a_slow_loop_over_query_reference_pairs(seed):
    """The memory term of each built-in loss: every (query, memory row) pair, no pair left out (the memory never
    holds the queries), reduced as the loss reduces the batch's pairs."""
    x, y, r, ry = queries_and_memory(seed)
    assert float(ContrastiveLoss()(x, y, r, ry)) == pytest.approx(slow_contrastive(x, y, r, ry), abs=1e-10)
    assert float(BinomialDevianceLoss()(x, y, r, ry)) == pytest.approx(slow_binomial(x, y, r, ry), abs=1e-10)
    assert float(TripletLoss()(x, y, r, ry)) == pytest.approx(slow_triplet(x, y, r, ry), abs=1e-10)
    assert float(MultiSimilarityLoss()(x, y, r, ry)) == pytest.approx(slow_multi_similarity(x, y, r, ry), abs=1e-10)
    assert float(MultiSimilarityLoss(mining=False)(x, y, r, ry)) == pytest.approx(
        slow_multi_similarity(x, y, r, ry, mining=False), abs=1e-10)
    margin = MarginLoss().double()
    beta = float(margin.beta.detach())
    assert float(margin(x, y, r, ry).detach()) == pytest.approx(slow_margin(x, y, r, ry, beta=beta), abs=1e-10)
    assert float(EuclideanContrastiveLoss()(x, y, r, ry)) == pytest.approx(
        slow_euclidean_contrastive(x, y, r, ry), abs=1e-10)
    off_sphere = EuclideanContrastiveLoss(unit=False)
    scaled_x, scaled_r = 1.5 * x, 0.7 * r  # raw Euclidean distances between the two sets
    expected = mean([float((scaled_x[i] - scaled_r[j]).pow(2).sum()) if y[i] == ry[j] else
                     max(0.0, 1.0 - float((scaled_x[i] - scaled_r[j]).norm())) for i in range(12) for j in range(20)])
    assert float(off_sphere(scaled_x, y, scaled_r, ry)) == pytest.approx(expected, abs=1e-10)


def test_the_batch_as_its_own_reference_counts_the_self_pairs_the_square_case_leaves_out():
    """One pair loop, two rules: the square call (no reference) is the loop over the batch without its self-pairs
    (test_losses.py's slow loops); the batch passed as a reference set is the loop with them (s = 1 with itself)."""
    x, y = unit_rows(12), torch.arange(4).repeat_interleave(3)
    assert float(ContrastiveLoss()(x, y, x, y)) == pytest.approx(slow_contrastive(x, y, x, y), abs=1e-10)
    assert float(BinomialDevianceLoss()(x, y, x, y)) == pytest.approx(slow_binomial(x, y, x, y), abs=1e-10)
    without_self = [(i, j) for i in range(12) for j in range(12) if i != j]
    pos = [(1 - float(x[i] @ x[j])) ** 2 for i, j in without_self if y[i] == y[j]]
    neg = [float(x[i] @ x[j]) - 0.5 for i, j in without_self if y[i] != y[j] and float(x[i] @ x[j]) > 0.5]
    assert float(ContrastiveLoss()(x, y)) == pytest.approx(0.5 * mean(pos) + 0.5 * mean(neg), abs=1e-10)
    assert float(ContrastiveLoss()(x, y)) != pytest.approx(float(ContrastiveLoss()(x, y, x, y)), abs=1e-6)


def test_the_triplet_loss_against_a_large_memory_is_computed_by_groups_of_anchors_with_the_same_value(monkeypatch):
    import deepmetric.losses.triplet as triplet

    x, y, r, ry = queries_and_memory(3)
    x.requires_grad_(True)
    whole = TripletLoss()(x, y, r, ry)
    (whole_grad,) = torch.autograd.grad(whole, x)
    monkeypatch.setattr(triplet, "TRIPLETS_AT_ONCE", 2 * 20 * 20)  # two anchors at a time
    grouped = TripletLoss()(x, y, r, ry)
    (grouped_grad,) = torch.autograd.grad(grouped, x)
    assert float(grouped.detach()) == pytest.approx(float(whole.detach()), abs=1e-12)
    assert torch.allclose(grouped_grad, whole_grad, atol=1e-12)


def test_a_reference_set_needs_its_labels_and_the_queries_width():
    x, y, r, ry = queries_and_memory()
    with pytest.raises(ValueError, match="give both or neither"):
        ContrastiveLoss()(x, y, r)
    with pytest.raises(ValueError, match=r"expected \(R, 8\)"):
        ContrastiveLoss()(x, y, r[:, :4], ry)


# --- the queue ------------------------------------------------------------------------------------------------------

def test_the_memory_is_a_fifo_queue_of_its_declared_size():
    memory = CrossBatchMemory(size=7, warmup_steps=0)
    rows = torch.arange(30, dtype=torch.float32)[:, None].repeat(1, 2)  # row k holds k
    labels = torch.arange(30)
    memory.enqueue(rows[:3], labels[:3])
    assert memory.count == 3 and memory.position == 3 and memory.ordered()[1].tolist() == [0, 1, 2]
    memory.enqueue(rows[3:6], labels[3:6])
    memory.enqueue(rows[6:9], labels[6:9])  # crosses the end of the queue: wraps to its start
    assert memory.count == 7 and memory.position == 2
    assert memory.ordered()[1].tolist() == [2, 3, 4, 5, 6, 7, 8]
    assert memory.ordered()[0][:, 0].tolist() == [2, 3, 4, 5, 6, 7, 8] and memory.rows.shape == (7, 2)
    assert sorted(memory.stored()[1].tolist()) == [2, 3, 4, 5, 6, 7, 8]
    memory.enqueue(rows[9:19], labels[9:19])  # more rows than the memory holds: the newest 7
    assert memory.ordered()[1].tolist() == list(range(12, 19)) and memory.count == 7
    stored, _ = memory.stored()
    stored += 100  # a copy: the loss may keep it for its backward pass while the memory moves on
    assert memory.ordered()[1].tolist() == list(range(12, 19)) and float(memory.rows.max()) < 100


def test_the_memory_holds_detached_rows():
    memory = CrossBatchMemory(size=4, warmup_steps=0)
    rows = torch.randn(2, 3, requires_grad=True)
    memory.enqueue(rows * 2, torch.tensor([0, 1]))
    assert not memory.rows.requires_grad and not memory.stored()[0].requires_grad


class RecordingLoss(torch.nn.Module):
    """Contrastive loss that records the reference set of each call."""

    def __init__(self):
        super().__init__()
        self.loss, self.references = ContrastiveLoss(), []

    def forward(self, embeddings, labels, ref_emb=None, ref_labels=None):
        if ref_emb is not None:
            self.references.append((ref_emb.clone(), ref_labels.clone()))
        return self.loss(embeddings, labels, ref_emb, ref_labels)


def batches(steps, n=12, dim=8):
    labels = torch.arange(n // 3).repeat_interleave(3)
    return [(HeadOutput(embedding=unit_rows(n, dim, seed, torch.float32), parts=[]), labels + step)
            for step, seed in enumerate(range(steps))]


def test_no_memory_term_before_the_warm_up_then_the_batch_against_the_earlier_batches_only():
    """Warm-up W = 3: steps 0-2 neither use nor fill the memory; step 3 starts it (empty: term 0), so a query never
    meets its own copy; from step 4 the term is the loss of the batch against the batches since step 3, and the total
    is the batch term plus weight x that."""
    loss = RecordingLoss()
    objective = Objective(loss, memory=CrossBatchMemory(size=24, warmup_steps=3, weight=0.5))
    data = batches(7)
    for step, (output, labels) in enumerate(data):
        objective.set_step(step)
        total, terms = objective(output, labels)
        assert set(terms) == {"metric", "memory"}
        held = [data[k] for k in range(3, step)][-2:]  # a memory of 24 rows holds the last two batches
        if step <= 3:
            assert float(terms["memory"]) == 0.0 and len(loss.references) == 0
            assert objective.memory.count == (12 if step == 3 else 0)
            continue
        reference = torch.cat([o.embedding for o, _ in held])
        reference_labels = torch.cat([lab for _, lab in held])
        expected = slow_contrastive(output.embedding.double(), labels, reference.double(), reference_labels)
        assert float(terms["memory"]) == pytest.approx(expected, abs=1e-6)
        assert float(total) == pytest.approx(float(terms["metric"]) + 0.5 * float(terms["memory"]), abs=1e-6)
        got, got_labels = loss.references[-1]
        # the rows paired with the queries are the earlier batches' (as a set: slot order), never this batch's
        assert sorted(got_labels.tolist()) == sorted(reference_labels.tolist())
        assert not any(torch.equal(q, m) for q in output.embedding for m in got)
    assert objective.memory.count == 24


def test_the_memory_term_has_gradient_for_the_queries_only():
    objective = Objective(ContrastiveLoss(), memory=CrossBatchMemory(size=24, warmup_steps=0))
    (first, labels), (second, _) = batches(2)
    objective(first, labels)
    queries = second.embedding.clone().requires_grad_(True)
    _, terms = objective(HeadOutput(embedding=queries, parts=[]), labels)
    terms["memory"].backward()
    assert queries.grad is not None and queries.grad.abs().sum() > 0
    assert not objective.memory.rows.requires_grad


def test_an_objective_in_evaluation_mode_reads_the_memory_without_filling_it():
    objective = Objective(ContrastiveLoss(), memory=CrossBatchMemory(size=24, warmup_steps=0))
    (first, labels), (second, _) = batches(2)
    objective(first, labels)
    objective.eval()
    _, terms = objective(second, labels)
    assert objective.memory.count == 12 and float(terms["memory"]) > 0


def parts_output(n=12, widths=(4, 4, 4), seed=0):
    parts = [unit_rows(n, w, seed + k, torch.float32) for k, w in enumerate(widths)]
    return HeadOutput(embedding=F.normalize(torch.cat(parts, dim=1), dim=1), parts=parts)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_with_one_loss_per_learner_each_learner_meets_its_own_part_of_the_memory(reduction):
    """``loss.on: parts`` (ABE, DeML): the memory holds every learner's part side by side; learner p's loss pairs its
    part of the batch with its part of the memory, reduced over learners as the batch term is."""
    losses = [BinomialDevianceLoss(), BinomialDevianceLoss(), BinomialDevianceLoss()]
    objective = Objective(losses, on="parts", parts_reduction=reduction,
                          memory=CrossBatchMemory(size=24, warmup_steps=0))
    labels = torch.arange(4).repeat_interleave(3)
    first, second = parts_output(seed=0), parts_output(seed=10)
    objective(first, labels)
    assert objective.memory.rows.shape == (24, 12)
    _, terms = objective(second, labels + 2)
    per_part = [slow_binomial(q.double(), labels + 2, m.double(), labels)
                for q, m in zip(second.parts, first.parts, strict=True)]
    expected = sum(per_part) / (3 if reduction == "mean" else 1)
    assert float(terms["memory"]) == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("head, options, on, width", [
    ("abe", {"num_learners": 2}, "parts", 16),
    ("deml", {"num_scales": 2, "num_branches": 2}, "parts", 16),
    ("abe", {"num_learners": 2}, "embedding", 16),
    ("gap", {}, None, 16),
])
def test_every_head_fills_the_memory_with_what_its_metric_losses_see(head, options, on, width):
    model = create_model("tiny", head=head, embedding_dim=16, pretrained=False, **options)
    objective = create_objective(model.head, "contrastive", num_classes=4, on=on, memory={"size": 24,
                                                                                          "warmup_steps": 0})
    images, labels = torch.rand(8, 3, 16, 16), torch.arange(4).repeat_interleave(2)
    for step in range(3):
        objective.set_step(step)
        loss, terms = objective(model(images), labels)
        loss.backward()
    assert objective.memory.count == 24 and objective.memory.rows.shape[1] == width
    assert float(terms["memory"].detach()) > 0 and torch.isfinite(loss)


# --- configuration ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("memory, steps, message", [
    ({"size": -1}, 50, "loss.memory.size must be at least 0"),
    ({"size": 64, "weight": -1}, 50, "loss.memory.weight must be at least 0"),
    ({"size": 64, "warmup_steps": 0, "weight": "x"}, 50, "'loss.memory.weight': expected a number"),
    ({"size": 64, "sise": 3}, 50, "unknown config key 'loss.memory.sise' .*did you mean 'loss.memory.size'"),
    ({"size": 10, "warmup_steps": 0}, 50, r"at least one batch \(data.classes_per_batch x data.samples_per_class "
                                          r"= 12\), got 10"),
    ({"size": 64}, 50, "loss.memory.warmup_steps=1000 is not below train.steps=50"),
])
def test_bad_memory_settings_are_refused_naming_the_key(memory, steps, message):
    with pytest.raises(ConfigError, match=message):
        tiny_config(loss={"memory": memory}, train={"steps": steps})


def test_the_memory_is_off_by_default_and_the_objective_unchanged():
    config = build_config({})
    assert (config.loss.memory.size, config.loss.memory.warmup_steps, config.loss.memory.weight) == (0, 1000, 1.0)
    objective = build_objective(config.loss, create_model("tiny", embedding_dim=8, pretrained=False).head)
    assert objective.memory is None and objective.checkpoint_state() == ({}, None)
    output, labels = batches(1)[0]
    assert set(objective(output, labels)[1]) == {"metric"}


def test_proxy_and_classification_losses_are_refused_with_a_memory():
    with pytest.raises(ConfigError, match="'pml:ProxyAnchorLoss' is not one .*CrossBatchMemory supports"):
        tiny_config(loss={"name": "pml:ProxyAnchorLoss", "memory": {"size": 64, "warmup_steps": 0}})
    with pytest.raises(ConfigError, match="'pml:ArcFaceLoss' is not one"):
        create_objective(create_model("tiny", embedding_dim=8, pretrained=False).head, "pml:ArcFaceLoss",
                         num_classes=4, memory={"size": 64})
    tiny_config(loss={"name": "pml:ContrastiveLoss", "memory": {"size": 64, "warmup_steps": 0}})  # a pair loss


def test_a_loss_of_ones_own_without_a_reference_set_is_refused_with_a_memory():
    class SquareOnly(torch.nn.Module):
        def forward(self, embeddings, labels):
            return ContrastiveLoss()(embeddings, labels)

    LOSSES.register("square-only", SquareOnly)
    try:
        head = create_model("tiny", embedding_dim=8, pretrained=False).head
        create_objective(head, "square-only", num_classes=4)  # fine without a memory
        with pytest.raises(ConfigError, match="loss 'square-only' fails on a trial batch: TypeError"):
            create_objective(head, "square-only", num_classes=4, memory={"size": 64})
    finally:
        LOSSES.unregister("square-only")


@pytest.mark.parametrize("miner", [None, "pml:MultiSimilarityMiner"])
def test_a_pml_pair_loss_pairs_the_batch_with_the_memory_through_pmls_reference_arguments(miner):
    from pytorch_metric_learning import losses as pml_losses
    from pytorch_metric_learning import miners as pml_miners

    x, y, r, ry = queries_and_memory(dim=8)
    x, r = x.float(), r.float()
    objective = build_objective(LossConfig(name="pml:MultiSimilarityLoss", miner=miner, regularizers={},
                                           memory={"size": 20, "warmup_steps": 0}),
                                create_model("tiny", embedding_dim=8, pretrained=False).head, num_classes=7)
    objective.memory.enqueue(r, ry)
    _, terms = objective(HeadOutput(embedding=x, parts=[]), y)
    pml_loss = pml_losses.MultiSimilarityLoss()
    indices = pml_miners.MultiSimilarityMiner()(x, y, r, ry) if miner else None
    assert float(terms["memory"]) == pytest.approx(float(pml_loss(x, y, indices, r, ry)), abs=1e-6)


# --- the trainer: log, distributed training, resumption ---------------------------------------------------------

MEMORY = {"size": 30, "warmup_steps": 1}  # batches of 12: full after 3 steps of memory, then wraps (position 6)


def test_the_run_logs_the_memory_term_from_the_end_of_the_warm_up(tmp_path):
    train(tiny_config(loss={"memory": MEMORY}, train={"steps": 4}), tmp_path / "run", progress=False)
    log = [r for r in RunDir(tmp_path / "run").read_log() if "loss" in r]
    assert [r["memory"] for r in log[:2]] == [0.0, 0.0] and all(r["memory"] > 0 for r in log[2:])
    tensors, state = load_checkpoint(tmp_path / "run/checkpoints/last.safetensors")
    assert state["memory"] == {"size": 30, "count": 30, "position": 6}
    assert tensors["memory.rows"].shape == (30, 16) and tensors["memory.labels"].shape == (30,)
    best = tmp_path / "run/checkpoints/best.safetensors"
    if best.is_file():  # evaluation needs no memory
        assert not any(k.startswith("memory.") for k in load_checkpoint(best)[0])


def test_a_resumed_run_goes_on_with_the_memory_of_an_uninterrupted_one(tmp_path):
    """4 steps straight, or 2 steps (the memory holds one batch) and --resume, with one memory part per learner
    (ABE; the GAP head's case is in test_resume.py): the memory's rows, labels and counters are in ``last`` and the two
    runs end bit-identical, the memory included."""
    straight, resumed, interrupted = train_straight_and_resumed(
        tmp_path, 4, 2, loss={"name": "contrastive", "memory": MEMORY},
        model={"head": "abe", "head_options": {"num_learners": 2}})
    assert interrupted[1]["memory"] == {"size": 30, "count": 12, "position": 12}
    assert_resumed_exactly(straight, resumed, 4)
    assert straight[1]["memory"] == {"size": 30, "count": 30, "position": 6}
    assert torch.equal(straight[0]["memory.rows"], resumed[0]["memory.rows"])


def test_without_its_memory_a_resumed_run_would_not_end_where_the_uninterrupted_one_ends(tmp_path, monkeypatch):
    """The resume test above is meaningful: a resume that forgets the memory (it starts empty) ends elsewhere."""
    monkeypatch.setattr(Objective, "load_checkpoint_state", lambda self, tensors, state: None)
    straight, resumed, _ = train_straight_and_resumed(tmp_path, 4, 2, loss={"memory": MEMORY})
    with pytest.raises(AssertionError):
        assert_resumed_exactly(straight, resumed, 4)


def test_a_checkpoint_without_the_memory_is_refused_by_name():
    memory = CrossBatchMemory(size=30, warmup_steps=0)
    with pytest.raises(CheckpointError, match="holds none for a cross-batch memory of size 30"):
        memory.load_checkpoint_state({}, None)
    with pytest.raises(CheckpointError, match="holds one of size 20"):
        memory.load_checkpoint_state({}, {"size": 20, "count": 0, "position": 0})
    with pytest.raises(CheckpointError, match="do not hold its 12 rows"):
        memory.load_checkpoint_state({}, {"size": 30, "count": 12, "position": 12})


def test_a_memory_of_another_width_than_the_losses_see_is_named():
    """A checkpoint's memory is loaded as saved; rows of another width (a file edited by hand) are refused by name."""
    objective = Objective(ContrastiveLoss(), memory=CrossBatchMemory(size=30, warmup_steps=0))
    objective.load_checkpoint_state({"rows": torch.zeros(12, 5), "labels": torch.zeros(12, dtype=torch.long)},
                                    {"size": 30, "count": 12, "position": 12})
    output, labels = batches(1)[0]
    with pytest.raises(ValueError, match="rows of width 5; the metric losses see 8"):
        objective(output, labels)


def test_two_processes_hold_and_use_the_memory_one_process_holds(tmp_path):
    """gloo on CPU, 2 ranks x 6 images against 1 process x 12: every rank enqueues the gathered global batch, so the
    memory in ``last`` (rank 0's), the logged memory term and the weights are one process's. A rank holding only its
    own rows would compute another memory term, and its gradients would move the weights elsewhere."""
    from deepmetric.training.launch import launch

    config = tiny_config(train={"steps": 4, "threads": 1}, loss={"name": "contrastive", "memory": MEMORY},
                         model={"head": "abe", "head_options": {"num_learners": 2}})
    train(config, tmp_path / "one", progress=False)
    launch(config, tmp_path / "two", nproc=2, progress=False)
    one, one_state = load_checkpoint(tmp_path / "one/checkpoints/last.safetensors")
    two, two_state = load_checkpoint(tmp_path / "two/checkpoints/last.safetensors")
    assert one_state["memory"] == two_state["memory"] == {"size": 30, "count": 30, "position": 6}
    assert torch.equal(one["memory.labels"], two["memory.labels"])
    assert torch.allclose(one["memory.rows"], two["memory.rows"], atol=1e-6)
    assert all(torch.allclose(one[k], two[k], atol=1e-6) for k in one if k.startswith("model."))
    logs = [[r["memory"] for r in RunDir(tmp_path / run).read_log() if "loss" in r] for run in ("one", "two")]
    assert logs[0] == pytest.approx(logs[1], abs=1e-6) and logs[0][-1] > 0
