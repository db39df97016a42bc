"""The icons protocol's rules without packages: the pinned table, which themes are vendors, which file of a name is
drawn, reading ``index.theme``, following links inside a package, the split and the copy removal."""

from __future__ import annotations

import hashlib
import math
import re

import numpy as np
import pytest

from deepmetric.data.icons.catalogue import (
    PACKAGES,
    IconFolder,
    Package,
    is_symbolic,
    is_symbolic_folder,
    is_vendor_theme,
    rank,
    training_names,
    vendor_themes,
)
from deepmetric.data.icons.dedup import (
    NEAR_IDENTICAL,
    SHARED_NEAR,
    Candidate,
    Look,
    distance,
    is_blank,
    look,
    select,
    sharing_vendors,
    signature,
)
from deepmetric.data.icons.themes import Tree, archive_path, read_index

BRIEF = ["adwaita-icon-theme", "gnome-icon-theme", "tango-icon-theme", "oxygen-icon-theme", "mate-icon-theme",
         "elementary-xfce-icon-theme", "faenza-icon-theme", "faba-icon-theme", "moka-icon-theme", "paper-icon-theme",
         "lxde-icon-theme", "gnome-icon-theme-nuovo", "gnome-icon-theme-gartoon", "deepin-icon-theme"]


def test_the_table_pins_exactly_the_fourteen_packages_by_version_and_sha256():
    assert list(PACKAGES) == BRIEF
    for package in PACKAGES.values():
        assert re.fullmatch(r"[0-9a-f]{64}", package.sha256) and package.version
    oxygen = PACKAGES["oxygen-icon-theme"]
    assert oxygen.spec == "oxygen-icon-theme=5:5.103.0-1"
    assert oxygen.deb == "oxygen-icon-theme_5%3a5.103.0-1_all.deb"  # as apt-get download names it
    assert Package("x", "1.0", "0" * 64).deb == "x_1.0_all.deb"


def test_variants_fold_into_the_theme_they_derive_from_within_their_package():
    inherits = {"Faenza": ["gnome", "hicolor"], "Faenza-Dark": ["Faenza"], "Faenza-Darkest": ["Faenza-Dark"],
                "Faenza-Ambiance": ["Faenza-Darkest"]}
    assert vendor_themes(inherits) == {"Faenza": ["Faenza", "Faenza-Ambiance", "Faenza-Dark", "Faenza-Darkest"]}
    deepin = {"bloom": ["Papirus"], "bloom-classic": ["bloom"], "bloom-dark": ["bloom", "bloom-classic"],
              "Sea": ["deepin", "Papirus"], "Vintage": ["bloom", "Papirus"]}
    assert vendor_themes(deepin) == {"Sea": ["Sea"], "bloom": ["bloom", "Vintage", "bloom-classic", "bloom-dark"]}
    assert vendor_themes({"B": ["A"], "A": ["B"], "C": ["C"]}) == {"A": ["A", "B"], "C": ["C"]}  # loops end


@pytest.mark.parametrize(("folder", "name", "vendor"), [
    ("Paper", "Paper", True), ("Paper-Mono-Dark", "Paper-Mono-Dark", False), ("hicolor", "Hicolor", False),
    ("default", "Default", False), ("Adwaita", "Adwaita Symbolic", False), ("Monokai", "Monokai", True),
    ("elementary-xfce-dark", "elementary Xfce dark", True), ("Faenza-Mono", "x", False)])
def test_which_themes_can_be_vendors(folder, name, vendor):
    assert is_vendor_theme(folder, name) is vendor


def test_symbolic_icons_and_folders_are_out():
    assert is_symbolic("printer-symbolic") and is_symbolic("user-trash-symbolic.symbolic")
    assert not is_symbolic("printer") and not is_symbolic("symbolic-link")
    assert is_symbolic_folder("symbolic/apps") and is_symbolic_folder("scalable/status-symbolic")
    assert not is_symbolic_folder("scalable/apps") and not is_symbolic_folder("scalable-up-to-32/status")


def test_the_file_drawn_nearest_the_stored_size_is_taken():
    folders = {
        "scalable": IconFolder("scalable/apps", "scalable", 16, 512),
        "128": IconFolder("128x128/apps", "fixed", 128, 128),
        "256": IconFolder("256x256/apps", "fixed", 256, 256),
        "512": IconFolder("512x512/apps", "fixed", 512, 512),
        "up-to-32": IconFolder("scalable-up-to-32/apps", "scalable", 16, 32),
        "64@2x": IconFolder("64x64@2x/apps", "threshold", 124, 132),
        "48": IconFolder("48x48/apps", "fixed", 48, 48),
        "16": IconFolder("16x16/apps", "fixed", 16, 16),
    }
    order = sorted([(k, e) for k in folders for e in (".svg", ".png")], key=lambda c: rank(folders[c[0]], c[1], 128))
    assert order[:6] == [("128", ".svg"), ("64@2x", ".svg"), ("scalable", ".svg"), ("128", ".png"),
                         ("64@2x", ".png"), ("scalable", ".png")]  # drawn at 128, a vector file first
    assert order[6:10] == [("256", ".svg"), ("256", ".png"), ("512", ".svg"), ("512", ".png")]  # scaled down
    assert order[10:] == [("48", ".svg"), ("up-to-32", ".svg"), ("16", ".svg"), ("48", ".png"),
                          ("up-to-32", ".png"), ("16", ".png")]  # vectors drawn for smaller sizes, then bitmaps


