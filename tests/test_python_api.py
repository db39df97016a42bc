"""The Python API of a trained run (issue 37, item 2): ``deepmetric.load_run(...).embed`` gives what ``deepmetric
embed`` writes, for files, PIL images, arrays and tensors; ``deepmetric.Index`` builds, saves, opens, extends and
searches the folders ``deepmetric index`` writes, and searches them as ``deepmetric search`` does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import deepmetric
from deepmetric.cli import main
from deepmetric.errors import CheckpointError, DataError, IndexStoreError
from deepmetric.retrieval.store import read_manifest
from deepmetric.runs.folder import RunDir
from serve_helpers import make_gallery


def cli(capsys, *argv) -> str:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def odd_mode_images(folder: Path) -> dict[str, Path]:
    """Files of the modes a plain ``convert("RGB")`` gets wrong or that need a conversion: RGBA with real
    transparency (alpha 0 over bright noise), a palette with a transparent index, grayscale, CMYK."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    rgba = rng.integers(0, 256, size=(22, 31, 4), dtype=np.uint8)
    rgba[..., 3] = np.where(np.arange(31) < 15, 0, np.linspace(60, 255, 31).astype(np.uint8))[None, :]
    palette = Image.fromarray(rng.integers(0, 256, size=(27, 18, 3), dtype=np.uint8)).quantize(16)
    pixels = np.array(palette)
    pixels[:, :9] = 0  # half of the image is the transparent index
    palette = Image.fromarray(pixels, mode="P")
    palette.putpalette(Image.fromarray(rng.integers(0, 256, size=(4, 4, 3), dtype=np.uint8)).quantize(16)
                       .getpalette())
    files = {"rgba": folder / "a-rgba.png", "palette": folder / "b-palette.png", "gray": folder / "c-gray.png",
             "cmyk": folder / "d-cmyk.tiff"}
    Image.fromarray(rgba, mode="RGBA").save(files["rgba"])
    palette.save(files["palette"], transparency=0)
    Image.fromarray(rng.integers(0, 256, size=(19, 25), dtype=np.uint8), mode="L").save(files["gray"])
    Image.fromarray(rng.integers(0, 256, size=(24, 20, 4), dtype=np.uint8), mode="CMYK").save(files["cmyk"])
    return files


def cli_embeddings(capsys, run, images: Path, out: Path) -> tuple[np.ndarray, list[str]]:
    cli(capsys, "embed", run, "--images", images, "--out", out, "--quiet")
    return np.load(out), out.with_suffix(".paths.txt").read_text().splitlines()


@pytest.fixture(scope="module")
def loaded(tiny_run):
    return deepmetric.load_run(tiny_run)


def test_embed_of_files_equals_deepmetric_embed_on_rgba_palette_gray_and_cmyk(tiny_run, loaded, tmp_path, capsys):
    files = odd_mode_images(tmp_path / "odd")
    assert {Image.open(f).mode for f in files.values()} == {"RGBA", "P", "L", "CMYK"}
    expected, paths = cli_embeddings(capsys, tiny_run, tmp_path / "odd", tmp_path / "e.npy")
    assert paths == [str(files[k]) for k in ("rgba", "palette", "gray", "cmyk")]

    got = loaded.embed(paths)  # str paths
    assert got.dtype == np.float32 and got.shape == (4, loaded.embedding_dim) == expected.shape
    np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)
    np.testing.assert_allclose(loaded.embed([Path(p) for p in reversed(paths)]), expected[::-1], atol=1e-6, rtol=0)
    np.testing.assert_allclose(loaded.embed(files["cmyk"]), expected[3:], atol=1e-6, rtol=0)  # one item: (1, D)

    # the transparency matters here: PIL's plain convert("RGB") gives another embedding for both transparent files
    for row, key in ((0, "rgba"), (1, "palette")):
        plain = loaded.embed(np.asarray(Image.open(files[key]).convert("RGB")))[0]
        assert float(plain @ expected[row]) < 0.999


