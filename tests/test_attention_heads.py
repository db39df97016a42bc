"""DIABLO, ABE and M-heads: parameter counts, selection blocks, merges, divergence loss, gradients."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from deepmetric import create_model
from deepmetric.errors import ConfigError
from deepmetric.losses import ABEDivergenceLoss, EuclideanContrastiveLoss
from deepmetric.models.heads import HeadOutput
from deepmetric.models.heads.attention import DimensionWiseSelection, FeatureWiseSelection

# ABE Table 1 (x 10^7, printed to two decimals) and our exact counts of the original GoogLeNet (5x5
# branches, conv biases, no BatchNorm) + 512-d, derived on paper (README, "ABE"): the paper gives no integers
TABLE_1 = {("gap", 1): (0.65, 6_497_840), ("abe", 1): (0.97, 9_706_848), ("abe", 2): (0.98, 9_844_544),
           ("abe", 4): (1.05, 10_513_152), ("abe", 8): (1.20, 12_046_976), ("mheads", 2): (1.18, 11_794_544),
           ("mheads", 8): (4.36, 43_574_768)}


@pytest.mark.parametrize(("head", "m"), list(TABLE_1))
def test_parameter_counts_match_abe_table_1(head, m):
    options = {"abe": {"num_learners": m}, "mheads": {"num_heads": m}}.get(head, {})
    model = create_model("inception-v1", head=head, pretrained=False, freeze_bn=False, **options)
    count = sum(p.numel() for p in model.parameters())
    paper, exact = TABLE_1[(head, m)]
    assert round(count / 1e7, 2) == paper  # the published figure, to the precision it is printed
    assert count == exact  # our derivation, as a regression value


def test_diablo_phi_is_a_separate_copy_of_inception_4a_to_4e():
    model = create_model("inception-v1", head="diablo", pretrained=False, num_entries=8)
    phi = sum(p.numel() for p in model.head.phi.parameters())
    # 2,809,168 = inception 4a-4e of the original architecture (= ABE-1 - 1-head - one 832->480 conv); the
    # thesis (§4.4.7.1) writes "3.5M additional parameters" for these five blocks.
    assert phi == 2_809_168
    assert model.head.selector.dictionary.shape == (8, 480, 832)  # N x c directions in R^m
    tail_4a = dict(model.head.psi.named_children())["inception4a"]
    assert model.head.phi.inception4a is not tail_4a
    pairs = zip(model.head.phi.inception4a.parameters(), tail_4a.parameters(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)


def phi_map(b=2, m=6, h=3, w=4, seed=0):
    return torch.randn(b, m, h, w, generator=torch.Generator().manual_seed(seed))


def assert_tends_to_argmax(make, soft, x):
    """As alpha grows the weights approach eq. 6's one-hot argmax (wherever the top two are not tied)."""
    sims = soft.similarity(x)
    one_hot = F.one_hot(sims.argmax(dim=1), sims.shape[1]).movedim(-1, 1).float()
    top2 = sims.topk(2, dim=1).values
    clear = (top2[:, 0] - top2[:, 1] > 1e-3).unsqueeze(1).expand_as(one_hot)
    errors = []
    for alpha in (1.0, 10.0, 100.0, 1e4):
        hard = make(alpha)
        hard.dictionary.data.copy_(soft.dictionary.data)
        weights = hard(x).reshape(one_hot.shape) if one_hot.dim() == 4 else hard(x)
        errors.append(float((weights.detach() - one_hot)[clear].abs().max()))
    assert errors == sorted(errors, reverse=True) and errors[-1] < 1e-3


def test_feature_wise_weights_sum_to_one_are_constant_over_channels_and_harden_with_alpha():
    x = phi_map()
    soft = FeatureWiseSelection(5, 6, alpha=10.0)
    a = soft(x)  # (B, N, 1, h, w): one weight per location, broadcast over every channel (eq. 8-9)
    assert a.shape == (2, 5, 1, 3, 4) and (a >= 0).all()
    assert torch.allclose(a.sum(dim=1), torch.ones(2, 1, 3, 4))
    assert_tends_to_argmax(lambda alpha: FeatureWiseSelection(5, 6, alpha), soft, x)


