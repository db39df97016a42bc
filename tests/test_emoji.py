"""The ``emoji`` loader on a small replica of the five npm packages' real layout (tarballs and unpacked folders with
``package/package.json``, ``package/emoji.json`` with the real fields, 64-px PNG folders), with no network: npm is
either absent or a stand-in script."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import math
import os
import stat
import tarfile

import numpy as np
import pytest
from PIL import Image

from deepmetric.data import emoji as emoji_module
from deepmetric.data import load_dataset
from deepmetric.data.emoji import PACKAGES, VENDORS, load_emoji
from deepmetric.errors import DataError

DATASOURCE = ("apple", "google", "twitter", "facebook")


def entry(unified, short_name, category, *, non_qualified=None, missing=(), skin=None, order=0):
    """An emoji.json record with the real package's fields."""
    record = {"name": short_name.upper(), "unified": unified, "non_qualified": non_qualified,
              "image": f"{unified.lower()}.png", "sheet_x": 0, "sheet_y": 0, "short_name": short_name,
              "short_names": [short_name], "text": None, "texts": None, "category": category,
              "subcategory": "test", "sort_order": order, "added_in": "1.0"}
    record.update({f"has_img_{v}": v not in missing for v in DATASOURCE})
    if skin:
        record["skin_variations"] = skin
    return record


def variant(unified, missing=()):
    record = {"unified": unified, "non_qualified": None, "image": f"{unified.lower()}.png", "sheet_x": 0,
              "sheet_y": 0, "added_in": "8.0"}
    record.update({f"has_img_{v}": v not in missing for v in DATASOURCE})
    return record


FLAGS = [entry(f"1F1E6-1F1{0xE6 + i:02X}", f"flag-a{i}", "Flags", order=i) for i in range(12)]
FACES = [entry(f"1F6{i:02X}", f"face-{i}", "Smileys & Emotion", order=20 + i) for i in range(12)]
WAVE = entry("1F44B", "wave", "People & Body", order=40,
             skin={"1F3FB": variant("1F44B-1F3FB"), "1F3FC": variant("1F44B-1F3FC", missing=("google",))})
HANDSHAKE = entry("1F91D", "handshake", "People & Body", order=41,
                  skin={"1F3FB-1F3FF": variant("1F91D-1F3FB-200D-1FAF2-1F3FF")})
SMILE_NQ = entry("263A-FE0F", "relaxed", "Smileys & Emotion", non_qualified="263A", order=42)
NO_FACEBOOK = entry("1F9CC", "troll", "Smileys & Emotion", missing=("facebook",), order=43)
NO_JOYPIXELS = entry("1FAE8", "shaking_face", "Smileys & Emotion", order=44)
SWATCH = entry("1F3FB", "skin-tone-2", "Component", order=45)
CATALOGUE = FLAGS + FACES + [WAVE, HANDSHAKE, SMILE_NQ, NO_FACEBOOK, NO_JOYPIXELS, SWATCH]
EXPECTED_BASES = [e["unified"] for e in FLAGS + FACES + [WAVE, HANDSHAKE, SMILE_NQ]]


def png(seed: int) -> bytes:
    """A distinct small RGBA drawing."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(8, 8, 4), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGBA").save(buffer, format="PNG")
    return buffer.getvalue()


def package_files(vendor: str) -> dict[str, bytes]:
    """The files of ``vendor``'s package as paths inside the tarball (``package/...``)."""
    package = PACKAGES[vendor]
    files = {"package/package.json": json.dumps({"name": package.name, "version": package.version}).encode()}
    names = []
    for record in CATALOGUE:
        if vendor == "joypixels":
            if record is NO_JOYPIXELS:
                continue
            key = record["non_qualified"] if record is SMILE_NQ else record["unified"]
            names.append(f"{key.lower()}.png")
        elif record[f"has_img_{vendor}"]:
            names.append(record["image"])
        for skin in (record.get("skin_variations") or {}).values():
            if vendor == "joypixels" or skin[f"has_img_{vendor}"]:
                names.append(f"{skin['unified'].lower()}.png")
    for i, name in enumerate(names):
        files[package.images + name] = png(hash((vendor, name)) % 2**32 + i)
    if vendor != "joypixels":
        files["package/emoji.json"] = json.dumps(CATALOGUE).encode()
        files[f"package/img/{vendor}/32/{names[0]}"] = png(1)  # another size: not unpacked
    else:
        files["package/LICENSE.md"] = b"JoyPixels Free License"
    return files


