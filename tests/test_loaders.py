"""Loaders on small replicas of each official layout (same file names and formats), and their errors."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from PIL import Image

from deepmetric.data import GLYPH_CHARS, build_glyphs, load_dataset
from deepmetric.data.benchmarks import load_cars, load_cub, load_inshop, load_sop
from deepmetric.data.glyphs import load_glyphs, matplotlib_fonts
from deepmetric.data.images import read_image
from deepmetric.errors import DataError


def write_image(path, value=128, size=(12, 10), mode="RGB"):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, value if mode != "RGB" else (value, value // 2, 255 - value)).save(path)


def make_cub(root, classes=(1, 2, 100, 101, 150, 200), per_class=2):
    base = root / "CUB_200_2011"
    lines, labels, names = [], [], []
    image_id = 0
    for c in classes:
        names.append(f"{c} {c:03d}.Bird_{c}")
        for k in range(per_class):
            image_id += 1
            rel = f"{c:03d}.Bird_{c}/Bird_{c}_{k:04d}.jpg"
            write_image(base / "images" / rel, value=c)
            lines.append(f"{image_id} {rel}")
            labels.append(f"{image_id} {c}")
    (base / "images.txt").write_text("\n".join(lines) + "\n")
    (base / "image_class_labels.txt").write_text("\n".join(labels) + "\n")
    (base / "classes.txt").write_text("\n".join(names) + "\n")
    (base / "train_test_split.txt").write_text("\n".join(f"{i} {i % 2}" for i in range(1, image_id + 1)))
    return base


def test_cub_replica_split_by_class(tmp_path):
    make_cub(tmp_path)
    for given in (tmp_path, tmp_path / "CUB_200_2011"):  # the data set's folder or its parent
        table = load_cub(given, check=False)
        assert table.count("train") == 6 and table.count("test") == 6
        assert set(table.classes("train")) == {1, 2, 100} and set(table.classes("test")) == {101, 150, 200}
        assert table.class_names[101] == "101.Bird_101"
        assert table.recall_at == (1, 2, 4, 8, 16, 32)


def test_published_count_check(tmp_path):
    make_cub(tmp_path)
    with pytest.raises(DataError, match="expected 5,864, found 6.*check_counts=false"):
        load_cub(tmp_path, check=True)
    table = load_dataset(f"cub:{tmp_path}", check_counts=False)
    assert table.meta["counts_match"] is False


def test_cub_wrong_layout_names_the_expected_file(tmp_path):
    (tmp_path / "images").mkdir()
    with pytest.raises(DataError, match=f"images.txt at {tmp_path}/images.txt"):
        load_cub(tmp_path)


def test_missing_image_is_named(tmp_path):
    base = make_cub(tmp_path)
    victim = next((base / "images").rglob("*.jpg"))
    victim.unlink()
    with pytest.raises(DataError, match=f"(?s)1 image.*{victim.name}"):
        load_dataset(f"cub:{tmp_path}", check_counts=False)


def make_cars(root, classes=(1, 50, 98, 99, 150, 196), per_class=2):
    from scipy.io import savemat

    fields = ["relative_im_path", "bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2", "class", "test"]
    records = np.zeros((1, len(classes) * per_class), dtype=[(f, "O") for f in fields])
    i = 0
    for c in classes:
        for _ in range(per_class):
            rel = f"car_ims/{i + 1:06d}.jpg"
            write_image(root / rel, value=c)
            records[0, i] = (rel, 1, 2, 10, 8, c, i % 2)
            i += 1
    names = np.array([f"Car model {c}" for c in range(1, 197)], dtype=object)[None, :]
    savemat(root / "cars_annos.mat", {"annotations": records, "class_names": names})


def test_cars_replica_ignores_the_classification_flag(tmp_path):
    make_cars(tmp_path)
    table = load_cars(tmp_path, check=False)
    assert table.count("train") == 6 and table.count("test") == 6
    assert set(table.classes("test")) == {99, 150, 196}
    assert table.class_names[99] == "Car model 99"


def write_boxes(base, boxes):
    (base / "bounding_boxes.txt").write_text("".join(f"{i} {x} {y} {w} {h}\n" for i, (x, y, w, h) in boxes.items()))


def test_cub_cropped_cuts_every_image_to_its_bounding_box(tmp_path):
    """``cub-cropped``: bounding_boxes.txt's ``x y width height`` -> pixels [y, y + height) x [x, x + width)
    (fractional edges rounded outwards); split, subset and the plain ``cub`` spec are unaffected."""
    base = make_cub(tmp_path)
    pattern = np.random.default_rng(0).integers(0, 256, size=(16, 20, 3), dtype=np.uint8)
    first = base / "images" / (base / "images.txt").read_text().split()[1]
    Image.fromarray(pattern).save(first.with_suffix(".png"))
    listing = base / "images.txt"
    listing.write_text(listing.read_text().replace(first.name, first.with_suffix(".png").name))
    write_boxes(base, {i: (1.0, 1.0, 4.0, 3.0) for i in range(2, 13)} | {1: (3.0, 2.0, 5.0, 4.5)})

    table = load_dataset(f"cub-cropped:{tmp_path}", check_counts=False)
    assert table.name == "cub-cropped" and table.recall_at == (1, 2, 4, 8, 16, 32)
    assert np.array_equal(table.image(0), pattern[2:7, 3:8])  # rows 2 .. 6.5 rounded out to 7
    assert table.image(1).shape == (3, 4, 3)
    test = table.split("test")
    assert test.boxes.shape == (6, 4) and test.image(0).shape == (3, 4, 3)
    assert load_dataset(f"cub:{tmp_path}", check_counts=False).image(0).shape == (16, 20, 3)

    write_boxes(base, {i: (1.0, 1.0, 4.0, 3.0) for i in range(2, 13)})
    with pytest.raises(DataError, match=r"no bounding box for image id\(s\) \[1\]"):
        load_cub(tmp_path, check=False, crop=True)
    (base / "bounding_boxes.txt").unlink()
    with pytest.raises(DataError, match="bounding_boxes.txt"):
        load_dataset(f"cub-cropped:{tmp_path}", check_counts=False)


def test_cars_cropped_reads_matlab_corners(tmp_path):
    """Cars' corners (x1, y1, x2, y2) = (1, 2, 10, 8) are 1-based and inclusive: columns 0-9, rows 1-7."""
    make_cars(tmp_path)
    table = load_dataset(f"cars-cropped:{tmp_path}", check_counts=False)
    assert table.name == "cars-cropped"
    whole = read_image(table.images[0])
    assert whole.shape == (10, 12, 3) and np.array_equal(table.image(0), whole[1:8, 0:10])
    assert load_cars(tmp_path, check=False).boxes is None


