"""Second-order pooling (thesis ch. 3): pooling identities, matrix square roots and their gradients,
sketches, and the ``bilinear`` head."""

from __future__ import annotations

import pytest
import torch

from deepmetric import create_model
from deepmetric.errors import ConfigError
from deepmetric.models.heads.second_order import FACTORIZATIONS, SecondOrderHead
from deepmetric.models.high_order.matrix import (
    covariance,
    cross,
    matrix_power,
    newton_schulz_sqrt,
    second_order,
    signed_sqrt,
)
from deepmetric.models.high_order.sketch import TensorSketch


def spd(c=6, low=0.5, high=2.0, seed=0, dtype=torch.float64):
    """A symmetric positive-definite matrix with well-separated eigenvalues in [low, high]."""
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(c, c, generator=g, dtype=dtype))
    return q @ torch.diag(torch.linspace(low, high, c, dtype=dtype)) @ q.t()


def eig_sqrt_autograd(sigma):
    """The eigen route differentiated by torch's own autograd (the reference)."""
    values, vectors = torch.linalg.eigh(sigma)
    return vectors @ torch.diag_embed(values.sqrt()) @ vectors.transpose(-1, -2)


def test_pooling_formulas():
    x, y = torch.randn(2, 4, 9), torch.randn(2, 3, 9)
    slow = sum(x[:, :, i, None] * x[:, None, :, i] for i in range(9)) / 9
    assert torch.allclose(second_order(x), slow, atol=1e-6)
    mu = x.mean(dim=2)
    assert torch.allclose(covariance(x), slow - mu[:, :, None] * mu[:, None, :], atol=1e-6)
    assert torch.allclose(cross(x, y), torch.einsum("bin,bjn->bij", x, y) / 9, atol=1e-6)
    assert torch.allclose(signed_sqrt(torch.tensor([-4.0, 0.0, 9.0])), torch.tensor([-2.0, 0.0, 3.0]), atol=1e-4)


def test_newton_schulz_matches_the_eigendecomposition_square_root():
    sigma = torch.stack([spd(seed=0), 3.0 * spd(seed=1, low=0.2)])
    reference = eig_sqrt_autograd(sigma)
    assert torch.allclose(newton_schulz_sqrt(sigma, iterations=20), reference, atol=1e-8)
    assert torch.allclose(matrix_power(sigma, 0.5), reference, atol=1e-10)
    assert torch.allclose(reference @ reference, sigma, atol=1e-10)
    # iSQRT-COV's 5 iterations are an approximation, not the square root
    assert (newton_schulz_sqrt(sigma, iterations=5) - reference).abs().max() > 1e-3


def test_square_root_gradients_match_autograd_of_the_eigen_route():
    sigma = spd(seed=2).requires_grad_()
    weights = torch.randn(6, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)

    def grad_of(function):  # the gradient on symmetric matrices (eigh's backward assumes Σ symmetric)
        (g,) = torch.autograd.grad((function(sigma) * weights).sum(), sigma)
        return (g + g.t()) / 2

    reference = grad_of(eig_sqrt_autograd)
    assert torch.allclose(grad_of(lambda s: newton_schulz_sqrt(s, iterations=25)), reference, atol=1e-7)
    assert torch.allclose(grad_of(lambda s: matrix_power(s, 0.5)), reference, atol=1e-9)
    # and for another power, against a finite difference of the forward
    assert torch.autograd.gradcheck(lambda s: matrix_power((s + s.t()) / 2, 0.3), (sigma.detach().requires_grad_(),))


def test_eigen_backward_stays_finite_with_repeated_eigenvalues():
    """Eq. 3.31's K_ij = 1/(λ_i - λ_j) is infinite for Σ = I; the divided difference tends to f'(λ)."""
    sigma = torch.eye(4, dtype=torch.float64).requires_grad_()
    weights = torch.randn(4, 4, dtype=torch.float64)
    (grad,) = torch.autograd.grad((matrix_power(sigma, 0.5) * weights).sum(), sigma)
    assert torch.isfinite(grad).all()
    # d sqrt(Σ) at Σ = I in direction E is E / 2, so the gradient is sym(weights) / 2
    assert torch.allclose(grad, (weights + weights.t()) / 4, atol=1e-12)
    (torch_grad,) = torch.autograd.grad((eig_sqrt_autograd(sigma) * weights).sum(), sigma)
    assert not torch.isfinite(torch_grad).all()  # what the unstable backward does


