"""The statistics of a study's tables: per variant the mean, sample std and 95% t-interval over its repeats; against
each reference variant (``compare:``) the difference of means, Welch's t-test across repeats and a paired bootstrap
over test queries, both Holm-corrected across every comparison of the table.

**Which test decides the marks.** ▲ / ▼ mark a difference whose Welch p-value, Holm-corrected across all the
table's comparisons, is below ``ALPHA`` (0.05). Welch's test treats each repeat (seed or split) as one observation,
so it measures the difference against the variance of *training*: what another seed would give. That is the claim a
table of methods makes ("method A trains better models than B"), and the variance the field reports (mean ± std
over seeds; Musgrave et al., "A Metric Learning Reality Check", 2020). The paired bootstrap resamples the *test
queries* of the same trained runs: it measures how precisely the test set pins down the difference between those
particular runs, not whether other seeds would reproduce it. With thousands of queries it calls almost every
difference of a point significant, including differences that flip sign from one seed to the next; it is shown as a
second column (its interval and p-value), so that a reader sees both sources of uncertainty, and a difference that
Welch marks but whose bootstrap interval contains 0 is worth a second look. With 3 seeds Welch's test has 2 to 4
degrees of freedom and is conservative: a difference must be several stds of the mean wide to be marked, which is
the honest consequence of 3 seeds.

Definitions (``values``: one figure per repeat; fractions, as the runs' files hold them):

- mean; std with ddof = 1 (0 for one repeat); the 95% t-interval ``mean ± t_{0.975, n-1} · std / √n`` (none for
  one repeat);
- difference = variant's mean − reference's mean;
- Welch: ``scipy.stats.ttest_ind(variant, reference, equal_var=False)``, two-sided; none unless both have two
  repeats or more and a spread;
- paired bootstrap: over the repeats both variants ran (the same seed, or split) whose per-query files ranked the
  same queries against the same gallery (``evaluation.per_query``), each query's paired difference is averaged
  over those repeats, ``d_q = mean_s (x_{s,q} − y_{s,q})`` (x: the variant's per-query score, 1 or 0 for Recall@1,
  AP@R for MAP@R; the queries every metric counts); ``RESAMPLES`` resamples of the queries with replacement (one
  ``numpy.random.default_rng`` stream seeded by ``BOOTSTRAP_SEED`` and the two variants' names, so a table is the
  same on every run and each comparison's stream does not depend on the others) give ``d*_b``, the mean of the
  resampled ``d_q``; the interval is their 2.5 and 97.5 percentiles, the two-sided p-value
  ``(1 + #{|d*_b − d| >= |d|}) / (RESAMPLES + 1)`` with ``d`` the mean of ``d_q`` (the resamples shifted to the null
  of no difference; Efron & Tibshirani, An Introduction to the Bootstrap, §16.4);
- Holm: the m p-values of a family sorted ``p_(1) <= … <= p_(m)``, ``p_(i)`` adjusted to
  ``max_{j <= i} min(1, (m − j + 1) p_(j))``; Welch's and the bootstrap's are two families, each over every
  comparison of the table that has one.
"""

from __future__ import annotations

import math
import warnings
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

ALPHA = 0.05
"""The family-wise error rate the marks keep (after Holm)."""

CONFIDENCE = 0.95
"""The level of every interval."""

RESAMPLES = 10_000
"""Bootstrap resamples of the test queries per comparison."""

BOOTSTRAP_SEED = 0

CHUNK = 500
"""Resamples drawn at once, at most; fewer for many queries, so that a chunk holds at most ``CHUNK_VALUES`` indices
(the draws do not depend on the chunking)."""

CHUNK_VALUES = 2**24
"""Indices drawn at once, at most: 16 M (128 MB of int64; SOP's 60,502 queries: 277 resamples a chunk)."""


@dataclass(frozen=True)
class Summary:
    """A variant's figure over its repeats: mean, std (ddof = 1), count and the 95% t-interval (None for n = 1)."""

    mean: float
    std: float
    n: int
    low: float | None
    high: float | None


