"""Property-based tests (hypothesis) for the metrics and for the CSV table loader."""

from __future__ import annotations

import csv
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from deepmetric.data import load_dataset
from deepmetric.errors import DataError
from deepmetric.evaluation import retrieval_metrics

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def labelled_embeddings(draw):
    n_classes = draw(st.integers(2, 6))
    per_class = draw(st.lists(st.integers(2, 5), min_size=n_classes, max_size=n_classes))
    labels = np.repeat(np.arange(n_classes), per_class)
    dim = draw(st.integers(2, 6))
    seed = draw(st.integers(0, 2**31 - 1))
    x = np.random.default_rng(seed).normal(size=(len(labels), dim)).astype(np.float32)
    if draw(st.booleans()):  # exact duplicates within a class: ties that cannot change any metric
        x[1] = x[0]
    return x, labels, seed


@SETTINGS
@given(labelled_embeddings())
def test_metrics_are_invariant_to_reordering_the_set(data):
    x, y, seed = data
    order = np.random.default_rng(seed + 1).permutation(len(y))
    a = retrieval_metrics(x, y, recall_at=(1, 2, 4), nmi=False)
    b = retrieval_metrics(x[order], y[order], recall_at=(1, 2, 4), nmi=False)
    assert all(abs(a[k] - b[k]) < 1e-6 for k in a)


@SETTINGS
@given(labelled_embeddings())
def test_metrics_are_bounded_and_recall_grows_with_k(data):
    x, y, _ = data
    m = retrieval_metrics(x, y, recall_at=(1, 2, 4, 8), nmi=False)
    assert all(0.0 <= v <= 1.0 for v in m.values())
    assert m["recall@1"] <= m["recall@2"] <= m["recall@4"] <= m["recall@8"]
    # per query MAP@R = (1/R) sum_{i<=R} P(i) rel(i) <= (1/R) sum_{i<=R} rel(i) = R-precision, as P(i) <= 1
    assert m["map@r"] <= m["r_precision"] + 1e-6
    assert (m["map@r"] > 0) == (m["r_precision"] > 0)


@SETTINGS
@given(labelled_embeddings(), st.floats(0.01, 100.0))
def test_metrics_ignore_the_scale_of_each_embedding(data, scale):
    x, y, _ = data
    a = retrieval_metrics(x, y, recall_at=(1, 2), nmi=False)
    b = retrieval_metrics(x * scale, y, recall_at=(1, 2), nmi=False)
    assert all(abs(a[k] - b[k]) < 1e-6 for k in a)


@SETTINGS
@given(st.lists(st.integers(2, 6), min_size=2, max_size=7), st.integers(0, 1000))
def test_perfect_embeddings_score_one(per_class, seed):
    labels = np.repeat(np.arange(len(per_class)), per_class)
    centres = np.eye(len(per_class) + 1)[: len(per_class)]
    x = centres[labels] + 1e-4 * np.random.default_rng(seed).normal(size=(len(labels), len(per_class) + 1))
    m = retrieval_metrics(x, labels, recall_at=(1,))
    assert m["recall@1"] == 1.0 and m["map@r"] == 1.0 and m["r_precision"] == 1.0
    assert abs(m["nmi"] - 1.0) < 1e-9


ROW = st.tuples(st.integers(-5, 5), st.sampled_from(["train", "val", "test"]), st.booleans(), st.booleans())


@SETTINGS
@given(st.lists(ROW, min_size=1, max_size=12))
def test_csv_tables_round_trip(rows):
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        with (root / "table.csv").open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["path", "label", "split", "is_query", "is_gallery"])
            for i, (label, split, query, gallery) in enumerate(rows):
                Image.new("L", (4, 4), i).save(root / f"{i}.png")
                writer.writerow([f"{i}.png", label, split, int(query), "true" if gallery else "false"])
        trained = {label for label, split, _, _ in rows if split == "train"}
        test = [r for r in rows if r[1] == "test"]
        zero_shot = (test and any(r[2] for r in test) and any(r[3] for r in test)
                     and not any(label in trained for label, split, _, _ in rows if split != "train"))
        if not zero_shot:  # refused when loaded: the protocol's promises (check_protocol)
            with pytest.raises(DataError, match="test row|also have training rows"):
                load_dataset(f"csv:{root / 'table.csv'}")
            return
        table = load_dataset(f"csv:{root / 'table.csv'}")
        assert table.labels.tolist() == [r[0] for r in rows]
        assert table.splits.tolist() == [r[1] for r in rows]
        assert table.is_query.tolist() == [r[2] for r in rows]
        assert table.is_gallery.tolist() == [r[3] for r in rows]
        assert [Path(p).name for p in table.images] == [f"{i}.png" for i in range(len(rows))]