def test_bad_bounding_boxes_are_named(tmp_path):
    from deepmetric.data.audit import audit_table
    from deepmetric.data.table import RetrievalTable

    paths = [tmp_path / f"{i}.png" for i in range(3)]
    for path in paths:
        write_image(path)  # 12 x 10
    columns = dict(labels=[0, 0, 0], splits=["train"] * 3, is_query=[True] * 3, is_gallery=[True] * 3)
    with pytest.raises(DataError, match=r"1 empty bounding box.*1.png \(5.0, 5.0, 5.0, 9.0\)"):
        RetrievalTable("t", [str(p) for p in paths], boxes=[[0, 0, 4, 4], [5, 5, 5, 9], [0, 0, 4, 4]], **columns)
    with pytest.raises(DataError, match=r"bounding boxes have shape \(2, 4\), expected \(3, 4\)"):
        RetrievalTable("t", [str(p) for p in paths], boxes=[[0, 0, 4, 4]] * 2, **columns)
    table = RetrievalTable("t", [str(p) for p in paths], boxes=[[0, 0, 4, 4], [12, 0, 20, 4], [-3, -2, 99, 99]],
                             **columns)
    assert table.image(2).shape == (10, 12, 3)  # clipped to the image
    with pytest.raises(DataError, match=r"1.png: its bounding box \(12, 0, 20, 4\) lies outside the 12 x 10 image"):
        table.image(1)
    problems = [(p.row, p.problem) for p in audit_table(table, progress=False)]
    assert problems == [(1, "its bounding box (12, 0, 20, 4) lies outside the 12 x 10 image")]