def test_tensor_sketch_approximates_the_squared_inner_product_in_expectation():
    x = torch.tensor([[0.9, -0.4, 1.1, 0.3, 0.2], [0.7, 0.5, 0.8, -0.6, 0.1]])
    products, norms = [], []
    for seed in range(400):
        phi = TensorSketch(5, 16, seed=seed)(x)
        products.append(float(phi[0] @ phi[1]))
        norms.append(float(phi[0] @ phi[0]))
    for values, target in ((products, float(x[0] @ x[1]) ** 2), (norms, float(x[0] @ x[0]) ** 2)):
        values = torch.tensor(values, dtype=torch.float64)
        assert abs(values.mean() - target) < 4 * values.std() / len(values) ** 0.5


def test_random_maclaurin_second_order_estimates_the_pooled_gram():
    """<mean φ(X), mean φ(Y)> estimates <Σ_X, Σ_Y>_F = mean_ij <x_i, y_j>^2 (eq. 3.43)."""
    head_x = torch.randn(1, 5, 2, 2)
    head_y = torch.randn(1, 5, 2, 2)
    sx, sy = second_order(head_x.flatten(2)), second_order(head_y.flatten(2))
    target = float((sx * sy).sum())
    estimates = []
    for seed in range(300):
        head = SecondOrderHead(5, 8, factorization="random_maclaurin", reduce_dim=None, sketch_dim=64,
                               signed_sqrt=False, seed=seed)
        estimates.append(float(head._factorized(head_x)[0] @ head._factorized(head_y)[0]))
    estimates = torch.tensor(estimates, dtype=torch.float64)
    assert abs(estimates.mean() - target) < 4 * estimates.std() / len(estimates) ** 0.5


@pytest.mark.parametrize("factorization", ["random_maclaurin", "tensor_sketch", "hpbp"])
def test_factorized_covariance_centres_each_image_over_its_locations(factorization):
    """pooling=covariance factorises Σ = mean_ij (x_ij - μ)(x_ij - μ)^T (eq. 3.2), μ the image's mean over its
    locations: the same statistic as second-order pooling of the explicitly centred map, and blind to a per-channel
    shift of the whole map."""
    options = {"factorization": factorization, "reduce_dim": None, "sketch_dim": 32, "rank": 12, "seed": 0}
    covariance_head = SecondOrderHead(5, 8, pooling="covariance", **options)
    second_order_head = SecondOrderHead(5, 8, pooling="second_order", **options)
    second_order_head.load_state_dict(covariance_head.state_dict())
    features = torch.randn(2, 5, 3, 3)
    centred = features - features.mean(dim=(2, 3), keepdim=True)
    shifted = features + torch.randn(2, 5, 1, 1) * 3
    with torch.no_grad():
        expected = second_order_head._factorized(centred)
        assert torch.allclose(covariance_head._factorized(features), expected, atol=1e-5)
        assert torch.allclose(covariance_head._factorized(shifted), expected, atol=1e-4)
        assert not torch.allclose(second_order_head._factorized(features), expected, atol=1e-3)


@pytest.mark.parametrize("options", [
    {"pooling": "second_order"}, {"pooling": "covariance", "matrix_norm": "power"},
    {"pooling": "second_order", "matrix_norm": "newton_schulz"}, {"pooling": "bilinear"},
    *[{"factorization": f} for f in FACTORIZATIONS if f != "none"],
    {"pooling": "covariance", "factorization": "hpbp"},
])
def test_every_form_trains_every_parameter_in_one_step(options):
    model = create_model("tiny", head="bilinear", pretrained=False, embedding_dim=8, reduce_dim=6, sketch_dim=32,
                         rank=12, **options)
    images = torch.rand(6, 3, 32, 32)
    output = model(images)
    assert output.embedding.shape == (6, 8)
    assert torch.allclose(output.embedding.norm(dim=1), torch.ones(6), atol=1e-5)
    assert output.extras["feature_map"].shape[1] == model.head.feature_channels == 32
    output.embedding.sum(0).pow(2).sum().backward()
    named = dict(model.head.named_parameters())
    assert named and all(p.grad is not None and p.grad.abs().sum() > 0 for p in named.values()), \
        [n for n, p in named.items() if p.grad is None or p.grad.abs().sum() == 0]


def test_representation_is_the_normalised_matrix():
    head = SecondOrderHead(4, 3, pooling="covariance", matrix_norm="power", reduce_dim=None)
    features = torch.randn(2, 4, 3, 3)
    expected = signed_sqrt(matrix_power(covariance(features.flatten(2)), 0.5).flatten(1))
    assert torch.allclose(head.representation(features), torch.nn.functional.normalize(expected, dim=1), atol=1e-5)


