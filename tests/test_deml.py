"""DeML head (CAMs, decoupled learners, scales), its regularisers, defaults and training through a run directory."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from deepmetric import create_model
from deepmetric.config import build_config
from deepmetric.errors import ConfigError
from deepmetric.losses import ActivationDecay, DeMLAdversary, DeMLPairHinge, LearnerRowNorm, build_objective
from deepmetric.losses.gradient_reversal import ganin_lambda, reverse_gradient
from deepmetric.losses.objective import Objective
from deepmetric.models import create_backbone
from deepmetric.models.heads import HeadOutput
from deepmetric.models.heads.deml import DeMLHead
from deepmetric.models.heads.deml_modules import ChannelAttention
from deepmetric.training.optim import build_optimizer
from helpers import tiny_config


def deml(num_scales=2, num_branches=2, embedding_dim=16, **options):
    torch.manual_seed(0)
    return create_model("tiny", head="deml", pretrained=False, embedding_dim=embedding_dim, freeze_bn=False,
                        num_scales=num_scales, num_branches=num_branches, **options)


def test_every_backbone_has_an_input_split_with_an_identity_trunk():
    net = create_backbone("tiny", pretrained=False, split="input")
    x = torch.rand(2, 3, 16, 16)
    assert (net.channels, net.stride, net.split_points[0]) == (3, 1, "input") and torch.equal(net.trunk(x), x)
    assert [n for n, _ in net.tail.named_children()] == ["stage1", "stage2", "stage3"]
    assert deml().spec["split"] == "input"  # the head's default split


@pytest.mark.parametrize(("grid", "per_learner"), [((1, 1), 512), ((1, 4), 128), ((1, 8), 64), ((2, 1), 256),
                                                   ((2, 4), 64), ((3, 1), 170), ((3, 3), 56)])
def test_learners_get_floor_of_d_over_ij_dimensions(grid, per_learner):
    model = deml(*grid, embedding_dim=512)
    i, j = grid
    assert model.head.part_dim == per_learner and model.embedding_dim == i * j * per_learner
    assert model.head.learners.weight.shape == (i, j, per_learner, 32)  # no bias
    assert model.head.num_parts == i * j
    if grid == (3, 3):
        assert model.embedding_dim == 504


def test_parameter_count_of_deml_3_3_on_the_original_googlenet():
    model = create_model("inception-v1", head="deml", pretrained=False, freeze_bn=False)
    backbone = 6_497_840 - 1024 * 512  # GoogLeNet up to inception 5b (ABE Table 1's 1-head minus its embedding)
    cams = 3 * 3 * (480 * 64 + 64 + 64 * 480 + 480)  # per scale and CAM after pool3: W1 (64 x 480), W2 (480 x 64)
    learners = 3 * 3 * 1024 * 56
    assert sum(p.numel() for p in model.parameters()) == 3 * backbone + cams + learners  # 3 separate copies
    head = model.head
    assert head.fnets[0][-1] is not head.fnets[1][-1] and head.oam_layers == ("inception4e", "inception5b")


def test_overall_cosine_is_the_mean_of_the_per_learner_cosines():
    model = deml(2, 3, embedding_dim=24).eval()
    with torch.no_grad():
        out = model(torch.rand(2, 3, 32, 32))
    assert len(out.parts) == 6 and all(torch.allclose(p.norm(dim=1), torch.ones(2), atol=1e-6) for p in out.parts)
    assert torch.allclose(out.embedding.norm(dim=1), torch.ones(2), atol=1e-6)
    overall = float(out.embedding[0] @ out.embedding[1])
    per_learner = [float(p[0] @ p[1]) for p in out.parts]
    assert overall == pytest.approx(sum(per_learner) / 6, abs=1e-6)
    raw = out.extras["learner_activations"]  # scale-major concatenation of the normalised raw outputs
    assert torch.allclose(out.embedding, F.normalize(raw, dim=2).flatten(1) / 6**0.5, atol=1e-6)


def test_the_shared_tail_runs_once_per_scale_on_all_branches():
    model = deml(2, 3)
    seen = []
    for gnet in model.head.gnets:  # g^i's first stage
        gnet[0].register_forward_hook(lambda module, args, out: seen.append(args[0].shape[0]))
    out = model(torch.rand(4, 3, 32, 32))
    assert seen == [12, 12]  # J·B per scale
    assert out.attention.shape == (4, 2, 32, 32) and out.extras["scale_inputs"].shape == (4, 2, 3, 32, 32)
    assert torch.equal(out.extras["regions"][:, 0], torch.tensor([[0.0, 0, 32, 32]] * 4))


def test_the_finer_scale_sees_the_crop_and_no_gradient_crosses_scales():
    model = deml(2, 1, embedding_dim=8).eval()
    images = torch.rand(3, 3, 32, 32, requires_grad=True)
    normalised = model.normalize(images)
    out = model.head(normalised)
    crops = out.extras["scale_inputs"][:, 1]
    for crop, image, region in zip(crops, normalised.detach(), out.extras["regions"][:, 1], strict=True):
        x0, y0, x1, y1 = region.int().tolist()
        assert x1 - x0 == y1 - y0 and x0 >= 0 and y0 >= 0 and x1 <= 32 and y1 <= 32
        zoomed = F.interpolate(image[None, :, y0:y1, x0:x1], size=(32, 32), mode="bilinear", align_corners=False)
        assert torch.allclose(crop[:, 1:-1, 1:-1], zoomed[0, :, 1:-1, 1:-1], atol=1e-4)
    first = torch.autograd.grad(out.parts[0].sum(), images, retain_graph=True)[0]
    assert first.abs().sum() > 0
    second = torch.autograd.grad(out.parts[1].sum(), images, allow_unused=True)[0]
    assert second is None or not second.any()  # the crop is not differentiable: scale 2 learns only in its copy


def test_deml_3_3_gives_the_same_output_with_its_boxes_found_as_on_a_gpu(monkeypatch):
    """The boxes a GPU finds on the device (``attention_boxes_on_device``), forced here on the CPU, give DeML(3,3)'s
    forward pass the crops, regions, embedding and parts that SciPy's boxes give."""
    from deepmetric.models.heads import deml as deml_module
    from deepmetric.models.heads.deml_oam import attention_boxes_on_device

    model = deml(3, 3, embedding_dim=18).eval()
    images = model.normalize(torch.rand(6, 3, 48, 48, generator=torch.Generator().manual_seed(1)))
    with torch.no_grad():
        by_scipy = model.head(images)
        monkeypatch.setattr(deml_module, "attention_boxes", attention_boxes_on_device)
        on_device = model.head(images)
    assert not torch.equal(by_scipy.extras["regions"][:, 1], torch.tensor([[0.0, 0, 48, 48]] * 6))  # real crops
    for key in ("regions", "scale_inputs"):
        assert torch.equal(by_scipy.extras[key], on_device.extras[key]), key
    assert torch.equal(by_scipy.embedding, on_device.embedding)
    assert all(torch.equal(a, b) for a, b in zip(by_scipy.parts, on_device.parts, strict=True))


