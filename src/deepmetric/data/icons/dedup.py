"""Which drawings are copies: no query may meet a copy of itself, in its own class or in another.

Themes share artwork: MATE forked GNOME 2's icons, Adwaita 43 still ships GNOME's legacy ones, deepin's ``Sea`` reuses
``bloom``'s, and a theme names one drawing under several icon names (a symbolic link from ``gtk-print`` to
``document-print``). ``select`` keeps one drawing of each copy and drops the others, for a reason:

- ``alias``: the same file as a kept drawing (a symbolic link, followed inside the package);
- ``identical``: a file of the same bytes, or one drawn to the same pixels;
- ``near-identical``: the same icon name drawn by another vendor from the same artwork: ``distance`` at most
  ``NEAR_IDENTICAL`` (below), or ``SHARED_NEAR`` between two vendors that share artwork;
- ``blank``: a drawing that does not show on the white it is trained on (``is_blank``: white-on-transparent panel
  icons made for dark panels).

The perceptual ``distance``: each drawing is composited on white, cut to the bounding box of its opaque pixels
(alpha > 16) and centred on a square, so that one artwork drawn at another margin or size compares equal, then
averaged down to 8 x 8 RGB cells; the distance is the root mean square difference of the 192 values (0-255).

``NEAR_IDENTICAL = 6`` was read off the pinned packages (blank drawings removed first): of the 1,012 same-name pairs
GNOME/MATE, which share most of their artwork, 885 (87 %) are within 6; of 14,639 same-name pairs of ten themes by
unrelated artists (oxygen, gartoon, Nuovo, Tango, Faenza, bloom, Paper, GNOME, Moka, nuoveXT2) none is, the closest
being at 8.1 (Paper's and nuoveXT2's optical discs, two plain grey discs). Looked at, the pairs up to 6 are the same
artwork (re-exported at another size, a highlight retouched); between 6 and 8 come the first different drawings of
plain shapes (Adwaita's and Paper's blank pages at 7.0, Faba's and MATE's rewind arrows at 7.2); the GNOME/MATE pairs
above 6 are MATE's recoloured folders and redrawn icons. The largest single cell difference instead of the RMS
caught fewer copies before its first unrelated pair (811, 80 %); without the crop, one artwork at another margin
(GNOME's and MATE's magnifier: 17.8 on 16 x 16 RGB cells) differed more than two unrelated plain discs (8.6).

Themes that share artwork also ship it re-drawn by hand at another size or recoloured (Adwaita's legacy 48-px icons
against GNOME's 256-px ones, MATE's recoloured folders), which lands above 6. So two vendors whose drawings of the
names they both draw are copies at 6 for at least ``SHARING`` (10 %) of those names share artwork
(``sharing_vendors``), and between them ``SHARED_NEAR = 25`` applies. On the pinned packages four pairs share: GNOME
and MATE (88 % of their common names within 6), Adwaita and GNOME (38 %), Adwaita and MATE (33 %), Sea and bloom
(30 %); the next pair is at 2.9 % (elementary-xfce and GNOME), so any cut between 3 and 30 % finds the same four.
Looked at, a sample of 60 of their pairs between 6 and 26 were all one design (re-drawn at 48 px, recoloured,
retouched); the first different drawings of one name come near 30 (two different trowels for
``applications-development`` at 31).

Copies across *different* names are only the exact ones (alias, identical): two names of one theme drawn on one
template (archive icons labelled XZ and GZ, folders with different emblems) come within 6 of each other yet are
different icons, which a model must tell apart.

Which copy is kept: drawings are taken in order (the name's own file before an alias, then the drawing made nearer
the stored size, then the package order of ``PACKAGES``, then the vendor and the name), and one is kept unless it
copies one kept before it.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

NEAR_IDENTICAL = 6.0
"""The largest ``distance`` (0-255) at which two vendors' drawings of one name are one artwork (module docstring)."""
SHARING = 0.10
"""Two vendors share artwork when at least this fraction of the names both draw are within ``NEAR_IDENTICAL``."""
SHARED_NEAR = 25.0
"""The ``distance`` within which two drawings of one name by vendors that share artwork are one design."""
CELLS = 8
"""The signature's grid: CELLS x CELLS RGB cells."""
OPAQUE = 16
"""Alpha above which a pixel belongs to the drawing's bounding box."""
BLANK_FRACTION = 0.005
"""A drawing is blank when fewer than this fraction of its pixels differ from white by more than ``BLANK_LEVEL``."""
BLANK_LEVEL = 32


@dataclass(frozen=True)
class Look:
    """What the comparison needs of one rendered drawing: its signature (``CELLS`` x ``CELLS`` x 3, float32) and a
    hash of its pixels; None signature when it is blank."""

    signature: np.ndarray | None
    pixels: str


def on_white(rgba: np.ndarray) -> np.ndarray:
    """An (H, W, 4) uint8 RGBA image composited on white, as (H, W, 3) float32."""
    alpha = rgba[..., 3:].astype(np.float32) / 255.0
    return rgba[..., :3].astype(np.float32) * alpha + 255.0 * (1.0 - alpha)


def is_blank(rgba: np.ndarray) -> bool:
    """Whether the drawing does not show on white (``BLANK_FRACTION``, ``BLANK_LEVEL``)."""
    ink = (255.0 - on_white(rgba)).max(axis=-1) > BLANK_LEVEL
    return bool(ink.mean() < BLANK_FRACTION)