def test_embed_of_pil_images_arrays_and_tensors_equals_deepmetric_embed(tiny_run, loaded, tmp_path, capsys):
    files = odd_mode_images(tmp_path / "odd")
    expected, _ = cli_embeddings(capsys, tiny_run, tmp_path / "odd", tmp_path / "e.npy")
    opened = [Image.open(files[k]) for k in ("rgba", "palette", "gray", "cmyk")]
    np.testing.assert_allclose(loaded.embed(opened), expected, atol=1e-6, rtol=0)

    arrays = [np.asarray(opened[0]),                      # (H, W, 4) RGBA, composited on white
              np.asarray(opened[1].convert("RGBA")),      # the palette's colours, its transparent index alpha 0
              np.asarray(opened[2]),                      # (H, W) gray
              np.asarray(opened[3].convert("RGB"))]       # (H, W, 3) RGB
    assert [a.shape[2] if a.ndim == 3 else 1 for a in arrays] == [4, 4, 1, 3]
    np.testing.assert_allclose(loaded.embed(arrays), expected, atol=1e-6, rtol=0)

    tensors = [torch.from_numpy(arrays[0].copy()).permute(2, 0, 1),          # uint8 (4, H, W)
               torch.from_numpy(arrays[1].copy()).permute(2, 0, 1).float() / 255,  # floats in [0, 1]
               torch.from_numpy(arrays[2].copy()),                           # (H, W)
               torch.from_numpy(arrays[3].copy()).permute(2, 0, 1)]
    np.testing.assert_allclose(loaded.embed(tensors), expected, atol=1e-6, rtol=0)
    mixed = [str(files["rgba"]), opened[1], arrays[2], tensors[3]]
    np.testing.assert_allclose(loaded.embed(mixed), expected, atol=1e-6, rtol=0)


def test_embed_batches_with_a_progress_bar_on_stderr_and_keeps_the_order(tiny_run, loaded, tmp_path, capsys):
    make_gallery(tmp_path / "gallery", 7)
    expected, paths = cli_embeddings(capsys, tiny_run, tmp_path / "gallery", tmp_path / "g.npy")
    got = loaded.embed(paths, batch_size=2, progress=True)
    out, err = capsys.readouterr()
    assert out == "" and "embedding" in err  # the bar is on standard error, never on standard output
    np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)
    assert loaded.embed([]).shape == (0, loaded.embedding_dim)
    batch = np.stack([np.full((20, 20, 3), v, np.uint8) for v in (0, 128, 255)])  # a 4-D array is a batch
    assert loaded.embed(batch).shape == (3, loaded.embedding_dim)


def test_load_run_selects_checkpoints_as_the_cli_and_describes_the_run(tiny_run, loaded):
    run_dir = RunDir(tiny_run)
    assert loaded.checkpoint == run_dir.checkpoint("auto") == run_dir.last  # the tiny run has no validation split
    assert loaded.path == Path(tiny_run) and loaded.step == 2 and loaded.device == torch.device("cpu")
    assert (loaded.embedding_dim, loaded.image_size, loaded.test_resize) == (16, 16, "resize")
    assert loaded.config.model.backbone == "tiny" and "last.safetensors" in repr(loaded)
    assert deepmetric.load_run(tiny_run, "last").checkpoint == run_dir.last
    assert deepmetric.load_run(tiny_run, checkpoint=run_dir.last, device="cpu").checkpoint == run_dir.last
    with pytest.raises(CheckpointError, match="best.safetensors does not exist"):
        deepmetric.load_run(tiny_run, "best")


def test_embed_refuses_what_is_not_an_image_in_one_line(loaded, tmp_path):
    for images, message in ((tmp_path, "is a folder"), (np.zeros((4, 4, 3), np.float32), "float32 array"),
                            ([np.zeros((4, 4, 2), np.uint8)], r"images\[0\] is an array of shape \(4, 4, 2\)"),
                            (torch.full((3, 4, 4), 2.0), r"outside \[0, 1\]"), ([3], "images\\[0\\] is an int;"),
                            ([{}], "images\\[0\\] is a dict;"), (b"\x89PNG", r"^images are bytes; .*io.BytesIO"),
                            ([tmp_path / "missing.png"], "does not exist"),
                            (5, r"^the image is an int; expected an image: a path, a PIL image, a uint8 numpy")):
        with pytest.raises(DataError, match=message):
            loaded.embed(images)