def test_the_finer_scales_attention_is_pasted_back_into_the_region_it_saw():
    """The attention of scale 2 is computed on the zoomed crop and shown in the original frame: zero outside the
    crop's region, and that map placed (``paste``) at the region; scale 1's map is left in the frame it was made."""
    from deepmetric.models.heads.deml_oam import object_attention, paste

    model = deml(2, 1, embedding_dim=8).eval()
    with torch.no_grad():
        normalised = model.normalize(torch.rand(3, 3, 32, 32))
        out = model.head(normalised)
        regions = out.extras["regions"][:, 1]
        assert ((regions[:, 2] - regions[:, 0]) < 32).any()  # a real crop somewhere, so an outside to check
        _, sources = model.head.scale_features(1, out.extras["scale_inputs"][:, 1])
        crop_attention = object_attention(sources, (32, 32), model.head.oam_steps, model.head.spatial_sigma)
        _, sources = model.head.scale_features(0, normalised)
        first = object_attention(sources, (32, 32), model.head.oam_steps, model.head.spatial_sigma)
    assert torch.allclose(out.attention[:, 0], first)
    assert torch.allclose(out.attention[:, 1], paste(crop_attention, regions), atol=1e-6)
    for pasted, (x0, y0, x1, y1) in zip(out.attention[:, 1], regions.round().int().tolist(), strict=True):
        outside = torch.ones(32, 32, dtype=torch.bool)
        outside[max(y0 - 1, 0):y1 + 1, max(x0 - 1, 0):x1 + 1] = False  # one pixel of bilinear border
        assert not pasted[outside].any() and pasted.abs().max() > 0


