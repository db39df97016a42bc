"""deepmetric index / search: build, append, search, refuse mismatches, never half-written; IVF-PQ."""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil

import numpy as np
import pytest

from deepmetric import workflows
from deepmetric.cli import main
from deepmetric.errors import IndexStoreError
from deepmetric.retrieval import IndexSearcher, Searcher, faiss_index, store
from deepmetric.retrieval.manifest import IndexManifest
from deepmetric.retrieval.store import create_index, read_manifest
from serve_helpers import make_gallery


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def search_json(capsys, index, image, k=3):
    code, out, err = run(capsys, "search", index, "--image", image, "--k", k, "--json")
    assert code == 0, err
    return json.loads(out)["results"]


def test_index_then_search_finds_each_gallery_image_first(tiny_run, tmp_path, capsys, caplog):
    files = make_gallery(tmp_path / "gallery", 8)
    index = tmp_path / "index"
    code, out, err = run(capsys, "index", tiny_run, "--images", tmp_path / "gallery", "--out", index, "--quiet")
    assert code == 0, err
    assert "indexed 8 images" in out and "holds 8 images (flat index)" in out

    manifest = json.loads((index / "index.json").read_text())
    assert manifest["format"] == "deepmetric-index-1" and manifest["count"] == 8 and manifest["embedding_dim"] == 16
    assert manifest["model"]["spec"]["backbone"] == "tiny"
    assert manifest["sources"] == ["../gallery"]  # beside the index: kept relative to it (item 30)
    assert manifest["origin"] == str(index.resolve())
    assert read_manifest(index).model["run_dir"] == str(tiny_run.resolve())
    assert read_manifest(index).sources == [str((tmp_path / "gallery").resolve())]
    names = {item["path"] for item in manifest["items"]}
    assert names == {f.relative_to(tmp_path / "gallery").as_posix() for f in files}  # relative, sorted order
    assert [item["id"] for item in manifest["items"]] == list(range(8))
    assert sorted(p.name for p in index.iterdir()) == ["embeddings-1.safetensors", "faiss-1.index", "index.json"]

    for item in manifest["items"]:
        hits = search_json(capsys, index, tmp_path / "gallery" / item["path"])
        assert hits[0]["id"] == item["id"] and hits[0]["name"] == item["path"]
        assert hits[0]["score"] == pytest.approx(1.0, abs=1e-4)
        assert len(hits) == 3 and hits[0]["score"] >= hits[1]["score"] >= hits[2]["score"]

    caplog.set_level(logging.INFO, logger="deepmetric")
    code, out, _ = run(capsys, "search", index, "--image", files[0], "--k", 100)
    assert code == 0 and out.splitlines()[0].split() == ["rank", "score", "id", "name"]
    assert len(out.splitlines()) == 1 + 8  # k is capped at the index size, and the log says so
    assert "the index holds 8 items: printing all of them (--k 100)" in caplog.text
    code, out, _ = run(capsys, "search", index, "--image", files[0], "-k", 2)  # the short form a user types
    assert code == 0 and len(out.splitlines()) == 1 + 2


def test_search_takes_several_queries_a_folder_or_a_list_and_embeds_them_all_before_printing(tiny_run, tmp_path,
                                                                                           capsys):
    files = make_gallery(tmp_path / "gallery", 4)
    index = tmp_path / "index"
    assert run(capsys, "index", tiny_run, "--images", tmp_path / "gallery", "--out", index, "--quiet")[0] == 0
    single = search_json(capsys, index, files[1], k=2)
    listing = tmp_path / "gallery" / "queries.txt"
    listing.write_text("jpegs/img002.jpg\n")
    code, out, err = run(capsys, "search", index, "--image", files[1], tmp_path / "gallery", listing, "--k", 2,
                         "--json", "--quiet")
    assert code == 0 and err == "", err
    lines = [json.loads(line) for line in out.splitlines()]  # JSON Lines: one object a query, in the order given
    assert [line["query"] for line in lines] == [str(files[1])] + [str(f) for f in sorted(files)] + [
        str(files[2].resolve())]
    assert lines[0]["results"] == single  # the same as searching it alone
    assert all(line["results"][0]["score"] == pytest.approx(1.0, abs=1e-4) for line in lines)

    code, out, _ = run(capsys, "search", index, "--image", files[0], "--image", files[1], "--k", 1, "--quiet")
    assert code == 0 and out.split("\n\n") == [  # each query's table under its name, a blank line between
        f"query {files[0]}\nrank    score       id  name\n   1   1.0000        0  img000.png",
        f"query {files[1]}\nrank    score       id  name\n   1   1.0000        1  img001.png\n"]

    first = run(capsys, "search", index, "--image", files[0], "--k", 1)
    assert run(capsys, "search", "--image", files[0], index, "--k", 1) == first  # the index after the image, too
    with pytest.raises(SystemExit) as stopped:  # argparse's own message, status 2
        run(capsys, "search", "--image", files[0], "--k", 1)
    out, err = capsys.readouterr()
    assert stopped.value.code == 2 and out == "" and "the following arguments are required: index_dir" in err

    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png")
    code, out, err = run(capsys, "search", index, "--image", files[0], broken, "--quiet")
    assert code == 2 and out == "" and "broken.png" in err  # nothing printed before the bad query stopped it


