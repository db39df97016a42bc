"""Decode one image file to an RGB uint8 array, naming the file when it cannot be read.

Valid unusual formats are converted rather than rejected: palette and grayscale images become RGB,
transparency is composited on white, CMYK is converted, 16-bit and 32-bit integer images are scaled
to 8 bits.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from ..errors import DataError

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


def read_image(path: str | Path) -> np.ndarray:
    """Read ``path`` as a (H, W, 3) uint8 RGB array; any failure raises DataError naming the file."""
    path = Path(path)
    try:
        with Image.open(path) as image:
            image.load()
            rgb = to_rgb(image)
    except FileNotFoundError:
        raise DataError(f"image {path} does not exist") from None
    except PermissionError:
        raise DataError(f"image {path} cannot be read (permission denied)") from None
    except UnidentifiedImageError:
        raise DataError(f"image {path} is not an image file PIL can identify") from None
    except (OSError, ValueError, SyntaxError) as error:
        raise DataError(f"image {path} is corrupt or truncated: {error}") from None
    return np.array(rgb, dtype=np.uint8)  # a writable copy