def test_dimension_wise_weights_sum_to_one_per_channel_and_harden_with_alpha():
    x = phi_map()
    soft = DimensionWiseSelection(4, 7, 6, alpha=10.0)
    a = soft(x)
    assert a.shape == (2, 4, 7, 3, 4) and torch.allclose(a.sum(dim=1), torch.ones(2, 7, 3, 4))
    assert not torch.allclose(a[:, :, 0], a[:, :, 1])  # weights differ between channels
    assert_tends_to_argmax(lambda alpha: DimensionWiseSelection(4, 7, 6, alpha), soft, x)


def test_selection_weights_are_a_softmax_of_cosines_computed_location_by_location():
    """DIABLO eq. 5 and eq. 10 against a slow loop: at each location (i, j), the softmax over entries n of
    alpha * cos(phi(f_ij), d^(n)) (one direction per entry) or alpha * cos(phi(f_ij), d^(n)_k) (one per entry and
    channel k). phi is scaled per location so that a cosine which forgets to normalise, or normalises along the
    wrong axis, shows."""
    x = phi_map() * torch.linspace(0.2, 5.0, 12).reshape(1, 1, 3, 4)  # (B, m, h, w), norms differ per location
    feature, dimension = FeatureWiseSelection(5, 6, alpha=3.0), DimensionWiseSelection(4, 7, 6, alpha=3.0)
    with torch.no_grad():
        feature.dictionary.mul_(torch.linspace(0.5, 2.0, 5)[:, None])
        dimension.dictionary.mul_(torch.linspace(0.5, 2.0, 7)[None, :, None])
        a, b = feature(x), dimension(x)
    for batch in range(x.shape[0]):
        for i in range(3):
            for j in range(4):
                f = x[batch, :, i, j]
                cos = torch.stack([F.cosine_similarity(f, d, dim=0) for d in feature.dictionary.detach()])
                assert torch.allclose(a[batch, :, 0, i, j], torch.softmax(3.0 * cos, dim=0), atol=1e-6)
                for k in range(7):
                    cos = torch.stack([F.cosine_similarity(f, d[k], dim=0) for d in dimension.dictionary.detach()])
                    assert torch.allclose(b[batch, :, k, i, j], torch.softmax(3.0 * cos, dim=0), atol=1e-6)


def test_pre_attention_merge_is_the_hadamard_product_with_duplicated_features_and_runs_psi_once():
    torch.manual_seed(0)
    model = create_model("tiny", head="diablo", pretrained=False, embedding_dim=16, num_entries=4,
                         freeze_bn=False, scale_compensation=False).eval()  # the paper's eq. 13 as written
    head = model.head
    features = model.trunk(model.normalize(torch.rand(3, 3, 32, 32)))  # (3, 8, 16, 16)
    seen = []
    head.psi.register_forward_hook(lambda module, args, out: seen.append(args[0].detach().clone()))
    pooled, maps, _ = head.branch_features(features)
    assert len(seen) == 1 and seen[0].shape == (3 * 4, 8, 16, 16)  # all branches in one batch
    duplicated = features.unsqueeze(1).expand(-1, 4, -1, -1, -1)  # F ⊗ 1_N
    assert torch.allclose(seen[0], (duplicated * maps).flatten(0, 1))  # eq. 13
    assert pooled.shape == (3, 4, 32)


@pytest.mark.parametrize("head_options", [{"head": "diablo", "num_entries": 4}, {"head": "abe", "num_learners": 4}])
def test_chunked_tail_gives_the_same_embeddings_and_gradients(head_options):
    def run(tail_chunk):
        torch.manual_seed(0)
        model = create_model("tiny", pretrained=False, embedding_dim=16, tail_chunk=tail_chunk, **head_options)
        calls = []
        model.head.psi.register_forward_hook(lambda module, args, out: calls.append(args[0].shape[0]))
        out = model.train()(torch.rand(3, 3, 32, 32))
        (out.embedding.sum() + sum(p[:, 0].sum() for p in out.parts)).backward()
        return out.embedding, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}, calls

    whole, whole_grads, whole_calls = run(None)
    chunked, chunked_grads, chunked_calls = run(5)
    assert whole_calls == [12] and chunked_calls == [5, 5, 2]  # B·N = 12 maps
    assert torch.allclose(whole, chunked, atol=1e-6)
    assert whole_grads.keys() == chunked_grads.keys()
    assert all(torch.allclose(whole_grads[n], chunked_grads[n], atol=1e-5) for n in whole_grads)