def test_index_and_embed_take_several_galleries_and_index_a_repeated_image_once(tiny_run, tmp_path, capsys,
                                                                               monkeypatch):
    shop_a = make_gallery(tmp_path / "shops" / "a", 3)
    shop_b = make_gallery(tmp_path / "shops" / "b", 2, seed=1, start=3)
    index = tmp_path / "index"
    code, out, err = run(capsys, "index", tiny_run, "--images", tmp_path / "shops" / "a", tmp_path / "shops" / "b",
                         "--images", shop_a[0], "--out", index, "--quiet")  # a repeated flag adds, not replaces
    assert code == 0, err
    assert "indexed 5 images (1 given more than once, indexed once)" in out and "holds 5 images" in out
    manifest = read_manifest(index)
    assert manifest.sources == [str((tmp_path / "shops").resolve())]  # the folder holding both galleries
    names = [item["path"] for item in json.loads((index / "index.json").read_text())["items"]]
    assert names == [f.relative_to(tmp_path / "shops").as_posix() for f in sorted(shop_a) + sorted(shop_b)]
    for item_id, file in enumerate(sorted(shop_a) + sorted(shop_b)):
        assert manifest.image_path(item_id) == file.resolve()
        assert search_json(capsys, index, file, k=1)[0]["id"] == item_id

    out_file = tmp_path / "feats.npy"
    code, out, err = run(capsys, "embed", tiny_run, "--images", tmp_path / "shops" / "b", "--images", shop_a[0],
                         "--out", out_file, "--quiet")
    assert code == 0, err
    assert "wrote 3 embeddings" in out
    listed = (tmp_path / "feats.paths.txt").read_text().splitlines()
    assert listed == [str(f) for f in sorted(shop_b)] + [str(shop_a[0])]  # one row each, in the order given
    alone = tmp_path / "alone.npy"
    assert run(capsys, "embed", tiny_run, "--images", shop_a[0], "--out", alone, "--quiet")[0] == 0
    np.testing.assert_allclose(np.load(out_file)[2], np.load(alone)[0], atol=1e-5)

    code, out, err = run(capsys, "index", "--images", tmp_path / "shops" / "b", tiny_run, "--out", tmp_path / "b.index",
                         "--quiet")  # the run after the images, as before --images took several
    assert code == 0 and "indexed 2 images" in out, err

    code, out, err = run(capsys, "index", tiny_run, "--images", tmp_path / "shops" / "a", tmp_path / "nowhere",
                         "--out", tmp_path / "index2", "--quiet")
    assert code == 2 and "nowhere does not exist" in err and not (tmp_path / "index2").exists()
    monkeypatch.setattr(workflows, "load_run_model", lambda *_: pytest.fail("the model loaded before the images"))
    code, out, err = run(capsys, "embed", tiny_run, "--images", tmp_path / "shops" / "a", tmp_path / "nowhere",
                         "--out", tmp_path / "e.npy")
    assert code == 2 and "nowhere does not exist" in err and not (tmp_path / "e.npy").exists()


def test_add_appends_new_images_and_skips_known_ones(tiny_run, tmp_path, capsys):
    make_gallery(tmp_path / "a", 5)
    more = make_gallery(tmp_path / "b", 3, seed=1, start=5)
    listing = tmp_path / "b" / "list.txt"
    listing.write_text("# new images\n" + "".join(f"{f.relative_to(tmp_path / 'b')}\n\n" for f in more))
    index = tmp_path / "index"
    assert run(capsys, "index", tiny_run, "--images", tmp_path / "a", "--out", index, "--quiet")[0] == 0

    code, out, err = run(capsys, "index", tiny_run, "--images", listing, "--out", index, "--add", "--quiet")
    assert code == 0, err
    assert "added 3 images" in out and "holds 8 images" in out
    manifest = read_manifest(index)
    assert manifest.generation == 2 and manifest.count == 8 and len(manifest.sources) == 2
    assert sorted(p.name for p in index.iterdir()) == [".lock", "embeddings-2.safetensors", "faiss-2.index",
                                                        "index.json"]
    for new_id, file in zip(range(5, 8), more, strict=True):
        assert manifest.image_path(new_id) == file.resolve()
        hits = search_json(capsys, index, file)
        assert hits[0]["id"] == new_id and hits[0]["score"] == pytest.approx(1.0, abs=1e-4)

    code, out, _ = run(capsys, "index", tiny_run, "--images", tmp_path / "a", "--out", index, "--add", "--quiet")
    assert code == 0 and "added 0 images (5 already indexed, skipped)" in out
    assert read_manifest(index).generation == 2