INDEX = """# a comment
[Icon Theme]
Name=Test Theme
Comment=one; two
Inherits=Base, hicolor
Directories=48x48/apps,scalable/apps,24x24@2x/apps,nosize/apps,unlisted/apps
ScaledDirectories=32x32@2/apps

[48x48/apps]
Size=48
Type=fixed

[scalable/apps]
Size=48
MinSize=8
MaxSize=512
Type=Scalable

[24x24@2x/apps]
Size=24
Scale=2

[nosize/apps]
Type=Fixed

[32x32@2/apps]
Size=32
Scale=2
Type=Fixe
"""


def test_index_theme_is_read_as_desktops_read_it():
    name, inherits, folders = read_index(INDEX)
    assert name == "Test Theme" and inherits == ("Base", "hicolor")
    assert [(f.path, f.kind, f.low, f.high) for f in folders] == [
        ("48x48/apps", "fixed", 48, 48), ("scalable/apps", "scalable", 8, 512),
        ("24x24@2x/apps", "threshold", 44, 52),  # Threshold defaults to 2, times the scale
        ("32x32@2/apps", "fixed", 64, 64)]  # no Size: skipped; not a section: skipped
    assert read_index("[Something Else]\nName=x\n") is None
    assert read_index("not an ini file at all [") is None


def package_tree(entries: dict) -> Tree:
    """A package's tree from ``entries``: path -> None (a file) or a link target (a tuple: a hard link)."""
    tree = Tree()
    for path, target in entries.items():
        if target is None:
            tree.add(path, "file")
        elif isinstance(target, tuple):
            tree.add(path, "hard", "/" + target[0])
        else:
            tree.add(path, "link", target)
    return tree


def test_links_are_followed_inside_the_package_only():
    apps = "usr/share/icons/T/apps"
    tree = package_tree({
        f"{apps}/real.svg": None, f"{apps}/relative.svg": "real.svg",
        f"{apps}/absolute.svg": "/usr/share/icons/T/apps/real.svg",  # taken from the package's root
        f"{apps}/hard.svg": (f"{apps}/real.svg",),
        f"{apps}/escape.svg": "../../../../../../../etc/hostname", f"{apps}/absolute-out.svg": "/etc/hostname",
        f"{apps}/loop-a.svg": "loop-b.svg", f"{apps}/loop-b.svg": "loop-a.svg",
        f"{apps}/dangling.svg": "/usr/share/icons/Other/apps/x.svg", "usr/share/icons/Alias": "T"})
    real = f"{apps}/real.svg"
    for name in ("relative.svg", "absolute.svg", "hard.svg"):
        assert tree.resolve(f"{apps}/{name}") == real, name
    assert tree.resolve("usr/share/icons/Alias/apps/relative.svg") == real and tree.is_file(real)
    assert tree.is_dir(tree.resolve("usr/share/icons/Alias/apps"))
    for name in ("escape.svg", "absolute-out.svg", "loop-a.svg", "dangling.svg"):
        assert tree.resolve(f"{apps}/{name}") is None, name
    assert list(tree.listdir(apps))[:3] == ["absolute-out.svg", "absolute.svg", "dangling.svg"]
    assert archive_path("./usr/share/icons/") == "usr/share/icons" and archive_path("./../etc/passwd") is None


def test_the_split_is_the_first_half_by_the_hash_of_the_name():
    names = [f"icon-{i}" for i in range(11)]
    train = training_names(names)
    ordered = sorted(names, key=lambda n: hashlib.sha256(n.encode()).hexdigest())
    assert train == set(ordered[:math.ceil(11 / 2)]) and len(train) == 6
    assert training_names(reversed(names)) == train  # the order given does not matter


# ---------------------------------------------------------------------------------------------- copies

def shape(size: int = 128, margin: float = 0.1, colour=(200, 40, 40), second=(40, 40, 200)) -> np.ndarray:
    """A drawing (RGBA) of a two-colour block at ``margin``."""
    image = np.zeros((size, size, 4), dtype=np.uint8)
    low, high = int(size * margin), int(size * (1 - margin))
    middle = (low + high) // 2
    image[low:high, low:middle] = (*colour, 255)
    image[low:high, middle:high] = (*second, 255)
    return image


