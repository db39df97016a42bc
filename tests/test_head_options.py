"""Each head's options reach what they name, its bounds accept their edge values, and the heads without an equation
test elsewhere (the DGML grouping baselines, the second-order head's matrix functions) match an explicit
computation. Written against mutation survivors (docs/testing.md): each test checks a property a wrong line breaks.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from deepmetric.errors import ConfigError
from deepmetric.models import create_model
from deepmetric.models.heads.attention import check_tail_chunk
from deepmetric.models.heads.deml_oam import object_attention
from deepmetric.models.heads.dgml import AGroupingHead
from deepmetric.models.heads.grouping_baselines import CGroupingHead, GGroupingHead, MGroupingHead, NGroupingHead
from deepmetric.models.heads.jcf import JCFHead
from deepmetric.models.heads.second_order import SecondOrderHead
from deepmetric.models.high_order import HighOrderMoments
from deepmetric.models.high_order.matrix import newton_schulz_sqrt
from deepmetric.models.high_order.sketch import TensorSketch


def tiny(head, embedding_dim=16, **options):
    """``head`` with ``options`` on the tiny random-weight backbone."""
    return create_model(backbone="tiny", head=head, embedding_dim=embedding_dim, pretrained=False, **options)


def features(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------------------------- grouping baselines
def test_g_grouping_pools_the_features_gated_by_each_groups_mask():
    """G-grouping (DGML's gated baseline): group p's vector is GAP(J ⊙ M_p), M_p from the shared bottleneck; its
    attention is the gated map of the group's strongest pooled channel."""
    torch.manual_seed(0)
    head = GGroupingHead(in_channels=8, embedding_dim=6, groups=3, reduction=4)
    x = features(2, 8, 5, 4)
    out = head(x)
    masks = head.masks(head.shared(x)).view(2, 3, 8, 5, 4)
    for b in range(2):
        for p in range(3):
            gated = x[b] * masks[b, p]
            pooled = gated.mean(dim=(1, 2))
            torch.testing.assert_close(out.parts[p][b], F.normalize(head.embed(pooled), dim=0))
            torch.testing.assert_close(out.attention[b, p], gated[int(pooled.argmax())])
    assert out.extras == {}


def test_c_grouping_weights_the_pooled_channels_by_each_groups_excitation():
    """C-grouping: group p's vector is embed(w_p ⊙ GAP(J)), w_p = sigmoid(W2_p relu(W1_p GAP(J))); its attention is
    the strongest weighted channel's map times its weight."""
    torch.manual_seed(0)
    head = CGroupingHead(in_channels=10, embedding_dim=6, groups=3, se_reduction=5)
    x = features(2, 10, 4, 4)
    out = head(x)
    for b in range(2):
        pooled = x[b].mean(dim=(1, 2))
        for p in range(3):
            weight = torch.sigmoid(head.excite[p](torch.relu(head.squeeze[p](pooled))))
            weighted = weight * pooled
            torch.testing.assert_close(out.parts[p][b], F.normalize(head.embed(weighted), dim=0))
            strongest = int(weighted.argmax())
            torch.testing.assert_close(out.attention[b, p], x[b, strongest] * weight[strongest])


def test_grouping_heads_accept_one_dimension_per_group_and_keep_their_input_width():
    """embedding_dim == groups is allowed (one dimension each); fewer is refused; the baselines read in_channels."""
    for cls in (NGroupingHead, MGroupingHead, GGroupingHead, CGroupingHead):
        head = cls(in_channels=12, embedding_dim=2, **({} if cls is NGroupingHead else {"groups": 2}))
        out = head(features(2, 12, 3, 3))
        assert out.embedding.shape == (2, 2) and len(out.parts) == (1 if cls is NGroupingHead else 2)
    with pytest.raises(ConfigError):
        MGroupingHead(in_channels=12, embedding_dim=3, groups=4)
    # the bottlenecks keep at least one unit: 4 channels // 8 and // 5 leave one
    assert GGroupingHead(in_channels=4, embedding_dim=2, groups=2, reduction=8).shared.out_channels == 1
    assert CGroupingHead(in_channels=4, embedding_dim=2, groups=2, se_reduction=5).squeeze[0].out_features == 1


def test_dgml_parameter_groups_and_key_dim_bound():
    """The groups the optimiser gives their own rates (train.groups.<name>) carry these names; key_dim = 1 is
    allowed; the queries start in U(-1/sqrt(D_K), 1/sqrt(D_K))."""
    torch.manual_seed(0)
    head = AGroupingHead(in_channels=16, embedding_dim=8, groups=2, key_dim=1, projection=True)
    assert sorted(head.parameter_groups()) == ["key_value", "pretrained", "projection", "queries"]
    assert head.parameter_groups()["projection"] == list(head.projection.parameters())
    wide = AGroupingHead(in_channels=16, embedding_dim=400, groups=400, key_dim=4)
    assert wide.queries.abs().max() <= 0.5 and wide.queries.min() < -0.4 and wide.queries.max() > 0.4


# ----------------------------------------------------------------------------------------------- second order
def explicit_matrix(head, x, pooling, matrix_norm):
    """Σ of eqs. 3.1/3.2 (uncentred or centred), then U Δ^p U^T (eq. 3.28) or Newton-Schulz with a 1e-6 trace ridge."""
    reduced = head.reduce(x).flatten(2)
    if pooling == "covariance":
        reduced = reduced - reduced.mean(dim=2, keepdim=True)
    sigma = reduced @ reduced.transpose(1, 2) / reduced.shape[2]
    if matrix_norm == "power":
        values, vectors = torch.linalg.eigh(sigma)
        return vectors @ torch.diag_embed(values.clamp_min(1e-6 * values.amax(-1, keepdim=True)) ** head.power) \
            @ vectors.transpose(1, 2)
    if matrix_norm == "newton_schulz":
        ridge = 1e-6 * sigma.diagonal(dim1=1, dim2=2).mean(dim=1)
        return newton_schulz_sqrt(sigma + ridge[:, None, None] * torch.eye(sigma.shape[-1], dtype=sigma.dtype),
                                  head.iterations)
    return sigma


@pytest.mark.parametrize("pooling", ["second_order", "covariance"])
@pytest.mark.parametrize("matrix_norm", ["none", "power", "newton_schulz"])
def test_the_second_order_representation_is_its_matrix_function(pooling, matrix_norm):
    """The pooled matrix (uncentred for second_order, centred for covariance), its matrix function with the
    non-default power 0.3 and 3 iterations, then signed sqrt and l2: in float64, to 1e-10."""
    torch.manual_seed(0)
    head = SecondOrderHead(in_channels=6, embedding_dim=8, pooling=pooling, matrix_norm=matrix_norm,
                           reduce_dim=4, power=0.3, iterations=3).double()
    x = features(2, 6, 5, 5).double().abs()
    z = explicit_matrix(head, x, pooling, matrix_norm).flatten(1)
    z = torch.sign(z) * (torch.sqrt(z.abs() + 1e-8) - 1e-4)
    torch.testing.assert_close(head.representation(x), F.normalize(z, dim=1), rtol=1e-10, atol=1e-12)


def test_each_factorization_builds_its_own_factor_and_embedding():
    """Random Maclaurin and Tensor Sketch are fixed second-order sketches of sketch_dim; rank_one learns D rank-one
    projections and is its own embedding; hpbp learns `rank` and embeds them linearly."""
    def build(factorization, **options):
        return SecondOrderHead(in_channels=6, embedding_dim=8, factorization=factorization, reduce_dim=None,
                               sketch_dim=32, rank=5, seed=3, **options)

    maclaurin = build("random_maclaurin")
    assert isinstance(maclaurin.factor, HighOrderMoments) and maclaurin.factor.orders == 2
    assert maclaurin.representation_dim == 32 and maclaurin.embed.in_features == 32
    sketch = build("tensor_sketch")
    assert isinstance(sketch.factor, TensorSketch) and sketch.representation_dim == 32
    assert torch.equal(build("tensor_sketch").factor(features(3, 6)), sketch.factor(features(3, 6)))  # its seed
    other = SecondOrderHead(in_channels=6, factorization="tensor_sketch", reduce_dim=None, sketch_dim=32, seed=4)
    assert not torch.equal(other.factor(features(3, 6)), sketch.factor(features(3, 6)))
    rank_one = build("rank_one")
    assert isinstance(rank_one.embed, torch.nn.Identity) and rank_one.representation_dim == 8
    assert isinstance(rank_one.factor, HighOrderMoments) and rank_one.factor.orders == 2
    assert rank_one.factor.mode == "learned" and maclaurin.factor.mode == "rm_fixed"
    low_rank = build("hpbp")
    assert low_rank.representation_dim == 5 and low_rank.embed.in_features == 5 and low_rank.embed.bias is None
    assert low_rank.factor.orders == 2
    with pytest.raises(ConfigError, match="matrix_norm 'power' needs the symmetric"):
        SecondOrderHead(in_channels=6, pooling="bilinear", matrix_norm="power")


# ----------------------------------------------------------------------------------------------- JCF
def test_jcf_starts_from_its_documented_initialisation_and_bounds():
    """α = 1 until the k-means sets it; u, v ~ N(0, 1/d) (unit-variance projections of unit-variance features),
    a, b ~ N(0, 1/K); rank 1 is allowed, 0 codewords are not; the embedding layer of JCF-N has no bias."""
    torch.manual_seed(0)
    head = JCFHead(in_channels=8, embedding_dim=64, codewords=16, rank=1, reduce_dim=None)
    assert float(head.alpha) == 1.0
    assert head.u.std().item() == pytest.approx(1 / math.sqrt(8), rel=0.1)
    assert head.v.std().item() == pytest.approx(1 / math.sqrt(8), rel=0.1)
    big = JCFHead(in_channels=8, embedding_dim=8, codewords=400, rank=30, reduce_dim=None)
    assert big.a.std().item() == pytest.approx(1 / 20, rel=0.1) and big.b.std().item() == pytest.approx(1 / 20, rel=0.1)
    plain = JCFHead(in_channels=8, embedding_dim=8, codewords=2, factorization="none", reduce_dim=None)
    assert plain.embed.bias is None and plain.feature_channels == 8  # extras["feature_map"]'s channels
    with pytest.raises(ConfigError, match="codewords and rank must be positive"):
        JCFHead(in_channels=8, codewords=0)


# ----------------------------------------------------------------------------------------------- attention heads
@pytest.mark.parametrize("head", ["abe", "diablo"])
def test_phi_stages_name_the_attention_trunk(head):
    options = {"num_learners": 2} if head == "abe" else {"num_entries": 2}
    default = tiny(head, **options)
    chosen = tiny(head, phi_stages=["stage2", "stage3"], **options)
    assert [n for n, _ in chosen.head.phi.named_children()] == ["stage2", "stage3"]
    assert [n for n, _ in default.head.phi.named_children()] != ["stage2", "stage3"]
    with pytest.raises(ConfigError, match=r"has no stage\(s\) \['stage9'\]"):
        tiny(head, phi_stages=["stage9"], **options)


def test_attention_coarser_than_the_features_is_resized_bilinearly_without_aligned_corners():
    """phi on stages 2-3 gives maps coarser than the trunk's output it weights (pre-attention): they are resized
    to it with bilinear interpolation, align_corners=False."""
    torch.manual_seed(0)
    model = tiny("abe", num_learners=2, phi_stages=["stage2", "stage3"])
    head, x = model.head, model.trunk(torch.rand(2, 3, 64, 64))
    coarse = head.selector(head.phi(x))
    assert coarse.shape[-2:] != x.shape[-2:]
    expected = F.interpolate(coarse.flatten(1, 2), size=x.shape[-2:], mode="bilinear", align_corners=False)
    torch.testing.assert_close(head.attention_maps(x, x.shape[-2:]).flatten(1, 2), expected)


def test_diablo_options_reach_its_selection_and_embedding():
    """Post-attention weights the tail's output (its channels), pre-attention the trunk's; one entry is allowed;
    shared_embedding=True is one C x D/N matrix for every branch."""
    def diablo(**options):
        return tiny("diablo", **options).head

    pre, post = diablo(strategy="pre", num_entries=2), diablo(strategy="post", num_entries=2)
    assert pre.selector.dictionary.shape[1] != post.selector.dictionary.shape[1]
    tail_channels = post.embed.weight.shape[-1]  # the embedding reads the tail's pooled output
    assert post.selector.dictionary.shape[1] == tail_channels
    assert diablo(num_entries=1).selector.dictionary.shape[0] == 1
    assert diablo(num_entries=2, shared_embedding=True).embed.weight.dim() == 2
    assert diablo(num_entries=2).embed.weight.dim() == 3


def test_tail_chunk_accepts_one_and_the_attention_embedding_starts_symmetric():
    assert check_tail_chunk(1) == 1
    torch.manual_seed(0)
    head = tiny("diablo", embedding_dim=64, num_entries=2).head
    weight = head.embed.weight
    bound = 1 / math.sqrt(weight.shape[-1])
    assert weight.abs().max() <= bound and weight.min() < -0.8 * bound and weight.max() > 0.8 * bound


def test_gap_and_mheads_declare_what_their_consumers_read():
    """GAP's pooled_dim is the width of extras['pooled'] (MIRAGE's feature space); M-heads hands its feature map to
    `explain`."""
    model = tiny("gap")
    out = model(torch.rand(2, 3, 32, 32))
    assert model.head.pooled_dim == out.extras["pooled"].shape[1]
    bare = tiny("gap", use_tail=False)
    assert isinstance(bare.head.tail, torch.nn.Identity) and bare(torch.rand(2, 3, 32, 32)).embedding.shape == (2, 16)
    bilinear = tiny("bilinear", pooling="covariance", reduce_dim=4)
    assert bilinear.head.pooling == "covariance" and bilinear.head.representation_dim == 16  # its options arrive
    mheads = tiny("mheads", num_heads=2)
    assert mheads(torch.rand(2, 3, 32, 32)).extras["feature_map"].dim() == 4


# ----------------------------------------------------------------------------------------------- DeML
def test_deml_regions_are_width_by_height_on_a_non_square_image():
    model = tiny("deml", num_scales=2, num_branches=2)
    out = model(torch.rand(2, 3, 32, 48))
    assert out.extras["regions"][:, 0].tolist() == [[0.0, 0.0, 48.0, 32.0]] * 2


def test_deml_object_attention_reads_a_trunk_stage_before_the_gates():
    """An OAM source in the trunk f (before the CAMs) is that stage's output, shared by the branches; one in the
    tail g is the first branch's map."""
    torch.manual_seed(0)
    model = tiny("deml", num_scales=1, num_branches=2, oam_layers=["stage1", "stage3"], oam_steps=4,
                 spatial_sigma=0.5)
    head, images = model.head, model.trunk(torch.rand(2, 3, 32, 32))
    u = head.fnets[0].stage1(images)
    v = u.unsqueeze(1) * head.gates[0](u)
    v = v[:, 0]
    for stage in head.gnets[0].children():
        v = stage(v)
    expected = object_attention([u, v], (32, 32), 4, 0.5)
    torch.testing.assert_close(model.head(images).attention[:, 0], expected)


def test_deml_refuses_a_scale_count_or_a_branch_count_below_one():
    for bad in ({"num_scales": 0, "num_branches": 2}, {"num_scales": 2, "num_branches": 0}):
        with pytest.raises(ConfigError):
            tiny("deml", **bad)


# ----------------------------------------------------------------------------------------------- the output and export
def test_head_output_float_converts_every_floating_tensor_and_keeps_the_rest():
    """After a bfloat16 forward (train.amp) the objective gets float32 everywhere: embedding, parts, attention and
    the tensors nested in extras' lists and dicts; integer tensors and other values pass through; the gradient
    still reaches the bfloat16 source."""
    from deepmetric.models.heads.base import HeadOutput

    source = torch.ones(2, 3, dtype=torch.bfloat16, requires_grad=True)
    half = source * 2
    output = HeadOutput(embedding=half, parts=[half, half[:, :1]], attention=half[:, None, :, None],
                        extras={"maps": [half], "nested": {"x": half}, "index": torch.arange(3), "name": "n"})
    out = output.float()
    tensors = [out.embedding, *out.parts, out.attention, out.extras["maps"][0], out.extras["nested"]["x"]]
    assert all(t.dtype == torch.float32 for t in tensors)
    assert out.extras["index"].dtype == torch.int64 and out.extras["name"] == "n"
    sum(t.sum() for t in tensors).backward()
    assert source.grad is not None and float(source.grad.float().sum()) > 0


def test_only_a_multi_scale_deml_says_why_it_cannot_be_exported():
    def deml(scales):
        return tiny("deml", num_scales=scales, num_branches=2).head

    assert deml(1).export_blocker() is None
    reason = deml(2).export_blocker()
    assert reason.startswith("with 2 scales, each scale's crop box is found by the object-attention module")
    assert tiny("gap").head.export_blocker() is None


def test_option_names_are_the_builders_keywords_without_what_the_run_provides():
    """The registry's accepted options: a head's own from_backbone keywords (ABE), or __init__'s when from_backbone
    forwards **options (JCF, the bilinear head), never in_channels / embedding_dim / backbone, each once."""
    from deepmetric.models.heads import HEADS

    assert HEADS["gap"].option_names() == ["use_tail", "l2"]
    assert HEADS["abe"].option_names() == ["num_learners", "phi_stages", "tail_chunk", "branch_feature_map"]
    assert HEADS["jcf"].option_names() == ["codewords", "rank", "reduce_dim", "alpha", "factorization",
                                           "init_images"]
    assert HEADS["dgml"].option_names() == ["groups", "key_dim", "projection"]
    assert HEADS["n-grouping"].option_names() == []


@pytest.mark.parametrize(("head", "options"), [("abe", {"num_learners": 3}), ("diablo", {"num_entries": 3}),
                                               ("mheads", {"num_heads": 3})])
def test_attention_maps_are_one_per_branch_at_the_feature_maps_size(head, options):
    model = tiny(head, embedding_dim=12, **options)
    out = model(torch.rand(2, 3, 64, 48))
    if out.attention is not None:
        assert out.attention.shape[:2] == (2, 3) and out.attention.dim() == 4
        assert out.attention.shape[2] > out.attention.shape[3]  # the image's aspect: taller than wide


def test_deml_cam_form_chooses_pooled_or_per_pixel_gates():
    def gates(**options):
        return tiny("deml", num_scales=1, num_branches=2, **options).head.gates[0]

    assert gates().pooled and gates(cam_form="pooled").pooled and not gates(cam_form="pixel").pooled


# ----------------------------------------------------------------------------------------------- DeML's OAM pieces
def test_each_oam_layer_is_min_max_normalised_per_image_before_the_mean():
    from deepmetric.models.heads.deml_oam import _min_max

    maps = torch.stack([torch.linspace(2, 5, 12).view(3, 4), torch.linspace(-1, 9, 12).view(3, 4)])
    normalised = _min_max(maps)
    assert normalised.flatten(1).amin(1).tolist() == [0.0, 0.0] and normalised.flatten(1).amax(1).tolist() == [1, 1]


def test_the_spatial_sigma_reaches_the_random_walk():
    from deepmetric.models.heads.deml_oam import stationary_mass

    x = features(1, 4, 5, 5)
    assert not torch.allclose(stationary_mass(x, 5, 0.0), stationary_mass(x, 5, 0.8))
    assert not torch.allclose(stationary_mass(x, 1, 0.8), stationary_mass(x, 10, 0.8))  # and the step count


def test_a_box_inside_a_crop_is_scaled_by_the_crops_width_and_height():
    from deepmetric.models.heads.deml_oam import compose_boxes

    outer = torch.tensor([[8.0, 4.0, 24.0, 12.0]])  # a 16 x 8 crop of a 32 x 16 image
    inner = torch.tensor([[0.0, 8.0, 16.0, 16.0]])  # its lower half-width, in the crop's (resized) frame
    assert compose_boxes(outer, inner, (16, 32)).tolist() == [[8.0, 8.0, 16.0, 12.0]]


def test_attention_boxes_on_flat_single_pixel_and_non_square_maps():
    """A map flat to 1e-6 of its magnitude is no object (the whole image), however large its values; a faint but
    real pattern is one; a single hot pixel is a box of side 1; the square side never exceeds the shorter side."""
    from deepmetric.models.heads.deml_oam import attention_box

    noise = np.random.default_rng(0).random((6, 6))
    assert attention_box(1000.0 + 1e-5 * noise) == (0, 0, 6, 6)
    spike = np.zeros((6, 6))
    spike[2, 4] = 1.0
    assert attention_box(1000.0 + 1e-5 * spike) == (0, 0, 6, 6)  # 1e-8 of its magnitude: flat, not a spike
    hot = np.zeros((6, 6))
    hot[2, 4] = 1.0
    assert attention_box(1e-3 + 1e-7 * hot) == (4, 2, 5, 3)  # faint (1e-4 of its magnitude) but there
    assert attention_box(hot) == (4, 2, 5, 3)
    tall = np.zeros((12, 6))
    tall[1:11, 2:4] = 1.0
    assert attention_box(tall)[2] - attention_box(tall)[0] == 6 and attention_box(tall)[2] <= 6
    assert attention_box(tall.T)[3] - attention_box(tall.T)[1] == 6 and attention_box(tall.T)[3] <= 6