def test_tail_runs_unchunked_while_its_batchnorm_is_training():
    model = create_model("tiny", head="abe", num_learners=4, pretrained=False, embedding_dim=16, freeze_bn=False,
                         tail_chunk=2)
    merged = torch.rand(8, 8, 16, 16)
    assert model.train().head.chunk_size(merged) is None  # batch statistics of the whole B·N batch
    assert model.eval().head.chunk_size(merged) == 2
    with pytest.raises(ConfigError, match="tail_chunk"):
        create_model("tiny", head="diablo", pretrained=False, tail_chunk=0)


def test_feature_wise_post_attention_weights_psi_of_f():
    torch.manual_seed(0)
    model = create_model("tiny", head="diablo", pretrained=False, embedding_dim=8, num_entries=2,
                         selection="feature", strategy="post", freeze_bn=False).eval()
    features = model.trunk(model.normalize(torch.rand(2, 3, 32, 32)))
    pooled, maps, _ = model.head.branch_features(features)
    refined = model.head.psi(features)
    assert maps.shape == (2, 2, 1, *refined.shape[-2:])
    assert torch.allclose(pooled, (refined.unsqueeze(1) * maps).mean(dim=(3, 4)))
    assert torch.allclose(pooled.sum(dim=1), refined.mean(dim=(2, 3)), atol=1e-6)  # weights sum to 1


@pytest.mark.parametrize("options", [
    {"head": "diablo", "selection": "dimension", "strategy": "pre"},
    {"head": "diablo", "selection": "feature", "strategy": "post"},
    {"head": "abe", "num_learners": 4},
    {"head": "mheads", "num_heads": 2},
])
def test_output_contract_and_every_parameter_gets_a_gradient(options):
    torch.manual_seed(0)
    model = create_model("tiny", pretrained=False, embedding_dim=16, freeze_bn=False, **options)
    out = model(torch.rand(4, 3, 32, 32))
    n = model.head.num_parts
    assert isinstance(out, HeadOutput) and len(out.parts) == n and out.embedding.shape == (4, 16)
    assert torch.allclose(out.embedding.norm(dim=1), torch.ones(4), atol=1e-6)
    assert all(torch.allclose(p.norm(dim=1), torch.ones(4), atol=1e-6) for p in out.parts)
    if options["head"] != "mheads":
        assert out.attention.shape[:2] == (4, n)
    (out.embedding.sum() + sum(p[:, 0].sum() for p in out.parts)).backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing


def test_abe_initialises_each_mask_convolution_and_the_final_layers_as_glorot():
    """ABE §4: "the final layer of the network and the convolution layer of attention module are randomly
    initialized as proposed by Glorot et al.": U(±sqrt(6 / (fan_in + fan_out))) with one learner's fans, even
    where the M learners' layers are stored as one tensor; the masks' biases start at zero. DIABLO, which
    does not say, keeps nn.Linear's U(±1/sqrt(C))."""
    import math

    from deepmetric.models.heads.abe import MHeadsHead
    from deepmetric.models.heads.attention import BranchEmbedding, SigmoidMasks

    def spans(weight, bound):  # every value inside the bound, and the largest near it (thousands of draws)
        largest = float(weight.detach().abs().max())
        return 0.95 * bound < largest <= bound

    torch.manual_seed(0)
    masks = SigmoidMasks(num_learners=8, phi_dim=64, channels=32)
    assert spans(masks.convs.weight, math.sqrt(6 / (64 + 32))) and not masks.convs.bias.any()
    shared = BranchEmbedding(8, in_channels=256, embedding_dim=128, shared=True, glorot=True)
    assert spans(shared.weight, math.sqrt(6 / (256 + 16)))
    per_branch = BranchEmbedding(8, in_channels=256, embedding_dim=128, shared=False)
    assert spans(per_branch.weight, 1 / math.sqrt(256))
    abe = create_model("tiny", head="abe", embedding_dim=16, pretrained=False, num_learners=2).head
    assert abe.embed.weight.shape == (8, 32) and spans(abe.embed.weight, math.sqrt(6 / (32 + 8)))
    heads = MHeadsHead(torch.nn.Identity(), in_channels=512, embedding_dim=64, num_heads=4)
    assert all(spans(embed.weight, math.sqrt(6 / (512 + 16))) for embed in heads.embeds)


