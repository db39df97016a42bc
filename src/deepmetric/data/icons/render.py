"""Drawing one icon file as a square RGBA image of the stored size: SVGs with librsvg, bitmaps as they are.

SVGs are drawn by librsvg's ``rsvg-convert`` (Debian ``librsvg2-bin``, which the Makefile installs), the renderer
GTK and GNOME draw these themes with, so the drawings look as their artists saw them. Measured on the pinned
packages at 128 px: on 150 random SVGs, PyPI's ``resvg-py`` 0.5.0 draws as faithfully where it draws at all (median
difference to librsvg 0.66 of 255 a pixel) and a little faster in-process (35 ms an SVG against 52 ms for one
``rsvg-convert`` process), but it refuses 460 of the 544 SVGs of ``gnome-icon-theme-gartoon`` ("SVG has an invalid
size": Sodipodi-era ``width="72pt"`` without a ``viewBox``), of which librsvg draws all but one; CairoSVG misdraws
about one SVG in ten (its worst tenth differ from librsvg by more than 20 of 255 a pixel, and it failed on 2 of the
150). The build runs one ``rsvg-convert`` per core.

PNG and XPM icons are taken as they are (the largest size the theme has: ``catalogue.rank``) and scaled to
the stored size with Lanczos filtering on premultiplied alpha (no dark fringes). A drawing that is not square is
centred on a transparent square. The result keeps its transparency; training composites it on white
(``images.to_rgb``), as for emoji.
"""

from __future__ import annotations

import io
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ...errors import DataError

if TYPE_CHECKING:
    import PIL.Image

RENDERER = "rsvg-convert"
TIMEOUT_S = 60.0
"""Seconds one SVG may take to draw before it counts as unreadable."""


class Unreadable(Exception):
    """One icon file that cannot be drawn (a malformed SVG, a truncated PNG): it is left out, not fatal."""


def renderer() -> str:
    """The path of ``rsvg-convert``; a ``DataError`` saying how to install it when it is missing."""
    found = shutil.which(RENDERER)
    if found is None:
        raise DataError("icons: drawing the themes' SVG icons needs librsvg's rsvg-convert, which is not installed "
                        "(Debian: apt-get install librsvg2-bin; make test installs it)")
    return found


def renderer_version(program: str) -> str:
    """``rsvg-convert --version``'s answer (``rsvg-convert version 2.54.7``), recorded with the build."""
    try:
        result = subprocess.run([program, "--version"], capture_output=True, text=True, timeout=TIMEOUT_S,
                                stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise DataError(f"icons: {program} --version failed: {error}") from None
    return (result.stdout.strip().splitlines() or ["rsvg-convert (version unknown)"])[0]


def _square(image: PIL.Image.Image, size: int) -> np.ndarray:
    """``image`` (PIL) as a (size, size, 4) uint8 RGBA array: scaled so that its longer side is ``size``, centred."""
    from PIL import Image

    image = image.convert("RGBA")
    width, height = image.size
    if (width, height) != (size, size):
        scale = size / max(width, height)
        fitted = (max(1, round(width * scale)), max(1, round(height * scale)))
        image = image.convert("RGBa").resize(fitted, Image.Resampling.LANCZOS).convert("RGBA")
        if fitted != (size, size):
            canvas = Image.new("RGBA", (size, size), (0, 0, 0, 0))
            canvas.paste(image, ((size - fitted[0]) // 2, (size - fitted[1]) // 2))
            image = canvas
    return np.asarray(image, dtype=np.uint8).copy()


def render(file: Path, kind: str, size: int, program: str) -> np.ndarray:
    """Icon ``file`` (``kind``: ``svg``, ``png`` or ``xpm``) as a (size, size, 4) uint8 RGBA array; ``Unreadable``
    when it cannot be drawn."""
    from PIL import Image, UnidentifiedImageError

    try:
        if kind == "svg":
            result = subprocess.run([program, "--width", str(size), "--height", str(size), "--keep-aspect-ratio",
                                     str(file)], capture_output=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
            if result.returncode != 0 or not result.stdout:
                message = result.stderr.decode("utf-8", "replace").strip().splitlines() or ["no output"]
                raise Unreadable(f"{RENDERER} failed (exit {result.returncode}): {message[-1][:200]}")
            source: io.BytesIO | Path = io.BytesIO(result.stdout)
        else:
            source = file
        with Image.open(source) as image:
            image.load()
            return _square(image, size)
    except subprocess.TimeoutExpired:
        raise Unreadable(f"{RENDERER} took over {TIMEOUT_S:.0f} s") from None
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError, Image.DecompressionBombError) as error:
        raise Unreadable(f"cannot be read as {kind.upper()}: {error}") from None