def test_a_device_torch_does_not_know_is_one_error(tiny_run):
    """``load_run(run, device="gpu")`` ended in torch's RuntimeError listing twenty device types."""
    from deepmetric.errors import DeepMetricError

    with pytest.raises(DeepMetricError, match=r"^device 'gpu' is not one torch knows: give auto, cpu, cuda or cuda:N$"):
        deepmetric.load_run(tiny_run, device="gpu")


def test_the_package_exports_the_run_api_and_imports_it_on_first_use():
    code = "import sys, deepmetric\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False"]  # `import deepmetric` stays light
    from deepmetric import Index, TrainedRun, api, load_run

    assert (Index, TrainedRun, load_run) == (api.Index, api.TrainedRun, api.load_run)
    assert {"Index", "TrainedRun", "load_run"} <= set(deepmetric.__all__)


@pytest.mark.parametrize("module", ["deepmetric.retrieval.search", "deepmetric.retrieval.service", "deepmetric.api",
                                    "deepmetric.export", "deepmetric.viz.explain", "deepmetric.report.html"])
def test_search_serve_and_the_run_api_never_load_the_trainer(module):
    """Inference reads runs through ``deepmetric.runs``: importing it loads neither the trainer nor the losses nor the
    example generators (import-linter checks the imports as written; this checks what a fresh process loads)."""
    code = (f"import sys, {module}\n"
            "print(*sorted({n.split('.')[1] for n in sys.modules if n.startswith('deepmetric.')}))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert "runs" in loaded
    assert not {"training", "losses", "generators", "studies", "cli"} & set(loaded), loaded


def test_index_round_trip_build_save_open_search_add(tiny_run, loaded, tmp_path):
    files = make_gallery(tmp_path / "gallery", 8)
    index = deepmetric.Index.build(loaded, tmp_path / "gallery", tmp_path / "index")
    assert index.path == tmp_path / "index" and len(index) == 8 and index.kind == "flat"
    stored = json.loads((tmp_path / "index" / "index.json").read_text())
    assert stored["sources"] == ["../gallery"] and stored["count"] == 8  # as `deepmetric index` writes it
    assert read_manifest(tmp_path / "index", model=True).model["run_dir"] == str(Path(tiny_run).resolve())
    names = [f.relative_to(tmp_path / "gallery").as_posix() for f in sorted(files)]
    assert index.names == names

    assert len(deepmetric.Index.open(tmp_path / "index", run=loaded).search(files[0], k=8)[0]) == 8  # its model
    reopened = deepmetric.Index.open(tmp_path / "index", device="cpu")
    np.testing.assert_array_equal(reopened.embeddings, index.embeddings)
    hits = reopened.search([tmp_path / "gallery" / n for n in names], k=3)  # embedded by the index's own run
    assert [row[0].id for row in hits] == list(range(8)) and [row[0].name for row in hits] == names
    assert all(row[0].score == pytest.approx(1.0, abs=1e-5) and len(row) == 3 for row in hits)
    vector_hits = reopened.search(index.embeddings[5], k=2)[0]  # a (D,) embedding is one query
    assert vector_hits[0].id == 5 and vector_hits[0].score == pytest.approx(1.0, abs=1e-5)

    more = make_gallery(tmp_path / "more", 3, seed=1, start=8)
    ids = reopened.add(more, names=["x", "y", "z"])
    assert ids == [8, 9, 10] and "3 unsaved" in repr(reopened)
    assert reopened.save() == tmp_path / "index"
    again = deepmetric.Index.load(tmp_path / "index")
    assert len(again) == 11 and again.names[8:] == ["x", "y", "z"] and again.image_path(9) == more[1].resolve()
    assert json.loads((tmp_path / "index" / "index.json").read_text())["generation"] == 2
    assert [row[0].name for row in again.search(more, k=1)] == ["x", "y", "z"]
    code = main(["search", str(tmp_path / "index"), "--image", str(more[2]), "--k", "1", "--json"])
    assert code == 0  # the appended folder serves the CLI as well


def test_an_index_written_by_the_cli_searches_as_the_cli(tiny_run, loaded, tmp_path, capsys):
    make_gallery(tmp_path / "gallery", 9)
    queries = make_gallery(tmp_path / "queries", 3, seed=5)
    cli(capsys, "index", tiny_run, "--images", tmp_path / "gallery", "--out", tmp_path / "cli-index", "--quiet")
    index = deepmetric.Index.open(tmp_path / "cli-index")
    assert index.names == deepmetric.Index.build(loaded, tmp_path / "gallery").names
    for query, hits in zip(queries, index.search(queries, k=4), strict=True):
        expected = json.loads(cli(capsys, "search", tmp_path / "cli-index", "--image", query, "--k", 4, "--json"))
        assert [(h.id, h.name) for h in hits] == [(r["id"], r["name"]) for r in expected["results"]]
        np.testing.assert_allclose([h.score for h in hits], [r["score"] for r in expected["results"]], atol=1e-5)

    # a Python build of the same gallery writes the same embeddings as the CLI
    built = deepmetric.Index.build(loaded, tmp_path / "gallery", tmp_path / "py-index")
    np.testing.assert_allclose(built.embeddings, index.embeddings, atol=1e-6, rtol=0)


def test_an_index_of_embeddings_or_images_in_memory_keeps_its_names(loaded, tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 16)).astype(np.float32)
    index = deepmetric.Index.from_embeddings(x, names=[f"v{i}" for i in range(6)])
    assert index.path is None and "in memory" in repr(index)
    np.testing.assert_allclose(np.linalg.norm(index.embeddings, axis=1), 1, atol=1e-6)
    assert [h.name for h in index.search(torch.from_numpy(x[[2, 4]]), k=1)[0]] == ["v2"]
    with pytest.raises(IndexStoreError, match="no folder yet"):
        index.save()
    index.save(tmp_path / "vectors")
    opened = deepmetric.Index.open(tmp_path / "vectors")
    assert opened.names == [f"v{i}" for i in range(6)] and opened.search(x[3], k=1)[0][0].name == "v3"
    with pytest.raises(IndexStoreError, match="built from embeddings without a run"):
        opened.search(np.zeros((8, 8, 3), np.uint8))
    with pytest.raises(IndexStoreError, match="already holds an index"):
        deepmetric.Index.from_embeddings(x).save(tmp_path / "vectors")
    with pytest.raises(IndexStoreError, match="have 15 dimensions"):
        opened.add(np.ones((1, 15), np.float32))

    images = [Image.fromarray(rng.integers(0, 256, size=(20, 24, 3), dtype=np.uint8)) for _ in range(4)]
    memory = deepmetric.Index.build(loaded, images, names=["a", "b", "c", "d"])
    assert [row[0].name for row in memory.search(images[::-1], k=1)] == ["d", "c", "b", "a"]
    assert memory.image_path(0) is None
    plain = deepmetric.Index.build(loaded, images[:2])
    assert plain.names == ["#0", "#1"]
    with pytest.raises(IndexStoreError, match="already holds an index"):
        deepmetric.Index.build(loaded, images[:2], tmp_path / "vectors")
    with pytest.raises(DataError, match="one name per image, got 1 for 2"):
        deepmetric.Index.build(loaded, images[:2], names=["a"])

    manifest = json.loads((tmp_path / "vectors" / "index.json").read_text())
    manifest["items"][1]["name"] = 5  # a hand-edited name is one error naming the key
    (tmp_path / "vectors" / "index.json").write_text(json.dumps(manifest))
    with pytest.raises(IndexStoreError, match=r"items\[1\]\.name is 5 \(expected a non-empty string\)"):
        deepmetric.Index.open(tmp_path / "vectors")


