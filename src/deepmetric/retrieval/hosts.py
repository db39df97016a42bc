"""Which ``Host:`` names the retrieval service answers (DNS rebinding): the policy, free of the web framework; the
ASGI middleware that applies it is ``middleware.TrustedHosts``."""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import DeepMetricError

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_BINDS = frozenset({"0.0.0.0", "::", ""})
HOST_NAME = re.compile(r"[a-z0-9_]([a-z0-9_.-]{0,251}[a-z0-9_])?")
"""A DNS name (letters, digits, '-', '.', '_'), lowercase; IP literals are parsed by ``ipaddress``."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a --host value) names this machine only: ``localhost`` or an address in 127.0.0.0/8 / ::1."""
    host = host.strip("[]").lower().rstrip(".")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def split_host_header(value: str) -> tuple[str, int | None] | None:
    """``(name, port)`` of a ``Host:`` value (``name``, ``name:port``, ``[v6]``, ``[v6]:port``), the name
    lowercase without a trailing dot and IPv6 without brackets; None when it is malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        name, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
        port_text = rest[1:] if rest else None
        try:
            ipaddress.IPv6Address(name)
        except ValueError:
            return None
    else:
        name, colon, port_text = value.partition(":")
        port_text = port_text if colon else None
        name = name[:-1] if name.endswith(".") else name
        if not HOST_NAME.fullmatch(name):
            return None
    if port_text is not None and not re.fullmatch(r"[0-9]{0,5}", port_text):  # "name:" is valid (RFC 3986)
        return None
    port = int(port_text) if port_text else None
    if port is not None and port > 65535:
        return None
    return name, port


@dataclass(frozen=True)
class HostCheck:
    """The ``Host:`` names the service answers to (names only, any port; see the module docstring).

    ``names``: lowercase names and addresses (IPv6 without brackets); ``any_address``: also every IP literal (a
    service bound to all interfaces: a browser sends an address as ``Host`` only to a page of that address, so
    an address cannot be a rebinding); ``anything``: no check (``--allowed-hosts '*'``)."""

    names: frozenset[str] = LOOPBACK_NAMES
    any_address: bool = False
    anything: bool = False

    @classmethod
    def for_bind(cls, host: str, allowed: Iterable[str] = ()) -> HostCheck:
        """The check for a service bound to ``host`` (``--host``) with the extra names ``allowed``
        (``--allowed-hosts``; ``*`` accepts every name): the bound name; the loopback names (localhost,
        127.0.0.1, [::1]) when it is a loopback address; when it is 0.0.0.0 or ``::`` (every interface), the
        loopback names, this machine's host names and every IP address."""
        allowed = [a.strip().lower() for a in allowed if a.strip()]
        if "*" in allowed:
            return cls(anything=True)
        names = {host.strip("[]").lower().rstrip(".")}
        any_address = host.strip("[]") in WILDCARD_BINDS
        if any_address:
            names -= {host.strip("[]").lower()}
            names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
        if any_address or is_loopback(host):
            names |= LOOPBACK_NAMES
        for entry in allowed:
            parsed = split_host_header(entry)
            if parsed is None:
                raise DeepMetricError(f"--allowed-hosts: {entry!r} is not a host name or address")
            names.add(parsed[0])
        return cls(frozenset(names), any_address)

    def refusal(self, header: bytes | None) -> tuple[int, str] | None:
        """None when a request with this ``Host:`` value is served, else (status, message)."""
        if self.anything:
            return None
        if header is None:
            return 400, "the request has no Host header"
        text = header.decode("latin-1")
        parsed = split_host_header(text)
        shown = text[:100].encode("unicode_escape").decode("ascii")
        if parsed is None:
            return 400, f"the Host header '{shown}' is malformed"
        name = parsed[0]
        if name in self.names:
            return None
        if self.any_address:
            try:
                ipaddress.ip_address(name)
                return None
            except ValueError:
                pass
        return 421, (f"'{shown.lower()}' is not a name this service answers to (it answers to "
                     f"{', '.join(sorted(self.names)) + (' and IP addresses' if self.any_address else '')}; "
                     "deepmetric serve --allowed-hosts adds names)")

    def describe(self) -> str:
        if self.anything:
            return "any Host name"
        return ", ".join(sorted(self.names)) + (" and any IP address" if self.any_address else "")
