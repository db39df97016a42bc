"""Connection limits for the service's uvicorn: slow clients are cut off, connections are bounded.

uvicorn times out idle keep-alive connections but never a client that sends its request head slowly (a
"slowloris"): 20 connections sending partial headers stayed open indefinitely. ``GuardedH11Protocol`` is
uvicorn's h11 protocol with a deadline for the request line and headers, counted from the connection (or from
the previous response on a kept-alive one); the body has its own deadline in the ``LimitBodySize`` middleware
(``service.py``), and ``limit_concurrency`` bounds connections (beyond it uvicorn answers 503).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("deepmetric")


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol that closes a connection whose request head is not complete ``header_timeout``
    seconds after the connection opened or after its previous response."""

    header_timeout: float = 10.0
    _head_deadline: asyncio.TimerHandle | None = None

    # uvicorn's H11Protocol narrows asyncio.Protocol's BaseTransport to Transport (under its own ignore); so do we
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_deadline()

    def handle_events(self) -> None:
        waiting = self.cycle
        super().handle_events()
        if self.cycle is not waiting:  # a whole request head arrived
            self._cancel_head_deadline()

    def on_response_complete(self) -> None:
        if not self.transport.is_closing():
            self._arm_head_deadline()  # the next request's head (before super(): it may start a pipelined one)
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_deadline()
        super().connection_lost(exc)

    def _arm_head_deadline(self) -> None:
        self._cancel_head_deadline()
        self._head_deadline = self.loop.call_later(self.header_timeout, self._head_too_slow)

    def _cancel_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_too_slow(self) -> None:
        self._head_deadline = None
        if not self.transport.is_closing():
            log.warning("closing a connection from %s: no whole request head within %g s",
                        self.client[0] if self.client else "?", self.header_timeout)
            self.transport.close()


def uvicorn_config(app: Any, host: str, port: int, header_timeout: float, max_connections: int,
                   log_level: str = "info") -> uvicorn.Config:
    """The service's uvicorn settings: the guarded protocol, at most ``max_connections`` connections, idle
    keep-alive connections closed after 5 s."""
    protocol = type("DeadlineH11Protocol", (GuardedH11Protocol,), {"header_timeout": float(header_timeout)})
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on", timeout_keep_alive=5,
                          http=protocol, limit_concurrency=max_connections)