def test_save_refuses_an_index_changed_on_disk_by_another_writer(loaded, tmp_path):
    make_gallery(tmp_path / "gallery", 4)
    deepmetric.Index.build(loaded, tmp_path / "gallery", tmp_path / "index")
    first, second = deepmetric.Index.open(tmp_path / "index"), deepmetric.Index.open(tmp_path / "index")
    first.add(np.ones(16, np.float32), names=["one"])
    second.add(np.ones(16, np.float32), names=["other"])
    first.save()
    with pytest.raises(IndexStoreError, match="changed by another writer"):
        second.save()
    assert deepmetric.Index.open(tmp_path / "index").names[-1] == "one"


def test_an_ivf_pq_index_of_embeddings_round_trips_with_exact_scores(tmp_path):
    x = np.random.default_rng(3).normal(size=(1100, 16)).astype(np.float32)
    index = deepmetric.Index.from_embeddings(x[:1000], kind="ivf-pq", nlist=8, pq_m=4)
    assert index.kind == "ivf-pq" and index.manifest.ivf_pq["nlist"] == 8
    index.save(tmp_path / "ivf")
    opened = deepmetric.Index.open(tmp_path / "ivf")
    assert opened.add(x[1000:]) == list(range(1000, 1100))
    opened.save()
    again = deepmetric.Index.open(tmp_path / "ivf")
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    hits = again.search(x[::50], k=3)
    assert [row[0].id for row in hits] == list(range(0, 1100, 50))
    assert [row[0].name for row in hits[:2]] == ["#0", "#50"]
    np.testing.assert_allclose([row[1].score for row in hits],
                               [float(unit[q] @ unit[row[1].id]) for q, row in zip(range(0, 1100, 50), hits,
                                                                                   strict=True)], atol=1e-5)
    np.testing.assert_allclose(again.embeddings, unit, atol=1e-6)


