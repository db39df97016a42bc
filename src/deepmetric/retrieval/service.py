"""``deepmetric serve``: the retrieval index over HTTP (FastAPI), hardened for untrusted uploads.

Endpoints: ``GET /`` (a self-contained search page), ``GET /health``, ``POST /search`` (multipart field
``image``, optional ``k`` as a query parameter or form field) and ``GET /images/{id}`` (a JPEG thumbnail of
gallery item ``id``; ids only, so no path from a client ever reaches the file system). Each ``GET`` also answers
``HEAD``: its status and headers, without the body.

Defaults that matter for safety: loopback only (127.0.0.1); request bodies over ``max_body_bytes`` are
refused with 413 (from Content-Length before reading, or while streaming); the format is sniffed from the
bytes and images over ``max_pixels`` are refused before decoding (``uploads``); at most ``workers``
searches run at once with at most ``queue`` more waiting, beyond which the answer is 503; a search that
takes longer than ``timeout_s`` is answered 503 (its worker finishes in the background and still counts
against the limit). A connection must send its request head within ``header_timeout_s`` and its body within
``body_timeout_s`` (408), and at most ``max_connections`` are served at once (``connections``). Every error is
JSON ``{"error": "..."}``; bad input always gets a 4xx. No answer holds a path of the server: results name gallery
items by their path below their gallery folder (``IndexManifest.name``), and damaged stored data is a 500 whose
message names no file (the log has one line naming it, no traceback).

Only requests for the names the service is bound to are answered (``HostCheck``): a page of another site whose
name is made to resolve to 127.0.0.1 (DNS rebinding) could otherwise read results and thumbnails from the loopback
service. A ``Host:`` of another name is answered 421, a malformed one 400, before the body is read; the port is
not checked (an SSH tunnel or a container's port mapping changes it; the name is what a rebinding page cannot
choose), as in Django's ``ALLOWED_HOSTS`` and Starlette's ``TrustedHostMiddleware``.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException

from ..errors import IndexStoreError, UploadError
from .capacity import Busy, Gate, ThumbnailCache
from .connections import uvicorn_config
from .hosts import HostCheck, is_loopback
from .middleware import BodyTooSlow, LimitBodySize, RequestTooLarge, SecurityHeaders, TrustedHosts
from .uploads import decode_upload, gallery_thumbnail

log = logging.getLogger("deepmetric.serve")

ITEM_ID = re.compile(r"[0-9]{1,12}")
READ_METHODS = ["GET", "HEAD"]
"""What the pages and the files are answered to: ``HEAD`` as ``GET`` (the same status and headers, no body: the
server leaves it out), which link checkers and uptime monitors send (``HEAD /`` was a 405)."""
PAGE_POLICY = ("default-src 'none'; img-src 'self' blob:; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
               "connect-src 'self'; form-action 'none'; base-uri 'none'")


@dataclass
class ServiceLimits:
    """The service's resource limits (see the module docstring)."""

    max_body_bytes: int = 10 * 2**20
    max_pixels: int = 40_000_000
    workers: int = 2
    queue: int = 16
    timeout_s: float = 30.0
    max_k: int = 100
    default_k: int = 10
    thumbnail_px: int = 256
    thumbnail_cache: int = 512
    header_timeout_s: float = 10.0
    """A connection must send a whole request line and headers within this (slow clients are cut off)."""
    body_timeout_s: float = 30.0
    """A request body must arrive within this once its headers have (else 408)."""
    max_connections: int = 64
    """Connections served at once; beyond them uvicorn answers 503."""


def page_html() -> str:
    return resources.files("deepmetric.retrieval").joinpath("page.html").read_text(encoding="utf-8")


def parse_k(value: Any, limits: ServiceLimits) -> int:
    """``k`` from the query string or the form: ASCII digits from 1 to ``max_k``, else a 400. (``str.isdigit``
    accepted '²' and other Unicode digits that ``int`` then refused: a 500.)"""
    if value is None or value == "":
        return limits.default_k
    text = str(value).strip()
    if not re.fullmatch(r"[0-9]{1,9}", text) or not 1 <= int(text) <= limits.max_k:
        raise UploadError(f"k must be an integer from 1 to {limits.max_k}", 400)
    return int(text)