def test_add_refuses_another_model_and_search_refuses_a_changed_checkpoint(tiny_run, tmp_path, capsys):
    make_gallery(tmp_path / "g", 4)
    run_copy = tmp_path / "run-copy"
    shutil.copytree(tiny_run, run_copy)
    index = tmp_path / "index"
    assert run(capsys, "index", run_copy, "--images", tmp_path / "g", "--out", index, "--quiet")[0] == 0

    other = tmp_path / "other"  # another architecture: 8-d embeddings
    assert run(capsys, "train", "--data", "digits", "--backbone", "tiny", "--steps", "1", "--quiet", "--no-test",
               "--out", other, "model.pretrained=false", "model.embedding_dim=8", "data.image_size=16",
               "data.classes_per_batch=3", "data.samples_per_class=4", "eval.nmi=false")[0] == 0
    code, _, err = run(capsys, "index", other, "--images", tmp_path / "g", "--out", index, "--add", "--quiet")
    assert code == 2 and "holds 16-d embeddings" in err and "8-d" in err and len(err.strip().splitlines()) == 1

    # the same architecture with other weights (the run trained further) is refused too
    assert run(capsys, "train", "--resume", "--out", run_copy, "train.steps=3", "--no-test", "--quiet")[0] == 0
    code, _, err = run(capsys, "index", run_copy, "--images", tmp_path / "g", "--out", index, "--add", "--quiet")
    assert code == 2 and "different models are not comparable" in err
    code, _, err = run(capsys, "search", index, "--image", tmp_path / "g" / "img000.png")
    assert code == 2 and "has changed since" in err and "rebuild the index" in err
    assert read_manifest(index).count == 4


def test_user_errors_are_one_line(tiny_run, tmp_path, capsys):
    make_gallery(tmp_path / "g", 3)
    index = tmp_path / "index"
    code, _, err = run(capsys, "index", tiny_run, "--images", tmp_path / "nothing", "--out", index)
    assert code == 2 and f"{tmp_path / 'nothing'} does not exist" in err
    code, _, err = run(capsys, "search", index, "--image", tmp_path / "g" / "img000.png")
    assert code == 2 and "is not a deepmetric index: it does not exist" in err  # named before the query is read
    code, _, err = run(capsys, "index", tiny_run, "--images", tmp_path / "g", "--out", index, "--add")
    assert code == 2 and "is not a deepmetric index" in err
    assert run(capsys, "index", tiny_run, "--images", tmp_path / "g", "--out", index, "--quiet")[0] == 0
    os.mkfifo(tmp_path / "pipe")  # there, but neither a file nor a folder (reading it would wait forever)
    code, _, err = run(capsys, "search", index, "--image", tmp_path / "pipe")
    assert code == 2 and f"{tmp_path / 'pipe'} is neither an image file nor a folder" in err
    code, _, err = run(capsys, "index", tiny_run, "--images", tmp_path / "g", "--out", index)
    assert code == 2 and "already holds an index; add images to it with --add" in err
    code, _, err = run(capsys, "index", tiny_run, "--images", tmp_path / "g", "--out", tmp_path / "ivf", "--ivf-pq")
    assert code == 2 and "needs at least 1,000 images" in err and "this gallery has 3" in err
    assert not (tmp_path / "ivf").exists()
    code, _, err = run(capsys, "search", tmp_path / "g", "--image", tmp_path / "g" / "img000.png")
    assert code == 2 and "is not a deepmetric index" in err
    for command in (["search", tiny_run, "--image", tmp_path / "g" / "img000.png"], ["serve", tiny_run]):
        code, _, err = run(capsys, *command)  # the run where its index goes
        assert code == 2 and (f"{tiny_run} is a training run, not an index: build an index from it with "
                              f"deepmetric index {tiny_run} --images FOLDER --out INDEX") in err
    (tmp_path / "bad.txt").write_text("g/img000.png\nmissing.png\n")
    code, _, err = run(capsys, "index", tiny_run, "--images", tmp_path / "bad.txt", "--out", tmp_path / "i2")
    assert code == 2 and "bad.txt line 2: missing.png is not a file" in err


