"""``deepmetric report``: a self-contained page whose every image is a valid embedded PNG."""

from __future__ import annotations

import base64
import io
import re

import pytest
from PIL import Image

from deepmetric.cli import main
from test_cli import TINY

IMAGE = re.compile(r'<img alt="([^"]*)" src="data:image/png;base64,([A-Za-z0-9+/=]+)">')


def _embedded_pngs(page: str) -> dict[str, Image.Image]:
    """alt text -> decoded image, failing on any <img> that is not a base64 PNG data URI."""
    assert page.count("<img") == len(IMAGE.findall(page)), "an <img> that is not an embedded PNG"
    images = {}
    for alt, data in IMAGE.findall(page):
        raw = base64.b64decode(data, validate=True)
        assert raw.startswith(b"\x89PNG\r\n\x1a\n"), alt
        Image.open(io.BytesIO(raw)).verify()  # raises on a truncated or corrupt PNG
        images[alt] = Image.open(io.BytesIO(raw))
    return images


@pytest.mark.parametrize("head", ["gap", "dgml"])
def test_train_writes_a_report_whose_images_are_valid_pngs(tmp_path, head):
    out = tmp_path / "run"
    assert main(["train", *TINY, "--head", head, "--out", str(out), "eval.baseline=true"]) == 0
    page = (out / "report.html").read_text()
    assert "http://" not in page and "https://" not in page  # nothing fetched from elsewhere
    images = _embedded_pngs(page)
    expected = {"Recall@K curve", "training curves", "retrieval grid", "map of test embeddings"}
    assert expected <= set(images)
    attention = [alt for alt in images if alt.startswith("attention maps")]
    assert bool(attention) == (head == "dgml")  # overlays only for heads that return attention maps
    assert all(image.width > 50 and image.height > 50 for image in images.values())
    assert "untrained backbone" in page and "Resolved config" in page and "head: " + head in page


def test_report_command_and_opt_out(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *TINY, "--out", str(out), "eval.report=false"]) == 0
    assert not (out / "report.html").exists()
    assert main(["report", str(out), "--quiet"]) == 0
    assert str(out / "report.html") in capsys.readouterr().out
    _embedded_pngs((out / "report.html").read_text())
    elsewhere = tmp_path / "pages" / "run.html"  # --out: anywhere, its folder made
    assert main(["report", str(out), "--quiet", "--out", str(elsewhere)]) == 0
    assert str(elsewhere) in capsys.readouterr().out
    _embedded_pngs(elsewhere.read_text())
    assert main(["report", str(out), "--quiet", "--out", str(tmp_path)]) == 2  # a folder: refused, named
    assert f"{tmp_path} is a folder; give the file to write, e.g. {tmp_path / 'report.html'}" in capsys.readouterr().err


def test_the_report_shows_every_embedding_once_evaluated(tmp_path, capsys):
    """After ``evaluate --all-embeddings`` the report adds its table (ABE: each learner, their mean and std)."""
    out = tmp_path / "run"
    assert main(["train", *TINY, "--head", "abe", "--out", str(out), "eval.report=false",
                 "model.head_options.num_learners=2"]) == 0
    assert main(["report", str(out), "--quiet"]) == 0
    assert "Every embedding" not in (out / "report.html").read_text()
    assert main(["evaluate", str(out), "--all-embeddings", "--quiet"]) == 0
    assert main(["report", str(out), "--quiet"]) == 0
    page = (out / "report.html").read_text()
    assert "Every embedding" in page
    assert all(f"<td>{row}</td>" in page for row in ("abe.learner1", "abe.learner2", "abe.learner1-2 mean",
                                                      "abe.learner1-2 std"))


