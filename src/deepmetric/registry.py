"""One small registry for every kind of plug-in: backbones, heads, losses, regularisers, generators, data sources.

In the style of timm's ``_registry.py``: a name table with ``register`` (also as a decorator), ``check``
(the name and its options, each refused with the nearest valid name), ``build`` and ``names``::

    HEADS = Registry("head", provided=("backbone", "embedding_dim"))
    HEADS.register("gap", GAPHead)
    HEADS.check("gap", {"pooling": "max"})         # ConfigError: head 'gap' has no option 'pooling'; ...
    LOSSES.build("binomial", {"alpha": 2}, num_classes=100)

An entry is a class or a function. Its *options* are the keyword parameters of its constructor (or of
the function), less the *provided* arguments that the caller fills in (``num_classes``, ``head`` ...),
which ``build`` passes only to entries whose signature asks for them. A family of names that no table
can list (``timm:<model>``) is served by ``register_prefix``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from .errors import ConfigError, DeepMetricError, did_you_mean

T = TypeVar("T", bound=Callable[..., Any])  # an entry: a class or a function


def keyword_parameters(fn: Callable[..., Any]) -> list[str]:
    """Names of ``fn``'s named parameters (a class: its ``__init__``'s, less ``self``), ``*args``/``**kw`` excluded."""
    return [p.name for p in inspect.signature(fn).parameters.values()
            if p.name not in ("self", "cls") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def forwarded_parameters(entry: Callable[..., Any]) -> set[str]:
    """The names ``entry`` accepts, its own and, for a class whose ``__init__`` passes ``*args``/``**kwargs`` on,
    those of the base classes it forwards them to (pytorch-metric-learning's ``CosFaceLoss(*args, **kwargs)`` takes
    ``num_classes`` and ``embedding_size`` through ``LargeMarginSoftmaxLoss``): what ``build`` may provide to it."""
    if not inspect.isclass(entry):
        return set(keyword_parameters(entry))
    names: set[str] = set()
    for cls in entry.__mro__:
        init = vars(cls).get("__init__")
        if init is None:
            continue
        if cls.__module__.startswith(("torch.", "builtins")) or cls is object:
            break
        parameters = inspect.signature(init).parameters.values()
        names.update(p.name for p in parameters
                     if p.name not in ("self", "cls") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))
        if not any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters):
            break  # this one forwards nothing further up
    return names


class Registry(Generic[T]):
    """Named entries of one kind of plug-in.

    Args:
        kind: what an entry is, as messages say it ("head", "loss", "data set").
        provided: constructor arguments the caller fills in, never options.
        extra_options: options every entry accepts on top of its own (a regulariser's ``weight``), which
            ``build`` does not pass on.
        options_of: the option names of an entry, when its constructor does not tell them (heads).
        error: the exception raised for a bad name or option.
    """

    def __init__(self, kind: str, provided: tuple[str, ...] = (), extra_options: tuple[str, ...] = (),
                 options_of: Callable[[T], list[str]] | None = None,
                 error: type[DeepMetricError] = ConfigError):
        self.kind = kind
        self.provided = provided
        self.extra_options = extra_options
        self._options_of = options_of
        self.error = error
        self._entries: dict[str, T] = {}
        self._prefixes: dict[str, Callable[[str], T]] = {}

    def register(self, name: str, entry: T | None = None) -> Any:
        """Add ``entry`` under ``name``; without ``entry``, a decorator that adds what it decorates."""
        if entry is None:
            return lambda decorated: self.register(name, decorated)
        if name in self._entries and self._entries[name] is not entry:
            raise ValueError(f"{self.kind} '{name}' is registered twice")
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> T:
        """Remove and return entry ``name`` (tests that register a throw-away entry)."""
        return self._entries.pop(name)

    def register_prefix(self, prefix: str, resolve: Callable[[str], T]) -> None:
        """Serve every name ``<prefix>:<rest>`` with ``resolve(rest)`` (e.g. ``timm:<model>``)."""
        self._prefixes[prefix] = resolve

    def names(self) -> list[str]:
        """The registered names, in registration order, then ``<prefix>:<name>`` for each prefix."""
        return [*self._entries, *(f"{prefix}:<name>" for prefix in self._prefixes)]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self._entries or self._prefix_of(name) is not None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def items(self) -> list[tuple[str, T]]:
        return list(self._entries.items())

    def _prefix_of(self, name: str) -> str | None:
        prefix, sep, rest = name.partition(":")
        return prefix if sep and rest and prefix in self._prefixes else None

    def get(self, name: str) -> T:
        """The entry ``name``; an unknown name is refused with the nearest valid one and the full list."""
        if name in self._entries:
            return self._entries[name]
        prefix = self._prefix_of(name)
        if prefix is not None:
            return self._prefixes[prefix](name.partition(":")[2])
        expected = ", ".join(self.names()) or "none registered"
        raise self.error(f"unknown {self.kind} '{name}'{did_you_mean(name, self._entries)}; expected one of "
                         f"{expected}")

    def options(self, name: str) -> list[str]:
        """The options entry ``name`` accepts (``extra_options`` first)."""
        entry = self.get(name)
        own = self._options_of(entry) if self._options_of else keyword_parameters(entry)
        return [*self.extra_options, *(o for o in own if o not in self.provided and o not in self.extra_options)]

    def defaults(self, name: str) -> dict[str, Any]:
        """The options of entry ``name`` that have a default in its constructor, with that default (neither
        ``provided`` nor ``extra_options``)."""
        entry = self.get(name)
        return {p.name: p.default for p in inspect.signature(entry).parameters.values()
                if p.default is not p.empty and p.name not in self.provided and p.name not in self.extra_options
                and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}

    def check(self, name: str, options: dict[str, Any] | None = None) -> T:
        """The entry ``name``, once its name and every key of ``options`` are known (config validation)."""
        entry = self.get(name)
        accepted = self.options(name)
        for key in options or {}:
            if key not in accepted:
                spaced = str(key).partition(":")
                if spaced[1] and spaced[0] in accepted:  # {num_learners:0}: YAML reads one key, valued null
                    raise self.error(f"{self.kind} '{name}': option '{key}' reads as one name; YAML needs a space "
                                     f"after the colon: {{{spaced[0]}: {spaced[2]}}}")
                raise self.error(f"{self.kind} '{name}' has no option '{key}'{did_you_mean(key, accepted)}; its "
                                 f"options are: {', '.join(accepted) or 'none'}")
        return entry

    def build(self, name: str, options: dict[str, Any] | None = None, **provided: Any) -> Any:
        """Call entry ``name`` with ``options`` (checked) and the ``provided`` values its signature asks for (or
        that of a base class it forwards ``**kwargs`` to, ``forwarded_parameters``)."""
        entry = self.check(name, options)
        wanted = forwarded_parameters(entry)
        arguments = {k: v for k, v in (options or {}).items() if k not in self.extra_options}
        arguments.update({k: v for k, v in provided.items() if k in wanted})
        try:  # a required option left out is the user's to fix; a TypeError inside the constructor is a bug
            inspect.signature(entry).bind(**arguments)
        except TypeError as error:
            raise self.error(f"{self.kind} '{name}': {error}") from None
        return entry(**arguments)
