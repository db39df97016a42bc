"""The ``icons`` loader on small synthetic Debian packages made here with ``dpkg-deb -b`` (five themes by five
"artists", a few icons each: a symbolic-link alias, a byte-identical copy, a near-identical copy of shared artwork, a
symbolic icon and folder, a monochrome theme, a dark variant, a blank icon), with no network: the fetching step is a
function that copies the packages, or a stand-in ``apt-get`` script. Skipped without ``dpkg-deb`` or ``rsvg-convert``
(``make test`` installs librsvg2-bin)."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import shutil
import stat
import subprocess

import numpy as np
import pytest
from PIL import Image, ImageDraw

from deepmetric.data import load_dataset
from deepmetric.data.icons import build as icons_build
from deepmetric.data.icons import dedup as icons_dedup
from deepmetric.data.icons import load_icons
from deepmetric.data.icons import table as icons_table
from deepmetric.data.icons.catalogue import Package
from deepmetric.errors import DataError

pytestmark = pytest.mark.skipif(shutil.which("dpkg-deb") is None or shutil.which("rsvg-convert") is None,
                                reason="needs dpkg-deb (Debian's dpkg) and rsvg-convert (librsvg2-bin)")

COLOURS = ["#c0392b", "#2980b9", "#27ae60", "#8e44ad", "#d35400", "#16a085", "#2c3e50", "#f1c40f", "#7f8c8d",
           "#e84393", "#00cec9", "#6c5ce7", "#fd79a8", "#e17055", "#0984e3", "#b33939", "#218c74", "#474787"]


def drawing(seed: int) -> str:
    """A distinct SVG: a rectangle and a circle whose colours, places and sizes follow ``seed``."""
    rng = np.random.default_rng(seed)
    first, second = COLOURS[seed % len(COLOURS)], COLOURS[(seed * 7 + 3) % len(COLOURS)]
    x, y, w, h = rng.integers(2, 16), rng.integers(2, 16), rng.integers(20, 30), rng.integers(12, 30)
    cx, cy, r = rng.integers(14, 34), rng.integers(14, 34), rng.integers(6, 14)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="48" height="48" viewBox="0 0 48 48">'
            f'<rect x="{x}" y="{y}" width="{w}" height="{h}" fill="{first}"/>'
            f'<circle cx="{cx}" cy="{cy}" r="{r}" fill="{second}" stroke="#000" stroke-width="1.5"/></svg>')


def artwork(size: int, margin: float) -> bytes:
    """Shared bitmap artwork (a printer-ish drawing) at ``size`` px with ``margin`` of it left empty on each side."""
    canvas = Image.new("RGBA", (size, size), (0, 0, 0, 0))
    draw = ImageDraw.Draw(canvas)
    inner = size * (1 - 2 * margin)

    def at(u: float, v: float) -> tuple[float, float]:
        return size * margin + u * inner, size * margin + v * inner

    draw.rectangle([*at(0.0, 0.3), *at(1.0, 0.8)], fill=(90, 90, 100, 255))
    draw.rectangle([*at(0.2, 0.0), *at(0.8, 0.35)], fill=(250, 250, 250, 255))
    draw.ellipse([*at(0.7, 0.4), *at(0.85, 0.55)], fill=(220, 40, 40, 255))
    draw.rectangle([*at(0.15, 0.7), *at(0.85, 1.0)], fill=(240, 240, 240, 255))
    buffer = io.BytesIO()
    canvas.save(buffer, format="PNG")
    return buffer.getvalue()


INDEX = """[Icon Theme]
Name={name}
Inherits={inherits}
Directories={dirs}

