"""The emoji protocol: the catalogue (``emoji.json``) read and checked, and the classes and their split.

The protocol (``emoji_classes``, ``split_of``):

- classes are the base emoji of ``emoji.json`` (no skin-tone variant, no ``Component`` such as the bare skin-tone
  swatches) that all five vendors draw: 1,633 classes x 5 = 8,165 images for the pinned versions;
- a class is named by its ``unified`` code points and short name, e.g. ``1F600 grinning``;
- the split is class-disjoint, half/half, fixed: classes sorted by the SHA-256 of their code points, the first
  ceil(n/2) train (817 classes, 4,085 images) and the rest test (816, 4,080). A hash spreads every category over both
  halves; Unicode order would put every flag on one side;
- every test image queries the other test images (as in SOP); Recall@1, 2, 4, 8.

``emoji-skin`` adds each skin-tone variant that all five draw as a class of its own (e.g.
``1F44B-1F3FB waving-hand (light skin tone)``), on the same side of the split as its base emoji: a harder,
fine-grained variant, not the default.

Fetching, unpacking and loading the drawings: ``emoji.py``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import DataError

VENDORS = ("apple", "google", "twitter", "facebook", "joypixels")
EXCLUDED_CATEGORIES = ("Component",)
SKIN_TONES = {"1F3FB": "light", "1F3FC": "medium-light", "1F3FD": "medium", "1F3FE": "medium-dark",
              "1F3FF": "dark"}
CODE_POINTS = re.compile(r"[0-9A-Fa-f]{1,6}(-[0-9A-Fa-f]{1,6})*")
"""``unified``, ``non_qualified``, a skin variation's key: hexadecimal code points joined by ``-`` (``1F44B-1F3FB``)."""
MAX_LISTED = 10  # malformed records a refusal lists before it counts the rest


@dataclass(frozen=True)
class EmojiClass:
    """One class: its name, its base emoji's code points (which decide its side of the split), its category and the
    file name of each vendor's drawing."""

    name: str
    base: str
    category: str
    files: dict[str, str]


def split_of(base_unified: str) -> str:
    """The key that orders the classes for the split: SHA-256 of the base emoji's code points (upper case)."""
    return hashlib.sha256(base_unified.upper().encode("ascii")).hexdigest()


def _joypixels_file(entry: Mapping, available: set[str]) -> str | None:
    """JoyPixels files an emoji by its lower-case code points, some under the non-qualified form."""
    for key in (entry.get("unified"), entry.get("non_qualified")):
        if key and f"{key.lower()}.png" in available:
            return f"{key.lower()}.png"
    return None


def _drawings(entry: Mapping, available: Mapping[str, set[str]]) -> dict[str, str] | None:
    """Each vendor's file for ``entry`` (a base emoji or a skin variation), or None unless all five draw it."""
    files = {}
    for vendor in VENDORS:
        if vendor == "joypixels":
            name = _joypixels_file(entry, available[vendor])
        else:
            name = entry.get("image") if entry.get(f"has_img_{vendor}") else None
            name = name if name in available[vendor] else None
        if name is None:
            return None
        files[vendor] = name
    return files


def _skin_name(short_name: str, key: str) -> str:
    tones = [SKIN_TONES.get(part.upper(), part) for part in key.split("-")]
    return f"{short_name} ({', '.join(tones)} skin tone)"


def kind_of(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__)