def summarise(values: Sequence[float], confidence: float = CONFIDENCE) -> Summary:
    """Mean, sample std and the t-interval ``mean ± t_{(1+confidence)/2, n-1} · std / √n`` of ``values``."""
    from scipy import stats

    x = np.asarray(values, dtype=np.float64)
    if len(x) == 0:
        raise ValueError("no values to summarise")
    mean = float(x.mean())
    if len(x) < 2:
        return Summary(mean, 0.0, 1, None, None)
    std = float(x.std(ddof=1))
    half = float(stats.t.ppf((1 + confidence) / 2, len(x) - 1)) * std / math.sqrt(len(x))
    return Summary(mean, std, len(x), mean - half, mean + half)


def welch_p(variant: Sequence[float], reference: Sequence[float]) -> float | None:
    """Two-sided p-value of Welch's t-test of equal means (``scipy.stats.ttest_ind(..., equal_var=False)``); None
    when either side has fewer than two values, or neither has any spread (the test is undefined)."""
    from scipy import stats

    a, b = np.asarray(variant, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    if len(a) < 2 or len(b) < 2 or (np.ptp(a) == 0 and np.ptp(b) == 0):  # scipy says 0 (or NaN) when neither varies
        return None
    with warnings.catch_warnings():  # scipy's "catastrophic cancellation" warning on nearly equal values
        warnings.simplefilter("ignore", RuntimeWarning)
        p = float(stats.ttest_ind(a, b, equal_var=False).pvalue)
    return None if math.isnan(p) else p


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of the p-values of one family (None stays None and does not count in m)."""
    present = [(p, i) for i, p in enumerate(p_values) if p is not None]
    adjusted: list[float | None] = [None] * len(p_values)
    m = len(present)
    running = 0.0
    for rank, (p, index) in enumerate(sorted(present)):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[index] = running
    return adjusted


@dataclass(frozen=True)
class Bootstrap:
    """A paired bootstrap of a difference: the observed mean paired difference, its percentile interval, the
    two-sided p-value and how many repeats were paired."""

    difference: float
    low: float
    high: float
    p: float
    pairs: int


def stream_seed(*names: str, seed: int = BOOTSTRAP_SEED) -> list[int]:
    """The bootstrap stream's seed of a comparison: ``seed`` and a CRC-32 of ``names`` (stable across runs and
    Python versions, unlike ``hash``)."""
    return [seed, zlib.crc32("\0".join(names).encode("utf-8"))]


def paired_bootstrap(variant: Sequence[np.ndarray], reference: Sequence[np.ndarray], resamples: int = RESAMPLES,
                     seed: int | Sequence[int] = BOOTSTRAP_SEED, confidence: float = CONFIDENCE) -> Bootstrap:
    """The paired bootstrap over queries of the module docstring: ``variant[s]`` and ``reference[s]`` are the two
    runs of repeat ``s``, each a (Q,) array of per-query scores of the same queries in the same order."""
    if not variant or len(variant) != len(reference):
        raise ValueError("the bootstrap needs one reference run per variant run (paired by repeat)")
    x = np.stack([np.asarray(v, dtype=np.float64) for v in variant])
    y = np.stack([np.asarray(r, dtype=np.float64) for r in reference])
    if x.shape != y.shape or x.shape[1] == 0:
        raise ValueError(f"paired runs must score the same queries, got {x.shape} and {y.shape}")
    paired = (x - y).mean(axis=0)  # (Q,) each query's difference, averaged over the paired repeats
    observed = float(paired.mean())
    rng = np.random.default_rng(seed)
    queries = len(paired)
    means = np.empty(resamples)
    chunk = max(1, min(CHUNK, CHUNK_VALUES // queries))
    for start in range(0, resamples, chunk):
        stop = min(start + chunk, resamples)
        means[start:stop] = paired[rng.integers(0, queries, size=(stop - start, queries))].mean(axis=1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    extreme = int(np.count_nonzero(np.abs(means - observed) >= abs(observed)))
    return Bootstrap(observed, float(low), float(high), (1 + extreme) / (resamples + 1), len(variant))