def test_channel_attention_gates():
    features = torch.rand(2, 6, 5, 5)
    pooled = ChannelAttention(6, num_gates=3, hidden=4, pooled=True)
    gates = pooled(features)
    assert gates.shape == (2, 3, 6, 1, 1) and ((gates > 0) & (gates < 1)).all()  # one gate per channel (SE)
    assert not torch.allclose(gates[:, 0], gates[:, 1])  # J different CAMs
    pixel = ChannelAttention(6, num_gates=3, hidden=4, pooled=False)(features)
    assert pixel.shape == (2, 3, 6, 5, 5) and not torch.allclose(pixel[..., 0, 0], pixel[..., 1, 1])
    gated = features.unsqueeze(1) * gates
    assert ((gated >= 0) & (gated <= features.unsqueeze(1))).all()  # cap <= U for U >= 0


def test_cams_and_learners_start_from_the_codes_caffe_xavier_filler():
    """U(±sqrt(3 / fan_in)): the learners' rows start with ||omega_r||^2 ~ 1, so L_ntri (eq. 6) starts near 0
    (Glorot's rule gave ~1.9 on 1024 -> 56, and 0.25 L_ntri ~ 100 at the first step of DeML(3,3))."""
    import math

    from deepmetric.models.heads.deml_modules import DecoupledLearners

    torch.manual_seed(0)
    learners = DecoupledLearners(num_scales=3, num_branches=3, in_channels=1024, out_dim=56)
    rows = learners.matrices().flatten(0, 1)  # (I J d', C)
    assert rows.pow(2).sum(dim=1).mean().item() == pytest.approx(1.0, abs=0.02)
    assert learners.weight.abs().max().item() <= math.sqrt(3 / 1024)
    cams = ChannelAttention(512, num_gates=4, hidden=64)
    assert 0.95 * math.sqrt(3 / 512) < cams.squeeze.weight.abs().max().item() <= math.sqrt(3 / 512)
    assert 0.95 * math.sqrt(3 / 64) < cams.excite.weight.abs().max().item() <= math.sqrt(3 / 64)
    assert not cams.squeeze.bias.any() and not cams.excite.bias.any()


def test_branches_differ_only_through_their_cams():
    model = deml(1, 3, embedding_dim=12, share_learners=True).eval()
    gates = model.head.gates[0]
    with torch.no_grad():  # give CAM 2 the weights of CAM 1 (grouped conv: group j = rows j*64...)
        hidden = gates.squeeze.out_channels // 3
        gates.squeeze.weight[hidden:2 * hidden] = gates.squeeze.weight[:hidden]
        gates.squeeze.bias[hidden:2 * hidden] = gates.squeeze.bias[:hidden]
        gates.excite.weight[8:16] = gates.excite.weight[:8]
        gates.excite.bias[8:16] = gates.excite.bias[:8]
    out = model(torch.rand(2, 3, 32, 32))
    assert torch.allclose(out.parts[0], out.parts[1], atol=1e-6)
    assert not torch.allclose(out.parts[0], out.parts[2], atol=1e-3)