"""
SECTIONS = {
    "scalable/apps": "Size=48\nMinSize=16\nMaxSize=512\nType=Scalable\n",
    "scalable-up-to-32/apps": "Size=16\nMinSize=16\nMaxSize=32\nType=scalable\n",
    "symbolic/apps": "Size=128\nType=Fixed\n",
    "48x48/apps": "Size=48\nType=Fixed\n",
    "256x256/apps": "Size=256\nType=Fixed\n",
    "128x128/apps": "Size=128\nType=Fixed\n",
}


def theme(files: dict, folder: str, inherits: str = "hicolor", name: str | None = None) -> None:
    """Add theme ``folder``'s ``index.theme`` (listing the folders its icons are in) to a package's ``files``."""
    dirs = sorted({path.split("/", 1)[1].rsplit("/", 1)[0] for path in files if path.startswith(f"{folder}/")})
    text = INDEX.format(name=name or folder, inherits=inherits, dirs=",".join(dirs))
    text += "".join(f"[{d}]\n{SECTIONS[d]}\n" for d in dirs)
    files[f"{folder}/index.theme"] = text


BLANK = ('<svg xmlns="http://www.w3.org/2000/svg" width="48" height="48" viewBox="0 0 48 48">'
         '<path d="M8 40V20L24 6l16 14v20z" fill="#fff"/></svg>')  # white on transparent: does not show on white


def packages_files() -> dict[str, dict[str, str | bytes | tuple[str]]]:
    """Each package's files under ``usr/share/icons`` (a tuple: a symbolic link to that target)."""
    shared = drawing(500)  # Gamma's user-trash, copied byte for byte by Epsilon
    alpha = {
        "Alpha/scalable/apps/printer.svg": drawing(1),
        "Alpha/scalable/apps/user-trash.svg": drawing(2),
        "Alpha/scalable/apps/edit-delete.svg": ("user-trash.svg",),  # an alias: the same file under another name
        "Alpha/scalable/apps/folder.svg": drawing(3),
        "Alpha/scalable/apps/edit-copy.svg": drawing(4),
        "Alpha/scalable/apps/network-wired.svg": drawing(5),
        "Alpha/scalable/apps/printer-symbolic.svg": drawing(6),  # symbolic: not an icon of the set
        "Alpha/symbolic/apps/user-trash.svg": drawing(7),  # a symbolic folder drawn at 128: never chosen
        "Alpha/scalable/apps/escape.svg": ("../../../../../../../etc/hostname",),  # leaves the package: no icon
        "Alpha/scalable/apps/go-home.svg": ("/usr/share/icons/Alpha/scalable/apps/folder-home.svg",),
        "Alpha/scalable/apps/folder-home.svg": drawing(8),
        "Alpha-Dark/scalable/apps/media-playback-start.svg": drawing(9),  # only the dark variant draws it
        "Alpha-Dark/scalable/apps/printer.svg": drawing(10),  # the theme's own printer comes first
        "Alpha-Mono/scalable/apps/network-wired.svg": drawing(11),  # a monochrome theme: no vendor
        "hicolor/48x48/apps/printer.png": artwork(48, 0.1),  # the fallback theme: no vendor
    }
    beta = {
        "Beta/256x256/apps/printer.png": artwork(256, 0.05),  # the largest bitmap is taken
        "Beta/48x48/apps/printer.png": artwork(48, 0.3),
        "Beta/scalable/apps/user-trash.svg": drawing(21),
        "Beta/scalable/apps/edit-delete.svg": drawing(22),
        "Beta/scalable/apps/folder.svg": drawing(23),
        "Beta/scalable/apps/edit-copy.svg": drawing(24),
        "Beta/scalable/apps/network-wired.svg": drawing(25),
        "Beta/scalable/apps/media-playback-start.svg": drawing(26),
        "Beta/scalable/apps/document-save.svg": drawing(27),
        "Beta/scalable/apps/go-home.svg": drawing(28),
    }
    gamma = {
        "Gamma/scalable/apps/printer.svg": drawing(31),
        "Gamma/scalable/apps/user-trash.svg": shared,
        "Gamma/scalable/apps/edit-delete.svg": drawing(32),
        "Gamma/scalable/apps/folder.svg": drawing(33),
        "Gamma/scalable-up-to-32/apps/folder.svg": drawing(34),  # drawn for small sizes: the scalable one wins
        "Gamma/scalable/apps/edit-copy.svg": drawing(35),
        "Gamma/scalable/apps/network-wired.svg": drawing(36),
        "Gamma/scalable/apps/media-playback-start.svg": drawing(37),
        "Gamma/scalable/apps/document-save.svg": drawing(38),
        "Gamma/scalable/apps/go-home.svg": drawing(39),
    }
    delta = {
        "Delta/scalable/apps/printer.svg": drawing(41),
        "Delta/scalable/apps/user-trash.svg": drawing(42),
        "Delta/scalable/apps/edit-delete.svg": drawing(43),
        "Delta/scalable/apps/folder.svg": drawing(44),
        "Delta/scalable/apps/media-playback-start.svg": drawing(45),
        "Delta/scalable/apps/document-save.svg": drawing(46),
        "Delta/scalable/apps/network-wired-symbolic.svg": drawing(47),
        "Delta/scalable/apps/go-home.svg": BLANK,
    }
    epsilon = {
        "Epsilon/128x128/apps/printer.png": artwork(128, 0.1),  # Beta's artwork drawn at 128 px: this copy is kept
        "Epsilon/scalable/apps/user-trash.svg": shared,  # Gamma's file, byte for byte
        "Epsilon/scalable/apps/edit-delete.svg": drawing(51),
        "Epsilon/scalable/apps/folder.svg": drawing(52),
        "Epsilon/scalable/apps/edit-copy.svg": drawing(53),
        "Epsilon/scalable/apps/document-save.svg": drawing(54),
    }
    theme(alpha, "Alpha")
    theme(alpha, "Alpha-Dark", inherits="Alpha,Adwaita")
    theme(alpha, "Alpha-Mono", inherits="Alpha", name="Alpha Mono")
    theme(alpha, "hicolor")
    for files, folder in ((beta, "Beta"), (gamma, "Gamma"), (delta, "Delta"), (epsilon, "Epsilon")):
        theme(files, folder)
    return {"alpha-icon-theme": alpha, "beta-icon-theme": beta, "gamma-icon-theme": gamma,
            "delta-icon-theme": delta, "epsilon-icon-theme": epsilon}


