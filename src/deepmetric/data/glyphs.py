"""``glyphs``: the offline demo data set. Classes are characters, instances are fonts.

Zero-shot retrieval needs many training classes, which Fashion-MNIST and digits (5 training classes
each) do not have. ``glyphs`` renders 175 characters (Latin upper and lower case, digits, the 24 + 25
Greek letters including final sigma, and the 64 basic Cyrillic letters) from every installed font whose
character map covers all of them; a seeded random half of the characters train, the other half test.

Fonts come from the Debian packages the Makefile installs (dejavu, liberation, freefont, urw-base35,
noto-core, carlito, caladea, cantarell, open-sans, lato: about 150 covering fonts). Without them the
builder falls back to the fonts matplotlib ships and says so. Fonts whose 175 renderings are identical
to another font's (the same outlines packaged twice) are kept once, since a duplicate instance would
make retrieval trivial. The list of font files used is saved with the data set (``fonts.txt``).

Some characters look alike across scripts (Latin A, Greek Alpha, Cyrillic A; o / omicron / Cyrillic o):
they are distinct classes, as in any real catalogue of near-duplicates, and cap the reachable Recall@1.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np

from ..errors import DataError
from ..io.files import temporary_folder
from .registry import register_dataset
from .table import RetrievalTable
from .turns import taking_turns, unwritable

log = logging.getLogger("deepmetric")

LATIN = [chr(c) for c in range(0x41, 0x5B)] + [chr(c) for c in range(0x61, 0x7B)]
DIGITS = [chr(c) for c in range(0x30, 0x3A)]
GREEK = [chr(c) for c in range(0x391, 0x3AA) if c != 0x3A2] + [chr(c) for c in range(0x3B1, 0x3CA)]
CYRILLIC = [chr(c) for c in range(0x410, 0x450)]
GLYPH_CHARS: list[str] = LATIN + DIGITS + GREEK + CYRILLIC  # 52 + 10 + 49 + 64 = 175

FONT_DIRS = ("/usr/share/fonts", "/usr/local/share/fonts", "~/.local/share/fonts", "~/.fonts")
FONT_SUFFIXES = (".ttf", ".otf")
IMAGE_SIZE = 64
FORMAT_VERSION = 1


def data_home() -> Path:
    """Where built data sets live: ``$DEEPMETRIC_DATA`` or ``~/.cache/deepmetric``."""
    return Path(os.environ.get("DEEPMETRIC_DATA", "~/.cache/deepmetric")).expanduser()


def font_covers(path: Path, chars: list[str]) -> bool:
    """Whether the font's best character map has every one of ``chars``."""
    from fontTools.ttLib import TTFont, TTLibError

    try:
        font = TTFont(str(path), lazy=True, fontNumber=0)
        cmap = font.getBestCmap() or {}
    except (TTLibError, OSError, AssertionError, KeyError, ValueError):
        return False
    return all(ord(ch) in cmap for ch in chars)


def find_fonts(chars: list[str], dirs: tuple[str, ...] = FONT_DIRS) -> list[Path]:
    """Every TrueType/OpenType file under ``dirs`` that covers ``chars``, sorted by path."""
    found: list[Path] = []
    for root in dirs:
        base = Path(root).expanduser()
        if base.is_dir():
            found.extend(p for p in base.rglob("*") if p.suffix.lower() in FONT_SUFFIXES and p.is_file())
    return sorted(p for p in set(found) if font_covers(p, chars))


def matplotlib_fonts(chars: list[str]) -> list[Path]:
    import matplotlib

    base = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    return sorted(p for p in base.glob("*.ttf") if font_covers(p, chars))


def render_font(path: Path, chars: list[str], size: int = IMAGE_SIZE) -> np.ndarray | None:
    """Render ``chars`` black on white, centred, as (len(chars), size, size) uint8; None if a glyph is blank.

    The font size is 0.7 x ``size``, reduced for a character whose ink box would exceed 90% of the canvas.
    """
    from PIL import Image, ImageDraw, ImageFont

    fonts: dict[int, ImageFont.FreeTypeFont] = {}

    def font_at(points: int) -> ImageFont.FreeTypeFont:
        if points not in fonts:
            fonts[points] = ImageFont.truetype(str(path), points)
        return fonts[points]

    out = np.empty((len(chars), size, size), dtype=np.uint8)
    limit = 0.9 * size
    for i, ch in enumerate(chars):
        points = int(0.7 * size)
        box = font_at(points).getbbox(ch, anchor="mm")
        extent = max(box[2] - box[0], box[3] - box[1])
        if extent > limit:
            points = max(4, int(points * limit / extent))
        canvas = Image.new("L", (size, size), 255)
        ImageDraw.Draw(canvas).text((size / 2, size / 2), ch, font=font_at(points), fill=0, anchor="mm")
        out[i] = np.asarray(canvas)
        if out[i].min() > 128:  # no ink: the cmap lies about this glyph
            return None
    return out