def test_report_of_a_missing_run_is_one_clear_error(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nothing")]) == 2
    assert "error:" in capsys.readouterr().err


def test_train_reuses_the_test_embeddings_of_its_evaluation_for_the_report(tmp_path, monkeypatch):
    import deepmetric.report.html as report_html

    calls = []
    embed = report_html.embed_table
    monkeypatch.setattr(report_html, "embed_table", lambda *a, **k: calls.append(1) or embed(*a, **k))
    out = tmp_path / "run"
    assert main(["train", *TINY, "--out", str(out), "--quiet"]) == 0
    assert calls == []  # the report got the evaluation's embeddings
    from_training = IMAGE.findall((out / "report.html").read_text())
    assert main(["report", str(out), "--quiet"]) == 0
    assert calls == [1]  # on its own, the report embeds the test split
    again = IMAGE.findall((out / "report.html").read_text())
    grid = [data for alt, data in from_training if alt == "retrieval grid"]
    assert grid and grid == [data for alt, data in again if alt == "retrieval grid"]  # same rows, same order


def test_a_collapsed_model_gets_a_report_without_a_map_and_never_reaches_t_sne(tmp_path, monkeypatch):
    """Every test embedding one point (what identical images or a collapsed model give): scikit-learn's Barnes-Hut
    t-SNE divided by zero and crashed the process (exit 139) on such input; the report now says there is no map."""
    import numpy as np
    import sklearn.manifold

    from deepmetric.report import build_report
    from deepmetric.runs.folder import RunDir

    def no_tsne(*args, **kwargs):
        raise AssertionError("t-SNE must not run on coincident points")

    monkeypatch.setattr(sklearn.manifold, "TSNE", no_tsne)
    out = tmp_path / "run"
    assert main(["train", *TINY, "--out", str(out), "--quiet", "eval.report=false"]) == 0
    from deepmetric.runs.table import load_table

    rows = load_table(RunDir(out).config(), only_split="test")[0]
    collapsed = np.tile(np.eye(1, 16, dtype=np.float32), (len(rows), 1))
    page = build_report(out, progress=False, test_embeddings=collapsed).read_text()
    assert "No figure: the" in page and "coincide" in page
    images = _embedded_pngs(page)
    assert {"Recall@K curve", "training curves", "retrieval grid"} <= set(images)  # the rest is intact
    assert "map of test embeddings" not in images


def test_a_failing_figure_leaves_the_rest_of_the_report(tmp_path, monkeypatch):
    import deepmetric.report.figures as figures

    def broken(*args, **kwargs):
        raise ValueError("a drawing bug")

    out = tmp_path / "run"
    monkeypatch.setattr(figures, "retrieval_grid", broken)
    assert main(["train", *TINY, "--out", str(out), "--quiet"]) == 0  # training still succeeds
    page = (out / "report.html").read_text()
    assert "This figure failed (ValueError: a drawing bug)" in page
    assert {"Recall@K curve", "map of test embeddings"} <= set(_embedded_pngs(page))


def test_projection_falls_back_where_t_sne_cannot_run():
    import numpy as np

    from deepmetric.render import project_2d, projection_method

    rng = np.random.default_rng(0)
    assert projection_method(rng.normal(size=(40, 6))) == "tsne"
    few = np.repeat(rng.normal(size=(5, 6)), 8, axis=0)  # 40 points, 5 distinct
    assert projection_method(few) == "pca" and project_2d(few).shape == (40, 2)
    same = np.ones((40, 6))
    assert projection_method(same) == "none" and not project_2d(same).any()
    assert projection_method(np.full((3, 6), np.nan)) == "none" and projection_method(np.zeros((0, 6))) == "none"


EVIL = "<script>alert(1)</script><img src=x onerror=alert(2)>"
REPORT_TAGS = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "p", "table", "tr", "th", "td", "img",
               "pre", "code"}


def _tags_and_attributes(page: str) -> tuple[set[str], set[str]]:
    from html.parser import HTMLParser

    tags: set[str] = set()
    attributes: set[str] = set()

    class Collect(HTMLParser):
        def handle_starttag(self, tag, attrs):
            tags.add(tag)
            attributes.update(name for name, _ in attrs)

    Collect().feed(page)
    return tags, attributes


