"""Strict JSON and YAML. Every machine-readable output is RFC 8259 JSON (``to_json``): Python's ``json`` writes ``NaN``
and ``Infinity``, which ``jq``, browsers' ``JSON.parse`` and strict parsers refuse; an undefined value is ``null``.
Every JSON or YAML file read back (a checkpoint's header, a run's ``config.yaml``, ``metrics.jsonl``,
``metrics.json``, ``environment.json``, an index's ``index.json``, config files) is read through ``load_json`` /
``load_yaml``, which answer a malformed file with one ``MalformedFile`` (a ``ValueError``) saying why, never a
``RecursionError`` or a silently dropped key."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import DeepMetricError

if TYPE_CHECKING:
    import yaml


def finite_or_none(value: Any) -> Any:
    """``value`` with every NaN or infinite float (in lists, tuples and dicts too) replaced by None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_none(v) for v in value]
    return value


def to_json(value: Any, **options: Any) -> str:
    """``json.dumps`` that writes strict JSON: non-finite floats become ``null`` (``options`` as json.dumps')."""
    return json.dumps(finite_or_none(value), allow_nan=False, **options)


MAX_NESTING = 100
"""Deepest nesting of lists and mappings a JSON or YAML file read back may hold. deepmetric writes at most 6 levels;
100,000 nested brackets made Python's JSON reader and PyYAML raise ``RecursionError``, and data nested just below
their limit would make any later recursive walk over it do so."""
MAX_YAML_NODES = 20_000
"""Most values a YAML file may hold once its aliases are expanded. A config file holds a few hundred; an alias bomb
(each anchor referring to the previous one nine times: 243 bytes) holds billions, and printing, merging or checking
it ran for minutes and printed megabytes."""


TOO_DEEP = f"it nests too deeply (more than {MAX_NESTING} levels of lists or mappings)"


class MalformedFile(ValueError):
    """A JSON or YAML text that is not valid, nests too deeply, repeats a key (YAML) or expands too far (YAML
    aliases); its message says which (``it nests too deeply ...``), and ``naming(file)`` says it of the file."""

    def naming(self, source: object) -> str:
        """The message about ``source``: ``config.yaml nests too deeply (...)``."""
        return f"{source} {str(self).removeprefix('it ')}"


class NotParsable(MalformedFile):
    """A text that is not JSON (or not YAML) at all, as opposed to one too deep, too large or with a repeated key."""


def nesting_depth(value: Any, limit: int = MAX_NESTING) -> int:
    """How deeply lists, tuples and mappings nest in ``value`` (a scalar: 0), without recursion; stops past
    ``limit`` (a value that contains itself is endlessly deep). Shared parts are walked each time they are used: call
    it on parsed JSON, or on YAML whose ``expanded_size`` is bounded."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, dict | list | tuple):
            continue
        if depth > limit:
            return depth
        deepest = max(deepest, depth)
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list | tuple))
    return deepest


def _check_nesting(value: Any) -> Any:
    if nesting_depth(value) > MAX_NESTING:
        raise MalformedFile(TOO_DEEP)
    return value


def load_json(data: str | bytes) -> Any:
    """``json.loads`` for a file deepmetric reads back: a ``MalformedFile`` (a ``ValueError``) for text that is
    not JSON or not UTF-8, and for nesting deeper than ``MAX_NESTING`` (100,000 brackets raised ``RecursionError``
    inside the reader)."""
    try:
        value = json.loads(data)
    except RecursionError:
        raise MalformedFile(TOO_DEEP) from None
    except UnicodeDecodeError as error:
        raise NotParsable(f"it is not UTF-8 text ({error.reason} at byte {error.start})") from None
    except ValueError as error:
        raise NotParsable(f"it is not valid JSON: {error}") from None
    return _check_nesting(value)


def read_json_object(path: str | Path, error: type[DeepMetricError] = DeepMetricError) -> dict[str, Any]:
    """The JSON object in file ``path`` (``load_json``): one ``error`` naming the file when it cannot be read, is
    not JSON, nests too deeply or holds something else than an object."""
    try:
        record = load_json(Path(path).read_bytes())
    except MalformedFile as failure:
        raise error(f"{path} is not the JSON deepmetric writes ({failure})") from None
    except OSError as failure:
        raise error(f"{path} cannot be read: {failure.strerror or failure}") from None
    if not isinstance(record, dict):
        raise error(f"{path} is not the JSON deepmetric writes (a {type(record).__name__}, not an object)")
    return record


def expanded_size(value: Any, limit: int = MAX_YAML_NODES) -> int:
    """How many values ``value`` holds with every shared (aliased) part counted each time it is used, computed in
    time linear in the distinct objects (each one's size is remembered), stopping past ``limit``; a value that
    contains itself (``&a [*a]``) counts as past the limit."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()

    def size(item: Any) -> int:
        if not isinstance(item, dict | list):
            return 1
        key = id(item)
        if key in sizes:
            return sizes[key]
        if key in open_:
            return limit + 1
        open_.add(key)
        children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
        total = 1
        for child in children:
            total += size(child)
            if total > limit:
                break
        open_.discard(key)
        sizes[key] = total
        return total

    return size(value)


@functools.cache
def _strict_loader() -> type[yaml.SafeLoader]:
    """PyYAML's safe loader, refusing a key repeated in one mapping (PyYAML keeps the last silently: a config with
    two ``train:`` sections lost the first one's settings without a word)."""
    import yaml

    class StrictLoader(yaml.SafeLoader):
        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # '<<: *base' merges, by design
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    first = seen.setdefault(key, line)
                except TypeError:  # an unhashable key: PyYAML's own error says so below
                    continue
                if first != line:
                    raise MalformedFile(f"it repeats the key {key!r} in one mapping (lines {first} and {line}); "
                                        "YAML would keep only the last one, silently: merge them into one")
            return super().construct_mapping(node, deep=deep)

    return StrictLoader


def load_yaml(text: str) -> Any:
    """``yaml.safe_load`` for a file deepmetric reads (configs, a run's ``config.yaml``, study files): a
    ``MalformedFile`` for text that is not YAML, a key repeated in one mapping, nesting deeper than
    ``MAX_NESTING``, or more than ``MAX_YAML_NODES`` values once its aliases are expanded (or one containing
    itself)."""
    import yaml

    try:
        value = yaml.load(text, Loader=_strict_loader())  # a SafeLoader: no Python objects
    except RecursionError:
        raise MalformedFile(TOO_DEEP) from None
    except yaml.YAMLError as error:
        raise NotParsable(f"it is not valid YAML: {' '.join(str(error).split())}") from None
    try:  # first, as it counts each shared part once: nesting_depth walks an alias bomb's billions of values
        size = expanded_size(value)
    except RecursionError:
        raise MalformedFile(TOO_DEEP) from None
    if size > MAX_YAML_NODES:
        raise MalformedFile(f"it expands to more than {MAX_YAML_NODES:,} values through its YAML aliases "
                            "(&anchor / *alias), or contains itself; a config holds a few hundred")
    return _check_nesting(value)
