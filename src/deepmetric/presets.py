"""The presets that ship inside the package (``deepmetric/configs/``), found by name from any directory.

A preset is a run config (``configs/<name>.yaml``, e.g. ``abe/cub-abe8``) or a study file
(``configs/studies/<name>.yaml``, e.g. ``demo``). ``--config``, ``deepmetric study`` and ``extends:`` take a path or a
name: a path that exists wins; otherwise the text is looked up as a preset's name, with or without ``.yaml`` and
with or without a leading ``configs/`` (so every documented ``--config configs/abe/cub-abe8.yaml`` also works from
an installed package, outside a checkout). An unknown name is refused with the nearest names. In a git checkout the
root ``configs`` is a symbolic link to the same folder.

``deepmetric presets`` lists them, each with the published table it reproduces: a run config says so in its first
lines (``# Reproduces: PAPER (citation) Table N, row "..."``, checked by ``tests/test_presets.py``), a study in its
first comment line.

Nothing here imports torch: ``deepmetric presets`` answers at once.
"""

from __future__ import annotations

import difflib
import fnmatch
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigError

PRESETS_DIR = Path(__file__).resolve().parent / "configs"
"""The package's presets: run configs, and study files under ``studies/``."""
STUDIES = "studies"
SUFFIXES = (".yaml", ".yml")
KINDS = ("config", "study")
REPRODUCES = "# Reproduces: "


@dataclass
class Preset:
    """One packaged preset: its name (``abe/cub-abe8``), kind (``config`` or ``study``), file and what it
    reproduces (one entry per published table; a study's first comment line)."""

    name: str
    kind: str
    path: Path
    reproduces: list[str] = field(default_factory=list)


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


def _root(kind: str) -> Path:
    _check_kind(kind)
    return PRESETS_DIR / STUDIES if kind == "study" else PRESETS_DIR


def preset_names(kind: str = "config") -> list[str]:
    """Every preset name of ``kind``, sorted (run configs exclude the study files)."""
    root = _root(kind)
    if not root.is_dir():
        return []
    files = (p for p in root.rglob("*") if p.suffix in SUFFIXES and p.is_file())
    if kind == "config":
        files = (p for p in files if (PRESETS_DIR / STUDIES) not in p.parents)
    return sorted(p.relative_to(root).with_suffix("").as_posix() for p in files)


def _name_of(text: str, kind: str) -> str:
    """``configs/abe/cub-abe8.yaml`` -> ``abe/cub-abe8``; ``configs/studies/demo.yaml`` -> ``demo`` (a study)."""
    name = text.strip().replace("\\", "/")
    while name.startswith("./"):
        name = name[2:]
    name = name.removeprefix("configs/")
    for suffix in SUFFIXES:
        name = name.removesuffix(suffix)
    if kind == "study":
        name = name.removeprefix(f"{STUDIES}/")
    return name


def find_preset(text: str, kind: str = "config") -> Path | None:
    """The packaged file named by ``text`` (see ``_name_of``), or None."""
    name = _name_of(text, kind)
    if not name or ".." in name.split("/") or name.startswith("/"):
        return None
    if kind == "config" and name.split("/")[0] == STUDIES:
        return None
    root = _root(kind)
    for suffix in SUFFIXES:
        candidate = root / f"{name}{suffix}"
        if candidate.is_file():
            return candidate
    return None