def test_each_branch_pools_the_tail_of_the_features_its_cam_gates():
    """DeML §3.2: branch j's feature is g(u ⊙ a_j(u)), u the shared head f's output and a_j its CAM's channel gates;
    checked branch by branch against a manual pass through f, the CAMs and the tail g (multiplying, not dividing,
    by the gates)."""
    model = deml(1, 3, embedding_dim=12).eval()
    head = model.head
    images = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        pooled, _ = head.scale_features(0, images)
        u = head.fnets[0](images)
        gates = head.gates[0](u)  # (B, J, C, ...)
        for j in range(3):
            v = head.gnets[0](u * gates[:, j])
            assert torch.allclose(pooled[:, j], v.mean(dim=(2, 3)), atol=1e-5)


def test_gradient_reversal_flips_the_gradient_and_keeps_the_forward_pass():
    x = torch.randn(4, 3, requires_grad=True)
    weights = torch.randn(4, 3)
    y = reverse_gradient(x, 0.5)
    assert torch.equal(y, x)
    (grad,) = torch.autograd.grad((y * weights).sum(), x)
    assert torch.equal(grad, -0.5 * weights)


def learner_output(batch=6, scales=2, branches=3, dim=5, seed=0, requires_grad=True):
    g = torch.Generator().manual_seed(seed)
    parts = [F.normalize(torch.randn(batch, dim, generator=g), dim=1).requires_grad_(requires_grad)
             for _ in range(scales * branches)]
    return HeadOutput(embedding=torch.cat(parts, 1), parts=parts)


class Grid(torch.nn.Module):
    """Stands in for the deml head where a regulariser only needs its learner grid."""

    def __init__(self, scales, branches, dim):
        super().__init__()
        self.num_scales, self.num_branches, self.part_dim = scales, branches, dim


def test_the_adversary_descends_its_loss_while_the_learners_ascend_it():
    output = learner_output()
    adversary = DeMLAdversary(Grid(2, 3, 5), ramp_steps=0)  # lambda = 1 from the first step
    loss = adversary(output, None)
    grads = torch.autograd.grad(loss, [*output.parts, *adversary.parameters()])
    parts = torch.stack(output.parts, 1).view(6, 2, 3, 5)
    plain = adversary.adversary(parts)  # the same loss without the reversal layer
    p, q = torch.triu_indices(3, 3, offset=1)
    plain_loss = (plain[:, :, p] - plain[:, :, q]).pow(2).mean(dim=3).mean()
    assert float(plain_loss.detach()) == pytest.approx(float(loss.detach()))
    plain_grads = torch.autograd.grad(plain_loss, [*output.parts, *adversary.parameters()])
    for ours, reference in zip(grads[:6], plain_grads[:6], strict=True):  # learners: reversed
        assert torch.allclose(ours, -reference, atol=1e-6) and ours.abs().sum() > 0
    for ours, reference in zip(grads[6:], plain_grads[6:], strict=True):  # adversary: as is
        assert torch.allclose(ours, reference, atol=1e-6) and ours.abs().sum() > 0


@pytest.mark.parametrize(("step", "expected"), [(0, 0.0), (100, 0.049958), (1500, 0.635149), (5000, 0.986614),
                                              (10_000, 0.999909), (50_000, 0.999909)])
def test_ganins_ramp_takes_its_values_at_given_steps(step, expected):
    """lambda_p = 2 / (1 + exp(-10 p)) - 1, p = step / 10,000 held at 1 (values by hand: tanh(5 p))."""
    assert ganin_lambda(step, 10_000) == pytest.approx(expected, abs=1e-6)
    assert ganin_lambda(step, 10_000) == pytest.approx(math.tanh(5 * min(step / 10_000, 1.0)), abs=1e-12)
    assert ganin_lambda(step, 0) == 1.0