def test_abe_with_all_ones_masks_is_the_plain_network():
    torch.manual_seed(0)
    model = create_model("tiny", head="abe", pretrained=False, embedding_dim=12, num_learners=3,
                         freeze_bn=False).eval()
    head = model.head
    head.selector.forward = lambda phi_map: torch.ones(phi_map.shape[0], 3, 8, *phi_map.shape[-2:])
    x = torch.rand(2, 3, 32, 32)
    features = model.trunk(model.normalize(x))
    plain = F.normalize(head.psi(features).mean(dim=(2, 3)) @ head.embed.weight.t(), dim=1)
    out = model(x)
    for part in out.parts:  # B_m(x) = G(S(x)) for every learner
        assert torch.allclose(part, plain, atol=1e-6)


def slow_divergence(parts, margin=1.0):
    total, count = 0.0, 0
    for i in range(parts[0].shape[0]):
        for p, q in itertools.combinations(range(len(parts)), 2):
            total = total + torch.relu(margin - (parts[p][i] - parts[q][i]).pow(2).sum())
            count += 1
    return total / count


def test_divergence_loss_matches_a_slow_loop_with_its_gradient():
    g = torch.Generator().manual_seed(0)
    base = F.normalize(torch.randn(5, 8, generator=g), dim=1)
    parts = [F.normalize(base + 0.6 * torch.randn(5, 8, generator=g), dim=1).requires_grad_(True) for _ in range(4)]
    out = HeadOutput(embedding=base, parts=parts)
    ours = ABEDivergenceLoss()(out, None)
    grads = torch.autograd.grad(ours, parts)
    slow = slow_divergence(parts)
    slow_grads = torch.autograd.grad(slow, parts)
    assert float(ours.detach()) == pytest.approx(float(slow.detach()), abs=1e-6) and float(ours.detach()) > 0
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(grads, slow_grads, strict=False))
    total = ABEDivergenceLoss(reduction="sum")(out, None)
    assert float(total.detach()) == pytest.approx(float(slow.detach()) * 5 * 6, abs=1e-5)


def test_divergence_loss_is_zero_beyond_the_margin_and_for_one_learner():
    eye = torch.eye(4)
    parts = [eye[i].repeat(3, 1).requires_grad_(True) for i in range(4)]  # orthogonal: ||a - b||^2 = 2 > 1
    loss = ABEDivergenceLoss()(HeadOutput(embedding=eye, parts=parts), None)
    assert float(loss.detach()) == 0.0
    assert all(g is None or float(g.abs().sum()) == 0 for g in torch.autograd.grad(loss, parts, allow_unused=True))
    single = HeadOutput(embedding=eye, parts=[eye])
    assert float(ABEDivergenceLoss()(single, None)) == 0.0
    identical = [eye[0].repeat(2, 1)] * 3
    assert float(ABEDivergenceLoss()(HeadOutput(embedding=eye, parts=identical), None)) == 1.0  # max = m_div


def test_euclidean_contrastive_matches_a_slow_loop():
    g = torch.Generator().manual_seed(1)
    x = F.normalize(torch.randn(8, 5, generator=g, dtype=torch.float64), dim=1)
    y = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    for squared in (False, True):
        total, count = 0.0, 0
        for i in range(8):
            for j in range(8):
                if i == j:
                    continue
                d = float((x[i] - x[j]).norm())
                hinge = max(0.0, 1.0 - d) ** (2 if squared else 1)
                total += d * d if y[i] == y[j] else hinge
                count += 1
        assert float(EuclideanContrastiveLoss(1.0, squared)(x, y)) == pytest.approx(total / count, abs=1e-9)


def test_abe_defaults_sum_per_learner_losses_and_add_the_divergence():
    from deepmetric.config import build_config
    from deepmetric.losses import build_objective

    model = create_model("tiny", head="abe", pretrained=False, embedding_dim=16, num_learners=4)
    objective = build_objective(build_config({"loss": {"name": "contrastive"}}).loss, model.head)
    assert (objective.on, objective.parts_reduction, objective.weights) == ("parts", "sum", {"divergence": 1.0})
    diablo = create_model("tiny", head="diablo", pretrained=False, embedding_dim=16, num_entries=4)
    objective = build_objective(build_config({}).loss, diablo.head)
    assert objective.on == "embedding" and not objective.weights  # DIABLO: no divergence loss