def test_a_failed_write_leaves_no_index_and_a_failed_add_keeps_the_old_one(tiny_run, tmp_path, capsys, monkeypatch):
    make_gallery(tmp_path / "g", 3)
    make_gallery(tmp_path / "h", 2, seed=5, start=3)
    index = tmp_path / "index"

    def crash(_):
        raise OSError("disk full")

    original = faiss_index.serialize
    monkeypatch.setattr(faiss_index, "serialize", crash)
    with pytest.raises(OSError, match="disk full"):
        main(["index", str(tiny_run), "--images", str(tmp_path / "g"), "--out", str(index), "--quiet"])
    assert not index.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["g", "h"]  # no temp folder left

    monkeypatch.setattr(faiss_index, "serialize", original)
    assert run(capsys, "index", tiny_run, "--images", tmp_path / "g", "--out", index, "--quiet")[0] == 0
    before = {p.name: p.read_bytes() for p in index.iterdir()}
    monkeypatch.setattr(faiss_index, "serialize", crash)
    with pytest.raises(OSError, match="disk full"):
        main(["index", str(tiny_run), "--images", str(tmp_path / "h"), "--out", str(index), "--add", "--quiet"])
    manifest = read_manifest(index)
    assert manifest.generation == 1 and manifest.count == 3
    assert (index / "index.json").read_bytes() == before["index.json"]
    assert Searcher(index).search_file(tmp_path / "g" / "img001.png", 1)[0].id == 1


def vector_index(tmp_path, x, kind, params=None):
    manifest = IndexManifest(kind=kind, model={"spec": {}}, embedding_dim=x.shape[1],
                             items=[{"id": i, "source": 0, "path": None} for i in range(len(x))],
                             ivf_pq=params.to_dict() if params else None)
    return create_index(tmp_path / kind, manifest, x, faiss_index.build_faiss(x, kind, params))


def test_ivf_pq_on_random_vectors_finds_each_vector_with_exact_scores(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1000, 16)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    params = faiss_index.ivf_pq_params(len(x), 16)
    assert (params.nlist, params.m, params.nbits, params.nprobe) == (25, 2, 8, 25)
    searcher = IndexSearcher(vector_index(tmp_path, x, "ivf-pq", params))
    exact = IndexSearcher(vector_index(tmp_path, x, "flat"))
    queries = x[:50]
    approx_hits, exact_hits = searcher.search_vectors(queries, 10), exact.search_vectors(queries, 10)
    overlap = []
    for row, (hits, truth) in enumerate(zip(approx_hits, exact_hits, strict=True)):
        assert hits[0].id == row and hits[0].score == pytest.approx(1.0, abs=1e-5)
        assert hits[0].name == f"#{row}"
        for hit in hits:  # re-ranked: every score is the exact cosine
            assert hit.score == pytest.approx(float(x[row] @ x[hit.id]), abs=1e-5)
        overlap.append(len({h.id for h in hits} & {h.id for h in truth}) / 10)
    # two 8-bit codes per random 16-d vector are coarse; the 80 re-ranked candidates still hold nearly all of the
    # true top 10 (faiss' k-means is seeded, so this is deterministic)
    assert np.mean(overlap) > 0.9

    large = faiss_index.ivf_pq_params(100_000, 512)
    assert (large.nlist, large.m, large.nbits, large.nprobe) == (1265, 64, 8, 32)
    with pytest.raises(IndexStoreError, match="must divide the embedding dimension 16"):
        faiss_index.ivf_pq_params(1000, 16, m=3)
    with pytest.raises(IndexStoreError, match="--nlist must be between 1 and 25"):
        faiss_index.ivf_pq_params(1000, 16, nlist=26)
    with pytest.raises(IndexStoreError, match="at least 1,000 images"):
        faiss_index.ivf_pq_params(999, 16)


def test_store_rejects_foreign_and_inconsistent_folders(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "index.json").write_text('{"format": "something-else"}')
    with pytest.raises(IndexStoreError, match="is not a deepmetric index"):
        store.read_manifest(tmp_path / "a")
    x = np.eye(4, dtype=np.float32)
    folder = vector_index(tmp_path, x, "flat")
    data = json.loads((folder / "index.json").read_text())
    data["count"] = 5
    (folder / "index.json").write_text(json.dumps(data))
    with pytest.raises(IndexStoreError, match="lists 4 items but says count 5"):
        store.read_manifest(folder)


def test_an_index_lock_planted_as_a_link_is_refused(tmp_path):
    """``index --add`` opened ``INDEX/.lock`` following links: a dangling link created the file it names."""
    folder = vector_index(tmp_path, np.eye(4, dtype=np.float32), "flat")
    (folder / ".lock").unlink(missing_ok=True)
    elsewhere = tmp_path / "created-elsewhere"
    (folder / ".lock").symlink_to(elsewhere)
    with pytest.raises(IndexStoreError, match=r"\.lock is a symbolic link"), store.locked(folder):
        pass
    assert not elsewhere.exists()