EXPECTED_CLASSES = ["document-save", "edit-copy", "edit-delete", "folder", "media-playback-start", "printer",
                    "user-trash"]
EXPECTED_DROPPED = {("printer", "Beta"): ("near-identical", "Epsilon/printer"),
                    ("user-trash", "Epsilon"): ("identical", "Gamma/user-trash"),
                    ("edit-delete", "Alpha"): ("alias", "Alpha/user-trash")}


def build_deb(folder, name: str, version: str, files: dict) -> Package:
    """``dpkg-deb -b`` a package of ``files`` (under ``usr/share/icons``) and a copyright file; its table row."""
    root = folder / f"{name}-root"
    for path, content in files.items():
        target = root / "usr/share/icons" / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, tuple):
            target.symlink_to(content[0])
        elif isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)
    doc = root / "usr/share/doc" / name
    doc.mkdir(parents=True)
    (doc / "copyright").write_text(f"{name}: GPL-3+\n")
    (root / "DEBIAN").mkdir()
    (root / "DEBIAN/control").write_text(f"Package: {name}\nVersion: {version}\nArchitecture: all\n"
                                         "Maintainer: Test <test@example.org>\nDescription: test icons\n")
    package = Package(name, version, "0" * 64)
    deb = folder / package.deb
    subprocess.run(["dpkg-deb", "-Zgzip", "--root-owner-group", "-b", str(root), str(deb)], check=True,
                   capture_output=True)
    shutil.rmtree(root)
    return Package(name, version, hashlib.sha256(deb.read_bytes()).hexdigest())


@pytest.fixture(scope="module")
def debs(tmp_path_factory):
    """A folder of the five packages' ``.deb`` files and their package table (Epsilon's version has an epoch)."""
    folder = tmp_path_factory.mktemp("debs")
    table = {}
    for name, files in packages_files().items():
        version = "1:2.0-1" if name == "epsilon-icon-theme" else "1.0-1"
        table[name] = build_deb(folder, name, version, files)
    return folder, table


def copier(source):
    """A fetching step that copies the packages from ``source`` (what ``apt-get download`` would write)."""
    calls = []

    def fetch(packages, folder):
        calls.append([p.spec for p in packages])
        for package in packages:
            shutil.copyfile(source / package.deb, folder / package.deb)
    fetch.calls = calls
    return fetch