@pytest.mark.parametrize(("head", "option", "prefix"), [("abe", "num_learners", "abe.learner"),
                                                       ("mheads", "num_heads", "mheads.head")])
def test_each_learner_alone_is_offered_for_evaluation(head, option, prefix):
    """ABE Tables 1-2's individual learners: every learner's own l2-normalised embedding, in order; none with
    a single learner (it is the embedding)."""
    torch.manual_seed(0)
    model = create_model("tiny", head=head, pretrained=False, embedding_dim=16, **{option: 4}).eval()
    with torch.no_grad():
        output = model(torch.rand(3, 3, 32, 32))
    alone = model.head.auxiliary_embeddings(output)
    assert list(alone) == [f"{prefix}{m}" for m in range(1, 5)]
    assert all(torch.equal(alone[f"{prefix}{m + 1}"], output.parts[m]) and output.parts[m].shape == (3, 4)
               for m in range(4))
    assert torch.allclose(torch.cat(list(alone.values()), dim=1) / 2, output.embedding)
    single = create_model("tiny", head=head, pretrained=False, embedding_dim=16, **{option: 1})
    assert single.head.auxiliary_embeddings(single(torch.rand(2, 3, 32, 32))) == {}


def test_learner_summary_is_the_mean_and_population_deviation_of_the_numbered_rows():
    from deepmetric.evaluation.auxiliary import learner_summary

    rows = {"embedding": {"recall@1": 0.9}, "abe.learner1": {"recall@1": 0.5, "nmi": 0.2},
            "abe.learner2": {"recall@1": 0.6, "nmi": 0.4}, "abe.learner3": {"recall@1": 0.7, "nmi": 0.9},
            "abe.learnerX": {"recall@1": 0.0, "nmi": 0.0}, "deml.scale1": {"recall@1": 0.0, "nmi": 0.0}}
    summary = learner_summary(rows, "abe.learner")
    assert list(summary) == ["abe.learner1-3 mean", "abe.learner1-3 std"]
    assert summary["abe.learner1-3 mean"] == pytest.approx({"recall@1": 0.6, "nmi": 0.5})
    assert summary["abe.learner1-3 std"] == pytest.approx({"recall@1": (0.02 / 3) ** 0.5, "nmi": (0.26 / 3) ** 0.5})
    assert learner_summary({"abe.learner1": {"recall@1": 0.5}}, "abe.learner") == {}
    assert learner_summary(rows, None) == {}


def test_learner_summary_keeps_an_undefined_nmi_undefined():
    """NMI is None where it is undefined (every query of its own class): the summary rows say None for it, and
    still average the other metrics (numpy's mean of None raised a TypeError that took the whole evaluation down)."""
    from deepmetric.evaluation.auxiliary import learner_summary

    rows = {"abe.learner1": {"recall@1": 0.5, "nmi": None}, "abe.learner2": {"recall@1": 0.7, "nmi": None}}
    summary = learner_summary(rows, "abe.learner")
    assert summary["abe.learner1-2 mean"] == {"recall@1": pytest.approx(0.6), "nmi": None}
    assert summary["abe.learner1-2 std"] == {"recall@1": pytest.approx(0.1), "nmi": None}


def test_attention_heads_refuse_backbones_without_a_layout():
    from deepmetric.errors import ConfigError

    with pytest.raises(ConfigError, match="no split defined for backbone 'timm:resnet18'"):
        create_model("timm:resnet18", head="diablo", pretrained=False)
    with pytest.raises(ConfigError, match="no option 'entries'.*num_entries"):
        create_model("tiny", head="diablo", pretrained=False, entries=4)


@pytest.mark.parametrize("head_options", [("diablo", {"num_entries": 2}), ("abe", {"num_learners": 2}),
                                          ("mheads", {"num_heads": 2})])