@pytest.mark.parametrize("k", [0, -1, 2.5, "3", True, None])
def test_a_search_for_no_hits_or_a_k_that_is_not_a_number_is_refused(loaded, tmp_path, capsys, k):
    """``index.search(x, k=0)`` (and ``k=-1``) returned one hit each: the caller asked for none. Refused in the
    API, in ``deepmetric search``'s searcher and in ``serve``'s (one check, ``search.check_k``), before any image is
    embedded."""
    from deepmetric.retrieval.search import IndexSearcher

    index = deepmetric.Index.from_embeddings(np.eye(3, 16), names=["a", "b", "c"], run=loaded)
    with pytest.raises(IndexStoreError, match=r"^k must be a whole number of hits, 1 or more, not "):
        index.search(np.ones(16), k=k)
    with pytest.raises(IndexStoreError, match=r"^k must be a whole number"):
        index.search(tmp_path / "not-read.png", k=k)  # refused before the file is looked for
    index.save(tmp_path / "index")
    with pytest.raises(IndexStoreError, match=r"^k must be a whole number"):
        IndexSearcher(tmp_path / "index").search_vectors(np.ones((1, 16), np.float32), k)
    hits = index.search(np.eye(1, 16), k=np.int64(5))[0]  # numpy's integers are whole numbers; 5 > 3 items: 3
    assert len(hits) == 3 and hits[0].name == "a"


def test_a_run_folder_that_does_not_exist_is_named_as_such_and_an_index_counts_its_items():
    with pytest.raises(deepmetric.errors.DeepMetricError, match=r"^no such run directory: runs/does-not-exist$"):
        deepmetric.load_run("runs/does-not-exist")
    assert repr(deepmetric.Index.from_embeddings(np.ones((1, 2)))) == "Index(in memory, flat, 1 item of 2-d, 1 unsaved)"
    # Index("photos-index") was "missing 2 required positional arguments: 'index' and 'embeddings'"
    with pytest.raises(TypeError, match=r"^Index\('photos-index'\) takes no folder; open one with "
                                        r"deepmetric.Index.open\('photos-index'\)"):
        deepmetric.Index("photos-index")
    with pytest.raises(TypeError, match=r"^Index\(\) is made by Index.build"):
        deepmetric.Index(deepmetric.Index.from_embeddings(np.ones((1, 2))).manifest)