@pytest.mark.parametrize("step", [0, 100, 1500, 20_000])
def test_the_learners_gradient_from_the_adversary_is_minus_lambda_at_the_step(step):
    """By default (the authors' code) the reversed gradient on the learners is -lambda(step) times the adversary
    loss' own gradient, with Ganin's ramp over 10,000 steps; the adversary's own gradient does not ramp."""
    output = learner_output()
    ramped, constant = DeMLAdversary(Grid(2, 3, 5)), DeMLAdversary(Grid(2, 3, 5), ramp_steps=0)
    constant.load_state_dict(ramped.state_dict())
    assert ramped.ramp_steps == 10_000
    found = []
    for adversary in (ramped, constant):
        Objective(torch.nn.Identity(), regularizers={"deml-adversary": (adversary, 1.0)}).set_step(step)
        loss = adversary(output, None)
        found.append(torch.autograd.grad(loss, [*output.parts, *adversary.parameters()]))
    lam = ganin_lambda(step, 10_000)
    for ours, reference in zip(found[0][:6], found[1][:6], strict=True):
        assert torch.allclose(ours, lam * reference, atol=1e-7)
    for ours, reference in zip(found[0][6:], found[1][6:], strict=True):
        assert torch.allclose(ours, reference, atol=1e-7)


def test_the_trainer_tells_the_objective_every_step_and_a_resumed_run_goes_on_from_its_checkpoint(tmp_path,
                                                                                                    monkeypatch):
    from deepmetric.training import train

    seen = []
    monkeypatch.setattr(DeMLAdversary, "set_step", lambda self, step: seen.append(step))
    config = tiny_config(model={"head": "deml", "head_options": {"num_scales": 2, "num_branches": 2}},
                         train={"steps": 4, "checkpoint_every": 2})
    train(config, tmp_path / "run", progress=False)
    assert seen == [0, 1, 2, 3]
    seen.clear()
    train(tiny_config(model=config.model.__dict__, train={"steps": 6, "checkpoint_every": 2}), tmp_path / "run",
          resume=True, progress=False)
    assert seen == [4, 5]


def test_the_adversary_cannot_collapse_to_a_constant():
    output = learner_output(batch=8)
    adversary = DeMLAdversary(Grid(2, 3, 5), output_dim=16)
    loss = adversary(output, None)
    (grad,) = torch.autograd.grad(loss, adversary.w2)
    radial = (grad * adversary.w2).sum(dim=(1, 2))  # d loss / d log(scale of F^i): no pull towards 0
    assert (radial.abs() < 1e-4 * (grad * adversary.w2).abs().sum(dim=(1, 2))).all()
    with torch.no_grad():
        adversary.w2.mul_(1e-6)  # an adversary shrunk towards the trivial constant map ...
        features = adversary.adversary(torch.stack(output.parts, 1).view(8, 2, 3, 5))
        assert float(adversary(output, None)) == pytest.approx(float(loss.detach()), rel=1e-4)  # ... keeps its loss
    flat = features.transpose(1, 2).reshape(24, 2, 16)  # ... and unit variance per unit over B x J
    assert torch.allclose(flat.mean(0), torch.zeros(2, 16), atol=1e-5)
    assert torch.allclose(flat.var(0, unbiased=False), torch.ones(2, 16), atol=1e-3)
    same = [output.parts[0]] * 3 + [output.parts[3]] * 3  # identical learners: zero discrepancy
    assert float(adversary(HeadOutput(output.embedding, same), None).detach()) == pytest.approx(0.0, abs=1e-6)
    assert float(adversary(output, None).detach()) > 0.5
    assert not list(DeMLAdversary(Grid(2, 1, 5)).parameters())  # J = 1: nothing to compare


def test_the_pair_hinge_matches_a_slow_loop_and_vanishes_for_antipodal_learners():
    output = learner_output(requires_grad=False)
    ours = DeMLPairHinge(Grid(2, 3, 5))(output, None)
    slow = 0.0
    for scale in range(2):
        for j, k in itertools.combinations(range(3), 2):
            a, b = output.parts[scale * 3 + j], output.parts[scale * 3 + k]
            slow += torch.relu(2 - (a - b).norm(dim=1)).pow(2).sum() / (2 * 6)
    assert float(ours) == pytest.approx(float(slow), rel=1e-5) and float(ours) > 0
    e = F.normalize(torch.randn(4, 5), dim=1)
    antipodal = HeadOutput(e, [e, -e])
    assert float(DeMLPairHinge(Grid(1, 2, 5))(antipodal, None)) == pytest.approx(0.0, abs=1e-6)