def _record_problems(record: object, what: str, base: bool) -> list[str]:
    """What is wrong with one ``emoji.json`` record (``base``: an emoji; else a skin variation): the fields the
    protocol reads and their types."""
    if not isinstance(record, dict):
        return [f"{what} is {kind_of(record)}, not an object"]
    problems = []
    required = {"unified": "code points", "image": "a string"}
    if base:
        required.update(short_name="a string", category="a string")
    for field, expected in required.items():
        value = record.get(field)
        if field not in record:
            problems.append(f"{what} has no '{field}'")
        elif not isinstance(value, str):
            problems.append(f"{what}: '{field}' must be {expected}, not {kind_of(value)}")
        elif field == "unified" and not CODE_POINTS.fullmatch(value):
            problems.append(f"{what}: 'unified' must be hexadecimal code points such as '1F44B-1F3FB', not "
                            f"{value[:40]!r}")
        elif field == "short_name" and not (value and value.isprintable()):
            problems.append(f"{what}: 'short_name' {value[:40]!r} must be a non-empty printable name")
    non_qualified = record.get("non_qualified")
    if non_qualified is not None and not (isinstance(non_qualified, str) and CODE_POINTS.fullmatch(non_qualified)):
        problems.append(f"{what}: 'non_qualified' must be code points or null, not {non_qualified!r:.40}")
    for vendor in VENDORS:
        flag = record.get(f"has_img_{vendor}")
        if flag is not None and not isinstance(flag, bool):
            problems.append(f"{what}: 'has_img_{vendor}' must be true or false, not {kind_of(flag)}")
    if not base:
        return problems
    variations = record.get("skin_variations")
    if variations is not None and not isinstance(variations, dict):
        return [*problems, f"{what}: 'skin_variations' must be an object, not {kind_of(variations)}"]
    for key, variation in (variations or {}).items():
        if not CODE_POINTS.fullmatch(key):
            problems.append(f"{what}: skin variation {key[:40]!r} is not named by code points")
        problems.extend(_record_problems(variation, f"{what}'s skin variation {key[:40]!r}", base=False))
    return problems


def read_catalogue(data: bytes, where: str) -> list[dict]:
    """``emoji.json``'s records, each checked for the fields the protocol reads (``where``: the file, as messages
    name it); anything else is one ``DataError`` listing what is wrong."""
    try:
        catalogue = json.loads(data)
    except (ValueError, RecursionError) as error:  # invalid JSON or UTF-8; nesting too deep
        raise DataError(f"emoji: {where} is not valid JSON: {error}") from None
    if not isinstance(catalogue, list):
        raise DataError(f"emoji: {where} must be a list of emoji records, not {kind_of(catalogue)}")
    problems: list[str] = []
    seen: dict[str, int] = {}  # code points -> the first record that has them
    for number, record in enumerate(catalogue):
        unified = record.get("unified") if isinstance(record, dict) else None
        what = f"record {number}" + (f" ({unified[:40]!r})" if isinstance(unified, str) else "")
        found = _record_problems(record, what, base=True)
        problems.extend(found)
        if found:
            continue
        for variation in [record, *(record.get("skin_variations") or {}).values()]:
            unified = variation["unified"].upper()
            if unified in seen:
                problems.append(f"{what}: code points {unified} are already those of record {seen[unified]}")
            seen.setdefault(unified, number)
    if problems:
        more = f"\n  ... and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else ""
        raise DataError(f"emoji: {where} is not the emoji-datasource catalogue ({len(problems)} problem(s)):\n  "
                        + "\n  ".join(problems[:MAX_LISTED]) + more)
    return catalogue


def emoji_classes(catalogue: Sequence[Mapping], available: Mapping[str, set[str]],
                  skin: bool = False) -> list[EmojiClass]:
    """The protocol's classes, in catalogue order: base emoji outside ``EXCLUDED_CATEGORIES`` drawn by all five
    vendors (``available``: the PNG names each vendor ships), and with ``skin`` their skin-tone variants drawn by all
    five."""
    classes = []
    for entry in catalogue:
        if entry.get("category") in EXCLUDED_CATEGORIES:
            continue
        files = _drawings(entry, available)
        if files is None:
            continue
        base = str(entry["unified"]).upper()
        classes.append(EmojiClass(f"{base} {entry['short_name']}", base, str(entry["category"]), files))
        if not skin:
            continue
        for key, variant in sorted((entry.get("skin_variations") or {}).items()):
            variant_files = _drawings(variant, available)
            if variant_files is not None:
                classes.append(EmojiClass(f"{str(variant['unified']).upper()} {_skin_name(entry['short_name'], key)}",
                                          base, str(entry["category"]), variant_files))
    return classes


def training_bases(classes: list[EmojiClass]) -> set[str]:
    """The base emoji whose classes train: the first ceil(n/2) of the base emoji sorted by ``split_of``."""
    bases = sorted({c.base for c in classes}, key=split_of)
    return set(bases[: math.ceil(len(bases) / 2)])