def test_cars_foreign_mat_file_is_explained(tmp_path):
    from scipy.io import savemat

    savemat(tmp_path / "cars_annos.mat", {"something": np.zeros(3)})
    (tmp_path / "car_ims").mkdir()
    with pytest.raises(DataError, match="not the official annotation file"):
        load_cars(tmp_path)


def make_sop(root):
    base = root / "Stanford_Online_Products"
    header = "image_id class_id super_class_id path"
    train = [header, "1 1 1 bicycle_final/111085122871_0.JPG", "2 1 1 bicycle_final/111085122871_1.JPG",
             "3 2 1 bicycle_final/111265328556_0.JPG", "4 2 1 bicycle_final/111265328556_3.JPG"]
    test = [header, "5 11319 2 cabinet_final/110983893587_0.JPG", "6 11319 2 cabinet_final/110983893587_1.JPG",
            "7 11320 2 cabinet_final/111035711435_0.JPG", "8 11320 2 cabinet_final/111035711435_2.JPG",
            "9 11320 2 cabinet_final/111035711435_4.JPG"]
    for line in train[1:] + test[1:]:
        write_image(base / line.split()[3])
    (base / "Ebay_train.txt").write_text("\n".join(train) + "\n")
    (base / "Ebay_test.txt").write_text("\n".join(test) + "\n")


def test_sop_replica(tmp_path):
    make_sop(tmp_path)
    table = load_sop(tmp_path, check=False)
    assert table.count("train") == 4 and table.count("test") == 5
    assert table.recall_at == (1, 10, 100, 1000)
    with pytest.raises(DataError, match="59,551"):
        load_sop(tmp_path)


def make_inshop(root, flattened=False):
    rows = [("img/WOMEN/Dresses/id_00000002/02_1_front.jpg", "id_00000002", "train"),
            ("img/WOMEN/Dresses/id_00000002/02_2_side.jpg", "id_00000002", "train"),
            ("img/MEN/Denim/id_00000080/01_1_front.jpg", "id_00000080", "query"),
            ("img/MEN/Denim/id_00000080/01_2_side.jpg", "id_00000080", "gallery"),
            ("img/MEN/Denim/id_00000080/01_3_back.jpg", "id_00000080", "gallery"),
            ("img/WOMEN/Skirts/id_00000090/01_1_front.jpg", "id_00000090", "query"),
            ("img/WOMEN/Skirts/id_00000090/01_4_full.jpg", "id_00000090", "gallery")]
    image_root = root if flattened else root / "Img"
    for rel, _, _ in rows:
        write_image(image_root / rel)
    listing = root / ("list_eval_partition.txt" if flattened else "Eval/list_eval_partition.txt")
    listing.parent.mkdir(parents=True, exist_ok=True)
    listing.write_text(f"{len(rows)}\nimage_name item_id evaluation_status\n"
                       + "".join(f"{r[0]}  {r[1]}  {r[2]}\n" for r in rows))


@pytest.mark.parametrize("flattened", [False, True])
def test_inshop_replica_query_gallery(tmp_path, flattened):
    make_inshop(tmp_path, flattened)
    table = load_inshop(tmp_path, check=False)
    test = table.split("test")
    assert table.count("train") == 2 and int(test.is_query.sum()) == 2 and int(test.is_gallery.sum()) == 3
    assert not (test.is_query & test.is_gallery).any()
    assert table.recall_at == (1, 10, 20, 30, 40, 50)


def test_folder_loader_and_errors(tmp_path):
    for c, name in enumerate(["cat", "dog", "emu", "fox", "gnu"]):
        for k in range(3):
            write_image(tmp_path / name / f"{k}.png", value=40 * c)
    table = load_dataset(f"folder:{tmp_path}")
    assert table.count("train") == 9 and table.count("test") == 6  # 5 classes: 3 train, 2 test
    assert table.class_names[0] == "cat"
    (tmp_path / "hyena").mkdir()
    with pytest.raises(DataError, match="hyena holds no image"):
        load_dataset(f"folder:{tmp_path}")
    flat = tmp_path / "flat"  # images with no class folders: said only "has 0 class sub-folder(s)"
    for k in range(3):
        write_image(flat / f"{k}.png", value=40 * k)
    with pytest.raises(DataError, match=r"^folder: .*flat has 0 class sub-folder\(s\); expected at least 2 \(its 3 "
                                        r"image\(s\) lie in the folder itself: put each class's images in a "
                                        r"sub-folder named after the class, .*flat/<class>/<image>\)$"):
        load_dataset(f"folder:{flat}")