def test_activation_decay_and_row_norm_values_and_where_their_gradients_go():
    model = deml(2, 2)
    with torch.no_grad():
        out = model(torch.rand(3, 3, 32, 32))
    z = out.extras["learner_activations"]
    assert float(ActivationDecay()(out, None)) == pytest.approx(float(z.pow(2).sum() / (2 * 4 * 3)), rel=1e-5)
    assert torch.allclose(out.extras["learner_activations_fc_only"], z)  # same values, different gradient path
    for reach, backbone_moves in ((True, True), (False, False)):
        model.zero_grad()
        ActivationDecay(reach_backbone=reach)(model(torch.rand(3, 3, 32, 32)), None).backward()
        assert model.head.learners.weight.grad.abs().sum() > 0
        backbone = [p.grad for p in model.head.fnets.parameters()] + [p.grad for p in model.head.gates.parameters()]
        assert all(g is not None and g.abs().sum() > 0 for g in backbone) == backbone_moves
        assert backbone_moves or all(g is None for g in backbone)
    weights = out.extras["learner_weights"]
    assert weights.shape == (4, 4, 32)
    norms = weights.detach().pow(2).sum(dim=2)
    assert float(LearnerRowNorm()(out, None).detach()) == pytest.approx(float((norms - 1).pow(2).sum()), rel=1e-5)
    unit = HeadOutput(out.embedding, out.parts, extras={"learner_weights": F.normalize(weights.detach(), dim=2)})
    assert float(LearnerRowNorm()(unit, None)) == pytest.approx(0.0, abs=1e-9)
    w = weights.detach().clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(LearnerRowNorm()(HeadOutput(out.embedding, [], extras={"learner_weights": w}),
                                                   None), w)
    assert torch.allclose(grad, 4 * (w.pow(2).sum(dim=2, keepdim=True) - 1) * w, atol=1e-5)  # 4(|w_r|^2 - 1) w_r
    with pytest.raises(ConfigError, match="needs extras\\['learner_weights'\\]"):
        LearnerRowNorm()(HeadOutput(out.embedding, out.parts), None)


@pytest.mark.parametrize("variant", [{}, {"cam_at": "code", "oam_layers": "code", "cam_form": "pixel",
                                          "spatial_sigma": 0.15, "share_learners": True}])