@pytest.fixture(scope="module")
def built(debs, tmp_path_factory):
    """One build from the packages (fetched by copying), shared by the tests that only read it."""
    source, packages = debs
    root = tmp_path_factory.mktemp("data") / "icons"
    table = load_icons(root=root, packages=packages, fetch=copier(source), progress=False)
    return root, table


def rows(path):
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def leftovers(folder):
    return sorted(p for p in os.listdir(folder) if p != "icons")


# ---------------------------------------------------------------------------------------------- the build

def test_the_classes_are_names_drawn_by_four_vendors_once_copies_are_removed(built):
    root, table = built
    names = [table.class_names[i] for i in range(len(table.class_names))]
    assert names == EXPECTED_CLASSES  # network-wired: 3 vendors (Alpha-Mono and a -symbolic one do not count);
    #                                   go-home: 3 (Delta's is blank, Alpha's an absolute link within the package)
    vendors = {name: sorted(os.path.basename(os.path.dirname(p)) for p, y in zip(table.images, table.labels,
                                                                                  strict=True)
                            if table.class_names[int(y)] == name) for name in names}
    assert vendors["printer"] == ["Alpha", "Delta", "Epsilon", "Gamma"]  # Beta's is Epsilon's artwork, at 256 px
    assert vendors["user-trash"] == ["Alpha", "Beta", "Delta", "Gamma"]  # Epsilon's is Gamma's file
    assert vendors["edit-delete"] == ["Beta", "Delta", "Epsilon", "Gamma"]  # Alpha's is its user-trash
    assert vendors["folder"] == ["Alpha", "Beta", "Delta", "Epsilon", "Gamma"]
    assert vendors["media-playback-start"] == ["Alpha", "Beta", "Delta", "Gamma"]  # Alpha's from Alpha-Dark
    assert len(table.images) == sum(len(v) for v in vendors.values()) == 29
    assert table.recall_at == (1, 2, 4, 8) and table.is_query.all() and table.is_gallery.all()
    for path in table.images:
        with Image.open(path) as image:
            assert image.size == (128, 128) and image.mode == "RGBA"


def test_the_catalogue_says_which_file_each_image_is(built):
    root, _ = built
    listed = {(r["vendor"], r["name"]): r for r in rows(root / "images.csv")}
    assert listed["Alpha", "user-trash"]["file"] == "usr/share/icons/Alpha/scalable/apps/user-trash.svg"
    assert listed["Alpha", "printer"]["theme"] == "Alpha"  # not the dark variant's printer
    assert listed["Alpha", "media-playback-start"]["theme"] == "Alpha-Dark"
    assert listed["Epsilon", "printer"]["kind"] == "png"
    dropped = {(r["vendor"], r["name"]): r for r in rows(root / "duplicates.csv")}
    assert dropped["Beta", "printer"]["file"].endswith("256x256/apps/printer.png")  # its largest bitmap, not 48 px
    assert listed["Gamma", "folder"]["file"] == "usr/share/icons/Gamma/scalable/apps/folder.svg"
    assert {r["package"] for r in listed.values()} == {f"{n}-icon-theme" for n in
                                                       ("alpha", "beta", "gamma", "delta", "epsilon")}
    assert sorted(os.listdir(root / "licences")) == sorted(f"{n}-icon-theme.copyright" for n in
                                                           ("alpha", "beta", "gamma", "delta", "epsilon"))


def test_copies_are_dropped_for_a_reason_naming_what_they_copy(built):
    root, _ = built
    dropped = {(r["name"], r["vendor"]): (r["reason"], r["copy_of"]) for r in rows(root / "duplicates.csv")}
    for key, expected in EXPECTED_DROPPED.items():
        assert dropped[key] == expected
    near = next(r for r in rows(root / "duplicates.csv") if r["reason"] == "near-identical")
    assert 0 <= float(near["distance"]) <= icons_dedup.NEAR_IDENTICAL
    meta = json.loads((root / "meta.json").read_text())
    assert meta["dropped"] == {"alias": 1, "identical": 1, "near-identical": 1}
    assert meta["images"] == 29 and meta["classes"] == 7 and meta["size"] == 128
    assert set(meta["vendors"]) == {"Alpha", "Beta", "Gamma", "Delta", "Epsilon"}
    assert meta["renderer"].startswith("rsvg-convert")
    # Epsilon copies one of Beta's six common names and one of Gamma's: over the 10 % that marks shared artwork
    assert meta["sharing_vendors"] == [["Beta", "Epsilon"], ["Epsilon", "Gamma"]]


