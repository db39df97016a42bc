"""The service run from a thread of this process, on a free port (tests, benchmarks, the screenshot tool)."""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn

from ..errors import DeepMetricError
from .connections import uvicorn_config
from .service import ServiceLimits


class BackgroundServer:
    """uvicorn serving ``app`` from a thread (tests and benchmarks); ``port=0`` picks a free port."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, limits: ServiceLimits | None = None):
        limits = limits or ServiceLimits()
        self.server = uvicorn.Server(uvicorn_config(app, host, port, limits.header_timeout_s, limits.max_connections,
                                                    log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, name="deepmetric-uvicorn", daemon=True)
        self.host = host

    def __enter__(self) -> BackgroundServer:
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise DeepMetricError("the HTTP server stopped while starting (port in use?)")
            time.sleep(0.01)
        return self

    @property
    def url(self) -> str:
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://{self.host}:{port}"

    @property
    def open_connections(self) -> int:
        """How many client connections the server holds open now (accepted, not yet closed)."""
        return len(self.server.server_state.connections)

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join()