def test_the_signature_sees_one_artwork_at_two_margins_as_one_and_other_colours_as_other():
    one, smaller = signature(shape(margin=0.05)), signature(shape(margin=0.3))
    assert distance(one, smaller) < NEAR_IDENTICAL  # the block's boundary moves by a rounded pixel
    assert distance(one, signature(shape(colour=(40, 160, 40)))) > 3 * NEAR_IDENTICAL
    white = np.zeros((128, 128, 4), dtype=np.uint8)
    white[20:100, 20:100] = (255, 255, 255, 255)
    assert is_blank(white) and look(white).signature is None
    assert not is_blank(shape()) and signature(np.zeros((128, 128, 4), dtype=np.uint8)) is None


def candidate(vendor, name, order, file, content=None):
    return Candidate(vendor, name, order, file, content or file)


def test_select_keeps_one_of_each_copy_in_order():
    red, blue = look(shape()), look(shape(colour=(40, 160, 40), second=(250, 200, 0)))
    red_far = look(shape(margin=0.25))  # the same artwork, drawn smaller
    looks = {"a/printer": red, "b/printer": red_far, "c/printer": blue, "d/copy": blue,
             "e/zip": Look(red.signature + 2.0, "zip"), "e/gz": Look(red.signature + 3.0, "gz"),
             "f/blank": Look(None, "x")}
    candidates = [
        candidate("A", "printer", (0, 0), "a/printer"),
        candidate("B", "printer", (0, 1), "b/printer"),  # A's artwork: near-identical
        candidate("C", "printer", (0, 2), "c/printer"),
        candidate("A", "document-print", (1, 0), "a/printer"),  # A's file under another name: alias
        candidate("D", "folder", (0, 3), "d/copy", content="c/printer"),  # C's bytes: identical
        candidate("E", "zip", (0, 4), "e/zip"),  # another name looking like A's printer: kept (only exact copies
        candidate("E", "gz", (0, 5), "e/gz"),    # count across names), and like E's zip: kept too
        candidate("F", "folder", (0, 6), "f/blank"),
        candidate("G", "folder", (0, 7), "g/missing"),
    ]
    kept, dropped = select(reversed(candidates), looks)
    assert [(c.vendor, c.name) for c in kept] == [("A", "printer"), ("C", "printer"), ("E", "zip"), ("E", "gz")]
    reasons = {(d.candidate.vendor, d.candidate.name): (d.reason, d.kept and (d.kept.vendor, d.kept.name))
               for d in dropped}
    assert reasons == {("B", "printer"): ("near-identical", ("A", "printer")),
                       ("A", "document-print"): ("alias", ("A", "printer")),
                       ("D", "folder"): ("identical", ("C", "printer")),
                       ("F", "folder"): ("blank", None), ("G", "folder"): ("unreadable", None)}
    near = next(d for d in dropped if d.reason == "near-identical")
    assert near.distance <= NEAR_IDENTICAL
    same_pixels = {"x": red, "y": Look(red.signature + 40, red.pixels)}  # drawn to the same pixels
    kept, dropped = select([candidate("X", "a", (0,), "x"), candidate("Y", "b", (1,), "y")], same_pixels)
    assert [c.vendor for c in kept] == ["X"] and dropped[0].reason == "identical"


def test_vendors_that_share_artwork_are_found_and_compared_more_loosely():
    base = look(shape()).signature
    far = base + 15.0  # one design re-drawn: beyond NEAR_IDENTICAL, within SHARED_NEAR
    other = base + 60.0
    looks = {}
    candidates = []
    for i in range(10):  # A and B draw ten names: two are copies at NEAR_IDENTICAL, the rest re-drawn copies
        looks[f"a{i}"], looks[f"b{i}"] = Look(base + 3 * i, f"a{i}"), Look(base + 3 * i + (2 if i < 2 else 15), f"b{i}")
        looks[f"c{i}"] = Look(base + 3 * i + 60, f"c{i}")  # C draws them its own way
        candidates += [candidate(v, f"n{i}", (k, i), f"{v.lower()}{i}") for k, v in enumerate("ABC")]
    assert NEAR_IDENTICAL < 15 <= SHARED_NEAR < 60 and distance(base, far) == 15 and distance(base, other) == 60
    shared = sharing_vendors(candidates, looks)
    assert shared == {frozenset("AB")}  # 2 of 10 common names within NEAR_IDENTICAL: 20 % >= SHARING
    kept, dropped = select(candidates, looks, shared=shared)
    assert {c.vendor for c in kept} == {"A", "C"} and {d.candidate.vendor for d in dropped} == {"B"}
    kept, dropped = select(candidates, looks)  # without it, only the two close copies go
    assert sorted(d.candidate.name for d in dropped) == ["n0", "n1"]