def write_tarball(path, files: dict[str, bytes], extra: list[tarfile.TarInfo] = ()) -> None:
    with tarfile.open(path, "w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        for info in extra:
            archive.addfile(info, io.BytesIO(b"x" * info.size) if info.isfile() else None)


def integrity(path) -> str:
    import base64

    return "sha512-" + base64.b64encode(hashlib.sha512(path.read_bytes()).digest()).decode()


@pytest.fixture
def replica(tmp_path):
    """A folder of the five tarballs, and the package table whose integrity hashes are theirs."""
    source = tmp_path / "packages"
    source.mkdir()
    packages = {}
    for vendor in VENDORS:
        path = source / PACKAGES[vendor].tarball
        write_tarball(path, package_files(vendor))
        packages[vendor] = dataclasses.replace(PACKAGES[vendor], integrity=integrity(path))
    return source, packages


def load(source, packages, root, **options):
    return load_emoji(source, check=False, root=root, packages=packages, progress=False, **options)


def test_the_protocol_on_the_replica(replica, tmp_path):
    source, packages = replica
    table = load(source, packages, tmp_path / "home" / "emoji")
    names = [table.class_names[i] for i in range(len(table.class_names))]
    # base emoji drawn by all five; the Component swatch, a missing Facebook and a missing JoyPixels drawing are out
    assert [n.split(" ")[0] for n in names] == EXPECTED_BASES
    assert names[0] == "1F1E6-1F1E6 flag-a0" and "263A-FE0F relaxed" in names  # JoyPixels filed it as 263a.png
    assert len(table.labels) == 5 * len(names) and np.bincount(table.labels).tolist() == [5] * len(names)
    for label in range(len(names)):  # one drawing of each vendor, from its own folder
        paths = [p for p, y in zip(table.images, table.labels, strict=True) if y == label]
        assert [p.split(os.sep)[-3] for p in paths] == list(VENDORS)
    # the split: classes ordered by SHA-256 of their code points, the first ceil(n/2) train (an independent oracle)
    ordered = sorted(EXPECTED_BASES, key=lambda u: hashlib.sha256(u.encode()).hexdigest())
    first_half = ordered[:math.ceil(len(ordered) / 2)]
    train = {names.index(next(n for n in names if n.startswith(u + " "))) for u in first_half}
    assert set(table.classes("train")) == train and len(table.classes("test")) == len(names) - len(train)
    for group in (FLAGS, FACES):  # every category lands on both sides
        sides = {table.splits[table.labels == names.index(f"{e['unified']} {e['short_name']}")][0] for e in group}
        assert sides == {"train", "test"}
    assert table.recall_at == (1, 2, 4, 8) and table.is_query.all() and table.is_gallery.all()
    first = table.images[0]
    assert Image.open(first).size == (8, 8)  # the drawings are the packages' own files


def test_skin_variants_are_classes_on_their_base_emojis_side(replica, tmp_path):
    source, packages = replica
    root = tmp_path / "emoji"
    plain = load(source, packages, root)
    built = (root / "meta.json").stat().st_mtime_ns
    table = load(source, packages, root, skin=True)
    assert (root / "meta.json").stat().st_mtime_ns == built  # one build serves both
    names = {table.class_names[i]: i for i in range(len(table.class_names))}
    assert "1F44B-1F3FB wave (light skin tone)" in names
    assert "1F91D-1F3FB-200D-1FAF2-1F3FF handshake (light, dark skin tone)" in names
    assert not any(n.startswith("1F44B-1F3FC") for n in names)  # Google lacks that drawing
    assert len(names) == len(plain.class_names) + 2
    side = {n: table.splits[table.labels == i][0] for n, i in names.items()}
    assert side["1F44B-1F3FB wave (light skin tone)"] == side["1F44B wave"]
    assert side["1F91D-1F3FB-200D-1FAF2-1F3FF handshake (light, dark skin tone)"] == side["1F91D handshake"]
    # the base emoji keep their sides when the variants are added
    for i, name in plain.class_names.items():
        assert plain.splits[plain.labels == i][0] == side[name]


def test_unpacked_packages_read_like_tarballs(replica, tmp_path):
    source, packages = replica
    unpacked = tmp_path / "unpacked"
    for vendor in VENDORS:
        package = PACKAGES[vendor]
        folder = unpacked / (package.name if vendor != "google" else f"{package.name}-{package.version}")
        with tarfile.open(source / package.tarball) as archive:
            archive.extractall(folder, filter="data")
    from_tar = load(source, packages, tmp_path / "a")
    from_folders = load(unpacked, packages, tmp_path / "b")
    assert from_folders.class_names == from_tar.class_names
    assert (from_folders.splits == from_tar.splits).all()
    relative = [os.path.relpath(p, tmp_path / "b") for p in from_folders.images]
    assert relative == [os.path.relpath(p, tmp_path / "a") for p in from_tar.images]


def test_a_tarball_that_fails_its_integrity_check_is_refused_and_nothing_is_left(replica, tmp_path):
    source, packages = replica
    tarball = source / PACKAGES["joypixels"].tarball
    tarball.write_bytes(tarball.read_bytes()[:-10] + b"0123456789")
    root = tmp_path / "home" / "emoji"
    with pytest.raises(DataError, match=r"emoji-assets-11\.0\.0\.tgz is not emoji-assets@11\.0\.0 as the npm "
                                        r"registry publishes it"):
        load(source, packages, root)
    assert not root.exists() and os.listdir(root.parent) == []  # no half-built set, no temporary folder


def test_another_version_and_a_missing_package_are_named(replica, tmp_path):
    source, packages = replica
    (source / PACKAGES["google"].tarball).rename(source / "emoji-datasource-google-15.1.2.tgz")
    with pytest.raises(DataError, match=r"no emoji-datasource-google-16\.0\.0\.tgz.*15\.1\.2\.tgz is another "
                                        r"version.*npm pack emoji-datasource-google@16\.0\.0"):
        load(source, packages, tmp_path / "emoji")
    folder = source / "emoji-datasource-google" / "package"
    folder.mkdir(parents=True)
    (folder / "package.json").write_text(json.dumps({"name": "emoji-datasource-google", "version": "15.1.2"}))
    with pytest.raises(DataError, match=r"holds emoji-datasource-google 15\.1\.2; the emoji protocol is defined "
                                        r"on 16\.0\.0"):
        load(source, packages, tmp_path / "emoji")


def test_the_published_counts_refuse_a_replica(replica, tmp_path):
    source, packages = replica
    with pytest.raises(DataError, match=r"emoji: split sizes differ.*expected 4,085"):
        load_emoji(source, root=tmp_path / "emoji", packages=packages, progress=False)


def test_archive_members_cannot_write_outside_the_data_folder(replica, tmp_path):
    source, packages = replica
    vendor = PACKAGES["twitter"]
    evil = [tarfile.TarInfo(f"{vendor.images}../../../../escaped.png"), tarfile.TarInfo(f"{vendor.images}link.png")]
    evil[0].size = 5
    evil[1].type, evil[1].linkname = tarfile.SYMTYPE, "/etc/passwd"
    path = source / vendor.tarball
    write_tarball(path, package_files("twitter"), extra=evil)
    packages["twitter"] = dataclasses.replace(vendor, integrity=integrity(path))
    root = tmp_path / "home" / "emoji"
    load(source, packages, root)
    assert not list(tmp_path.rglob("escaped.png")) and not (root / "twitter" / "64" / "link.png").exists()


def fake_npm(folder, source, corrupt=None):
    """An ``npm`` on PATH that 'fetches' from ``source``: ``npm pack NAME@VERSION --json --pack-destination D``."""
    script = folder / "npm"
    script.write_text(f"""#!/bin/sh
spec="$2"; dest="$5"; name="${{spec%@*}}"; version="${{spec##*@}}"
file="$name-$version.tgz"
cp "{source}/$file" "$dest/$file"
if [ "$name" = "{corrupt}" ]; then printf 'tampered' >> "$dest/$file"; fi
echo '[{{"filename": "'$file'"}}]'
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def npm_on_path(replica, tmp_path, monkeypatch):
    """A folder for a fake ``npm`` first on PATH, ``DEEPMETRIC_DATA`` in ``tmp_path`` and the replica's packages
    pinned; returns (that folder, the replica's source)."""
    source, packages = replica
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("DEEPMETRIC_DATA", str(tmp_path / "data"))
    monkeypatch.setattr(emoji_module, "PACKAGES", packages)
    return bin_dir, source


def test_npm_fetches_checks_and_a_failed_build_never_counts(replica, tmp_path, monkeypatch):
    bin_dir, source = npm_on_path(replica, tmp_path, monkeypatch)
    fake_npm(bin_dir, source, corrupt="emoji-assets")
    with pytest.raises(DataError, match="emoji-assets-11.0.0.tgz is not emoji-assets@11.0.0"):
        load_dataset("emoji", check_counts=False)
    assert not (tmp_path / "data" / "emoji").exists()
    assert os.listdir(tmp_path / "data") == []  # neither a half-built set nor a downloaded tarball is left
    fake_npm(bin_dir, source)
    table = load_dataset("emoji-skin", check_counts=False, val_fraction=0.25)
    assert table.name == "emoji-skin" and set(np.unique(table.splits)) == {"train", "val", "test"}
    assert sorted(os.listdir(tmp_path / "data" / "emoji")) == sorted([*VENDORS, "meta.json"])
    assert json.loads((tmp_path / "data" / "emoji" / "meta.json").read_text())["source"] == "npm"


def test_without_npm_the_error_says_how_to_install_it_or_where_to_put_the_tarballs(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(DataError, match=r"needs npm.*apt-get install npm.*emoji-assets-11\.0\.0\.tgz.*emoji:FOLDER"):
        load_emoji(root=tmp_path / "emoji", progress=False)


def test_fetching_with_npm_writes_nothing_to_standard_output(replica, tmp_path, monkeypatch, capfd, caplog):
    """Issue 39: ``load_dataset("emoji")`` printed its npm progress on standard output, so a program printing JSON
    after it printed invalid JSON. The library's messages go to logging, npm's own output (a noisy stand-in here)
    and the unpacking bars to standard error, or nowhere."""
    import logging

    bin_dir, source = npm_on_path(replica, tmp_path, monkeypatch)
    fake_npm(bin_dir, source)
    noisy = (bin_dir / "npm").read_text().replace('cp "', 'echo "npm notice 📦 $spec"; echo "npm WARN x" >&2; cp "', 1)
    (bin_dir / "npm").write_text(noisy)
    caplog.set_level(logging.INFO, logger="deepmetric")
    table = load_emoji(check=False)  # progress bars on, as load_dataset has them
    print(json.dumps({"images": len(table.images)}))  # what a program does next
    out = capfd.readouterr().out
    assert json.loads(out) == {"images": len(table.images)}, out
    assert "emoji: fetching emoji-assets@11.0.0 with npm (5/5)" in caplog.text
    assert "drawings of 5 vendors" in caplog.text
    assert len(load_dataset("emoji", check_counts=False).images) == len(table.images)  # built: nothing fetched
    assert capfd.readouterr().out == ""


# ---------------------------------------------------------------------------------------------- malformed input

def unpacked_copy(source, folder):
    """The replica's five tarballs unpacked into ``folder/NAME/package/`` (no integrity hash guards a folder)."""
    for vendor in VENDORS:
        with tarfile.open(source / PACKAGES[vendor].tarball) as archive:
            archive.extractall(folder / PACKAGES[vendor].name, filter="data")
    return folder


def records(**changes):
    """The replica's catalogue with record 0 changed (``None`` removes a field)."""
    first = {k: v for k, v in {**FLAGS[0], **changes}.items() if v is not None}
    return json.dumps([first, *CATALOGUE[1:]]).encode()


MALFORMED_CATALOGUES = {
    "invalid JSON": (b'[{"unified": "1F600",', r"is not valid JSON: Expecting"),
    "not UTF-8": (b'[{"short_name": "\xff"}]', r"is not valid JSON: 'utf-8' codec"),
    "nested too deep": (b"[" * 200_000, r"is not valid JSON"),
    "an object": (json.dumps({"emoji": CATALOGUE}).encode(), r"must be a list of emoji records, not an object"),
    "a number record": (json.dumps([7, *CATALOGUE]).encode(), r"record 0 is a number, not an object"),
    "no short_name": (records(short_name=None), r"record 0 \('1F1E6-1F1E6'\) has no 'short_name'"),
    "image a list": (records(image=["1f1e6-1f1e6.png"]), r"record 0 \('1F1E6-1F1E6'\): 'image' must be a string, "
                                                         r"not a list"),
    "non-ASCII unified": (records(unified="1F1E6-1F1É6"), r"'unified' must be hexadecimal code points such as "
                                                          r"'1F44B-1F3FB', not '1F1E6-1F1É6'"),
    "full-width digits": (records(unified="１F600"), r"'unified' must be hexadecimal code points"),
    "a line break": (records(unified="1F1E6-1F1E6\n"), r"'unified' must be hexadecimal code points"),
    "unified a number": (records(unified=1234), r"record 0: 'unified' must be code points, not a number"),
    "no category": (records(category=None), r"has no 'category'"),
    "short_name empty": (records(short_name=""), r"'short_name' '' must be a non-empty printable name"),
    "has_img a string": (records(has_img_apple="yes"), r"'has_img_apple' must be true or false, not a string"),
    "skin a list": (records(skin_variations=[1]), r"'skin_variations' must be an object, not a list"),
    "skin record": (records(skin_variations={"1F3FB": {"unified": "1F1E6-1F3FB", "image": 5}}),
                    r"skin variation '1F3FB': 'image' must be a string, not a number"),
    "repeated emoji": (json.dumps([*CATALOGUE, FLAGS[3]]).encode(), r"code points 1F1E6-1F1E9 are already those of "
                                                                     r"record 3"),
    "too few drawn": (json.dumps(CATALOGUE[:3]).encode(), r"lists only 3 emoji that all five vendors draw"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED_CATALOGUES))
def test_a_malformed_catalogue_is_one_error_naming_it_and_never_counts_as_built(replica, tmp_path, case):
    """Issue item 15: a malformed ``emoji.json`` was a traceback, and ``meta.json`` was written before the catalogue
    was read, so the broken folder counted as built and a later good PATH kept failing. Every malformed catalogue is
    one DataError naming the file and what is wrong; nothing is left that counts as built."""
    source, packages = replica
    bad = unpacked_copy(source, tmp_path / "bad")
    catalogue = bad / "emoji-datasource-apple" / "package" / "emoji.json"
    data, message = MALFORMED_CATALOGUES[case]
    catalogue.write_bytes(data)
    root = tmp_path / "home" / "emoji"
    with pytest.raises(DataError, match=rf"(?s)^emoji: {catalogue} .*{message}") as caught:
        load(bad, packages, root)
    assert "Traceback" not in str(caught.value) and len(str(caught.value)) < 2000
    assert not root.exists() and os.listdir(root.parent) == []  # no build, no temporary folder
    table = load(source, packages, root)  # a good PATH after the bad one builds and loads
    assert len(table.class_names) == len(EXPECTED_BASES)


def test_a_malformed_catalogue_in_a_tarball_is_named_by_the_tarball(replica, tmp_path):
    source, packages = replica
    apple = PACKAGES["apple"]
    files = package_files("apple")
    files["package/emoji.json"] = records(image=["x"])
    write_tarball(source / apple.tarball, files)
    packages["apple"] = dataclasses.replace(apple, integrity=integrity(source / apple.tarball))
    with pytest.raises(DataError, match=rf"^emoji: package/emoji.json in {source / apple.tarball} is not the "
                                        r"emoji-datasource catalogue \(1 problem\(s\)\):\n  record 0 .*'image' must"):
        load(source, packages, tmp_path / "emoji")
    assert not (tmp_path / "emoji").exists()


@pytest.mark.parametrize(("text", "message"), [
    (b"[1, 2]", r"must be an object with the package's name and version, not a list"),
    (b'"16.0.0"', r"must be an object .*, not a string"),
    (b'{"name": "emoji-datasource-google", "version": 16}', r"has no version string \('version' is a number\)"),
    (b"{", r"is not valid JSON"),
    (b"\xff\xfe\x00", r"is not valid JSON"),
])
def test_a_malformed_package_json_is_one_error_naming_it(replica, tmp_path, text, message):
    source, packages = replica
    bad = unpacked_copy(source, tmp_path / "bad")
    manifest = bad / "emoji-datasource-google" / "package" / "package.json"
    manifest.write_bytes(text)
    root = tmp_path / "home" / "emoji"
    with pytest.raises(DataError, match=rf"^emoji: {manifest} {message}"):
        load(bad, packages, root)
    assert not root.exists()


def test_a_path_that_does_not_exist_is_refused_never_replaced_by_an_earlier_build(replica, tmp_path, monkeypatch):
    """Issue item 15: ``emoji:/nonexistent`` silently used the build made earlier from another source. ``emoji:PATH``
    must name a folder holding the five packages; an earlier build of the same versions is used (not unpacked
    again) only when it does."""
    source, packages = replica
    monkeypatch.setenv("DEEPMETRIC_DATA", str(tmp_path / "data"))
    monkeypatch.setattr(emoji_module, "PACKAGES", packages)
    root = tmp_path / "data" / "emoji"
    load_dataset(f"emoji:{source}", check_counts=False)
    built = (root / "meta.json").stat().st_mtime_ns
    missing = tmp_path / "nonexistent"
    for spec in (f"emoji:{missing}", f"emoji-skin:{missing}"):
        with pytest.raises(DataError, match=rf"^{spec.split(':')[0]}: no such folder: {missing}$"):
            load_dataset(spec, check_counts=False)
    with pytest.raises(DataError, match=rf"^emoji: no such folder: {missing}$"):  # the loader itself, called directly
        load_emoji(missing, check=False, progress=False)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match=rf"^emoji: {empty} has no emoji-datasource-apple-16\.0\.0\.tgz"):
        load_dataset(f"emoji:{empty}", check_counts=False)
    with pytest.raises(DataError, match=r"is not a folder"):
        load_dataset(f"emoji:{source / PACKAGES['apple'].tarball}", check_counts=False)
    (source / PACKAGES["google"].tarball).write_bytes(b"not the tarball")
    with pytest.raises(DataError, match=r"emoji-datasource-google-16\.0\.0\.tgz is not emoji-datasource-google"):
        load_dataset(f"emoji:{source}", check_counts=False)  # PATH's packages are checked even when built
    assert (root / "meta.json").stat().st_mtime_ns == built  # none of these touched the build


def test_two_processes_loading_emoji_at_once_build_it_once(replica, tmp_path, monkeypatch):
    """Two trainings started together on one machine (``--nproc 2``, two torchrun ranks) with emoji not yet built:
    both built it and replaced each other's folder. Now the second waits for the first one's lock, saying so, and
    loads its build."""
    from helpers import loaded_twice_at_once

    source, packages = replica
    root = tmp_path / "home" / "emoji"
    tables, errors, builds, waited = loaded_twice_at_once(monkeypatch, emoji_module, "build_emoji",
                                                          lambda: load(source, packages, root))
    assert errors == [] and builds == 1 and waited
    assert len(tables) == 2 and tables[0].class_names == tables[1].class_names
    assert sorted(p.name for p in root.parent.iterdir()) == ["emoji"]  # no lock file, no temporary folder left


def test_a_path_holding_the_same_versions_uses_the_build(replica, tmp_path):
    source, packages = replica
    root = tmp_path / "emoji"
    first = load(source, packages, root)
    built = (root / "meta.json").stat().st_mtime_ns
    again = load(unpacked_copy(source, tmp_path / "unpacked"), packages, root)
    assert (root / "meta.json").stat().st_mtime_ns == built and again.class_names == first.class_names


def test_a_folder_left_marked_built_with_a_broken_catalogue_is_built_again(replica, tmp_path, caplog):
    """A folder the earlier code marked built before reading its catalogue (or one broken since) does not count as
    built: a good PATH rebuilds it; a ``meta.json`` that is not an object is no build either."""
    import logging

    source, packages = replica
    root = tmp_path / "emoji"
    load(source, packages, root)
    (root / "apple" / "emoji.json").write_text('{"not": "a list"}')
    caplog.set_level(logging.WARNING, logger="deepmetric")
    table = load(source, packages, root)
    assert "is not a complete build" in caplog.text and len(table.class_names) == len(EXPECTED_BASES)
    (root / "meta.json").write_text("[1, 2]")
    assert len(load(source, packages, root).class_names) == len(EXPECTED_BASES)
    assert json.loads((root / "meta.json").read_text())["format"] == emoji_module.FORMAT_VERSION