def create_app(searcher: Any, limits: ServiceLimits | None = None, hosts: HostCheck | None = None) -> Any:
    """The FastAPI application serving ``searcher`` (a ``Searcher``: an index and its model) to requests for the
    ``Host:`` names of ``hosts`` (default: the loopback names, for a service bound to 127.0.0.1)."""
    limits = limits or ServiceLimits()
    hosts = hosts or HostCheck()
    gate = Gate(limits.workers, limits.queue, limits.timeout_s)
    thumbnails = ThumbnailCache(limits.thumbnail_cache)
    unreadable: set[int] = set()  # gallery items whose file could not be read, reported once each
    manifest = searcher.manifest

    @asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        yield
        gate.close()

    app = FastAPI(title="deepmetric retrieval", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.gate = gate

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        message = exc.detail if exc.status_code != 404 else f"not found: {request.method} {request.url.path[:200]}"
        return JSONResponse({"error": str(message)}, status_code=exc.status_code, headers=exc.headers)  # 405: Allow

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error(400, f"bad request: {exc.errors()[0].get('msg', 'invalid input') if exc.errors() else ''}")

    @app.exception_handler(UploadError)
    async def upload_error(_: Request, exc: UploadError) -> JSONResponse:
        return error(exc.status, str(exc))

    @app.exception_handler(Busy)
    async def busy(_: Request, exc: Busy) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=503, headers={"retry-after": "1"})

    @app.exception_handler(RequestTooLarge)
    async def too_large(_: Request, exc: RequestTooLarge) -> JSONResponse:
        return error(413, f"the request body is larger than the limit of {limits.max_body_bytes:,} bytes")

    @app.exception_handler(BodyTooSlow)
    async def too_slow(_: Request, exc: BodyTooSlow) -> JSONResponse:
        return error(408, f"the request body did not arrive within {limits.body_timeout_s:g} s")

    @app.exception_handler(IndexStoreError)
    async def damaged(request: Request, exc: IndexStoreError) -> JSONResponse:
        log.error("%s %s: %s", request.method, request.url.path[:200], exc)  # one line; the client gets no path
        return error(500, "the index's stored data for this request is damaged (the server's log names the problem)")

    @app.exception_handler(Exception)
    async def internal(_: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error")
        return error(500, "internal error")

    @app.api_route("/", methods=READ_METHODS, response_class=HTMLResponse)
    async def page() -> HTMLResponse:
        return HTMLResponse(page_html(), headers={"content-security-policy": PAGE_POLICY, "cache-control": "no-cache"})

    @app.api_route("/health", methods=READ_METHODS)
    async def health() -> dict[str, Any]:
        spec = manifest.model["spec"]
        return {"status": "ok", "images": manifest.count, "embedding_dim": manifest.embedding_dim,
                "index": manifest.kind, "model": f"{spec.get('backbone')} + {spec.get('head')}",
                "max_k": limits.max_k, "max_body_bytes": limits.max_body_bytes, "max_pixels": limits.max_pixels}

    def search_job(data: bytes, k: int) -> list[dict[str, Any]]:
        return [hit.to_dict() for hit in searcher.search_image(decode_upload(data, limits.max_pixels), k)]

    @app.post("/search")
    async def search(request: Request) -> dict[str, Any]:
        try:
            form = await request.form(max_files=1, max_fields=4, max_part_size=64 * 1024)
        except (HTTPException, RequestTooLarge, BodyTooSlow):
            raise
        except Exception as exc:  # python-multipart on hostile bytes: any parse failure is the client's
            raise UploadError(f"malformed multipart body ({type(exc).__name__})", 400) from None
        upload = form.get("image")
        if not isinstance(upload, UploadFile):
            raise UploadError("send the query image as a multipart/form-data file field named 'image'", 400)
        k = parse_k(request.query_params.get("k", form.get("k")), limits)
        data = await upload.read()
        started = time.perf_counter()
        results = await gate.run(search_job, data, k)
        return {"k": k, "results": results, "took_ms": round(1000 * (time.perf_counter() - started), 1)}

    def gallery_file(item_id: int) -> str:
        """The file of a gallery item: what the index stores for it is data read from disk, so a failure here is
        damage to be reported in one line (``IndexStoreError``), not a bug's traceback."""
        try:
            path = manifest.image_path(item_id)
        except Exception as failure:  # a record changed in memory after it was checked (the checks run on read)
            raise IndexStoreError(f"item {item_id}'s record is damaged ({type(failure).__name__}: {failure})") \
                from None
        if path is None:
            raise UploadError(f"image {item_id} has no file in this index", 404)
        return str(path)

    def thumbnail_job(item_id: int) -> bytes:
        cached = thumbnails.get(item_id)
        if cached is None:
            path = gallery_file(item_id)
            try:
                cached = gallery_thumbnail(path, limits.thumbnail_px, limits.max_pixels)
            except UploadError as refusal:
                if item_id not in unreadable:  # once per item: a client asking again cannot flood the log
                    unreadable.add(item_id)
                    log.warning("thumbnail of item %d (%s): %s", item_id, path, refusal)
                raise
            thumbnails.put(item_id, cached)
        return cached

    @app.api_route("/images/{item}", methods=READ_METHODS)
    async def image(item: str) -> Response:
        if not ITEM_ID.fullmatch(item) or int(item) >= manifest.count:
            raise UploadError(f"no image with id '{item[:40]}' (ids are 0 to {manifest.count - 1})", 404)
        data = await gate.run(thumbnail_job, int(item))
        return Response(data, media_type="image/jpeg", headers={"cache-control": "public, max-age=3600"})

    app.add_middleware(LimitBodySize, max_bytes=limits.max_body_bytes, timeout_s=limits.body_timeout_s)
    app.add_middleware(TrustedHosts, check=hosts)  # outside the body limit: another name's body is never read
    app.add_middleware(SecurityHeaders)
    return app


def serve(index_dir: str, host: str = "127.0.0.1", port: int = 8000, limits: ServiceLimits | None = None,
          allowed_hosts: Iterable[str] = (), device: str = "cpu", amp: str | None = None,
          compile: bool | None = None) -> None:
    """Load the index and its model (on ``device``, embedding queries under ``amp``'s autocast, compiled with
    ``compile``: ``Searcher``), then serve until interrupted, answering requests for the bound name
    (``HostCheck.for_bind``) and ``allowed_hosts``."""
    from .search import Searcher

    hosts = HostCheck.for_bind(host, allowed_hosts)  # a bad name is refused before the index is loaded
    searcher = Searcher(index_dir, device, amp=amp, compile=compile)
    if not is_loopback(host):
        log.warning("serving on %s: every machine that can reach this port can query the index and read "
                    "thumbnails of every indexed image", host)
    log.info("serving %d images of %s on http://%s:%d (answering Host: %s)", searcher.count, index_dir, host, port,
             hosts.describe())
    limits = limits or ServiceLimits()
    uvicorn.Server(uvicorn_config(create_app(searcher, limits, hosts), host, port, limits.header_timeout_s,
                                  limits.max_connections)).run()