def test_heads_train_evaluate_and_reload_through_the_run_directory(tmp_path, head_options, monkeypatch):
    from deepmetric.runs.checkpoint import load_checkpoint, save_checkpoint
    from deepmetric.training import train
    from deepmetric.workflows import evaluate_all_embeddings, evaluate_run
    from helpers import record_audited_splits, tiny_config

    head, options = head_options
    config = tiny_config(model={"head": head, "head_options": options}, train={"steps": 2})
    train(config, tmp_path / "run", progress=False)
    record = evaluate_run(tmp_path / "run", progress=False)
    assert 0 <= record["metrics"]["recall@1"] <= 1
    log = (tmp_path / "run" / "metrics.jsonl").read_text()
    assert ('"divergence"' in log) == (head == "abe")
    audited = record_audited_splits(monkeypatch)
    rows = evaluate_all_embeddings(tmp_path / "run", progress=False)["embeddings"]
    assert audited == [{"test"}]  # no PCA: the training images are not read
    assert rows["embedding"] == record["metrics"]  # the same checkpoint, split and kNN engine
    last = tmp_path / "run" / "checkpoints" / "last.safetensors"
    tensors, state = load_checkpoint(last)
    assert state.pop("objective_classes") == 5  # digits' training classes
    save_checkpoint(last, tensors, state)  # as written before the count was saved: counted from the audited table
    audited.clear()
    assert evaluate_all_embeddings(tmp_path / "run", progress=False)["embeddings"] == rows
    assert audited == [{"test"}, {"train"}]
    if head == "diablo":
        assert list(rows) == ["embedding"]
        return
    prefix = {"abe": "abe.learner", "mheads": "mheads.head"}[head]  # ABE Tables 1-2: "Ind" = mean ± std
    assert list(rows) == ["embedding", f"{prefix}1", f"{prefix}2", f"{prefix}1-2 mean", f"{prefix}1-2 std"]
    for key in rows["embedding"]:
        one, two = rows[f"{prefix}1"][key], rows[f"{prefix}2"][key]
        assert rows[f"{prefix}1-2 mean"][key] == pytest.approx((one + two) / 2)
        assert rows[f"{prefix}1-2 std"][key] == pytest.approx(abs(one - two) / 2)


def _merged_maps(model, images):
    """The pre-attention merge (B, N, c, h, w) that the head hands its tail, and the trunk map F (B, c, h, w)."""
    seen = []
    features = model.trunk(model.normalize(images))
    handle = model.head.psi.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    try:
        model.head.branch_features(features)
    finally:
        handle.remove()
    assert len(seen) == 1  # B·N = 12 maps: one call of psi
    return seen[0].unflatten(0, (len(images), -1)), features


@pytest.mark.parametrize(("option", "scale"), [("auto", 4.0), (True, 4.0), (False, 1.0)])
def test_diablos_scale_compensation_gives_the_attended_maps_the_scale_of_f(option, scale):
    """The entries' maps sum to 1 (a softmax), so sum_n A_n ⊙ F = F: compensated (N · A_n ⊙ F, the default on a
    tail with BatchNorm, as the tiny backbone's) the mean of the N merged maps is F itself; uncompensated, F / N."""
    from deepmetric import create_model

    torch.manual_seed(0)
    model = create_model("tiny", head="diablo", pretrained=False, embedding_dim=16, num_entries=4,
                         scale_compensation=option).eval()
    merged, features = _merged_maps(model, torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(0)))
    assert merged.shape[1] == 4 and model.head.merge_scale == scale
    torch.testing.assert_close(merged.mean(dim=1), features * scale / 4, rtol=1e-5, atol=1e-6)


def test_diablo_compensates_by_default_only_where_the_tail_has_batch_norm():
    from deepmetric import create_model
    from deepmetric.errors import ConfigError
    from deepmetric.models.heads.diablo import has_batch_norm

    paper = create_model("inception-v1", head="diablo", pretrained=False, num_entries=8)  # Caffe's: no BatchNorm
    assert not has_batch_norm(paper.head.psi) and paper.head.merge_scale == 1.0
    bn = create_model("tiny", head="diablo", pretrained=False, embedding_dim=16, num_entries=8)
    assert has_batch_norm(bn.head.psi) and bn.head.merge_scale == 8.0
    with pytest.raises(ConfigError, match="scale_compensation must be true, false or auto, got 'yes'"):
        create_model("tiny", head="diablo", pretrained=False, embedding_dim=16, scale_compensation="yes")
