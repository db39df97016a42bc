"""Decode an untrusted uploaded image: sniff its bytes, check its pixel count before decoding, convert to RGB.

The format is read from the first bytes, never from the file name or the declared content type, and PIL
is only allowed the sniffed decoder (``Image.open(..., formats=[...])``). The header gives the size; an
image of more than ``max_pixels`` pixels is refused before its pixel data is decompressed (a PNG that
declares 50,000 x 50,000 is a few hundred bytes and would need 7.5 GB decoded). Every failure is an
``UploadError`` carrying a 4xx status.
"""

from __future__ import annotations

import io
import os
import warnings

import numpy as np
from PIL import Image, UnidentifiedImageError

from ..data.images import to_rgb
from ..errors import UploadError

ACCEPTED = "JPEG, PNG, GIF, WebP or BMP"


def sniff_format(data: bytes) -> str | None:
    """PIL's format name for the image whose bytes start ``data``, or None when it is none we accept."""
    if data.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "GIF"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    if data[:2] == b"BM":
        return "BMP"
    return None


def open_checked(data: bytes, max_pixels: int) -> Image.Image:
    """Open (header only) an image whose format is sniffed from ``data`` and whose size is within ``max_pixels``."""
    if not data:
        raise UploadError("the uploaded file is empty", 400)
    fmt = sniff_format(data)
    if fmt is None:
        raise UploadError(f"the upload is not a {ACCEPTED} image (judged by its content, not its name)", 415)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=[fmt])
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise UploadError(f"the image has too many pixels (the limit is {max_pixels:,})", 413) from None
    except UnidentifiedImageError:
        raise UploadError(f"the upload starts like a {fmt} image but is not a readable one", 400) from None
    except Exception as error:  # a decoder failing on hostile bytes is the client's problem
        raise UploadError(f"the {fmt} image is corrupt ({type(error).__name__})", 400) from None
    width, height = image.size
    if width < 1 or height < 1:
        raise UploadError(f"the {fmt} image declares an empty size {width}x{height}", 400)
    if width * height > max_pixels:
        raise UploadError(f"the image is {width}x{height} = {width * height:,} pixels; the limit is {max_pixels:,}",
                          413)
    return image


def decode_upload(data: bytes, max_pixels: int = 40_000_000) -> np.ndarray:
    """(H, W, 3) uint8 RGB array of the uploaded image ``data`` (first frame of an animation)."""
    image = open_checked(data, max_pixels)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image.load()
            return np.array(to_rgb(image), dtype=np.uint8)
    except Image.DecompressionBombWarning:
        raise UploadError(f"the image has too many pixels (the limit is {max_pixels:,})", 413) from None
    except Exception as error:  # any decoder failure on untrusted bytes is bad input, not a 500
        raise UploadError(f"the {image.format} image is corrupt or truncated: {error}", 400) from None
    finally:
        image.close()


def thumbnail_jpeg(image: Image.Image, size: int) -> bytes:
    """A JPEG at most ``size`` pixels on its longer side."""
    with image:
        image.draft("RGB", (size, size))  # JPEG: decode at a reduced scale directly
        image.thumbnail((size, size))
        buffer = io.BytesIO()
        to_rgb(image).save(buffer, format="JPEG", quality=85)
    return buffer.getvalue()


def gallery_thumbnail(path: str, size: int, max_pixels: int) -> bytes:
    """A JPEG thumbnail of an indexed gallery file (any format PIL reads, within ``max_pixels``). The file is stored
    data that may have changed since it was indexed: anything but a regular file PIL reads (a folder or a FIFO,
    which would block the worker, a file PIL fails on in any way) is 404 "no longer readable"."""
    if not os.path.isfile(path):
        raise UploadError("the gallery image is no longer readable", 404)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(path)
            if image.size[0] * image.size[1] > max_pixels:
                image.close()
                raise UploadError(f"the gallery image is larger than {max_pixels:,} pixels", 404)
            return thumbnail_jpeg(image, size)
    except UploadError:
        raise
    except Exception:  # any decoder failure on a stored file is its damage, not the service's bug
        raise UploadError("the gallery image is no longer readable", 404) from None
