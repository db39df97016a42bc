"""Decode one image file to an RGB uint8 array, naming the file when it cannot be read; cut out a bounding box.

Valid unusual formats are converted rather than rejected, every PIL mode through the same three steps
(``to_rgb``, described for other implementations by ``RGB_CONVERSION``, which ``deepmetric export`` writes into the
model's JSON): 16-bit, 32-bit integer and float pixels are scaled to 8-bit gray; anything transparent (an alpha band,
or a palette / gray / RGB colour key in ``image.info["transparency"]``) is composited on white; every other mode
(palette, grayscale, 1-bit, CMYK, YCbCr, ...) becomes RGB by PIL's own conversion.
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


DEEP_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I", "F")
"""PIL modes of more than 8 bits a channel, scaled to 8-bit gray first (``to_rgb``, step 1)."""
ALPHA_MODES = ("RGBA", "LA", "PA", "RGBa")
"""PIL modes with an alpha band (``RGBa``: premultiplied, as some TIFFs), composited on ``BACKGROUND`` (step 2)."""
BACKGROUND = (255, 255, 255)
"""What transparent pixels are composited on: white."""

RGB_CONVERSION = {
    "library": "deepmetric.data.images.to_rgb",
    "decode": "PIL.Image.open, its first frame, pixels as stored (the EXIF orientation is not applied)",
    "depth": {
        "modes": list(DEEP_MODES),
        "I;16 (I;16B, I;16L, I;16N alike)": "gray = clip(floor(v / 65535 * 255 + 0.5), 0, 255), as 8-bit L",
        "I": "the same, dividing by 65535 when any pixel is above 255, else by 255",
        "F": "gray = floor((v - min) / max(max - min, 1e-12) * 255 + 0.5)",
        "transparency": "where image.info holds a 'transparency' value, the pixels equal to it (compared before "
                        "scaling) get alpha 0 and the rest alpha 255: the 8-bit gray becomes LA",
    },
    "transparency": {
        "when": "the mode is one of alpha_modes (LA too when step 1 found a transparency key), or image.info holds "
                "a 'transparency' key (a palette index or table of alphas, a gray value, an RGB colour)",
        "alpha_modes": list(ALPHA_MODES),
        "how": "PIL Image.convert('RGBA'), then PIL.Image.alpha_composite on an opaque background of that colour: "
               "c' = round((c * a + background * (255 - a)) / 255) for c in R, G, B",
        "background": list(BACKGROUND),
    },
    "colour": "every other mode (P without transparency, L, 1, CMYK, YCbCr, LAB, HSV, RGBX) by PIL "
              "Image.convert('RGB'); no ICC colour profile is applied",
    "result": "8-bit RGB, (H, W, 3) uint8",
}
"""``to_rgb`` in words and values, for a reimplementation without deepmetric (the export's JSON carries it)."""


def to_rgb(image: Image.Image) -> Image.Image:
    """Any PIL mode as 8-bit RGB, in three steps (``RGB_CONVERSION``): (1) pixels deeper than 8 bits
    (``DEEP_MODES``) are scaled to 8-bit gray, a transparency key kept as alpha; (2) anything transparent (an alpha
    band, or a transparency key in ``image.info``: palette, gray, 1-bit or RGB) is composited on white;
    (3) the rest is converted by PIL (palette, grayscale, CMYK, ...)."""
    key = image.info.get("transparency")
    if image.mode in DEEP_MODES:
        array = np.asarray(image, dtype=np.float64)
        if image.mode == "F":
            scaled = (array - array.min()) / max(array.max() - array.min(), 1e-12) * 255.0
        else:
            top = 65535.0 if image.mode.startswith("I;16") or array.max() > 255 else 255.0
            scaled = array / top * 255.0
        gray = np.clip(scaled + 0.5, 0, 255).astype(np.uint8)
        if isinstance(key, (int, float)):
            alpha = np.where(array == key, 0, 255).astype(np.uint8)
            image = Image.fromarray(np.stack([gray, alpha], axis=-1), mode="LA")
        else:
            image = Image.fromarray(gray, mode="L")
    if image.mode in ALPHA_MODES or "transparency" in image.info:
        rgba = image.convert("RGBA")
        image = Image.alpha_composite(Image.new("RGBA", rgba.size, (*BACKGROUND, 255)), rgba)
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
    except IsADirectoryError:  # `deepmetric search --image photos/`: not "corrupt or truncated"
        raise DataError(f"image {path} is a folder, not an image file") from None
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