def test_hand_edited_indexes_and_checkpoints_are_one_error(tiny_run, tmp_path, capsys):
    """What is read back is validated as strictly as what a user types: every case is exit 2 with one line."""
    from safetensors.torch import load_file, save_file

    make_gallery(tmp_path / "gallery", 4)
    index = tmp_path / "index"
    assert run(capsys, "index", tiny_run, "--images", tmp_path / "gallery", "--out", index, "--quiet")[0] == 0
    query = tmp_path / "gallery" / json.loads((index / "index.json").read_text())["items"][0]["path"]
    pristine = (index / "index.json").read_text()
    edits = {"model.image_size=0": (("model", "image_size"), 0),
             "model.test_resize=evil": (("model", "test_resize"), "evil"),
             "kind": (("kind",), "hnsw"),
             "huge nprobe": (("ivf_pq",), {"nlist": 4, "m": 2, "nbits": 8, "nprobe": 10**12})}
    for name, (keys, value) in edits.items():
        data = json.loads(pristine)
        target = data
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value
        (index / "index.json").write_text(json.dumps(data))
        code, _, err = run(capsys, "search", index, "--image", query)
        assert code == 2 and "damaged index manifest" in err and "Traceback" not in err, name
    (index / "index.json").write_text(pristine)
    vectors = faiss_index.deserialize((index / "faiss-1.index").read_bytes(), None).reconstruct_n(0, 4)
    vectors[1, 0] = float("nan")  # a flat index searches the faiss file's vectors (it returned no results)
    (index / "faiss-1.index").write_bytes(faiss_index.serialize(faiss_index.build_faiss(vectors, "flat")))
    code, _, err = run(capsys, "search", index, "--image", query)
    assert code == 2 and "NaN or infinite vectors" in err
    embeddings = load_file(index / "embeddings-1.safetensors")  # what IVF-PQ re-ranks with
    embeddings["embeddings"][1, 0] = float("nan")
    save_file(embeddings, index / "embeddings-1.safetensors", metadata={"format": store.FORMAT})
    with pytest.raises(IndexStoreError, match=r"NaN or infinite embeddings \(1 rows\)"):
        store.read_embeddings(index, read_manifest(index))

    from deepmetric.runs.checkpoint import FORMAT

    last = tiny_run / "checkpoints" / "last.safetensors"
    tensors = load_file(last)
    header = json.loads(last.read_bytes()[8:8 + int.from_bytes(last.read_bytes()[:8], "little")])["__metadata__"]
    state = json.loads(header["state"])
    broken = tmp_path / "broken"
    shutil.copytree(tiny_run, broken)
    target = broken / "checkpoints" / "last.safetensors"
    (broken / "checkpoints" / "best.safetensors").unlink(missing_ok=True)
    damaged_states = {"not JSON": "{bad", "no model_spec": json.dumps({k: v for k, v in state.items()
                                                                       if k != "model_spec"}),
                      "extra key": json.dumps({**state, "model_spec": {**state["model_spec"], "evil": 1}})}
    for name, text in damaged_states.items():
        save_file(tensors, target, metadata={"format": FORMAT, "state": text})
        code, _, err = run(capsys, "evaluate", broken, "--quiet")
        assert code == 2 and "Traceback" not in err and ("damaged header" in err or "model_spec" in err), name
    nan = dict(tensors)
    key = next(k for k in nan if k.startswith("model.") and nan[k].is_floating_point())
    nan[key] = nan[key].clone().fill_(float("nan"))
    save_file(nan, target, metadata=header)
    code, _, err = run(capsys, "evaluate", broken, "--quiet")
    assert code == 2 and "NaN or infinite weights" in err


def test_add_accepts_the_same_deml_run_whose_width_is_below_its_configured_size(tmp_path, capsys):
    """Issue 39 item 16: DeML rounds the embedding down to a multiple of its learners (18 over 4 learners: 16-d);
    ``index --add`` with the run that built the index was refused ("16-d ... this model gives 18-d")."""
    deml = tmp_path / "deml"
    assert run(capsys, "train", "--data", "digits", "--backbone", "tiny", "--head", "deml", "--steps", "1", "--quiet",
               "--no-test", "--out", deml, "model.pretrained=false", "model.embedding_dim=18", "data.image_size=16",
               "model.head_options.num_scales=2", "model.head_options.num_branches=2",
               "data.classes_per_batch=3", "data.samples_per_class=4", "eval.nmi=false")[0] == 0
    make_gallery(tmp_path / "a", 3)
    make_gallery(tmp_path / "b", 2, seed=1, start=3)
    index = tmp_path / "index"
    assert run(capsys, "index", deml, "--images", tmp_path / "a", "--out", index, "--quiet")[0] == 0
    assert read_manifest(index).embedding_dim == 16
    code, out, err = run(capsys, "index", deml, "--images", tmp_path / "b", "--out", index, "--add", "--quiet")
    assert code == 0, err
    assert read_manifest(index).count == 5


