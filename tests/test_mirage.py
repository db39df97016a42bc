"""MIRAGE (thesis ch. 6): labels, batch composition, who updates what, the plain pipeline when off, resume."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from deepmetric.cli import main
from deepmetric.config import build_config
from deepmetric.errors import ConfigError
from deepmetric.generators import MirageGenerator, build_generator
from deepmetric.generators.mirage import reconstruction_loss
from deepmetric.io.tensors import unprefixed
from deepmetric.losses import build_objective
from deepmetric.runs.checkpoint import load_checkpoint
from deepmetric.training import train
from deepmetric.training.setup import build_model
from helpers import tiny_config

NUM_CLASSES = 5


def setup(**options):
    torch.manual_seed(0)
    config = tiny_config()
    model = build_model(config)
    generator = build_generator("mirage", options, head=model.head, num_classes=NUM_CLASSES, batch_size=12, lr=1e-3,
                                seed=0)
    images = torch.rand(12, 3, 16, 16)
    labels = torch.tensor([0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4])
    return config, model, generator, images, labels


def embedding_head(embedding_dim, normalized):
    """A stand-in head without a pooled encoder: MIRAGE works in its embedding space (l2 or not)."""
    return SimpleNamespace(pooled_dim=None, embedding_dim=embedding_dim, normalized=normalized)


def snapshot(params):
    return [p.detach().clone() for p in params]


def changed(before, params):
    return [not torch.equal(a, p.detach()) for a, p in zip(before, params, strict=True)]


def test_virtual_labels_never_share_a_real_label_and_rows_are_unit_vectors():
    _, model, generator, images, labels = setup(mode="both", virtual_ratio=2.0)
    output = model(images)
    batch = generator.generate(output, labels)
    assert generator.num_virtual == 10 and generator.extra_classes == 10
    real = set(labels.tolist())
    examples = batch.labels[:batch.examples]
    virtual, training = examples[examples >= NUM_CLASSES], examples[examples < NUM_CLASSES]
    assert len(virtual) == 6 and len(training) == 6
    proxies = batch.labels[batch.examples:]  # the prototypes of the batch's classes and of the drawn virtual ones
    assert proxies[:3].tolist() == [0, 2, 4] and set(proxies[3:].tolist()) == set(virtual.tolist())
    assert not set(virtual.tolist()) & set(range(NUM_CLASSES))  # never a training label
    assert set(training.tolist()) <= real  # training-class rows come from the batch's classes (they have positives)
    assert torch.allclose(batch.embeddings.norm(dim=1), torch.ones(len(batch.labels)), atol=1e-5)  # E is l2
    eps = generator.sample_noise(4)
    assert torch.allclose(generator.noisy(generator.prototypes[:4], eps).norm(dim=1), torch.ones(4))  # G's input


@pytest.mark.parametrize(("options", "expected"), [
    ({"mode": "both"}, (6, 6)), ({"mode": "both", "batch_ratio": 2.0}, (12, 12)),
    ({"mode": "tcg", "batch_ratio": 0.5}, (6, 0)), ({"mode": "tcg", "batch_ratio": 4.0}, (48, 0)),
    ({"mode": "virtual"}, (0, 12)), ({"mode": "virtual", "virtual_ratio": 0.0}, (0, 0)),
    ({"mode": "both", "virtual_fraction": 0.25}, (9, 3)), ({"mode": "none"}, (0, 0)),
])
def test_batch_composition_follows_the_ratios(options, expected):
    _, model, generator, images, labels = setup(**options)
    batch = generator.generate(model(images), labels)
    generated = torch.empty(0) if batch is None else batch.labels[:batch.examples]
    n_t, n_v = int((generated < NUM_CLASSES).sum()), int((generated >= NUM_CLASSES).sum())
    assert (n_t, n_v) == expected
    assert n_t + n_v == round(options.get("batch_ratio", 1.0) * len(labels)) or expected == (0, 0)
    virtual_ratio = options.get("virtual_ratio", 1.0) if options["mode"] in ("both", "virtual") else 0
    assert generator.num_virtual == round(virtual_ratio * NUM_CLASSES)
    if n_v:  # virtual rows come in classes of K = 4 (the real batch's samples per class), so they have positives
        _, counts = torch.unique(generated[generated >= NUM_CLASSES], return_counts=True)
        assert counts.min() >= min(4, n_v) and len(counts) == max(1, n_v // 4)


def test_gradients_go_where_the_thesis_says():
    config, model, generator, images, labels = setup(mode="both")
    objective = build_objective(config.loss, model.head, NUM_CLASSES + generator.extra_classes)
    output = model(images)
    batch = generator.generate(output, labels)
    loss, _ = objective(output, labels, batch.rows())
    loss.backward()
    # L_DML: backbone, encoder E (the head's embedding layer) and prototypes; not G, not D
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.trunk.parameters())
    assert model.head.embed.weight.grad.abs().sum() > 0
    grad = generator.prototypes.grad
    assert grad[:NUM_CLASSES].abs().sum() > 0 and grad[NUM_CLASSES:].abs().sum() > 0
    assert all(p.grad is None for p in generator.generator.parameters())
    assert all(p.grad is None for p in generator.discriminator_parameters())

    head_grad = model.head.embed.weight.grad.clone()
    features, real = output.extras["pooled"].detach(), output.embedding.detach()
    g_params, d_params = list(generator.generator.parameters()), generator.discriminator_parameters()
    g0, d0 = snapshot(g_params), snapshot(d_params)
    generator.discriminator_step(real, labels)  # D step: D moves, G does not
    assert all(changed(d0, d_params)) and not any(changed(g0, g_params))
    d1 = snapshot(d_params)
    proto_grad = generator.prototypes.grad.clone()
    generator.generator_step(features, real)  # G step: G moves, D does not, E gets nothing
    assert all(changed(g0, g_params)) and not any(changed(d1, d_params))
    assert torch.equal(model.head.embed.weight.grad, head_grad)
    adversarial = generator.prototypes.grad - proto_grad  # only the virtual prototypes get the adversarial gradient
    assert adversarial[:NUM_CLASSES].abs().sum() == 0 and adversarial[NUM_CLASSES:].abs().sum() > 0


def test_reconstruction_is_l1_plus_squared_l2():
    f, g = torch.randn(3, 7), torch.randn(3, 7)
    expected = sum(float((f[i] - g[i]).abs().sum() + ((f[i] - g[i]) ** 2).sum()) for i in range(3)) / 3
    assert float(reconstruction_loss(f, g)) == pytest.approx(expected, rel=1e-6)


def model_tensors(path):
    tensors, state = load_checkpoint(path)
    return unprefixed("model", tensors), tensors, state


@pytest.mark.parametrize("options", [{"mode": "none"}, {"mode": "tcg", "batch_ratio": 0.0}])
def test_with_generation_off_training_is_the_plain_pipeline(tmp_path, options):
    train(tiny_config(train={"steps": 2}), tmp_path / "plain", progress=False)
    train(tiny_config(train={"steps": 2}, generator={"name": "mirage", "options": options}), tmp_path / "off",
          progress=False)
    a, _, _ = model_tensors(tmp_path / "plain/checkpoints/last.safetensors")
    b, tensors, _ = model_tensors(tmp_path / "off/checkpoints/last.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(k.startswith("generator.") for k in tensors)


def test_mirage_changes_training_and_logs_its_terms(tmp_path):
    """(Its exact resumption, generator state and noise stream included, is in test_resume.py.)"""
    config = tiny_config(train={"steps": 4}, generator={"name": "mirage", "options": {"diagnostic_images": 0}})
    train(config, tmp_path / "mirage", progress=False)
    train(tiny_config(train={"steps": 4}), tmp_path / "plain", progress=False)
    _, a, _ = model_tensors(tmp_path / "mirage/checkpoints/last.safetensors")
    _, c, _ = model_tensors(tmp_path / "plain/checkpoints/last.safetensors")
    assert not torch.equal(a["model.head.embed.weight"], c["model.head.embed.weight"])
    log = [json.loads(line) for line in (tmp_path / "mirage/metrics.jsonl").read_text().splitlines()]
    assert all({"mirage_rec", "mirage_disc", "mirage_adv_g"} <= set(r) for r in log if "loss" in r)


def test_options_are_checked():
    with pytest.raises(ConfigError, match="has no option 'batch_ration'.*did you mean 'batch_ratio'"):
        build_config({"generator": {"name": "mirage", "options": {"batch_ration": 1}}})
    with pytest.raises(ConfigError, match="unknown generator 'mirag'"):
        build_config({"generator": {"name": "mirag"}})
    with pytest.raises(ConfigError, match="mode must be one of"):
        _, model, *_ = setup()
        MirageGenerator(model.head, 5, 12, mode="all")


def test_cli_flag_and_2d_diagnostics(tmp_path, capsys):
    """--generator on the digits data in a 2-D latent space without l2: the thesis' Fig. 6.3b picture."""
    out = tmp_path / "run"
    code = main(["train", "--data", "digits", "--backbone", "tiny", "--steps", "3", "--quiet", "--no-test",
                 "--generator", "mirage", "--out", str(out), "model.pretrained=false", "model.embedding_dim=2",
                 "model.head_options={l2: false}", "loss.name=contrastive-euclidean", "loss.options={unit: false}",
                 "data.image_size=16", "data.classes_per_batch=3", "data.samples_per_class=4", "train.lr=1e-3",
                 "generator.options.diagnostic_images=200"])
    capsys.readouterr()
    assert code == 0
    summary = json.loads((out / "generator.json").read_text())
    assert 0.0 <= summary["nearest_prototype_is_virtual"] <= 1.0
    assert summary["training_prototypes"] == 5 and summary["virtual_prototypes"] == 5
    assert summary["pictures"] == ["mirage-prototypes.png", "mirage-latent2d.png"]
    for name in ("mirage-prototypes.png", "mirage-latent2d.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_head_without_a_pooled_encoder_trains_in_its_embedding_space(tmp_path):
    """ABE (two learners, metric loss per part): f = the embedding, E = l2; generated rows are cut into parts."""
    config = tiny_config(train={"steps": 2}, model={"head": "abe", "head_options": {"num_learners": 2}},
                         generator={"name": "mirage", "options": {"diagnostic_images": 0}})
    train(config, tmp_path / "abe", progress=False)
    _, tensors, _ = model_tensors(tmp_path / "abe/checkpoints/last.safetensors")
    assert tensors["generator.module.generator.2.weight"].shape == (16, 512)  # G decodes to the 16-d embedding
    assert json.loads((tmp_path / "abe/generator.json").read_text())["virtual_prototypes"] == 5


def test_the_discriminator_learns_when_its_learning_rate_allows():
    """The demo's D loss stayed near chance (200 steps at lr 1e-4): the wiring is not the cause. On fixed real
    embeddings, with D and G at lr 1e-2, D's loss falls far below chance within 100 steps."""
    import math

    _, model, generator, images, labels = setup(mode="both", lr_discriminator=1e-2, lr_generator=1e-2)
    with torch.no_grad():
        output = model(images)
    chance = 2 * math.log(2) + 2 * math.log(NUM_CLASSES + generator.num_virtual)  # BCE twice, CE twice
    losses = []
    for _ in range(100):
        generator.generate(output, labels)
        losses.append(float(generator.step(output, labels)["mirage_disc"]))
    assert losses[0] == pytest.approx(chance, rel=0.05)
    assert min(losses) < 0.3 * chance


def generated_examples(generator):
    """The round's virtual examples x~_v = E(G(n(p_v + eps))) (eq. 6.2) with their rows y_v, without gradients."""
    rows, eps = generator._virtual
    with torch.no_grad():
        return generator.encode(generator.decode(generator.noisy(generator.prototypes[rows], eps))), rows


def adversarial_state(generator, real, labels):
    """D's view of the round's fixed inputs: (margin, L_adv). The margin is mean D_g logit of the real embeddings
    minus that of the virtual examples x~_v = E(G(n(p_v + eps))) (eq. 6.2; D_g's sigmoid ranks them the same way);
    L_adv is §6.3.4's adversarial loss (the unnumbered equation after eq. 6.3), recomputed by hand."""
    import torch.nn.functional as F

    fake, rows = generated_examples(generator)
    with torch.no_grad():
        real_logit, real_class = generator.discriminate(real)
        fake_logit, fake_class = generator.discriminate(fake)
        l_adv = (F.softplus(-real_logit).mean() + F.softplus(fake_logit).mean()  # -log D_g(real) - log(1 - D_g(fake))
                 + F.cross_entropy(real_class, labels) + F.cross_entropy(fake_class, rows))
    return float(real_logit.mean() - fake_logit.mean()), float(l_adv)


def own_class_probability(generator):
    """Mean D_c(x~_v)[y_v]: the discriminator's probability of each generated example's own class."""
    fake, rows = generated_examples(generator)
    with torch.no_grad():
        return float(torch.softmax(generator.discriminate(fake)[1], dim=1).gather(1, rows[:, None]).mean())


def fixed_round(**options):
    """One alternating round's fixed inputs: real embeddings/features of a fixed batch, and x~_v's rows and noise."""
    _, model, generator, images, labels = setup(mode="both", **options)
    with torch.no_grad():
        output = model(images)
    generator.generate(output, labels)  # draws the virtual rows and their noise (kept in generator._virtual)
    return generator, output.extras["pooled"], output.embedding, labels


def test_the_discriminator_step_scores_real_above_generated():
    """D minimises L_adv (§6.3.4, -log D_g(E(f_t)) - log(1 - D_g(x~_v)) - ...): on fixed inputs each D step lowers
    L_adv, and D comes to score the real embeddings above the generated ones (D_g(real) > 1/2 > D_g(x~_v)), from
    a start where it cannot tell them apart. Swapping the real/fake targets makes the margin negative."""
    generator, _, real, labels = fixed_round(lr_discriminator=1e-3)
    margin, l_adv = adversarial_state(generator, real, labels)
    assert abs(margin) < 0.1  # a fresh D: no preference
    history, reported = [(margin, l_adv)], []
    for _ in range(30):
        reported.append(float(generator.discriminator_step(real, labels)))
        history.append(adversarial_state(generator, real, labels))
    margins, losses = zip(*history, strict=True)
    assert margins[-1] > 1.0 and margins[-1] > margins[0] + 1.0, margins
    assert all(b < a for a, b in zip(losses, losses[1:], strict=False)), losses  # L_adv falls at every D step
    assert reported == pytest.approx(losses[:-1], rel=1e-5)  # each step minimised the L_adv of its inputs
    fake, _ = generated_examples(generator)
    with torch.no_grad():
        assert (torch.sigmoid(generator.discriminate(real)[0]) > 0.5).all()
        assert (torch.sigmoid(generator.discriminate(fake)[0]) < 0.5).all()


@pytest.mark.parametrize("gan_loss", ["minimax", "nonsaturating"])
def test_the_generator_step_fools_the_discriminator(gan_loss):
    """G maximises L_adv with D fixed (§6.3.5; ``nonsaturating`` minimises -log D_g(x~_v) - log(1 - D_c(x~_v)[y_v])
    instead, which points the same way): after D has learnt to tell real from generated, each G step (reconstruction
    weight 0, so only the adversarial term acts) lowers D's margin real - generated and raises L_adv, and D's
    weights do not move. With the generator's sign flipped, G would help D: the margin would grow. Both losses also
    make D's classifier less sure of each generated example's own class (D_c(x~_v)[y_v] falls)."""
    generator, features, real, labels = fixed_round(lr_discriminator=1e-3, lr_generator=1e-3, gan_loss=gan_loss,
                                                    reconstruction_weight=0.0)
    for _ in range(30):
        generator.discriminator_step(real, labels)
    d_before = snapshot(generator.discriminator_parameters())
    history = [adversarial_state(generator, real, labels)]
    own = [own_class_probability(generator)]
    assert history[0][0] > 1.0  # D prefers the real embeddings
    for _ in range(10):
        terms = generator.generator_step(features, real)
        history.append(adversarial_state(generator, real, labels))
        own.append(own_class_probability(generator))
        if gan_loss == "minimax":  # the logged term is L_adv's generated half, before the step
            assert float(terms["mirage_adv_g"]) > 0
    margins, losses = zip(*history, strict=True)
    assert all(b < a for a, b in zip(margins, margins[1:], strict=False)), margins  # it falls at every G step
    assert margins[-1] < margins[0] - 0.2, margins
    assert losses[-1] > losses[0], losses  # G pushed L_adv up
    assert own[-1] < own[0] - 0.01, own  # and D_c's belief in the generated rows' own classes down
    assert not any(changed(d_before, generator.discriminator_parameters()))


@pytest.mark.parametrize("gan_loss", ["minimax", "nonsaturating"])
def test_the_generators_class_term_alone_makes_the_classifier_doubt(gan_loss):
    """The class half of G's objective on its own (D_g silenced: zero weights, so its term has no gradient): G's steps
    lower D_c(x~_v)[y_v], under minimax (maximising CE) and non-saturating (minimising -log(1 - D_c[y_v])) alike."""
    generator, features, real, labels = fixed_round(lr_discriminator=1e-3, lr_generator=1e-3, gan_loss=gan_loss,
                                                    reconstruction_weight=0.0)
    for _ in range(30):
        generator.discriminator_step(real, labels)
    with torch.no_grad():
        generator.disc_real.weight.zero_()
        generator.disc_real.bias.zero_()
    own = [own_class_probability(generator)]
    for _ in range(5):
        generator.generator_step(features, real)
        own.append(own_class_probability(generator))
    assert all(b < a for a, b in zip(own, own[1:], strict=False)), own


def test_noise_and_the_generators_input_follow_eq_6_2():
    """eps ~ N(0, Sigma) with Sigma = (noise_std^2 / D) I, so E||eps||^2 = noise_std^2, drawn from the generator's
    own seeded stream (torch's global stream does not matter); the input of G is n(p + eps), the l2-normalised sum."""
    _, _, generator, _, _ = setup(mode="both", noise_std=0.5)
    state = generator.noise.get_state()
    eps = generator.sample_noise(20000)
    assert eps.shape == (20000, 16)
    assert float(eps.pow(2).sum(1).mean()) == pytest.approx(0.25, rel=0.03)
    torch.manual_seed(123)
    generator.noise.set_state(state)
    assert torch.equal(generator.sample_noise(20000), eps)
    p, e = generator.prototypes[:3].detach(), eps[:3]
    torch.testing.assert_close(generator.noisy(p, e), (p + e) / (p + e).norm(dim=1, keepdim=True))


def test_the_generator_learns_to_reconstruct_and_the_prototypes_take_their_step():
    """Without virtual rows G minimises w_rec L_rec (eq. 6.3) alone: it falls over G steps on fixed features. After
    a round's L_DML backward, ``step`` moves the prototypes (Adam) and clears their gradient."""
    config, model, generator, images, labels = setup(mode="tcg", lr_generator=1e-3)
    with torch.no_grad():
        output = model(images)
    features, real = output.extras["pooled"], output.embedding
    losses = [float(generator.generator_step(features, real)["mirage_rec"]) for _ in range(20)]
    assert losses[-1] < 0.9 * losses[0], losses
    objective = build_objective(config.loss, model.head, NUM_CLASSES + generator.extra_classes)
    output = model(images)
    batch = generator.generate(output, labels)
    objective(output, labels, batch.rows())[0].backward()
    before = generator.prototypes.detach().clone()
    generator.step(output, labels)
    assert not torch.equal(before, generator.prototypes.detach()) and generator.prototypes.grad is None


def test_the_generators_checkpoint_restores_its_state_and_noise_stream():
    """``checkpoint_state`` / ``load_checkpoint_state``: a generator of another seed that loads the state draws the
    same noise and virtual classes, and its next round ends with the same weights and Adam moments."""
    _, model, generator, images, labels = setup(mode="both")
    with torch.no_grad():
        output = model(images)
    for _ in range(2):
        generator.generate(output, labels)
        generator.step(output, labels)
    tensors, state = generator.checkpoint_state()
    tensors = {k: v.clone() for k, v in tensors.items()}  # as read from a file: no storage shared with generator
    other = build_generator("mirage", {"mode": "both"}, head=model.head, num_classes=NUM_CLASSES, batch_size=12,
                            lr=1e-3, seed=5)
    other.load_checkpoint_state(tensors, state)
    for g in (generator, other):
        g.generate(output, labels)
        g.step(output, labels)
    a, b = generator.checkpoint_state()[0], other.checkpoint_state()[0]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_nearest_prototype_is_virtual_counts_training_prototypes_with_a_virtual_neighbour():
    """§6.4.1's diagnostic (80 % on CUB): the fraction of training prototypes whose nearest other prototype (cosine,
    the embeddings being l2-normalised) is virtual; 0 without virtual classes."""
    _, _, generator, _, _ = setup(mode="both", virtual_ratio=0.4)  # 5 training, 2 virtual prototypes
    angle = torch.deg2rad(torch.tensor([0.0, 40.0, 80.0, 200.0, 300.0, 95.0, 205.0]))
    with torch.no_grad():
        generator.prototypes.zero_()
        generator.prototypes[:, 0], generator.prototypes[:, 1] = 3 * torch.cos(angle), 3 * torch.sin(angle)
    # nearest: 0 -> 1 (40), 1 -> 0 or 2 (40, training), 2 -> 5 (15, virtual), 3 -> 6 (5, virtual), 4 -> 0 (60)
    assert generator.nearest_prototype_is_virtual() == pytest.approx(2 / 5)
    _, _, one, _, _ = setup(mode="both", virtual_ratio=0.2)  # a single virtual prototype, next to prototype 0
    with torch.no_grad():
        one.prototypes.copy_(torch.eye(16)[[0, 3, 4, 5, 6, 0]] + 0.1 * torch.eye(16)[[1, 1, 1, 1, 1, 2]])
    assert one.num_virtual == 1 and one.nearest_prototype_is_virtual() == pytest.approx(1 / 5)
    _, _, plain, _, _ = setup(mode="tcg")
    assert plain.num_virtual == 0 and plain.nearest_prototype_is_virtual() == 0.0


def test_each_option_reaches_the_network_or_optimiser_it_names():
    """MirageOptions' documented knobs (generator output, discriminator heads, learning rates, Adam's betas) are the
    ones the built networks and optimisers carry; the prototypes start near the unit sphere (randn / sqrt(D))."""
    from deepmetric.generators.mirage import MirageOptions

    _, model, generator, *_ = setup(mode="both", virtual_ratio=0.4)
    assert isinstance(generator.generator[-1], torch.nn.ReLU)  # pooled features are post-ReLU: G ends in a ReLU
    assert generator.disc_real.out_features == 1 and generator.num_virtual == 2
    assert generator.disc_class.out_features == NUM_CLASSES + 2
    assert isinstance(generator.disc_trunk[-1], torch.nn.ReLU)
    lrs = {name: [g["lr"] for g in opt.param_groups] for name, opt in generator.optimizers.items()}
    assert lrs == {"prototypes": [1e-3], "generator": [1e-4], "discriminator": [1e-4]}  # lr=1e-3 given to setup()
    torch.manual_seed(0)
    tuned = build_generator("mirage", {"lr_generator": 2e-4, "lr_discriminator": 3e-4, "lr_prototypes": 5e-2,
                                       "betas": [0.3, 0.9], "generator_output": "linear"},
                            head=model.head, num_classes=NUM_CLASSES, batch_size=12, lr=1e-3, seed=0)
    assert isinstance(tuned.generator[-1], torch.nn.Linear)
    for name, lr in (("prototypes", 5e-2), ("generator", 2e-4), ("discriminator", 3e-4)):
        assert tuned.optimizers[name].param_groups[0]["lr"] == lr
    assert tuned.optimizers["generator"].param_groups[0]["betas"] == (0.3, 0.9)
    assert tuned.optimizers["discriminator"].param_groups[0]["betas"] == (0.3, 0.9)
    wide = MirageGenerator(embedding_head(256, normalized=False), 40, 12, seed=3)
    assert (wide.prototypes.detach().pow(2).sum(1).mean() - 1).abs() < 0.05  # E||p||^2 = 1
    assert isinstance(wide.generator[-1], torch.nn.Linear)  # embeddings can be negative: no final ReLU
    x = torch.randn(4, 256) * 3
    assert torch.equal(wide.encode(x), x)  # no l2 for a head that does not normalise
    unit = MirageGenerator(embedding_head(8, normalized=True), 4, 12)
    assert torch.allclose(unit.encode(x[:, :8]).norm(dim=1), torch.ones(4))
    for good in ({"projection": "pca"}, {"generator_output": "relu"}, {"generator_output": "linear"}):
        MirageOptions(**good)
    for edge in ({"virtual_fraction": 0.0}, {"virtual_fraction": 1.0}, {"noise_std": 0.0}):  # the bounds are allowed
        MirageOptions(**edge)
    for bad in ({"batch_ratio": -1}, {"virtual_ratio": -1}, {"virtual_fraction": 1.5}, {"virtual_fraction": -0.1},
                {"noise_std": -1}, {"projection": "umap"}, {"generator_output": "tanh"}):
        with pytest.raises(ConfigError, match="generator 'mirage'"):
            MirageOptions(**bad)


@pytest.mark.parametrize("gan_loss", ["minimax", "nonsaturating"])
def test_the_generators_gradients_are_those_of_its_objective(gan_loss):
    """G's step follows the gradient of its own objective, written out here from §6.3.4: minimax descends
    w_rec L_rec - w_adv L_adv^G with L_adv^G = -log(1 - D_g(x~_v)) + CE(D_c(x~_v), y_v); non-saturating descends
    w_rec L_rec + w_adv (-log D_g(x~_v) - mean log(1 - D_c(x~_v)[y_v])). The two differ in value and gradient."""
    import torch.nn.functional as F

    generator, features, real, _ = fixed_round(gan_loss=gan_loss, reconstruction_weight=0.5, adversarial_weight=2.0)
    rows, eps = generator._virtual
    params = list(generator.generator.parameters())
    rec = reconstruction_loss(features, generator.generator(real))
    logit, classes = generator.discriminate(generator.encode(generator.generator(generator.noisy(
        generator.prototypes[rows], eps))))
    if gan_loss == "minimax":
        objective = 0.5 * rec - 2.0 * (F.softplus(logit).mean() + F.cross_entropy(classes, rows))
    else:
        own = torch.softmax(classes, dim=1).gather(1, rows[:, None]).squeeze(1)
        objective = 0.5 * rec + 2.0 * (F.softplus(-logit).mean() - torch.log(1 - own).mean())
    expected = torch.autograd.grad(objective, params)
    seen = []
    generator.optimizers["generator"].register_step_pre_hook(
        lambda optimizer, *_: seen.extend(p.grad.clone() for p in params))
    generator.generator_step(features, real)
    assert len(seen) == len(expected)
    for got, want in zip(seen, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_a_saturated_class_discriminator_leaves_the_non_saturating_step_finite():
    """-log(1 - D_c[y_v]) is infinite where D_c is certain (softmax 1.0 in float32): the clamp keeps G's step finite."""
    generator, features, real, _ = fixed_round(gan_loss="nonsaturating")
    rows, _ = generator._virtual
    with torch.no_grad():
        generator.disc_class.weight.zero_()
        generator.disc_class.bias.zero_()
        generator.disc_class.bias[rows] = 200.0  # every generated row's own class (one virtual class here)
    assert own_class_probability(generator) == 1.0
    generator.generator_step(features, real)
    assert all(torch.isfinite(p).all() for p in generator.generator.parameters())


def test_the_adversarial_gradient_of_the_prototypes_adds_to_their_metric_loss_gradient():
    """With ``adversarial_prototypes`` the virtual prototypes' L_adv gradient is added to the gradient the trainer's
    L_DML backward left in ``prototypes.grad`` (both step together in ``step``)."""
    import copy

    generator, features, real, _ = fixed_round(adversarial_prototypes=True)
    other = copy.deepcopy(generator)
    generator.generator_step(features, real)
    adversarial = generator.prototypes.grad.clone()  # from None: the adversarial gradient alone
    assert adversarial.abs().sum() > 0
    metric = torch.randn_like(adversarial)
    other.prototypes.grad = metric.clone()
    other.generator_step(features, real)
    torch.testing.assert_close(other.prototypes.grad, metric + adversarial)


def test_the_normalisations_follow_the_head_unless_an_option_says_otherwise():
    """n(.) of G's input is l2 when the head's embeddings are (``normalize_input`` unset) and as the option says
    otherwise; the prototype rows added to the batch are l2-normalised only for a normalising head."""
    z = torch.randn(6, 8) * 3
    eps = torch.zeros(6, 8)
    for normalized, option, unit in ((True, None, True), (True, False, False), (False, None, False),
                                     (False, True, True)):
        generator = MirageGenerator(embedding_head(8, normalized), 4, 12, normalize_input=option)
        norms = generator.noisy(z, eps).norm(dim=1)
        assert torch.allclose(norms, torch.ones(6)) == unit, (normalized, option)
    raw = MirageGenerator(embedding_head(8, normalized=False), 4, 12, mode="both")
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    batch = raw.generate(SimpleNamespace(embedding=torch.randn(6, 8)), labels)
    proxies = batch.embeddings[batch.examples:]
    torch.testing.assert_close(proxies, raw.prototypes[batch.labels[batch.examples:]].detach())


def test_virtual_per_class_sets_the_size_of_the_virtual_classes():
    """``virtual_per_class`` rows per drawn virtual class (0: the real batch's K = 4): 6 rows in classes of 2 -> 3
    classes; of K -> 1 class."""
    for option, classes in ((2, 3), (0, 1)):
        _, model, generator, images, labels = setup(mode="both", virtual_ratio=2.0, virtual_per_class=option)
        batch = generator.generate(model(images), labels)
        virtual = batch.labels[:batch.examples][batch.labels[:batch.examples] >= NUM_CLASSES]
        assert len(virtual) == 6 and len(torch.unique(virtual)) == classes, option
