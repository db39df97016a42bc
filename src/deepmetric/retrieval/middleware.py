"""The service's ASGI middleware: a bounded, timely request body, security headers on every response, and only the
``Host:`` names the service is bound to (``hosts.HostCheck``)."""

from __future__ import annotations

import asyncio
from typing import Any

from ..io.strict import to_json
from .hosts import HostCheck

SECURITY_HEADERS = [(b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"),
                    (b"x-frame-options", b"DENY")]


class RequestTooLarge(Exception):
    """Raised from the wrapped ``receive`` once a streamed body passes the limit."""


def error_body(message: str) -> bytes:
    return to_json({"error": message}).encode()


class BodyTooSlow(Exception):
    """Raised from the wrapped ``receive`` once a body has not arrived within its deadline."""


class LimitBodySize:
    """ASGI middleware: refuse bodies over ``max_bytes`` (413 JSON), by Content-Length or while streaming, and
    bodies that do not arrive within ``timeout_s`` of the request's start (408 JSON: a client sending one byte
    every few seconds held its connection and its upload buffer indefinitely)."""

    def __init__(self, app: Any, max_bytes: int, timeout_s: float = 30.0):
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def _reply(self, send: Any, status: int, message: str) -> None:
        body = error_body(message)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close"), *SECURITY_HEADERS]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = f"the request body is larger than the limit of {self.max_bytes:,} bytes"
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                await self._reply(send, 400, "the Content-Length header is not a number")
                return
            if int(declared) > self.max_bytes:
                await self._reply(send, 413, too_large)
                return
        received = 0
        started = False
        body_done = False
        deadline = asyncio.get_running_loop().time() + self.timeout_s

        async def limited_receive() -> dict:
            nonlocal received, body_done
            if body_done:  # later receives wait for a disconnect: no deadline
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(deadline - asyncio.get_running_loop().time(), 0))
            except TimeoutError:
                raise BodyTooSlow() from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise RequestTooLarge()
                body_done = not message.get("more_body", False)
            return message

        async def tracked_send(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracked_send)
        except RequestTooLarge:
            if not started:
                await self._reply(send, 413, too_large)
        except BodyTooSlow:
            if not started:
                await self._reply(send, 408, f"the request body did not arrive within {self.timeout_s:g} s")


class SecurityHeaders:
    """ASGI middleware: ``nosniff``, no referrer and no framing on every response."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        async def with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS]}
            await send(message)

        await self.app(scope, receive, with_headers if scope["type"] == "http" else send)


class TrustedHosts:
    """ASGI middleware: answer only requests whose ``Host:`` is a name of ``HostCheck`` (421 JSON for another
    name, 400 for a missing or malformed one), before the application or the body is read."""

    def __init__(self, app: Any, check: HostCheck):
        self.app = app
        self.check = check

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        hosts = [value for key, value in scope.get("headers", []) if key == b"host"]
        refusal = self.check.refusal(hosts[0] if len(hosts) == 1 else None)
        if len(hosts) > 1:
            refusal = (400, "the request has more than one Host header")
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, message = refusal
        body = error_body(message)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
