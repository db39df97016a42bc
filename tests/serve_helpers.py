"""Helpers of the retrieval tests: small galleries of distinct images, hostile image bytes, process memory."""

from __future__ import annotations

import io
import os
import struct
import zlib
from pathlib import Path

import numpy as np
from PIL import Image


def make_gallery(folder: Path, count: int, seed: int = 0, start: int = 0) -> list[Path]:
    """``count`` distinct random images (PNG, and JPEG in a subfolder for every third) of varied sizes."""
    rng = np.random.default_rng(seed)
    files = []
    for i in range(start, start + count):
        size = (int(rng.integers(14, 40)), int(rng.integers(14, 40)))
        pixels = rng.integers(0, 256, size=(*size, 3), dtype=np.uint8)
        path = folder / ("jpegs" if i % 3 == 2 else "") / f"img{i:03d}.{'jpg' if i % 3 == 2 else 'png'}"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(path, **({"quality": 95} if path.suffix == ".jpg" else {}))
        files.append(path)
    return files


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_bomb(width: int = 50_000, height: int = 50_000) -> bytes:
    """A valid-looking PNG of a few dozen bytes whose header declares ``width x height`` RGB pixels."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", header) + png_chunk(b"IDAT", zlib.compress(b"\0" * 1024))
            + png_chunk(b"IEND", b""))


def image_bytes(path: Path) -> bytes:
    return Path(path).read_bytes()


def encoded(pixels: np.ndarray, fmt: str) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt)
    return buffer.getvalue()


def rss_bytes() -> int:
    """This process' resident set size now (Linux)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")
