"""Weight files: a backbone's ``model.weights`` (safetensors, or a trusted legacy torch pickle) and the pickle
check every reader of a file of tensors makes first (a checkpoint's too: ``runs.checkpoint``), since unpickling a
file can execute code from it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from ..errors import CheckpointError
from .bn_inception import bn_inception_state

PICKLE_MAGIC = (b"\x80", b"PK\x03\x04")  # pickle protocol >= 2; torch's zip archives


def looks_like_safetensors(data: bytes) -> bool:
    """A safetensors file starts with its JSON header's length (8 bytes, little-endian) and then ``{``. The
    length's first byte may be 0x80, the pickle protocol opcode, so this is checked before the pickle magic
    (the header may be padded with spaces)."""
    header_length = int.from_bytes(data[:8], "little")
    header = data[8:8 + header_length].rstrip(b" ")  # the writer pads the header with spaces
    return len(data) >= 8 + header_length and header[:1] == b"{" and header[-1:] == b"}"


def file_start(path: Path) -> bytes:
    """A file's first 8 bytes and, when they are a safetensors header's length, the header: what ``is_pickled``
    and a checkpoint's header read."""
    with open(path, "rb") as handle:
        start = handle.read(8)
        return start + handle.read(min(int.from_bytes(start, "little"), path.stat().st_size))


def is_pickled(start: bytes) -> bool:
    """Whether a file starting with ``start`` is a pickle or torch's zip archive of one (and not safetensors)."""
    return not looks_like_safetensors(start) and (start[:1] == PICKLE_MAGIC[0] or start[:4] == PICKLE_MAGIC[1])


PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".pkl")


def read_weights(file: Path, trust_pickle: bool) -> dict[str, torch.Tensor]:
    """A state dict from safetensors, or from a legacy pickled torch file when the user trusts it. A pickle is
    recognised by its first bytes too (``is_pickled``), whatever the file is named."""
    if is_pickled(file_start(file)) and not trust_pickle:
        raise CheckpointError(f"refusing to load {file}: it is a pickled torch file, and unpickling a file can "
                              "execute code from it. Convert it to .safetensors, or pass --trust-pickle "
                              "(model.trust_pickle=true) if you trust where it came from.")
    if file.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(file))
    if file.suffix in PICKLE_SUFFIXES and trust_pickle:
        # Even when trusted, read with torch's restricted unpickler: tensors and containers only.
        state = torch.load(file, map_location="cpu", weights_only=True)
        return state.get("state_dict", state) if isinstance(state, dict) else state
    if file.suffix in PICKLE_SUFFIXES:
        raise CheckpointError(f"refusing to load {file}: it is a pickled torch file, and unpickling a file can "
                              "execute code from it. Convert it to .safetensors, or pass --trust-pickle "
                              "(model.trust_pickle=true) if you trust where it came from.")
    raise CheckpointError(f"backbone weights {file}: expected a .safetensors file (or a legacy torch file with "
                          "--trust-pickle)")


# Backbones whose usual weight files name their tensors otherwise: the renaming applied before loading.
WEIGHT_RENAMERS: dict[str, Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]] = {
    "bn-inception": bn_inception_state,
}


# Where the weight files a backbone is usually given come from (no weights ship for these).
WEIGHT_SOURCES: dict[str, str] = {
    "bn-inception": "the BN-Inception converted from Caffe that pretrainedmodels (Cadene) and TSN distribute as "
                    "bn_inception-*.pth (read with model.trust_pickle=true, or converted to .safetensors: "
                    "docs/reproduce/horde.md)",
    "inception-v1": "Caffe's bvlc_googlenet converted to a .safetensors state dict of deepmetric's inception-v1 "
                    "(docs/reproduce/index.md, the common setting)",
}


def load_weights(model: nn.Module, path: str, trust_pickle: bool = False, backbone: str = "") -> None:
    """Load the weight file ``path`` (``model.weights``) into a backbone's network, renamed as its usual files need
    (``WEIGHT_RENAMERS``); every tensor must fit."""
    file = Path(path).expanduser()  # "~/weights.safetensors" in a config file: the home folder's
    if not file.is_file():
        source = f"; it is {WEIGHT_SOURCES[backbone]}" if backbone in WEIGHT_SOURCES else ""
        raise CheckpointError(f"backbone weights {file} (model.weights) do not exist{source}")
    state = read_weights(file, trust_pickle)
    if backbone in WEIGHT_RENAMERS:
        state = WEIGHT_RENAMERS[backbone](state)
    result = model.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise CheckpointError(f"backbone weights {file} do not fit the network: missing "
                              f"{result.missing_keys[:5]}, unexpected {result.unexpected_keys[:5]}")