def test_the_split_is_class_disjoint_by_the_hash_of_the_name_and_validation_is_seeded(built, debs, tmp_path,
                                                                                       monkeypatch):
    _, table = built
    names = [table.class_names[i] for i in range(len(table.class_names))]
    ordered = sorted(names, key=lambda n: hashlib.sha256(n.encode()).hexdigest())  # an independent oracle
    train = set(ordered[:math.ceil(len(ordered) / 2)])
    sides = {table.class_names[int(y)]: s for y, s in zip(table.labels, table.splits, strict=True)}
    assert {n for n, s in sides.items() if s == "train"} == train and len(train) == 4
    for name in names:  # every image of a class on one side
        assert len(set(table.splits[table.labels == names.index(name)])) == 1
    source, packages = debs
    monkeypatch.setenv("DEEPMETRIC_DATA", str(tmp_path / "data"))
    monkeypatch.setattr(icons_table, "PACKAGES", packages)
    monkeypatch.setattr(icons_build, "apt_get_download", copier(source))  # build_icons' default fetcher
    first = load_dataset("icons", val_fraction=0.5, val_seed=3)
    again = load_dataset("icons", val_fraction=0.5, val_seed=3)
    assert first.meta["val_classes"] == again.meta["val_classes"] and len(first.meta["val_classes"]) == 2
    val = {first.class_names[c] for c in first.meta["val_classes"]}
    assert val <= train and set(np.unique(first.splits)) == {"train", "val", "test"}
    seeds = {tuple(load_dataset("icons", val_fraction=0.5, val_seed=s).meta["val_classes"]) for s in range(6)}
    assert len(seeds) > 1  # the seed chooses the validation classes


def test_a_path_of_deb_files_builds_the_same_set_and_a_build_of_the_same_versions_is_reused(built, debs, tmp_path):
    _, table = built
    source, packages = debs
    root = tmp_path / "icons"
    from_path = load_icons(source, root=root, packages=packages, progress=False)
    assert from_path.class_names == table.class_names and len(from_path.images) == len(table.images)
    assert json.loads((root / "meta.json").read_text())["source"] == str(source)
    before = (root / "meta.json").stat().st_mtime_ns
    fetch = copier(source)
    load_icons(source, root=root, packages=packages, fetch=fetch, progress=False)
    load_icons(root=root, packages=packages, fetch=fetch, progress=False)
    assert (root / "meta.json").stat().st_mtime_ns == before and fetch.calls == []  # nothing fetched or unpacked
    missing = tmp_path / "nowhere"
    with pytest.raises(DataError, match=rf"^icons: no such folder: {missing}$"):
        load_icons(missing, root=root, packages=packages, progress=False)


# ---------------------------------------------------------------------------------------------- clear errors

def test_a_package_of_another_version_or_hash_is_one_clear_error_and_nothing_is_left(debs, tmp_path):
    source, packages = debs
    folder = tmp_path / "debs"
    shutil.copytree(source, folder)
    gamma = packages["gamma-icon-theme"]
    (folder / gamma.deb).rename(folder / "gamma-icon-theme_0.9-1_all.deb")
    root = tmp_path / "data" / "icons"
    with pytest.raises(DataError, match=r"^icons: .* has no gamma-icon-theme_1\.0-1_all\.deb \(gamma-icon-theme_0\.9-1"
                                        r"_all\.deb is another version\); fetch it with: apt-get download "
                                        r"gamma-icon-theme=1\.0-1$"):
        load_icons(folder, root=root, packages=packages, progress=False)
    (folder / "gamma-icon-theme_0.9-1_all.deb").rename(folder / gamma.deb)
    with open(folder / gamma.deb, "ab") as handle:
        handle.write(b"tampered")
    with pytest.raises(DataError, match=r"gamma-icon-theme_1\.0-1_all\.deb is not gamma-icon-theme 1\.0-1 as the "
                                        r"Debian archive publishes it"):
        load_icons(folder, root=root, packages=packages, progress=False)
    assert not root.exists() and os.listdir(root.parent) == []  # no half-built set, no temporary folder


