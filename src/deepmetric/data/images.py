"""Decode one image file to an RGB uint8 array, naming the file when it cannot be read; cut out a bounding box.

Valid unusual formats are converted rather than rejected: palette and grayscale images become RGB,
transparency is composited on white, CMYK is converted, 16-bit and 32-bit integer images are scaled
to 8 bits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from ..errors import DataError

MAX_PIXELS = 40_000_000
"""The most pixels an image file may have (the service's default ``--max-megapixels 40``): a bigger one is refused
from its header, before its pixels are decoded (a 20,000 x 20,000 PNG of zeros is 389 KB on disk, 1.2 GB decoded)."""

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")


def to_rgb(image: Image.Image) -> Image.Image:
    """Convert any PIL mode to 8-bit RGB (alpha composited on white, deep integer modes rescaled)."""
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):
        array = np.asarray(image, dtype=np.float64)
        top = 65535.0 if image.mode.startswith("I;16") or array.max() > 255 else 255.0
        image = Image.fromarray(np.clip(array / top * 255.0 + 0.5, 0, 255).astype(np.uint8), mode="L")
    elif image.mode == "F":
        array = np.asarray(image, dtype=np.float64)
        span = max(array.max() - array.min(), 1e-12)
        image = Image.fromarray(((array - array.min()) / span * 255.0 + 0.5).astype(np.uint8), mode="L")
    if image.mode == "P":
        image = image.convert("RGBA" if "transparency" in image.info else "RGB")
    if image.mode in ("RGBA", "LA", "PA"):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        image = Image.alpha_composite(background, rgba)
    return image.convert("RGB") if image.mode != "RGB" else image


def read_image(path: str | Path, max_pixels: int = MAX_PIXELS) -> np.ndarray:
    """Read ``path`` as a (H, W, 3) uint8 RGB array; any failure, an image of more than ``max_pixels`` pixels
    included, raises DataError naming the file."""
    path = Path(path)
    try:
        with Image.open(path) as image:
            width, height = image.size
            if width * height > max_pixels:
                raise DataError(f"image {path} is {width} x {height} = {width * height:,} pixels; the limit is "
                                f"{max_pixels:,} (decoding it would take {width * height * 3 / 2**30:.1f} GB)")
            image.load()
            rgb = to_rgb(image)
    except FileNotFoundError:
        raise DataError(f"image {path} does not exist") from None
    except PermissionError:
        raise DataError(f"image {path} cannot be read (permission denied)") from None
    except UnidentifiedImageError:
        raise DataError(f"image {path} is not an image file PIL can identify") from None
    except Image.DecompressionBombError:  # PIL's own cap, checked in Image.open before ours
        raise DataError(f"image {path} has too many pixels (the limit is {max_pixels:,})") from None
    except (OSError, ValueError, SyntaxError) as error:
        raise DataError(f"image {path} is corrupt or truncated: {error}") from None
    return np.array(rgb, dtype=np.uint8)  # a writable copy


def clip_box(box: Sequence[float], width: int, height: int) -> tuple[int, int, int, int] | None:
    """``box`` = (left, top, right, bottom) in pixels, right and bottom exclusive, rounded outwards to whole
    pixels and clipped to a ``width`` x ``height`` image; None when nothing of it lies inside the image."""
    left, top = max(0, math.floor(box[0])), max(0, math.floor(box[1]))
    right, bottom = min(width, math.ceil(box[2])), min(height, math.ceil(box[3]))
    return (left, top, right, bottom) if right > left and bottom > top else None


def crop_to_box(image: np.ndarray, box: Sequence[float], name: str) -> np.ndarray:
    """The pixels of ``image`` (H, W[, 3]) inside ``box`` (see ``clip_box``); DataError naming ``name`` when the
    box lies outside the image."""
    height, width = image.shape[:2]
    clipped = clip_box(box, width, height)
    if clipped is None:
        raise DataError(f"image {name}: {box_problem(box, width, height)}")
    left, top, right, bottom = clipped
    return np.ascontiguousarray(image[top:bottom, left:right])


def box_problem(box: Sequence[float], width: int, height: int) -> str:
    shown = ", ".join(f"{v:g}" for v in box)
    return f"its bounding box ({shown}) lies outside the {width} x {height} image"