def test_csv_loader_and_its_errors(tmp_path):
    for i in range(4):
        write_image(tmp_path / "img" / f"{i}.png", value=50 * i)
    good = "path,label,split,is_query,is_gallery\nimg/0.png,0,train,1,1\nimg/1.png,0,train,1,1\n" \
           "img/2.png,5,test,1,0\nimg/3.png,5,test,0,1\n"
    (tmp_path / "t.csv").write_text(good)
    table = load_dataset(f"csv:{tmp_path / 't.csv'}")
    assert table.count("test") == 2 and table.is_query.tolist() == [True, True, True, False]
    cases = {
        "path,label\nimg/0.png,0\n": "lacks column.*split",
        "path,label,split\nimg/0.png,cat,train\n": "line 2: label 'cat' is not an integer",
        "path,label,split\nimg/0.png,0,train\nimg/0.png,1,test\n": "line 3: image 'img/0.png' already listed",
        "path,label,split\nimg/0.png,0,dev\n": "split 'dev'",
        "path,label,split\nimg/9.png,0,train\n": "9.png",
    }
    for text, message in cases.items():
        (tmp_path / "bad.csv").write_text(text)
        with pytest.raises(DataError, match=message):
            load_dataset(f"csv:{tmp_path / 'bad.csv'}")


def test_unknown_spec_and_missing_path():
    with pytest.raises(DataError, match="did you mean 'cub'"):
        load_dataset("cubb:/x")
    with pytest.raises(DataError, match="needs a path"):
        load_dataset("sop")