def test_a_fetched_package_that_fails_its_check_leaves_nothing(debs, tmp_path):
    source, packages = debs

    def tampering(to_fetch, folder):
        copier(source)(to_fetch, folder)
        with open(folder / packages["delta-icon-theme"].deb, "ab") as handle:
            handle.write(b"x")

    root = tmp_path / "data" / "icons"
    with pytest.raises(DataError, match=r"delta-icon-theme_1\.0-1_all\.deb is not delta-icon-theme 1\.0-1"):
        load_icons(root=root, packages=packages, fetch=tampering, progress=False)
    assert os.listdir(tmp_path / "data") == []


def test_a_file_that_is_not_a_debian_package_is_one_clear_error(debs, tmp_path):
    source, packages = debs
    folder = tmp_path / "debs"
    shutil.copytree(source, folder)
    junk = b"not a Debian package" * 50
    delta = packages["delta-icon-theme"]
    (folder / delta.deb).write_bytes(junk)  # pinned as it is: only dpkg-deb can tell
    packages = {**packages, delta.name: Package(delta.name, delta.version, hashlib.sha256(junk).hexdigest())}
    with pytest.raises(DataError, match=r"^icons: dpkg-deb cannot unpack .*delta-icon-theme_1\.0-1_all\.deb: "):
        load_icons(folder, root=tmp_path / "data" / "icons", packages=packages, progress=False)
    assert os.listdir(tmp_path / "data") == []


def fake_apt(bin_dir, script: str) -> None:
    """An ``apt-get`` first on PATH running ``script`` (sh)."""
    bin_dir.mkdir(exist_ok=True)
    apt = bin_dir / "apt-get"
    apt.write_text("#!/bin/sh\n" + script)
    apt.chmod(apt.stat().st_mode | stat.S_IEXEC)


