"""The benchmarks' rounds: each round starts one place further along the list of set-ups, and ``eval_speed.py``
pairs each phase with the bare products of its own round (on noisy machines the bound drifts within a run)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = str(Path(__file__).resolve().parents[1] / "benchmarks")


@pytest.fixture(scope="module")
def eval_speed() -> ModuleType:
    """``benchmarks/eval_speed.py`` as a module (the benchmarks are scripts beside their ``_results`` helpers)."""
    sys.path.insert(0, BENCHMARKS)
    try:
        return importlib.import_module("eval_speed")
    finally:
        sys.path.remove(BENCHMARKS)


def test_each_round_starts_one_place_further_and_every_set_up_leads_once(eval_speed):
    rotated = eval_speed.rotated
    items = ["a", "b", "c"]
    orders = [rotated(items, turn) for turn in range(4)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    assert sorted(order[0] for order in orders[:3]) == items


def _runs(phase: str, seconds: list[float]) -> list[dict]:
    return [{"phase": phase, "seconds": s, "peak_rss_mb": 100.0 + i, "metrics": {}} for i, s in enumerate(seconds)]


def test_a_phase_is_paired_with_the_faster_bare_products_of_its_own_round(eval_speed):
    summary, add_ratios = eval_speed.summary, eval_speed.add_ratios
    # round 2 runs everything twice as slowly (a busy host): the paired ratio does not move, the pooled one would
    rows = {"matmul-torch": summary(_runs("matmul-torch", [10.0, 20.0, 10.0])),
            "matmul-numpy": summary(_runs("matmul-numpy", [12.0, 16.0, 13.0])),
            "knn-torch": summary(_runs("knn-torch", [11.0, 17.6, 11.0]))}
    add_ratios(rows, rounds=3)
    knn = rows["knn-torch"]
    assert knn["seconds"] == 11.0 and knn["round_seconds"] == [11.0, 17.6, 11.0]
    assert knn["peak_rss_mb"] == 102.0
    assert knn["round_ratios"] == pytest.approx([1.1, 1.1, 1.1])  # round 2's bound is numpy's 16 s, not torch's 20
    assert knn["median_round_ratio"] == pytest.approx(1.1)
    assert knn["ratio_to_bare_products"] == pytest.approx(11.0 / 10.0)  # median 11 s over the faster median, 10 s
    assert rows["matmul-numpy"]["round_ratios"] == pytest.approx([1.2, 1.0, 1.3])
    assert knn["pml_over_this"] is None


def test_gpu_phases_are_paired_with_the_gpus_bare_products_and_pml_with_itself(eval_speed):
    summary, add_ratios = eval_speed.summary, eval_speed.add_ratios
    rows = {"matmul-torch": summary(_runs("matmul-torch", [10.0])),
            "matmul-cuda": summary(_runs("matmul-cuda", [0.1])),
            "knn-cuda": summary(_runs("knn-cuda", [0.15])),
            "pml": summary(_runs("pml", [40.0]))}
    add_ratios(rows, rounds=1)
    assert rows["knn-cuda"]["ratio_to_bare_products"] == pytest.approx(1.5)
    assert rows["pml"]["ratio_to_bare_products"] == pytest.approx(4.0)
    assert rows["knn-cuda"]["pml_over_this"] == pytest.approx(40.0 / 0.15)
    assert rows["pml"]["median_round_ratio"] == pytest.approx(4.0)