REMOVED = object()


def edited(data: dict, keys: tuple, value) -> dict:
    data = copy.deepcopy(data)
    target = data
    for key in keys[:-1]:
        target = target[key]
    if value is REMOVED:
        del target[keys[-1]]
    else:
        target[keys[-1]] = value
    return data


def label_of(keys: tuple) -> str:
    return ".".join(f"[{k}]" if isinstance(k, int) else k for k in keys).replace(".[", "[")


OPTIONAL_KEYS = {"created_at", "updated_at", "embeddings_file", "faiss_file", "origin", "ivf_pq", "model.step"}


def test_every_key_of_a_hand_edited_manifest_is_checked_when_read(tiny_run, tmp_path, capsys):
    """Issue 39 item 17: an index.json without image_size or checkpoint_sha256, or with an item's source 7,
    tracebacked in ``index --add`` (a KeyError naming the key, an IndexError). Every key (top level, the model
    record, an item) removed and given a value no key accepts: ``index --add`` and ``search`` are exit 2 with one
    line naming index.json and the key, or (an optional key removed) work."""
    make_gallery(tmp_path / "gallery", 3)
    make_gallery(tmp_path / "more", 2, seed=1, start=3)
    index = tmp_path / "index"
    assert run(capsys, "index", tiny_run, "--images", tmp_path / "gallery", "--out", index, "--quiet")[0] == 0
    pristine = json.loads((index / "index.json").read_text())
    backup = tmp_path / "backup"
    shutil.copytree(index, backup)
    query = tmp_path / "gallery" / pristine["items"][0]["path"]
    keys = ([(k,) for k in pristine] + [("model", k) for k in pristine["model"]]
            + [("items", 1, k) for k in pristine["items"][1]])
    cases = [(k, REMOVED) for k in keys] + [(k, [[]]) for k in keys]
    cases += [(("model", "image_size"), "16"), (("model", "checkpoint_sha256"), "0" * 64 + "0"),
              (("items", 1, "source"), 7), (("items", 1, "source"), -1), (("items", 1, "source"), True),
              (("items", 1, "id"), 2), (("items", 1, "path"), 5), (("items", 1, "path"), "../../etc/passwd"),
              (("items", 1, "path"), "a\x00b"), (("items", 1, "path"), ""), (("items", 1), "img001.png"),
              (("sources",), ["../gallery", 3]), (("sources",), "../gallery"), (("sources",), []),
              (("count",), "3"), (("count",), 3.0), (("generation",), "1"), (("embedding_dim",), 16.5),
              (("embedding_dim",), None), (("model", "spec"), None), (("model",), "tiny"), (("items",), {}),
              (("origin",), "relative/folder"), (("ivf_pq",), {"nlist": 4, "m": 2, "nbits": 8, "nprobe": 2}),
              (("kind",), "ivf-pq"), (("embeddings_file",), "../../elsewhere.safetensors"),
              (("model", "run_dir"), ""), (("model", "step"), -3)]
    for keys_, value in cases:
        label = label_of(keys_)
        (index / "index.json").write_text(json.dumps(edited(pristine, keys_, value)))
        for argv in (("search", index, "--image", query), ("index", tiny_run, "--images", tmp_path / "more",
                                                           "--out", index, "--add", "--quiet")):
            code, _, err = run(capsys, *argv)
            case = f"{argv[0]}: {label} = {'removed' if value is REMOVED else repr(value)}"
            assert "Traceback" not in err, case
            if value is REMOVED and label in OPTIONAL_KEYS:
                assert code == 0, (case, err)
                shutil.rmtree(index)  # undo an --add
                shutil.copytree(backup, index)
                (index / "index.json").write_text(json.dumps(edited(pristine, keys_, value)))
                continue
            assert code == 2, (case, err)
            assert len(err.strip().splitlines()) == 1 and "index.json" in err, (case, err)
            also = {"format": "is not a deepmetric index", "sources": "(sources is empty)"}.get(label, "\0")
            assert label in err or also in err, (case, err)
    named = {("model", "image_size"): "model.image_size is missing (expected an integer from 8 to 8192)",
             ("model", "checkpoint_sha256"): "model.checkpoint_sha256 is missing (expected the checkpoint's SHA-256",
             ("count",): "count is missing"}
    for keys_, message in named.items():
        (index / "index.json").write_text(json.dumps(edited(pristine, keys_, REMOVED)))
        code, _, err = run(capsys, "index", tiny_run, "--images", tmp_path / "more", "--out", index, "--add")
        assert code == 2 and f"{index / 'index.json'} is a damaged index manifest: {message}" in err, err
    (index / "index.json").write_text(json.dumps(edited(pristine, ("items", 1, "source"), 7)))
    code, _, err = run(capsys, "search", index, "--image", query)
    assert code == 2 and "items[1].source is 7 (expected an integer from 0 to 0 (an entry of sources))" in err, err
    for text, message in (("[]", "it holds a list"), ("null", "it holds null"), ("7", "it holds a number"),
                          ("[" * 100_000, "nests too deeply"), ('{"format": "deepmetric-index-1"', "not valid JSON")):
        (index / "index.json").write_text(text)
        code, _, err = run(capsys, "index", tiny_run, "--images", tmp_path / "more", "--out", index, "--add")
        assert code == 2 and message in err and "Traceback" not in err, (text[:20], err)
    (index / "index.json").write_text(json.dumps(pristine))
    assert run(capsys, "index", tiny_run, "--images", tmp_path / "more", "--out", index, "--add", "--quiet")[0] == 0
    assert read_manifest(index).count == 5