def signature(rgba: np.ndarray) -> np.ndarray | None:
    """The drawing cut to its bounding box, centred on a square, composited on white and averaged to ``CELLS`` x
    ``CELLS`` RGB cells (float32, 0-255); None when no pixel is opaque."""
    from PIL import Image

    rows, cols = np.nonzero(rgba[..., 3] > OPAQUE)
    if len(rows) == 0:
        return None
    top, bottom, left, right = rows.min(), rows.max() + 1, cols.min(), cols.max() + 1
    height, width = bottom - top, right - left
    side = max(height, width)
    square = np.zeros((side, side, 4), dtype=np.uint8)
    y, x = (side - height) // 2, (side - width) // 2
    square[y:y + height, x:x + width] = rgba[top:bottom, left:right]
    small = Image.fromarray(square, "RGBA").convert("RGBa").resize((CELLS, CELLS), Image.Resampling.BOX)
    return on_white(np.asarray(small.convert("RGBA")))


def look(rgba: np.ndarray) -> Look:
    """The ``Look`` of a rendered drawing."""
    pixels = hashlib.sha256(rgba.tobytes()).hexdigest()
    return Look(None if is_blank(rgba) else signature(rgba), pixels)


def distance(a: np.ndarray, b: np.ndarray) -> float:
    """The root mean square difference of two signatures (0-255)."""
    return float(np.sqrt(np.mean((a - b) ** 2)))


@dataclass(frozen=True)
class Candidate:
    """One vendor's drawing of one name, as ``select`` sees it: ``order`` sorts it (module docstring), ``file`` and
    ``content`` (its bytes' hash) find exact copies."""

    vendor: str
    name: str
    order: tuple
    file: str
    content: str


@dataclass(frozen=True)
class Dropped:
    """A drawing left out: why, and the kept drawing it copies (``None`` for a blank or unreadable one)."""

    candidate: Candidate
    reason: str
    kept: Candidate | None = None
    distance: float | None = None


def sharing_vendors(candidates: Iterable[Candidate], looks: Mapping[str, Look], threshold: float = NEAR_IDENTICAL,
                    fraction: float = SHARING) -> set[frozenset[str]]:
    """The pairs of vendors that share artwork: for at least ``fraction`` of the names both draw (both drawings
    visible), their two drawings are within ``threshold`` of each other."""
    by_name: dict[str, dict[str, np.ndarray]] = {}
    for candidate in candidates:
        seen = looks.get(candidate.file)
        if seen is not None and seen.signature is not None:
            by_name.setdefault(candidate.name, {})[candidate.vendor] = seen.signature
    common: Counter[frozenset[str]] = Counter()
    near: Counter[frozenset[str]] = Counter()
    for drawn in by_name.values():
        vendors = sorted(drawn)
        for i, first in enumerate(vendors):
            for second in vendors[i + 1:]:
                pair = frozenset((first, second))
                common[pair] += 1
                near[pair] += distance(drawn[first], drawn[second]) <= threshold
    return {pair for pair, count in common.items() if near[pair] >= fraction * count}


def select(candidates: Iterable[Candidate], looks: Mapping[str, Look], threshold: float = NEAR_IDENTICAL,
           shared: Collection[frozenset[str]] = (), shared_threshold: float = SHARED_NEAR,
           ) -> tuple[list[Candidate], list[Dropped]]:
    """Keep one drawing of each copy (module docstring); ``looks``: each file's ``Look`` (a file without one could
    not be drawn and is dropped as ``unreadable``); ``shared``: the vendor pairs that share artwork, compared within
    ``shared_threshold`` rather than ``threshold``. Returns the kept drawings and the dropped ones, both in order."""
    kept: list[Candidate] = []
    dropped: list[Dropped] = []
    by_file: dict[str, Candidate] = {}
    by_content: dict[str, Candidate] = {}
    by_pixels: dict[str, Candidate] = {}
    by_name: dict[str, list[tuple[Candidate, np.ndarray]]] = {}  # the kept drawings of a name, with their signatures
    for candidate in sorted(candidates, key=lambda c: c.order):
        seen = looks.get(candidate.file)
        if seen is None:
            dropped.append(Dropped(candidate, "unreadable"))
            continue
        if seen.signature is None:
            dropped.append(Dropped(candidate, "blank"))
            continue
        if candidate.file in by_file:
            dropped.append(Dropped(candidate, "alias", by_file[candidate.file], 0.0))
            continue
        twin = by_content.get(candidate.content) or by_pixels.get(seen.pixels)
        if twin is not None:
            dropped.append(Dropped(candidate, "identical", twin, 0.0))
            continue
        copy = None
        for other, other_signature in by_name.get(candidate.name, ()):
            if other.vendor == candidate.vendor:
                continue
            apart = distance(seen.signature, other_signature)
            limit = shared_threshold if frozenset((other.vendor, candidate.vendor)) in shared else threshold
            if apart <= limit and (copy is None or apart < copy[0]):
                copy = (apart, other)
        if copy is not None:
            dropped.append(Dropped(candidate, "near-identical", copy[1], round(copy[0], 2)))
            continue
        kept.append(candidate)
        by_file[candidate.file] = candidate
        by_content.setdefault(candidate.content, candidate)
        by_pixels.setdefault(seen.pixels, candidate)
        by_name.setdefault(candidate.name, []).append((candidate, seen.signature))
    return kept, dropped