def test_bad_combinations_are_named():
    with pytest.raises(ConfigError, match="matrix_norm 'power' needs the symmetric c x c matrix"):
        SecondOrderHead(8, factorization="tensor_sketch", matrix_norm="power")
    with pytest.raises(ConfigError, match="factorization must be one of"):
        SecondOrderHead(8, factorization="sketch")
    with pytest.raises(ConfigError, match="two-stream pooling"):
        SecondOrderHead(8, pooling="bilinear", factorization="rank_one")


def test_bilinear_head_trains_and_evaluates_through_the_cli(tmp_path, capsys):
    from deepmetric.cli import main
    from helpers import assert_trained_metrics_are_evaluates
    from test_cli import TINY

    out = tmp_path / "run"
    assert main(["train", *TINY, "--head", "bilinear", "--out", str(out), "model.head_options.reduce_dim=6",
                 "model.head_options.matrix_norm=newton_schulz"]) == 0
    assert "trained (last, step 4)" in capsys.readouterr().out
    assert_trained_metrics_are_evaluates(out, capsys)  # finite, and what `deepmetric evaluate` recomputes


def test_gap_head_can_pool_the_trunk_features_as_a_first_order_control():
    model = create_model("tiny", pretrained=False, embedding_dim=8, split="stage2", use_tail=False)
    images = torch.rand(2, 3, 32, 32)
    features = model.trunk(model.normalize(images))
    assert features.shape[1] == 16 and model.head.feature_channels == 16
    expected = torch.nn.functional.normalize(model.head.embed(features.mean(dim=(2, 3))), dim=1)
    assert torch.allclose(model(images).embedding, expected, atol=1e-6)
    assert not list(model.head.tail.parameters())
    assert create_model("tiny", pretrained=False, embedding_dim=8, split="stage2").head.feature_channels == 32


def test_matrix_functions_treat_a_batch_as_its_matrices_one_by_one():
    """A head pools one matrix per image, so eq. 3.28's ``U Δ^α U^T`` (and its custom backward, fed an upstream
    gradient that is not symmetric) and Newton-Schulz (eq. 3.42, each matrix normalised by its own trace) on a
    (B, c, c) batch equal the same functions applied matrix by matrix."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(3, 5, 7, generator=g, dtype=torch.float64)
    sigma = a @ a.transpose(-1, -2) / 7 * torch.tensor([1.0, 10.0, 0.1], dtype=torch.float64)[:, None, None]
    weights = torch.randn(3, 5, 5, generator=g, dtype=torch.float64)
    for f in (lambda s: matrix_power(s, 0.5), lambda s: matrix_power(s, 0.3),
              lambda s: newton_schulz_sqrt(s, iterations=8)):
        batch = sigma.clone().requires_grad_()
        out = f(batch)
        (out * weights).sum().backward()
        for i in range(3):
            one = sigma[i].clone().requires_grad_()
            single = f(one)
            (single * weights[i]).sum().backward()
            assert torch.allclose(out[i], single, atol=1e-10) and torch.allclose(batch.grad[i], one.grad, atol=1e-9)


def test_signed_sqrt_is_shifted_to_zero_at_zero():
    """``sign(v) (sqrt(|v| + eps) - sqrt(eps))`` (the element-wise normalisation after eq. 3.28), with an eps large
    enough to see: odd, 0 at 0, and sqrt(|v| + eps) - sqrt(eps) elsewhere."""
    v = torch.tensor([-4.0, 0.0, 9.0], dtype=torch.float64)
    expected = torch.tensor([-(4.01**0.5 - 0.1), 0.0, 9.01**0.5 - 0.1], dtype=torch.float64)
    assert torch.allclose(signed_sqrt(v, eps=0.01), expected, atol=1e-12)


def test_tensor_sketch_hashes_are_a_function_of_its_seed_and_not_saved():
    """TensorSketch's count-sketch hashes and signs (Pham & Pagh) are drawn from its own seeded stream, whatever
    torch's global stream holds, so they are rebuilt identically and kept out of checkpoints; the hashes reach every
    one of the D bins and the signs are +-1."""
    torch.manual_seed(1)
    a = TensorSketch(400, 16, seed=3)
    torch.manual_seed(2)
    b, c = TensorSketch(400, 16, seed=3), TensorSketch(400, 16, seed=4)
    assert all(torch.equal(x, y) for x, y in zip(a.buffers(), b.buffers(), strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(a.buffers(), c.buffers(), strict=True))
    assert a.state_dict() == {}
    for sketch in (a.sketch1, a.sketch2):  # (in_features, D): one signed 1 per row
        assert set(sketch.unique().tolist()) == {-1.0, 0.0, 1.0} and (sketch.abs().sum(1) == 1).all()
        assert (sketch.abs().sum(0) > 0).all()  # column 0 included