def test_an_index_written_with_absolute_paths_still_loads_and_names_no_absolute_path(tiny_run, tmp_path, capsys):
    """Issue 39 item 30: indexes written before paths were kept relative (absolute run, checkpoint and sources, no
    origin; an item stored absolute inside its gallery folder) still search, and a result never names a folder of
    the server (the absolute item is read as relative to its folder: issue 53 item 12). ``--add`` writes the index
    again with relative paths."""
    files = make_gallery(tmp_path / "gallery", 4)
    index = tmp_path / "index"
    assert run(capsys, "index", tiny_run, "--images", tmp_path / "gallery", "--out", index, "--quiet")[0] == 0
    data = json.loads((index / "index.json").read_text())
    data["model"]["run_dir"] = str(tiny_run.resolve())
    data["model"]["checkpoint"] = str((tiny_run / "checkpoints" / "last.safetensors").resolve())
    data["sources"] = [str((tmp_path / "gallery").resolve())]
    del data["origin"]
    outside = data["items"][2]["path"]
    data["items"][2]["path"] = str((tmp_path / "gallery" / outside).resolve())
    (index / "index.json").write_text(json.dumps(data, indent=1))
    for item in data["items"]:
        file = item["path"] if item["path"].startswith("/") else tmp_path / "gallery" / item["path"]
        hits = search_json(capsys, index, file, k=4)
        assert hits[0]["id"] == item["id"] and hits[0]["score"] == pytest.approx(1.0, abs=1e-4)
        assert all(not h["name"].startswith("/") and str(tmp_path) not in h["name"] for h in hits)
    assert {h["name"] for h in hits} == {*(i["path"] for i in data["items"] if i["id"] != 2), outside}  # relative
    make_gallery(tmp_path / "more", 1, seed=2, start=4)
    assert run(capsys, "index", tiny_run, "--images", tmp_path / "more", "--out", index, "--add", "--quiet")[0] == 0
    again = json.loads((index / "index.json").read_text())
    assert again["sources"] == ["../gallery", "../more"] and again["model"]["run_dir"].startswith("../")
    assert again["origin"] == str(index.resolve()) and read_manifest(index).image_path(0) == files[0].resolve()


@pytest.mark.parametrize("channels_last", [True, False, None])
def test_a_query_is_embedded_in_the_memory_format_of_its_gallery(tiny_run, tmp_path, capsys, channels_last):
    """``deepmetric search`` and ``serve`` embedded queries NCHW while ``deepmetric index`` (and the Python API)
    embedded the gallery in the run's ``train.channels_last`` (NHWC by default): scores differed from the API's in
    the last bits. Now the searcher takes the run's format (None: a run
    folder without its config, where the default applies) and embeds a query exactly as ``load_run`` does."""
    import deepmetric
    from deepmetric.data.images import read_image

    copy_of_run = tmp_path / "run"
    shutil.copytree(tiny_run, copy_of_run)
    if channels_last is not None:
        config = copy_of_run / "config.yaml"
        setting = f"channels_last: {str(channels_last).lower()}"
        config.write_text(config.read_text().replace("channels_last: true", setting))
    make_gallery(tmp_path / "g", 3)
    assert run(capsys, "index", copy_of_run, "--images", tmp_path / "g", "--out", tmp_path / "index", "--quiet")[0] == 0
    expected = deepmetric.load_run(copy_of_run, device="cpu")
    if channels_last is None:
        (copy_of_run / "config.yaml").unlink()
    searcher = Searcher(tmp_path / "index")
    assert searcher.model.channels_last is (True if channels_last is None else channels_last)
    assert searcher.model.channels_last is expected.model.channels_last
    image = tmp_path / "g" / "img001.png"
    np.testing.assert_array_equal(searcher.embed(read_image(image)), expected.embed(image)[0])