def test_one_step_of_the_default_objective_gives_every_parameter_a_gradient(variant):
    model = deml(2, 3, embedding_dim=24, **variant)
    objective = build_objective(build_config({"loss": {"options": {"negative_weight": 35}}}).loss, model.head)
    assert (objective.on, objective.parts_reduction) == ("parts", "mean") and len(objective.metric_losses) == 6
    assert objective.weights == {"deml-adversary": 1.0, "activation-decay": 0.014, "learner-row-norm": 0.25}
    total, terms = objective(model(torch.rand(6, 3, 32, 32)), torch.tensor([0, 0, 1, 1, 2, 2]))
    assert torch.isfinite(total) and set(terms) == {"metric", *objective.weights}
    total.backward()
    named = [*model.named_parameters(), *objective.named_parameters()]
    missing = [name for name, p in named if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing


def test_learners_gates_and_adversary_default_to_ten_times_the_rate_unless_the_config_says():
    model = deml(2, 2)
    config = tiny_config(model={"head": "deml"}, train={"lr": 1e-4, "lr_backbone": 1e-5,
                                                        "groups": {"gates": {"lr_scale": 2.0}}})
    objective = build_objective(config.loss, model.head)
    groups = {g["name"]: g for g in build_optimizer(model, objective, config.train).param_groups}
    assert set(groups) == {"pretrained", "gates", "learners", "loss"}
    assert groups["learners"]["lr"] == pytest.approx(1e-3) and groups["loss"]["lr"] == pytest.approx(1e-3)
    assert groups["gates"]["lr"] == pytest.approx(2e-4) and groups["pretrained"]["lr"] == pytest.approx(1e-5)
    assert sum(len(g["params"]) for g in groups.values()) == len(list(model.parameters())) + 3  # + adversary


def test_bad_deml_options_are_named():
    with pytest.raises(ConfigError, match="must be cut at 'input'"):
        create_model("tiny", head="deml", pretrained=False, split="stage1")
    with pytest.raises(ConfigError, match="cam_at names \\['stage9'\\].*stage1, stage2, stage3"):
        create_model("tiny", head="deml", pretrained=False, cam_at="stage9")
    with pytest.raises(ConfigError, match="cam_form must be"):
        create_model("tiny", head="deml", pretrained=False, cam_form="global")
    with pytest.raises(ConfigError, match="no 'paper' layout for backbone 'timm:resnet18'"):
        create_model("timm:resnet18", head="deml", pretrained=False)
    with pytest.raises(ConfigError, match="needs a head with I x J decoupled learners"):
        build_objective(build_config({"loss": {"regularizers": {"deml-hinge": {}}}}).loss,
                        create_model("tiny", pretrained=False).head)


def test_each_root_learner_alone_is_its_scales_learners_concatenated():
    """Table 2's O columns: scale i's embedding is its J parts side by side, / sqrt(J) (unit length); the
    whole embedding is the scales side by side, / sqrt(I)."""
    model = deml(3, 2).eval()
    with torch.no_grad():
        output = model(torch.rand(4, 3, 16, 16))
    scales = model.head.auxiliary_embeddings(output)
    assert list(scales) == ["deml.scale1", "deml.scale2", "deml.scale3"]
    for i, vectors in enumerate(scales.values()):
        assert torch.allclose(vectors, torch.cat(output.parts[2 * i:2 * i + 2], dim=1) / 2**0.5)
        assert torch.allclose(vectors.norm(dim=1), torch.ones(4), atol=1e-6)
    assert torch.allclose(torch.cat(list(scales.values()), dim=1) / 3**0.5, output.embedding, atol=1e-6)
    assert deml(1, 4).head.auxiliary_embeddings(output) == {}  # one scale: the root-learner is the embedding


def test_deml_trains_resumes_and_reloads_through_the_run_directory(tmp_path, capsys):
    import json

    from deepmetric.cli import main
    from deepmetric.training import train
    from deepmetric.workflows import evaluate_run

    options = {"num_scales": 2, "num_branches": 2}
    config = tiny_config(model={"head": "deml", "head_options": options}, train={"steps": 2, "checkpoint_every": 1})
    train(config, tmp_path / "run", progress=False)
    record = evaluate_run(tmp_path / "run", progress=False)
    assert 0 <= record["metrics"]["recall@1"] <= 1
    capsys.readouterr()
    assert main(["evaluate", str(tmp_path / "run"), "--all-embeddings", "--json", "--quiet"]) == 0
    rows = json.loads(capsys.readouterr().out)  # no PCA row: the scales are parts of the embedding
    assert list(rows) == ["embedding", "deml.scale1", "deml.scale2"]
    assert rows["embedding"] == pytest.approx(record["metrics"])
    log = (tmp_path / "run" / "metrics.jsonl").read_text()
    assert all(f'"{term}"' in log for term in ("deml-adversary", "activation-decay", "learner-row-norm"))
    longer = tiny_config(model={"head": "deml", "head_options": options}, train={"steps": 3})
    train(longer, tmp_path / "run", resume=True, progress=False)
    assert '"step": 3' in (tmp_path / "run" / "metrics.jsonl").read_text()


def test_presets_cover_the_ablation_grid_on_four_data_sets_and_the_demo_matches_the_baseline():
    from pathlib import Path

    from deepmetric.config import load_yaml

    configs = Path(__file__).parent.parent / "configs"
    for data, (i, j) in itertools.product(("cub", "cars", "sop", "inshop"),
                                          ((1, 1), (1, 4), (1, 8), (2, 1), (2, 4), (3, 1), (3, 3))):
        config = build_config(load_yaml(configs / "deml" / f"{data}-deml{i}{j}.yaml"))
        assert config.model.head == "deml" and config.data.spec.startswith(data)
        assert (config.model.head_options["num_scales"], config.model.head_options["num_branches"]) == (i, j)
        assert config.loss.options == {"negative_weight": 35} and config.train.weight_decay == 2e-4
        assert config.train.lr == config.train.lr_backbone == 1e-5
        # learners, gates and adversary at 10x come from the head's default groups (J = 1 has no adversary)
        assert config.train.groups == {}
        assert all(DeMLHead.default_groups[g]["lr_scale"] == 10 for g in ("learners", "gates", "loss"))
    for data in ("cub", "cars", "sop", "inshop"):  # the U512 baseline (Tables 1, 3) under DeML's preprocessing
        u512, deml33 = (build_config(load_yaml(configs / "deml" / f"{data}-{n}.yaml")) for n in ("u512", "deml33"))
        assert (u512.model.head, u512.model.embedding_dim, u512.loss.name) == ("gap", 512, "binomial")
        assert u512.loss.options == {"negative_weight": 25} and u512.train.groups == {"new": {"lr_scale": 10}}
        assert (u512.data.classes_per_batch, u512.data.samples_per_class) == (65, 2)
        same = ("spec", "image_size", "resize_range", "test_resize")
        assert all(getattr(u512.data, key) == getattr(deml33.data, key) for key in same)
        assert u512.train.steps == (5000 if data == "cub" else deml33.train.steps)
    demo, baseline = (build_config(load_yaml(configs / name)) for name in ("demo-glyphs-deml.yaml", "demo-glyphs.yaml"))
    assert (demo.train.steps, demo.train.seed, demo.train.lr_backbone) == (baseline.train.steps, baseline.train.seed,
                                                                         baseline.train.lr_backbone)
    assert demo.data == baseline.data and demo.model.head_options["num_scales"] == 2
    learners = DeMLHead.default_groups["learners"]["lr_scale"]
    assert demo.train.lr * learners == baseline.train.lr  # the learners train at the baseline's new-layer rate


def test_the_gap_heads_single_learner_feeds_activation_decay_and_the_row_norm():
    """DeML Table 1's ``Ud + L_act``: the GAP head's linear layer is the one learner; L_act = mean ||W^T f||^2 / 2
    (I = J = 1), L_ntri = sum_r (||w_r||^2 - 1)^2; the released code's path trains only W."""
    torch.manual_seed(0)
    model = create_model("tiny", pretrained=False, embedding_dim=8, freeze_bn=False)
    output = model(torch.rand(5, 3, 16, 16))
    raw = model.head.embed(output.extras["pooled"])
    assert torch.allclose(ActivationDecay()(output, None), raw.pow(2).sum(dim=1).mean() / 2)
    weights = model.head.embed.weight  # (D, C)
    assert torch.allclose(LearnerRowNorm()(output, None), (weights.pow(2).sum(dim=1) - 1).pow(2).sum())
    assert torch.allclose(F.normalize(output.extras["learner_activations"][:, 0], dim=1), output.embedding)
    ActivationDecay(reach_backbone=False)(output, None).backward()
    assert weights.grad.abs().sum() > 0
    assert all(p.grad is None for name, p in model.named_parameters() if not name.startswith("head.embed"))
    bare = create_model("tiny", pretrained=False, embedding_dim=0)
    with pytest.raises(ConfigError, match="needs extras\\['learner_activations'\\].*feature_map, pooled"):
        ActivationDecay()(bare(torch.rand(2, 3, 16, 16)), None)