def test_values_from_run_files_are_escaped_in_the_report(tmp_path):
    """Issue 39: ``metrics-all-embeddings.json``'s ``step`` reached the page unescaped. Markup planted in every
    field the report reads from the run's files (metrics, baseline, every-embedding record, sessions, the run's
    folder name) must come out as text: the page holds only the report's own tags and attributes."""
    import json

    from deepmetric.errors import DeepMetricError
    from deepmetric.report import build_report

    out = tmp_path / f"run{EVIL.replace('/', '')}"
    assert main(["train", *TINY, "--out", str(out), "--quiet", "eval.report=false"]) == 0
    # the reported case: the step of the every-embedding record
    (out / "metrics-all-embeddings.json").write_text(json.dumps({
        "checkpoint": "last", "step": EVIL, "evaluated_at": "now", "embeddings": {"embedding": {"recall@1": 0.5}}}))
    page = build_report(out, progress=False).read_text()
    assert "<script" not in page.lower() and "Every embedding" in page
    # and every other field read from the run's files
    record = json.loads((out / "metrics.json").read_text())
    metrics = {**record["metrics"], EVIL: EVIL, "nmi": EVIL}
    environment = {"at": EVIL, "device": EVIL, "gpu": {"name": EVIL}, "source": EVIL * 3}
    planted = {**record, "checkpoint": EVIL, "step": EVIL, "metrics": metrics, "environment": environment}
    (out / "metrics.json").write_text(json.dumps(planted))
    (out / "metrics-last.json").write_text(json.dumps({**planted, "step": [EVIL]}))
    (out / "baseline.json").write_text(json.dumps({"metrics": metrics, "environment": environment}))
    (out / "metrics-all-embeddings.json").write_text(json.dumps({
        "checkpoint": EVIL, "step": EVIL, "evaluated_at": EVIL,
        "embeddings": {EVIL: metrics, "embedding": {"recall@1": 0.5, EVIL: {"x": EVIL}}}}))
    sessions = json.loads((out / "environment.json").read_text())
    sessions["sessions"] = [{**s, **environment, EVIL: EVIL} for s in sessions["sessions"]]
    (out / "environment.json").write_text(json.dumps(sessions))
    page = build_report(out, progress=False).read_text()
    tags, attributes = _tags_and_attributes(page)
    assert tags <= REPORT_TAGS, tags - REPORT_TAGS
    assert attributes <= {"charset", "alt", "src", "class"}, attributes
    assert "<script" not in page.lower() and "onerror=" not in page.replace("onerror=alert(2)&gt;", "")
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # shown as text
    assert "Every embedding" in page and "Provenance" in page
    (out / "metrics-all-embeddings.json").write_text(json.dumps([EVIL]))  # not the object deepmetric writes
    with pytest.raises(DeepMetricError, match="metrics-all-embeddings.json is not the JSON deepmetric writes"):
        build_report(out, progress=False)


def test_a_small_t_sne_runs_on_one_thread(monkeypatch):
    """The report's t-SNE of a few hundred points took 35 s on a loaded 2-core machine with OpenMP's threads and
    0.5 s with one: up to SINGLE_THREAD_TSNE_UP_TO points it runs inside a one-thread limit."""
    import numpy as np
    from sklearn.manifold import TSNE
    from threadpoolctl import threadpool_info

    from deepmetric.render import project_2d

    seen = []
    fit = TSNE.fit_transform
    monkeypatch.setattr(TSNE, "fit_transform", lambda self, x, *a, **k: seen.append(
        [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "openmp"]) or fit(self, x, *a, **k))
    points = np.random.default_rng(0).normal(size=(60, 5))
    assert project_2d(points).shape == (60, 2)
    assert seen and seen[0] and all(threads == 1 for threads in seen[0])  # OpenMP present, limited to one thread
