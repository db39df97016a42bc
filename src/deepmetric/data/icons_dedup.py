"""Which drawings are copies: no query may meet a copy of itself, in its own class or in another.

Themes share artwork: MATE forked GNOME 2's icons, Adwaita 43 still ships GNOME's legacy ones, deepin's ``Sea`` reuses
``bloom``'s, and a theme names one drawing under several icon names (a symbolic link from ``gtk-print`` to
``document-print``). ``select`` keeps one drawing of each copy and drops the others, for a reason:

- ``alias``: the same file as a kept drawing (a symbolic link, followed inside the package);
- ``identical``: a file of the same bytes, or one drawn to the same pixels;
- ``near-identical``: the same icon name drawn by another vendor from the same artwork: ``distance`` at most
  ``NEAR_IDENTICAL`` (below);
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

Copies across *different* names are only the exact ones (alias, identical): two names of one theme drawn on one
template (archive icons labelled XZ and GZ, folders with different emblems) come within 6 of each other yet are
different icons, which a model must tell apart.

Which copy is kept: drawings are taken in order (the name's own file before an alias, then the package order of
``PACKAGES``, then the vendor and the name), and one is kept unless it copies one kept before it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

NEAR_IDENTICAL = 6.0
"""The largest ``distance`` (0-255) at which two vendors' drawings of one name are one artwork (module docstring)."""
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


def select(candidates: Iterable[Candidate], looks: Mapping[str, Look],
           threshold: float = NEAR_IDENTICAL) -> tuple[list[Candidate], list[Dropped]]:
    """Keep one drawing of each copy (module docstring); ``looks``: each file's ``Look`` (a file without one could
    not be drawn and is dropped as ``unreadable``). Returns the kept drawings and the dropped ones, both in order."""
    kept: list[Candidate] = []
    dropped: list[Dropped] = []
    by_file: dict[str, Candidate] = {}
    by_content: dict[str, Candidate] = {}
    by_pixels: dict[str, Candidate] = {}
    by_name: dict[str, list[Candidate]] = {}
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
        near = [(distance(seen.signature, looks[k.file].signature), k) for k in by_name.get(candidate.name, ())
                if k.vendor != candidate.vendor]
        closest = min(near, key=lambda item: item[0], default=None)
        if closest is not None and closest[0] <= threshold:
            dropped.append(Dropped(candidate, "near-identical", closest[1], round(closest[0], 2)))
            continue
        kept.append(candidate)
        by_file[candidate.file] = candidate
        by_content.setdefault(candidate.content, candidate)
        by_pixels.setdefault(seen.pixels, candidate)
        by_name.setdefault(candidate.name, []).append(candidate)
    return kept, dropped