def test_an_unreachable_registry_is_one_clear_error(debs, tmp_path, monkeypatch, capfd):
    _, packages = debs
    fake_apt(tmp_path / "bin", 'echo "Get:1 somewhere"\necho "E: Failed to fetch http://deb.example/x.deb  '
                               'Temporary failure resolving \'deb.example\'" >&2\nexit 100\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    root = tmp_path / "data" / "icons"
    with pytest.raises(DataError, match=r"^icons: apt-get download failed \(exit 100\): E: Failed to fetch .*"
                                        r"Temporary failure resolving .*--data icons:FOLDER$"):
        load_icons(root=root, packages=packages, progress=False)
    assert os.listdir(tmp_path / "data") == [] and capfd.readouterr().out == ""  # apt-get's output is captured


def test_apt_get_download_is_asked_for_the_pinned_versions(debs, tmp_path, monkeypatch, capfd):
    source, packages = debs
    fake_apt(tmp_path / "bin", f'shift\nfor spec in "$@"; do echo "$spec" >> "{tmp_path}/asked"; done\n'
                               f'echo "Get:1 a noisy client"\ncp "{source}"/*.deb .\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    table = load_icons(root=tmp_path / "data" / "icons", packages=packages)  # progress bars on, as load_dataset has
    assert capfd.readouterr().out == ""  # apt-get's output and the bars never reach standard output
    assert len(table.class_names) == len(EXPECTED_CLASSES)
    assert (tmp_path / "asked").read_text().split() == [p.spec for p in packages.values()]
    assert "epsilon-icon-theme=1:2.0-1" in (tmp_path / "asked").read_text()  # the epoch, filed as %3a
    assert os.listdir(tmp_path / "data") == ["icons"]  # the downloads and the unpacked files are gone


def test_without_apt_get_the_error_says_what_to_do(debs, tmp_path, monkeypatch):
    _, packages = debs
    (tmp_path / "bin").mkdir()
    os.symlink(shutil.which("rsvg-convert"), tmp_path / "bin" / "rsvg-convert")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    with pytest.raises(DataError, match=r"needs Debian's package client apt-get.*apt-get download "
                                        r"alpha-icon-theme=1\.0-1 .*--data icons:FOLDER"):
        load_icons(root=tmp_path / "icons", packages=packages, progress=False)


def test_a_folder_deepmetric_did_not_make_is_never_replaced(debs, tmp_path):
    source, packages = debs
    root = tmp_path / "icons"
    root.mkdir()
    (root / "mine.txt").write_text("mine")
    fetch = copier(source)
    with pytest.raises(DataError, match=rf"^icons: {root} exists but was not built by deepmetric"):
        load_icons(root=root, packages=packages, fetch=fetch, progress=False)
    assert os.listdir(root) == ["mine.txt"] and fetch.calls == []
    link = tmp_path / "linked"
    link.symlink_to(root)
    with pytest.raises(DataError, match=r"is a symbolic link; deepmetric never replaces what it did not create"):
        load_icons(root=link, packages=packages, fetch=fetch, progress=False)
    assert fetch.calls == []


def test_a_damaged_build_is_one_clear_error(debs, tmp_path):
    source, packages = debs
    root = tmp_path / "icons"
    table = load_icons(root=root, packages=packages, fetch=copier(source), progress=False)
    os.remove(table.images[3])
    with pytest.raises(DataError, match=rf"^icons: {root} is damaged: 1 image\(s\) it lists are missing .*delete "
                                        r"the folder and run again"):
        load_icons(root=root, packages=packages, fetch=copier(source), progress=False)
    (root / "images.csv").write_text("not,the\ncatalogue,at all\n")
    with pytest.raises(DataError, match=r"is damaged: .*images\.csv is not the catalogue of the build"):
        load_icons(root=root, packages=packages, fetch=copier(source), progress=False)
    shutil.rmtree(root)  # the way out the message gives
    assert len(load_icons(root=root, packages=packages, fetch=copier(source), progress=False).images) == 29


def test_a_build_of_other_versions_is_replaced(debs, tmp_path):
    source, packages = debs
    root = tmp_path / "icons"
    load_icons(root=root, packages=packages, fetch=copier(source), progress=False)
    meta = json.loads((root / "meta.json").read_text())
    meta["packages"]["beta-icon-theme"] = "0.1-1"
    (root / "meta.json").write_text(json.dumps(meta))
    (root / "stale.txt").write_text("from the old build")
    table = load_icons(root=root, packages=packages, fetch=copier(source), progress=False)
    assert len(table.images) == 29 and not (root / "stale.txt").exists()
    assert sorted(leftovers(tmp_path)) == []


def test_a_build_that_fails_late_leaves_the_earlier_build_as_it_was(debs, tmp_path, monkeypatch):
    """Atomicity: a rebuild that fails after fetching and reading (here: a renderer that draws nothing) is one error,
    and the set that was there stays whole; no temporary folder is left."""
    source, packages = debs
    root = tmp_path / "data" / "icons"
    load_icons(root=root, packages=packages, fetch=copier(source), progress=False)
    meta = json.loads((root / "meta.json").read_text())
    meta["packages"]["beta-icon-theme"] = "0.1-1"  # an older build: it will be built again
    (root / "meta.json").write_text(json.dumps(meta))
    before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    broken = tmp_path / "bin"
    fake = broken / "rsvg-convert"
    broken.mkdir()
    fake.write_text("#!/bin/sh\necho 'rsvg-convert version 0.0'\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{broken}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(DataError, match=r"icons: \d+ of \d+ icons could not be drawn .*is .*rsvg-convert working\?"):
        load_icons(root=root, packages=packages, fetch=copier(source), progress=False)
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == before
    assert json.loads((root / "meta.json").read_text()) == meta and os.listdir(tmp_path / "data") == ["icons"]


def test_the_help_lists_icons():
    from deepmetric.cli import parser

    assert "icons" in parser.DATA_HELP and "icons:PATH" in parser.DATA_HELP
