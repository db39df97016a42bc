"""JCF (thesis §4.3): the factorised codebook projection, its parameter counts (Table 4.2), k-means
initialisation through the trainer's generic hook."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from deepmetric import create_model
from deepmetric.errors import ConfigError
from deepmetric.models.heads.gap import GAPHead
from deepmetric.models.heads.jcf import JCFHead, jcf_pool, soft_assignment
from deepmetric.models.heads.second_order import SecondOrderHead


def slow_jcf(x, codeword, u, v):
    """sum over locations of z_i = (u_{i,j}^T x)(v_{i,j}^T x), j the location's codeword (eq. 4.16-4.18)."""
    b, length, _ = x.shape
    out = torch.zeros(b, u.shape[2], dtype=x.dtype)
    for n in range(b):
        for loc in range(length):
            j = codeword[n, loc]
            for i in range(u.shape[2]):
                out[n, i] += (u[j, :, i] @ x[n, loc]) * (v[j, :, i] @ x[n, loc])
    return out


def test_one_hot_jcf_is_the_per_codeword_rank_one_bilinear_projection():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 3, generator=g, dtype=torch.float64)
    u, v = (torch.randn(4, 3, 6, generator=g, dtype=torch.float64) for _ in range(2))
    codeword = torch.randint(0, 4, (2, 5), generator=g)
    h = F.one_hot(codeword, 4).double()
    assert torch.allclose(jcf_pool(x, h, h, u, v), slow_jcf(x, codeword, u, v), atol=1e-10)
    # JCF-N-R with A = B = I (R = N) is JCF-N
    eye = torch.eye(4, dtype=torch.float64)
    assert torch.allclose(jcf_pool(x, h @ eye, h @ eye, u, v), jcf_pool(x, h, h, u, v))


def test_the_head_with_a_hard_assignment_matches_the_slow_loop():
    head = JCFHead(3, embedding_dim=6, codewords=4, reduce_dim=None, alpha=1e4).double()
    features = torch.randn(2, 3, 2, 3, dtype=torch.float64)
    x = head.local_features(features)
    with torch.no_grad():
        head.dictionary.copy_(x[0, :4])  # codewords on four of the features
    nearest = torch.cdist(x, head.dictionary[None].expand(2, -1, -1)).argmin(dim=2)
    h = soft_assignment(x.flatten(0, 1), head.dictionary, head.alpha)
    assert torch.allclose(h.max(dim=1).values, torch.ones(12, dtype=torch.float64))
    expected = F.normalize(slow_jcf(x, nearest, head.u.detach(), head.v.detach()), dim=1)
    assert torch.allclose(head(features).embedding, expected, atol=1e-8)


def count(head):
    return sum(p.numel() for p in head.parameters())


@pytest.mark.parametrize("row, n, r, millions", [
    ("JCF (factorisation, no codebook)", 1, None, 0.8), ("JCF-4", 4, None, 1.6), ("JCF-16-4", 16, 4, 1.6),
    ("JCF-16-8", 16, 8, 2.6), ("JCF-16(-16)", 16, None, 4.7), ("JCF-32-4", 32, 4, 1.6), ("JCF-32-8", 32, 8, 2.6),
    ("JCF-32-16", 32, 16, 4.7), ("JCF-32(-32)", 32, None, 8.9),
])
def test_table_4_2_parameter_counts(row, n, r, millions):
    """2048-d features reduced to d = 256, D = 512 (the sizes the table's counts imply; thesis §4.3.7)."""
    with torch.device("meta"):
        head = JCFHead(2048, 512, codewords=n, rank=r, reduce_dim=256)
    assert round(count(head) / 1e6, 1) == millions, row
    projectors = n if r is None else r
    assert count(head) == 2048 * 256 + 2 * 512 * 256 * projectors + n * 256 + (2 * n * r if r else 0)


def test_table_4_2_baselines_parameter_counts():
    """Baseline GAP -> 512: 1M; BP (256² -> 512): 34M; BP + a 4-word codebook: 135M (8 words: ~270M, §4.3.7)."""
    with torch.device("meta"):
        assert round(count(GAPHead(torch.nn.Identity(), 2048, 512)) / 1e6) == 1
        assert round(count(SecondOrderHead(2048, 512, reduce_dim=256)) / 1e6) == 34
        assert round(count(JCFHead(2048, 512, codewords=4, factorization="none")) / 1e6) == 135
        assert round(count(JCFHead(2048, 512, codewords=8, factorization="none")) / 1e7) == 27