def test_a_path_given_without_its_kind_says_which_spec_reads_it(tmp_path, monkeypatch, capsys):
    """Issue 53 item 2: ``--data icons/`` (``folder:`` forgotten) said "unknown data set 'icons/' (did you mean
    'inshop'?)"; a folder is answered with ``folder:icons/``, a CSV file with ``csv:``."""
    from deepmetric.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "my-icons" / "printer").mkdir(parents=True)
    (tmp_path / "labels.csv").write_text("path,label,split\n")
    with pytest.raises(DataError, match=r"^unknown data set 'my-icons/': my-icons/ is a folder; .* give --data "
                                        r"folder:my-icons/$"):
        load_dataset("my-icons/")
    with pytest.raises(DataError, match=r"labels.csv is a CSV file; .* give --data csv:labels.csv$"):
        load_dataset("labels.csv")
    assert main(["train", "--data", "my-icons", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "give --data folder:my-icons" in err and "did you mean" not in err and not (tmp_path / "run").exists()
    with pytest.raises(DataError, match="did you mean 'cub'"):  # a name that is no path: the nearest name
        load_dataset("cubb")


def test_validation_split_is_class_disjoint_and_seeded():
    table = load_dataset("digits", val_fraction=0.4, val_seed=3)  # 2 of the 5 training digits
    val, train = set(table.classes("val")), set(table.classes("train"))
    assert len(val) == 2 and not val & train and val | train == {0, 1, 2, 3, 4}
    assert table.meta["val_classes"] == sorted(load_dataset("digits", val_fraction=0.4, val_seed=3).classes("val"))
    with pytest.raises(DataError, match="both need at least 2"):
        load_dataset("digits", val_fraction=0.2)


def test_digits_and_fashion_mnist_zero_shot_split():
    digits = load_dataset("digits")
    assert set(digits.classes("train")) == {0, 1, 2, 3, 4} and set(digits.classes("test")) == {5, 6, 7, 8, 9}
    try:
        fashion = load_dataset("fashion-mnist")
    except DataError:
        pytest.skip("Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)")
    assert len(fashion) == 70000 and fashion.count("train") == 35000 and fashion.images.shape[1:] == (28, 28)


def test_two_processes_loading_glyphs_at_once_build_it_once(tmp_path, monkeypatch):
    """Two trainings started together on one machine (``--nproc 2``, two torchrun ranks) with glyphs not yet built:
    both rendered it and replaced each other's folder, one of them while the other read it. Now the second waits
    for the first one's lock, saying so, and loads its build."""
    from deepmetric.data import glyphs as glyphs_module
    from helpers import loaded_twice_at_once

    fonts = matplotlib_fonts(GLYPH_CHARS)[:3]
    root = tmp_path / "glyphs"
    tables, errors, builds, waited = loaded_twice_at_once(
        monkeypatch, glyphs_module, "build_glyphs", lambda: load_glyphs(root),
        build=lambda root, size=None: build_glyphs(root, size=16, fonts=fonts, progress=False))
    assert errors == [] and builds == 1 and waited
    assert len(tables) == 2 and all(np.array_equal(t.images, tables[0].images) for t in tables)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["glyphs"]  # no lock file, no temporary folder left


def test_glyphs_build_and_load(tmp_path):
    fonts = matplotlib_fonts(GLYPH_CHARS)[:3]
    root = build_glyphs(tmp_path / "glyphs", size=32, fonts=fonts, progress=False)
    meta = json.loads((root / "meta.json").read_text())
    assert meta["fonts"] == len(fonts) and meta["images"] == 175 * len(fonts)
    assert [line.split("\t")[1] for line in (root / "fonts.txt").read_text().splitlines()] == [str(f) for f in fonts]
    table = load_glyphs(root, seed=0, build=False)
    assert len(table) == 175 * len(fonts) and table.images.shape[1:] == (32, 32)
    assert len(table.classes("train")) == 88 and len(table.classes("test")) == 87
    again, other = load_glyphs(root, seed=0, build=False), load_glyphs(root, seed=1, build=False)
    assert np.array_equal(again.classes("train"), table.classes("train"))
    assert not np.array_equal(other.classes("train"), table.classes("train"))
    # every rendering has ink, and the character's class is its row block
    assert (table.images.reshape(len(table), -1).min(axis=1) < 128).all()
    assert table.class_names[0].startswith("A ")


def test_unusual_image_formats_are_converted(tmp_path):
    cases = {"p.png": "P", "la.png": "LA", "rgba.png": "RGBA", "cmyk.jpg": "CMYK", "i16.png": "I;16", "l.jpg": "L"}
    for name, mode in cases.items():
        write_image(tmp_path / name, value=100, mode=mode)
        array = read_image(tmp_path / name)
        assert array.shape == (10, 12, 3) and array.dtype == np.uint8


def test_corrupt_and_fake_images_are_named(tmp_path):
    write_image(tmp_path / "ok.jpg")
    (tmp_path / "truncated.jpg").write_bytes((tmp_path / "ok.jpg").read_bytes()[:40])
    (tmp_path / "text.png").write_text("not an image")
    (tmp_path / "empty.jpg").write_bytes(b"")
    for name in ("truncated.jpg", "text.png", "empty.jpg", "absent.jpg"):
        with pytest.raises(DataError, match=name):
            read_image(tmp_path / name)
    with pytest.raises(DataError, match=f"^image {tmp_path} is a folder, not an image file$"):
        read_image(tmp_path)


def test_csv_from_excel_latin_1_huge_labels_and_every_bad_row_at_once(tmp_path):
    """A byte-order mark is read (Excel writes one); a latin-1 file, a label beyond 64 bits and several bad rows
    are each one DataError that lists every bad row; with skip_bad a repeated image keeps its first row."""
    for i in range(3):
        write_image(tmp_path / "img" / f"{i}.png", value=50 * i)
    bom = tmp_path / "excel.csv"
    bom.write_bytes("path,label,split\nimg/0.png,0,train\nimg/1.png,0,train\nimg/2.png,1,test\n".encode("utf-8-sig"))
    assert len(load_dataset(f"csv:{bom}")) == 3
    latin = tmp_path / "latin.csv"
    latin.write_bytes("path,label,split\nimg/0.png,0,train\nimg/caf\u00e9.png,0,train\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"line 3 is not UTF-8 \(byte 0xe9\)"):
        load_dataset(f"csv:{latin}")
    bad = tmp_path / "bad.csv"
    bad.write_text("path,label,split\nimg/0.png,0,train\nimg/0.png,0,train\nimg/1.png," + "1" + "0" * 30
                   + ",train\nimg/2.png,x,test\n")
    with pytest.raises(DataError, match="3 bad row") as caught:
        load_dataset(f"csv:{bad}")
    assert all(f"line {n}" in str(caught.value) for n in (3, 4, 5)) and "64 bits" in str(caught.value)
    repeated = tmp_path / "repeated.csv"
    repeated.write_text("path,label,split\nimg/0.png,0,train\nimg/1.png,0,train\nimg/0.png,1,test\nimg/2.png,1,test\n")
    with pytest.raises(DataError, match="line 4: image 'img/0.png' already listed on line 2"):
        load_dataset(f"csv:{repeated}")
    table = load_dataset(f"csv:{repeated}", skip_bad=True)
    assert len(table) == 3 and table.labels.tolist() == [0, 0, 1]


def test_an_image_with_too_many_pixels_is_refused_from_its_header(tmp_path):
    """A 20,000 x 20,000 PNG of zeros is 389 KB on disk and 1.2 GB decoded: the reader of training images,
    ``index`` and ``search --image`` refuses what has more pixels than the service allows, naming the file."""
    from deepmetric.data.images import read_image
    from serve_helpers import png_bomb

    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(png_bomb(8_000, 8_000))  # below PIL's own cap, which would otherwise decode it
    with pytest.raises(DataError, match=r"bomb.png is 8000 x 8000 = 64,000,000 pixels; the limit is 40,000,000"):
        read_image(bomb)
    huge = tmp_path / "huge.png"
    huge.write_bytes(png_bomb(50_000, 50_000))  # beyond PIL's own cap, which raises in Image.open
    with pytest.raises(DataError, match="huge.png has too many pixels"):
        read_image(huge)


def test_the_protocol_is_checked_when_a_data_set_is_loaded(tmp_path):
    """Before any training: test classes seen in training are refused (they were called "unseen", R@1 100), and
    so are a test split without rows, queries or gallery (an empty gallery crashed after training)."""
    for i in range(6):
        write_image(tmp_path / "img" / f"{i}.png", value=40 * i)
    header = "path,label,split,is_query,is_gallery\n"
    train = "img/0.png,0,train,1,1\nimg/1.png,0,train,1,1\nimg/2.png,1,train,1,1\nimg/3.png,1,train,1,1\n"
    cases = {
        train + "img/4.png,1,test,1,1\nimg/5.png,1,test,1,1\n": "1 test class.*also have training rows",
        train: "has no test rows",
        train + "img/4.png,7,test,1,0\nimg/5.png,7,test,1,0\n": "no test row is a gallery",
        train + "img/4.png,7,test,0,1\nimg/5.png,7,test,0,1\n": "no test row is a query",
        train + "img/4.png,1,val,1,1\nimg/5.png,7,test,1,1\n": "1 val class.*also have training rows",
    }
    for rows, message in cases.items():
        (tmp_path / "t.csv").write_text(header + rows)
        with pytest.raises(DataError, match=message):
            load_dataset(f"csv:{tmp_path / 't.csv'}")
    (tmp_path / "t.csv").write_text(header + train + "img/4.png,7,test,1,1\nimg/5.png,7,test,1,1\n")
    assert load_dataset(f"csv:{tmp_path / 't.csv'}").count("test") == 2


def test_empty_embeddings_are_one_clear_error():
    from deepmetric.errors import DeepMetricError
    from deepmetric.evaluation import retrieval_metrics

    query, labels = np.eye(4, dtype=np.float32), np.array([0, 0, 1, 1])
    with pytest.raises(DeepMetricError, match="gallery embeddings are empty"):
        retrieval_metrics(query, labels, np.zeros((0, 4), np.float32), np.zeros(0, np.int64))


def test_every_data_set_declares_what_its_path_is():
    from deepmetric.data import DATASETS, PATH_KINDS

    assert set(PATH_KINDS) == set(DATASETS.names())
    assert set(PATH_KINDS.values()) <= {"folder", "file", "built", "none"}


@pytest.mark.parametrize("name", ["cub", "cub-cropped", "cars", "cars-cropped", "sop", "inshop", "folder", "csv",
                                  "emoji", "emoji-skin", "icons", "fashion-mnist"])
def test_a_data_path_that_does_not_exist_is_named_for_every_loader(tmp_path, monkeypatch, name):
    """Issue item 28: ``cub:/nonexistent`` said "expected images.txt at /nonexistent/images.txt" (after the weights'
    download). Every loader's missing PATH is "NAME: no such folder: PATH" (a CSV's: file), checked before the loader
    runs; a file where a folder belongs (and the reverse) is named too."""
    from deepmetric.data import PATH_KINDS, check_data_path

    monkeypatch.setenv("DEEPMETRIC_DATA", str(tmp_path / "data"))  # emoji: no earlier build to fall back on
    kind = PATH_KINDS[name]
    for missing in (tmp_path / "nonexistent", tmp_path / "nonexistent" / "deeper", "relative/nonexistent"):
        expected = rf"^{re.escape(name)}: no such {kind}: {re.escape(str(missing))}$"
        with pytest.raises(DataError, match=expected):
            check_data_path(f"{name}:{missing}")
        with pytest.raises(DataError, match=expected):
            load_dataset(f"{name}:{missing}")
    a_file, a_folder = tmp_path / "a-file", tmp_path / "a-folder"
    a_file.write_text("x")
    a_folder.mkdir()
    wrong, message = (a_folder, "is a folder, not a file") if kind == "file" else (a_file, "is not a folder")
    with pytest.raises(DataError, match=rf"^{re.escape(name)}: {re.escape(str(wrong))} {message}$"):
        load_dataset(f"{name}:{wrong}")
    with pytest.raises(DataError, match=rf"^{re.escape(name)}: .* cannot be read: embedded null byte"):
        check_data_path(f"{name}:{tmp_path}/a\0b")
    assert not (tmp_path / "data").exists() and not (tmp_path / "nonexistent").exists()  # nothing built or made


def test_glyphs_builds_at_its_path_and_a_spec_without_a_path_is_not_checked(tmp_path):
    from deepmetric.data import check_data_path

    check_data_path(f"glyphs:{tmp_path / 'new'}")  # built there on first use
    check_data_path("digits")
    check_data_path("glyphs")


def test_a_data_path_with_a_tilde_is_the_home_folder(tmp_path, monkeypatch):
    """``--data 'folder:~/birds'`` (quoted, or in a YAML config, where no shell expands it) read the folder "~" in
    the working directory; now ``~`` is the home folder, for the check and the loader alike."""
    from deepmetric.data import check_data_path, parse_spec

    monkeypatch.setenv("HOME", str(tmp_path))
    for label in range(4):
        (tmp_path / "birds" / f"class{label}").mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (8, 8), (label * 60, i * 100, 0)).save(tmp_path / "birds" / f"class{label}" / f"{i}.png")
    assert parse_spec("folder:~/birds") == ("folder", str(tmp_path / "birds"))
    check_data_path("folder:~/birds")
    table = load_dataset("folder:~/birds")
    assert len(table) == 8 and all(str(p).startswith(str(tmp_path / "birds")) for p in table.images)
    with pytest.raises(DataError, match=rf"^folder: no such folder: {re.escape(str(tmp_path / 'fish'))}$"):
        check_data_path("folder:~/fish")


@pytest.mark.parametrize("spec", ["digits:/anything", "digits:~/x", "DIGITS:data"])
def test_a_path_given_to_a_loader_that_reads_none_is_refused(spec):
    """``digits:/anything`` loaded scikit-learn's digits and ignored the path: a user who meant their own folder got
    another data set without a word."""
    from deepmetric.data import check_data_path

    with pytest.raises(DataError, match=r"^data set 'digits' reads no path \(it is built in\): give 'digits', not "):
        check_data_path(spec)
    with pytest.raises(DataError, match="reads no path"):
        load_dataset(spec)
