"""The images the Python API takes (paths, PIL images, arrays, tensors), checked and read as ``deepmetric embed``
reads files, and the embeddings it takes in their place (float rows, l2-normalised here)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from ..data.images import read_image, to_rgb
from ..data.table import RetrievalTable
from ..errors import DataError, IndexStoreError

ImageInput = str | os.PathLike | Image.Image | np.ndarray | torch.Tensor
"""One image: a file path, a PIL image (any mode), a uint8 numpy array (H, W), (H, W, 3) RGB or (H, W, 4) RGBA, or
a tensor (C, H, W) or (H, W), C in 1, 3, 4, of uint8 or of floats in [0, 1] (torchvision's layouts)."""


@dataclass(kw_only=True)
class ImagesTable(RetrievalTable):
    """A table of checked images (``image_items``): each row is read when the loader asks for it, a file by the
    library's reader (``read_image``, as ``deepmetric embed``), a PIL image or an RGBA / gray array by ``to_rgb``."""

    items: list[Path | Image.Image | np.ndarray]
    """The images, one per row; ``images`` holds their names (the path, or ``images[i]``)."""

    @classmethod
    def of(cls, items: list[Path | Image.Image | np.ndarray]) -> ImagesTable:
        """A table of ``items`` (``image_items``' answer), every row a test query and gallery image."""
        n = len(items)
        names = [str(item) if isinstance(item, Path) else f"images[{i}]" for i, item in enumerate(items)]
        return cls(name="images", images=names, items=items, labels=np.zeros(n),
                   splits=np.array(["test"] * n, dtype=object), is_query=np.ones(n, bool), is_gallery=np.ones(n, bool))

    def image(self, index: int) -> np.ndarray:
        item = self.items[index]
        if isinstance(item, Path):
            return read_image(item)
        if isinstance(item, np.ndarray):
            if item.ndim == 3 and item.shape[2] == 3:
                return np.array(item)  # a copy: torch warns of a read-only one (np.asarray of a PIL image)
            item = Image.fromarray(item)  # (H, W): L; (H, W, 4): RGBA, composited on white by to_rgb
        else:
            item.load()  # as read_image: the pixels, and the info (transparency) some formats only fill in then
        return np.array(to_rgb(item), dtype=np.uint8)


def _tensor_array(tensor: torch.Tensor, where: str) -> np.ndarray:
    """A (C, H, W) or (H, W) tensor of uint8 or of floats in [0, 1] as a uint8 (H, W[, C]) array."""
    t = tensor.detach().cpu()
    if t.is_floating_point():
        if not torch.isfinite(t).all() or t.numel() and (t.min() < 0 or t.max() > 1):
            raise DataError(f"{where} is a float tensor with values outside [0, 1]; give floats in [0, 1] or uint8")
        t = (t.float() * 255).round().to(torch.uint8)
    elif t.dtype != torch.uint8:
        raise DataError(f"{where} is a {t.dtype} tensor; give uint8 or floats in [0, 1]")
    if t.ndim == 3:
        if t.shape[0] not in (1, 3, 4):
            raise DataError(f"{where} is a tensor of shape {tuple(t.shape)}; expected (C, H, W) with C in 1, 3, 4, "
                            "or (H, W)")
        t = t.permute(1, 2, 0)
    return t.numpy()


def _checked_array(array: np.ndarray, where: str) -> np.ndarray:
    if array.dtype != np.uint8:
        raise DataError(f"{where} is a {array.dtype} array; images as arrays are uint8 (H, W), (H, W, 3) RGB or "
                        "(H, W, 4) RGBA (a float array is taken for embeddings where a search accepts them)")
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    if array.ndim not in (2, 3) or array.ndim == 3 and array.shape[2] not in (3, 4) or 0 in array.shape:
        raise DataError(f"{where} is an array of shape {array.shape}; expected (H, W), (H, W, 3) RGB or (H, W, 4) "
                        "RGBA")
    return np.ascontiguousarray(array)


def _image_item(item: Any, where: str) -> Path | Image.Image | np.ndarray:
    """``item`` checked: a Path, a PIL image, or a uint8 (H, W), (H, W, 3) or (H, W, 4) array."""
    if isinstance(item, str | os.PathLike):
        path = Path(item)
        if path.is_dir():
            raise DataError(f"{where}: {path} is a folder; give its image files, e.g. "
                            "deepmetric.data.listing.list_images(folder) (the files, in the order, deepmetric embed "
                            "takes), or build an Index from the folder")
        return path
    if isinstance(item, Image.Image):
        if 0 in item.size:  # numpy's (0, N) array was refused; PIL's became a torch traceback
            raise DataError(f"{where} is a PIL image of {item.width} x {item.height} pixels; an image needs at least "
                            "one pixel each way")
        return item
    if isinstance(item, torch.Tensor):
        item = _tensor_array(item, where)
    if isinstance(item, np.ndarray):
        return _checked_array(item, where)
    article = "an" if type(item).__name__[:1].lower() in "aeiou" else "a"
    raise DataError(f"{where} is {article} {type(item).__name__}; expected an image: a path, a PIL image, a uint8 "
                    "numpy array (H, W), (H, W, 3) or (H, W, 4), or a tensor (C, H, W)")


def image_items(images: Any) -> list[Path | Image.Image | np.ndarray]:
    """A single image or a sequence of them (a 4-D array (N, H, W, C) or tensor (N, C, H, W) is a batch), checked."""
    if isinstance(images, bytes | bytearray | memoryview):
        raise DataError("images are bytes; give a path, or open them first: PIL.Image.open(io.BytesIO(data))")
    if not isinstance(images, Sequence | np.ndarray | torch.Tensor) or isinstance(images, str) or (
            isinstance(images, np.ndarray | torch.Tensor) and images.ndim < 4):
        return [_image_item(images, "the image")]  # one image, or what is none: its message names the type
    return [_image_item(item, f"images[{i}]") for i, item in enumerate(images)]


def is_vectors(x: Any, what: str = "the queries", images_too: bool = True) -> bool:
    """Embeddings rather than images: a float numpy array of one (D,) or several (N, D) rows, or a float tensor of
    one (D,) row, or of (N, D) rows where no image is taken (``images_too`` False: an index without a run). Where
    images are taken too, a float (H, W) tensor is refused: ``TrainedRun.embed`` takes it as one gray image
    (torchvision's layout), and reading it as H embeddings answered another question than the one asked."""
    if isinstance(x, torch.Tensor):
        if x.is_floating_point() and x.ndim == 2 and images_too:
            rows, width = x.shape
            raise DataError(f"{what} are a float tensor of shape ({rows}, {width}): one gray image to "
                            f"TrainedRun.embed, {rows} embeddings of {width} dimensions to an index. Say which: "
                            "embeddings as a numpy array (x.numpy()), or the image as a list ([x]) or a (1, H, W) "
                            "tensor (x[None])")
        return x.is_floating_point() and x.ndim in (1, 2)
    return isinstance(x, np.ndarray) and np.issubdtype(x.dtype, np.floating) and x.ndim in (1, 2)


def embedding_rows(x: Any, what: str) -> np.ndarray:
    """``x`` (a numpy array or tensor, or what numpy makes an array of) as a real (N, D) array: one (D,) row or
    several (N, D) rows of real numbers (float or integer); anything else is one ``IndexStoreError``."""
    array = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    if array.dtype == bool or not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
        raise IndexStoreError(f"{what} must be real numbers (float or integer), got an array of {array.dtype}")
    if array.ndim not in (1, 2) or 0 in array.shape[1:] or array.ndim == 1 and not array.size:
        raise IndexStoreError(f"{what} must be one (D,) row or an (N, D) array of rows, got shape {array.shape}")
    return np.atleast_2d(array)


def unit_rows(x: np.ndarray | torch.Tensor, dim: int | None, what: str) -> np.ndarray:
    """(N, D) float32 rows of ``x`` l2-normalised (an index scores by inner product: cosine for unit rows)."""
    array = embedding_rows(x, what).astype(np.float32)
    if dim is not None and array.shape[1] != dim:
        raise IndexStoreError(f"{what} have {array.shape[1]} dimensions; the index holds {dim}-d embeddings")
    if not np.isfinite(array).all():
        raise IndexStoreError(f"{what} hold NaN or infinite values")
    norms = np.linalg.norm(array, axis=1, keepdims=True)
    if (norms == 0).any():
        raise IndexStoreError(f"{what} hold {int((norms == 0).sum())} all-zero row(s), which have no direction")
    return np.ascontiguousarray(array / norms, dtype=np.float32)