def test_a_float_tensor_that_is_one_image_to_embed_is_not_taken_as_rows_of_embeddings_by_an_index(loaded):
    """Issue 53 item 17: ``Index.search``/``add`` took a float (H, W) tensor as H embeddings, where ``TrainedRun.embed``
    takes it as one gray image: a 16 x 16 image searched a 16-d index as 16 queries. Where both readings are possible
    (an index that embeds images) it is refused, naming both and how to say which; where one is (an index without a
    run: embeddings), and for every unambiguous form, nothing changes."""
    index = deepmetric.Index.from_embeddings(np.eye(3, 16), names=["a", "b", "c"], run=loaded)
    image = torch.rand(16, 16)
    for call in (lambda: index.search(image, k=1), lambda: index.add(image)):
        with pytest.raises(DataError, match=r"are a float tensor of shape \(16, 16\): one gray image to TrainedRun."
                                            r"embed, 16 embeddings of 16 dimensions to an index\. Say which"):
            call()
    assert len(index) == 3 and loaded.embed(image).shape == (1, 16)
    assert len(index.search([image], k=1)) == 1 and len(index.search(image[None], k=1)) == 1  # one image
    assert len(index.search(image.numpy(), k=1)) == 16  # a float numpy array: embeddings, as documented
    assert len(index.search(torch.eye(16)[0], k=1)) == 1  # a (D,) tensor: one embedding (no image is 1-D)
    vectors_only = deepmetric.Index.from_embeddings(np.eye(3, 16))  # no run: a tensor of rows is embeddings
    assert len(vectors_only.search(image, k=1)) == 16 and vectors_only.add(image) == list(range(3, 19))


def test_empty_pil_images_bad_batch_sizes_the_meta_device_and_arrays_that_are_no_embeddings_are_one_error(
        loaded, tiny_run):
    """Issue 53 items 25 and 26: a 0 x N PIL image was a torch traceback (the numpy array of that shape was refused);
    ``embed(batch_size=-1 | 2.5 | '4')`` raw errors from torch and ``0`` the default silently; ``device='meta'``
    loaded a run that embeds nothing; ``Index.from_embeddings`` took a 0-D or complex array (a 3-D one was 'all-zero
    rows', a string array numpy's ValueError)."""
    for size in ((0, 5), (5, 0)):
        with pytest.raises(DataError, match=rf"the image is a PIL image of {size[0]} x {size[1]} pixels; an image "
                                            "needs at least one pixel each way"):
            loaded.embed(Image.new("RGB", size))
    for batch_size in (-1, 2.5, "4", 0, True):
        with pytest.raises(DataError, match=r"^batch_size must be a whole number of images, 1 or more .*not "):
            loaded.embed(np.zeros((8, 8, 3), np.uint8), batch_size=batch_size)
    assert loaded.embed(np.zeros((8, 8, 3), np.uint8), batch_size=np.int64(2)).shape == (1, 16)
    with pytest.raises(deepmetric.errors.DeepMetricError, match=r"^device 'meta' is not one deepmetric computes on"):
        deepmetric.load_run(tiny_run, device="meta")
    for array, message in ((np.zeros((2, 3, 16)), r"must be one \(D,\) row or an \(N, D\) array of rows, got shape "
                                                  r"\(2, 3, 16\)"),
                           (np.float32(1.0), r"must be .*got shape \(\)"),
                           (np.ones((3, 0)), r"must be .*got shape \(3, 0\)"),
                           (np.ones((3, 16), complex), "must be real numbers .*complex128"),
                           (np.array([["a"] * 16]), "must be real numbers .*<U1"),
                           (np.ones((3, 16), bool), "must be real numbers .*bool")):
        with pytest.raises(IndexStoreError, match=f"^the embeddings {message}"):
            deepmetric.Index.from_embeddings(array)
    assert len(deepmetric.Index.from_embeddings(np.eye(3, 16, dtype=np.int64))) == 3  # integers are real numbers