@pytest.mark.parametrize("options", [{}, {"rank": 3}, {"factorization": "none"}])
def test_every_jcf_parameter_gets_a_gradient(options):
    model = create_model("tiny", head="jcf", pretrained=False, embedding_dim=8, codewords=5, reduce_dim=6,
                         **options)
    output = model(torch.rand(4, 3, 32, 32))
    assert output.embedding.shape == (4, 8) and output.extras["feature_map"].shape[1] == 32
    output.embedding.sum(0).pow(2).sum().backward()
    named = dict(model.head.named_parameters())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in named.values()), \
        [k for k, p in named.items() if p.grad is None or p.grad.abs().sum() == 0]


def test_kmeans_initialisation_and_netvlad_alpha():
    from sklearn.cluster import KMeans

    head = JCFHead(4, 8, codewords=3, reduce_dim=None)
    g = torch.Generator().manual_seed(0)
    centres = torch.tensor([[5.0, 0, 0, 0], [0, 5.0, 0, 0], [0, 0, 5.0, 0]])
    batches = [(centres[torch.randint(0, 3, (2, 16), generator=g)] + 0.1 * torch.randn(2, 16, 4, generator=g))
               .permute(0, 2, 1).reshape(2, 4, 4, 4) for _ in range(3)]
    head.initialize(iter(batches))
    points = torch.cat([head.local_features(b).flatten(0, 1) for b in batches]).numpy()
    reference = KMeans(n_clusters=3, n_init=1, random_state=0).fit(points)
    assert np.allclose(head.dictionary.detach().numpy(), reference.cluster_centers_, atol=1e-5)
    distances = np.sort(reference.transform(points) ** 2, axis=1)
    assert float(head.alpha) == pytest.approx(math.log(100) / np.mean(distances[:, 1] - distances[:, 0]), rel=1e-4)
    fixed = JCFHead(4, 8, codewords=3, reduce_dim=None, alpha=2.0)
    fixed.initialize(iter(batches))
    assert float(fixed.alpha) == 2.0
    with pytest.raises(ConfigError, match="cannot initialise 100 codewords"):
        JCFHead(4, 8, codewords=100, reduce_dim=None).initialize(iter(batches[:1]))


def test_trainer_initialises_any_head_that_asks_before_training_only(tmp_path, monkeypatch):
    """The trainer's hook is generic: it calls ``head.initialize`` with trunk features when ``init_images``."""
    from deepmetric.training import train
    from helpers import tiny_config

    calls = []

    def initialize(self, feature_batches):
        calls.append([f.shape for f in feature_batches])

    monkeypatch.setattr(GAPHead, "init_images", 10)
    monkeypatch.setattr(GAPHead, "initialize", initialize)
    train(tiny_config(train={"steps": 2}, eval={"batch_size": 4}), tmp_path / "run", progress=False)
    assert calls == [[torch.Size([4, 32, 2, 2])] * 2 + [torch.Size([2, 32, 2, 2])]]
    train(tiny_config(train={"steps": 3}), tmp_path / "run", resume=True, progress=False)
    assert len(calls) == 1  # resuming loads the initialised weights instead


def test_jcf_option_errors():
    with pytest.raises(ConfigError, match="factorization must be 'jcf' or 'none'"):
        JCFHead(8, factorization="full")
    with pytest.raises(ConfigError, match="rank \\(JCF-N-R\\) needs factorization=jcf"):
        JCFHead(8, rank=2, factorization="none")


def test_jcf_head_trains_and_evaluates_through_the_cli(tmp_path, capsys):
    from deepmetric.cli import main
    from deepmetric.runs.model import load_run_model
    from helpers import assert_trained_metrics_are_evaluates
    from test_cli import TINY

    out = tmp_path / "run"
    assert main(["train", *TINY, "--head", "jcf", "--out", str(out), "model.head_options.codewords=4",
                 "model.head_options.rank=2", "model.head_options.reduce_dim=6",
                 "model.head_options.init_images=40"]) == 0
    assert "trained (last, step 4)" in capsys.readouterr().out
    assert_trained_metrics_are_evaluates(out, capsys)  # finite, and what `deepmetric evaluate` recomputes
    model, _, _ = load_run_model(out, "last")
    assert model.head.rank == 2 and float(model.head.alpha) != 1.0  # the k-means-initialised α was saved