def resolve(text: str | Path, kind: str = "config", what: str | None = None, relative_to: Path | None = None
            ) -> Path:
    """A config or study file: ``text`` itself when that file exists (or ``text.yaml`` / ``text.yml``: ``--config
    demo-glyphs`` beside a ``demo-glyphs.yaml`` of the user's reads that file), else the preset of that name; else a
    ``ConfigError`` naming the nearest presets. ``what`` names the file in messages (default: config/study file).
    A relative ``text`` is looked for in ``relative_to`` (``extends:`` in a config: its folder), by default the
    working directory."""
    path = Path(text) if relative_to is None else relative_to / text
    if path.is_file():
        return path
    if path.suffix not in SUFFIXES:  # a file of that name with .yaml / .yml wins over the preset too
        local = next((f for f in (path.with_name(path.name + x) for x in SUFFIXES) if f.is_file()), None)
        if local is not None:
            return local
    found = find_preset(str(text), kind)
    if found is not None:
        return found
    what = what or ("study file" if kind == "study" else "config file")
    name = _name_of(str(text), kind)
    if kind == "config" and find_preset(str(text), "study") is not None:
        raise ConfigError(f"{what} '{text}' is a study, not a run config: run it with deepmetric study "
                          f"{_name_of(str(text), 'study')}")
    if path.is_dir():
        raise ConfigError(f"{what} '{text}' is a folder; give a YAML file or a preset name")
    names = preset_names(kind)
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    close += [n for n in names if name and name in n and n not in close][:3 - len(close)]
    hint = f"; nearest presets: {', '.join(close)}" if close else ""
    listing = "deepmetric presets" + (" --studies" if kind == "study" else "")
    raise ConfigError(f"{what} '{text}' does not exist and is not a preset{hint} ({listing} lists them)")


def reproduces(path: Path) -> list[str]:
    """A run config's ``# Reproduces:`` lines (its first lines), without the prefix."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [line.removeprefix(REPRODUCES) for line in itertools.takewhile(lambda x: x.startswith(REPRODUCES), lines)]


SUMMARY_CHARACTERS = 160


def study_summary(path: Path) -> str:
    """The first sentence of a study file's leading comment (what it compares), at most ``SUMMARY_CHARACTERS``; a
    ``# Reproduces:`` line is passed over where a description follows it (it ran into the sentence after it)."""
    lines = [line.lstrip("#").strip() for line in
             itertools.takewhile(lambda x: x.startswith("#"), path.read_text(encoding="utf-8").splitlines())]
    described = [line for line in lines if not line.startswith(REPRODUCES.removeprefix("# ").strip())]
    text = " ".join(described or lines)
    end = re.search(r"\.\s+(?=[A-Z])", text)  # "ch. 5" does not end the sentence
    sentence = text[:end.start() + 1] if end else text
    return sentence if len(sentence) <= SUMMARY_CHARACTERS else sentence[:SUMMARY_CHARACTERS - 1].rstrip() + "…"


def list_presets(pattern: str | None = None, kind: str = "config") -> list[Preset]:
    """The packaged presets of ``kind`` whose name matches the shell-style ``pattern`` (``abe/*``, ``*cub*``)."""
    presets = []
    for name in preset_names(kind):
        if pattern and not fnmatch.fnmatchcase(name, pattern) and pattern not in name:
            continue
        path = find_preset(name, kind)
        assert path is not None
        described = reproduces(path) if kind == "config" else [study_summary(path)]
        presets.append(Preset(name, kind, path, [d for d in described if d]))
    return presets


def format_presets(presets: list[Preset], kind: str = "config") -> str:
    """A two-column table: name, then what it reproduces (one line per table)."""
    header, plural = ("study", "studies") if kind == "study" else ("preset", "presets")
    usage = ("deepmetric study NAME" if kind == "study" else "deepmetric train --config NAME")
    column = "compares" if kind == "study" else "reproduces"
    if not presets:
        return f"no {header} matches (deepmetric presets{' --studies' if kind == 'study' else ''} lists them all)"
    width = max(len(header), *(len(p.name) for p in presets))
    lines = [f"{header:<{width}}  {column}"]
    for preset in presets:
        for number, entry in enumerate(preset.reproduces or ["-"]):
            lines.append(f"{preset.name if number == 0 else '':<{width}}  {entry}")
    lines.append(f"\n{len(presets)} {plural if len(presets) != 1 else header} in {PRESETS_DIR}; use one with {usage}")
    return "\n".join(lines)