def test_an_ivf_pq_file_whose_ids_are_no_items_is_a_damaged_index(tiny_run, tmp_path, capsys, monkeypatch):
    """Issue 53 item 22: an IVF-PQ faiss file storing an item id beyond the item count crashed ``search`` with an
    IndexError (``serve`` answered 500); a repeated id, a flat manifest over an IVF file or over one that maps its ids
    elsewhere were not seen either. Each is refused on load, naming the file: ``search`` exits 2, ``serve`` does not
    start."""
    import faiss

    import deepmetric
    import deepmetric.retrieval.service as service

    x = np.random.default_rng(0).normal(size=(1000, 16)).astype(np.float32)
    pristine = tmp_path / "pristine"
    deepmetric.Index.from_embeddings(x, run=deepmetric.load_run(tiny_run), kind="ivf-pq").save(pristine)
    query = make_gallery(tmp_path / "query", 1)[0]
    started = []
    monkeypatch.setattr(service.uvicorn, "Server", lambda config: started.append(config.app) or
                        type("NotRun", (), {"run": lambda self: None})())

    def tampered(name: str, edit) -> tuple:
        index = tmp_path / name
        shutil.copytree(pristine, index)
        file = index / read_manifest(index).faiss_file
        faiss_file = faiss_index.deserialize(file.read_bytes())
        ivf = faiss.extract_index_ivf(faiss_file)
        lists = [n for n in range(ivf.nlist) if ivf.invlists.list_size(n) >= 2]
        ids = faiss.rev_swig_ptr(ivf.invlists.get_ids(lists[0]), 2)
        edit(ids)
        file.write_bytes(faiss_index.serialize(faiss_file))
        return index, file

    for name, edit, message in (("beyond", lambda ids: ids.__setitem__(0, 5000), r"holds 1 item id\(s\) outside 0 to "
                                                                                r"999 \(e.g. 5000\)"),
                                ("negative", lambda ids: ids.__setitem__(0, -7), r"\(e.g. -7\)"),
                                ("repeated", lambda ids: ids.__setitem__(0, ids[1]), "does not hold each of its 1000 "
                                                                                      "items once")):
        index, file = tampered(name, edit)
        with pytest.raises(IndexStoreError, match=f"^{file}.* {message}.*the index is damaged: rebuild it"):
            deepmetric.Index.open(index)
        for command in (["search", index, "--image", query], ["serve", index]):
            code, _, err = run(capsys, *command)
            assert code == 2 and "the index is damaged" in err and "Traceback" not in err, (name, command, err)
    assert not started
    flat = tmp_path / "flat"
    shutil.copytree(pristine, flat)
    manifest = json.loads((flat / "index.json").read_text())
    manifest["kind"], manifest["ivf_pq"] = "flat", None  # a flat manifest over the IVF file
    (flat / "index.json").write_text(json.dumps(manifest))
    with pytest.raises(IndexStoreError, match="is not the flat index the manifest says"):
        deepmetric.Index.open(flat)
    mapped = faiss.IndexIDMap(faiss.IndexFlatIP(16))  # a flat file whose ids are not its rows
    mapped.add_with_ids(x, np.arange(1000, dtype=np.int64) + 10**6)
    (flat / manifest["faiss_file"]).write_bytes(faiss_index.serialize(mapped))
    with pytest.raises(IndexStoreError, match="is not the flat index the manifest says"):
        deepmetric.Index.open(flat)
    assert len(deepmetric.Index.open(pristine).search(x[:2], k=3)[0]) == 3


def test_an_ivf_pq_index_is_trained_without_polysemous_codes(caplog):
    """Issue 53 item 7: ``index --ivf-pq`` on 1,029 images took 141 s, 89-126 of them silent in faiss' polysemous
    training (it orders the PQ codes for Hamming filtering, which an inner-product search never uses). It is off,
    and the training is announced."""
    import faiss

    caplog.set_level(logging.INFO, logger="deepmetric")
    x = np.random.default_rng(0).normal(size=(1000, 16)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    index = faiss_index.build_faiss(x, "ivf-pq", faiss_index.ivf_pq_params(len(x), 16))
    ivf = faiss.downcast_index(faiss.extract_index_ivf(index))
    assert not ivf.do_polysemous_training and ivf.polysemous_ht == 0
    assert "training the IVF-PQ index on 1000 vectors" in caplog.text