def build_glyphs(root: Path | None = None, size: int = IMAGE_SIZE, fonts: list[Path] | None = None,
                 progress: bool = True) -> Path:
    """Render the data set into ``root`` (default ``data_home()/glyphs``) and return ``root``.

    Writes ``images.npy`` (N, size, size) uint8, ``glyphs.csv`` (row, label, char, font), ``fonts.txt``
    and ``meta.json``; the directory appears complete or not at all.
    """
    from ..progress import progress_bar

    root = Path(root) if root is not None else data_home() / "glyphs"
    source = "given"
    if fonts is None:
        fonts, source = find_fonts(GLYPH_CHARS), "system"
        if not fonts:
            fonts, source = matplotlib_fonts(GLYPH_CHARS), "matplotlib"
            log.warning("glyphs: no installed font covers all 175 characters (install the Debian font packages "
                        "listed in the Makefile for ~150 fonts); falling back to the %d fonts matplotlib ships",
                        len(fonts))
    if not fonts:
        raise DataError("glyphs: no font covering all 175 characters was found, not even matplotlib's")

    rendered, used, seen = [], [], set()
    for path in progress_bar(fonts, desc="rendering glyphs", unit="font", disable=not progress):
        images = render_font(path, GLYPH_CHARS, size)
        if images is None:
            continue
        digest = hashlib.sha1(images.tobytes()).hexdigest()
        if digest in seen:
            continue
        seen.add(digest)
        rendered.append(images)
        used.append(path)
    if len(used) < 2:
        raise DataError(f"glyphs: only {len(used)} usable font(s); retrieval needs at least 2 per class")

    images = np.stack(rendered, axis=1).reshape(-1, size, size)  # row = char * n_fonts + font
    n_fonts = len(used)
    tmp = temporary_folder(root)
    try:
        np.save(tmp / "images.npy", images)
        lines = ["row,label,codepoint,font"]
        for c in range(len(GLYPH_CHARS)):
            for f in range(n_fonts):
                lines.append(f"{c * n_fonts + f},{c},U+{ord(GLYPH_CHARS[c]):04X},{f}")
        (tmp / "glyphs.csv").write_text("\n".join(lines) + "\n")
        (tmp / "fonts.txt").write_text("".join(f"{i}\t{p}\n" for i, p in enumerate(used)))
        meta = {"format": FORMAT_VERSION, "size": size, "chars": "".join(GLYPH_CHARS), "fonts": n_fonts,
                "font_source": source, "images": int(images.shape[0])}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False))
        if root.exists():
            shutil.rmtree(root)
        os.replace(tmp, root)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    log.info("glyphs: %d characters x %d fonts (%s fonts) written to %s", len(GLYPH_CHARS), n_fonts, source, root)
    return root


def _built_meta(root: Path) -> dict | None:
    """``root``'s ``meta.json`` when it holds a build of this version's characters, else None."""
    try:
        meta = json.loads((root / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    current = isinstance(meta, dict) and meta.get("format") == FORMAT_VERSION and meta.get("chars") == "".join(
        GLYPH_CHARS)
    return meta if current else None


@register_dataset("glyphs", "built")
def load_glyphs(path: str | Path | None = None, seed: int = 0, build: bool = True) -> RetrievalTable:
    """Load (building first if needed) the glyphs table from folder ``path`` (default: the data home's
    ``glyphs``); a seeded random half of the characters trains."""
    root = Path(path) if path is not None else data_home() / "glyphs"
    meta_path = root / "meta.json"
    meta = _built_meta(root)
    if meta is None:
        if not build:
            raise DataError(f"glyphs: {meta_path} not found; build the data set first" if not meta_path.is_file()
                            else f"glyphs: {root} was built by another version; rebuild it")
        try:
            root.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise unwritable("glyphs", root.parent, error) from None
        with taking_turns(root.parent / f".{root.name}.lock", "glyphs"):  # two trainings started together
            meta = _built_meta(root)  # built by the process this one waited for
            if meta is None:
                earlier = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
                build_glyphs(root, size=earlier.get("size", IMAGE_SIZE))
                meta = json.loads(meta_path.read_text())
    images = np.load(root / "images.npy")
    n_chars, n_fonts = len(GLYPH_CHARS), meta["fonts"]
    if images.shape[0] != n_chars * n_fonts:
        raise DataError(f"glyphs: {root / 'images.npy'} holds {images.shape[0]} images, "
                        f"expected {n_chars} x {n_fonts}; rebuild the data set")
    labels = np.repeat(np.arange(n_chars), n_fonts)
    train_chars = np.random.default_rng(seed).permutation(n_chars)[: (n_chars + 1) // 2]
    splits = np.where(np.isin(labels, train_chars), "train", "test").astype(object)
    ones = np.ones(len(labels), dtype=bool)
    return RetrievalTable(
        name="glyphs", images=images, labels=labels, splits=splits, is_query=ones, is_gallery=ones,
        recall_at=(1, 2, 4, 8, 16, 32),
        class_names={i: f"{ch} (U+{ord(ch):04X})" for i, ch in enumerate(GLYPH_CHARS)},
        meta={"root": str(root), "fonts": n_fonts, "font_source": meta.get("font_source"), "seed": seed},
    )
