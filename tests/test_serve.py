"""The HTTP service: endpoints, hostile input (always a 4xx JSON, never a 5xx), saturation, a loopback load test."""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from deepmetric.cli import main
from deepmetric.retrieval import Searcher
from deepmetric.retrieval.background import BackgroundServer
from deepmetric.retrieval.search import Hit
from deepmetric.retrieval.service import ServiceLimits, create_app
from serve_helpers import encoded, make_gallery, png_bomb, rss_bytes

LIMITS = ServiceLimits(max_body_bytes=2**20, max_pixels=4_000_000)


@pytest.fixture(scope="module")
def gallery_index(tiny_run, tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    files = make_gallery(root / "gallery", 6)
    assert main(["index", str(tiny_run), "--images", str(root / "gallery"), "--out", str(root / "index"),
                 "--quiet"]) == 0
    return root / "index", files


@pytest.fixture(scope="module")
def searcher(gallery_index):
    return Searcher(gallery_index[0])


@pytest.fixture(scope="module")
def client(searcher):
    with TestClient(create_app(searcher, LIMITS), base_url="http://127.0.0.1:8000") as test_client:  # a bound name
        yield test_client


def post_image(client, data: bytes, name: str = "q.png", k=None, content_type: str = "image/png"):
    params = {} if k is None else {"k": k}
    return client.post("/search", params=params, files={"image": (name, data, content_type)})


def assert_json_error(response, status: int, fragment: str = ""):
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    message = response.json()["error"]
    assert isinstance(message, str) and fragment in message


def test_health_and_page(client):
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["images"] == 6 and health["embedding_dim"] == 16
    assert health["model"] == "tiny + gap" and health["index"] == "flat"
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'type="file"' in page.text and 'id="results"' in page.text
    assert "http://" not in page.text and "https://" not in page.text and "<script src" not in page.text  # no CDN
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert page.headers["x-content-type-options"] == "nosniff" and page.headers["x-frame-options"] == "DENY"


def test_head_is_answered_as_get_without_a_body(client, searcher):
    """Issue 53 item 10: ``HEAD /`` (a link checker's, an uptime monitor's) got 405. The page, ``/health`` and a
    thumbnail answer HEAD with GET's status and headers; on the wire no body follows them."""
    import socket

    for path in ("/", "/health", "/images/0"):
        got, head = client.get(path), client.head(path)
        assert head.status_code == 200 == got.status_code, (path, head.status_code)
        for name in ("content-type", "content-length", "content-security-policy", "x-content-type-options",
                     "cache-control"):
            assert head.headers.get(name) == got.headers.get(name), (path, name)
        assert int(head.headers["content-length"]) == len(got.content) > 0 and head.content == b""
    missing = client.head("/images/999")
    assert missing.status_code == 404 and missing.headers["content-type"] == "application/json"
    refused = client.head("/search")  # a search is a POST, never a HEAD
    assert refused.status_code == 405 and refused.headers["allow"] == "POST"
    with BackgroundServer(create_app(searcher, LIMITS)) as server:
        host, port = server.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(f"HEAD / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
            reply = b""
            while chunk := sock.recv(65536):
                reply += chunk
    status, _, rest = reply.partition(b"\r\n")
    headers, _, body = rest.partition(b"\r\n\r\n")
    assert status == b"HTTP/1.1 200 OK" and b"content-type: text/html" in headers.lower() and body == b""


def test_search_returns_the_gallery_image_first(client, gallery_index):
    _, files = gallery_index
    for item_id, file in enumerate(sorted(files)):
        response = post_image(client, file.read_bytes(), name=file.name, k=4)
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["k"] == 4 and len(body["results"]) == 4
        top = body["results"][0]
        assert top["id"] == item_id and top["score"] == pytest.approx(1.0, abs=1e-4)
        assert set(top) == {"id", "name", "score"} and top["name"].endswith(file.name)
        scores = [r["score"] for r in body["results"]]
        assert scores == sorted(scores, reverse=True)
    # k as a form field, and the default k (10) capped at the gallery size
    response = client.post("/search", data={"k": "2"}, files={"image": ("q.png", files[0].read_bytes())})
    assert response.status_code == 200 and len(response.json()["results"]) == 2
    assert len(post_image(client, files[0].read_bytes()).json()["results"]) == 6


def test_query_formats_are_sniffed_not_named(client):
    pixels = np.random.default_rng(3).integers(0, 256, size=(20, 30, 3), dtype=np.uint8)
    for fmt in ("PNG", "JPEG", "GIF", "WEBP", "BMP"):
        response = post_image(client, encoded(pixels, fmt), name="query.bin", content_type="application/octet-stream")
        assert response.status_code == 200, (fmt, response.text)
    rgba = Image.fromarray(pixels).convert("RGBA")
    buffer = io.BytesIO()
    rgba.save(buffer, format="PNG")
    assert post_image(client, buffer.getvalue()).status_code == 200


def test_thumbnails_by_id_only(client):
    response = client.get("/images/2")
    assert response.status_code == 200 and response.headers["content-type"] == "image/jpeg"
    with Image.open(io.BytesIO(response.content)) as thumb:
        assert thumb.format == "JPEG" and max(thumb.size) <= 256
    attempts = ["/images/6", "/images/-1", "/images/99999999999999999999", "/images/1e3", "/images/0x1",
                "/images/..%2F..%2Fetc%2Fpasswd", "/images/%2e%2e%2f%2e%2e%2fetc%2fpasswd", "/images/../index.json",
                "/images/2%00", "/images/ 2", "/images/%2Fetc%2Fpasswd", "/images/img000.png",
                "/images/", "/images"]
    for url in attempts:  # (httpx resolves a literal ".." segment itself: /images/../x asks for /x)
        response = client.get(url)
        assert_json_error(response, 404)
        assert b"root:" not in response.content


def test_bad_uploads_are_4xx_json(client, gallery_index):
    _, files = gallery_index
    good = files[0].read_bytes()
    assert_json_error(post_image(client, b"this is not an image at all", name="photo.jpg",
                                 content_type="image/jpeg"), 415, "not a JPEG, PNG")
    assert_json_error(post_image(client, b"<svg xmlns='http://www.w3.org/2000/svg'/>", name="x.svg"), 415)
    assert_json_error(post_image(client, b""), 400, "empty")
    assert_json_error(post_image(client, png_bomb()), 413, "pixels")
    assert_json_error(post_image(client, png_bomb(3000, 2000)), 413, "3000x2000 = 6,000,000 pixels")
    assert_json_error(post_image(client, good[: len(good) // 2]), 400, "corrupt")
    assert_json_error(post_image(client, b"\xff\xd8\xff" + b"\x00" * 64, name="a.jpg"), 400)
    assert_json_error(post_image(client, b"GIF89a\xff\xff\xff\xff" + b"\x00" * 20), 400)
    for k in ("0", "-1", "101", "abc", "1.5", "9" * 40, "²", "\u0663", "1\u00b2"):  # Unicode digits: a 500 before
        assert_json_error(post_image(client, good, k=k), 400, "k must be an integer from 1 to 100")
    assert_json_error(client.post("/search", files={"photo": ("q.png", good)}), 400, "field named 'image'")
    assert_json_error(client.post("/search", data={"image": "not a file"}), 400, "field named 'image'")
    assert_json_error(client.post("/search", content=good, headers={"content-type": "image/png"}), 400)
    assert_json_error(client.post("/search", content=b"--x\r\ngarbage",
                                  headers={"content-type": "multipart/form-data; boundary=x"}), 400)
    assert_json_error(client.post("/search", content=b"abc", headers={"content-type": "multipart/form-data"}), 400)
    assert_json_error(client.get("/search"), 405)
    assert_json_error(client.delete("/health"), 405)
    assert_json_error(client.get("/nowhere"), 404, "not found")


def test_oversize_bodies_are_413_whether_declared_or_streamed(client):
    big = b"\x89PNG\r\n\x1a\n" + b"\0" * (LIMITS.max_body_bytes + 10)
    assert_json_error(post_image(client, big), 413, "larger than the limit of 1,048,576 bytes")

    def chunks():  # no Content-Length: the limit applies while the body streams in
        for _ in range(40):
            yield b"\0" * 65536

    response = client.post("/search", content=chunks(), headers={"content-type": "multipart/form-data; boundary=b"})
    assert_json_error(response, 413, "larger than the limit")
    assert_json_error(client.post("/search", content=b"x", headers={"content-length": "abc"}), 400)


# Hostile bodies: random bytes as the upload, as the whole multipart body (with and without a boundary that
# matches), valid image headers followed by garbage, and random k. Deterministic (derandomize) and bounded.
IMAGE_PREFIXES = [b"\xff\xd8\xff\xe0", b"\x89PNG\r\n\x1a\n", b"GIF89a", b"RIFF\x10\x00\x00\x00WEBPVP8 ", b"BM"]


@settings(max_examples=120, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=st.one_of(
    st.tuples(st.just("upload"), st.binary(max_size=600), st.none()),
    st.tuples(st.just("image-prefix"), st.tuples(st.sampled_from(IMAGE_PREFIXES), st.binary(max_size=300)),
              st.none()),
    st.tuples(st.just("body"), st.binary(max_size=600), st.sampled_from(["b", "x" * 70, "", "\"q\""])),
    st.tuples(st.just("multipart-ish"), st.lists(st.sampled_from(
        [b"--b\r\n", b"Content-Disposition: form-data; name=\"image\"; filename=\"a.png\"\r\n",
         b"Content-Disposition: form-data; name=\"k\"\r\n", b"Content-Type: image/png\r\n", b"\r\n",
         b"--b--\r\n", b"\x89PNG\r\n\x1a\n", b"7", b"\xff" * 5, b"name=", b"; filename*=UTF-8''%ff\r\n"]),
        max_size=14), st.none()),
    st.tuples(st.just("k"), st.text(max_size=12), st.none()),
))
def test_fuzzed_requests_never_get_a_5xx(client, gallery_index, case):
    kind, payload, boundary = case
    good = gallery_index[1][0].read_bytes()
    if kind == "upload":
        response = post_image(client, payload, name="fuzz.jpg", content_type="image/jpeg")
    elif kind == "image-prefix":
        response = post_image(client, payload[0] + payload[1])
    elif kind == "body":
        response = client.post("/search", content=payload,
                               headers={"content-type": f"multipart/form-data; boundary={boundary}"})
    elif kind == "multipart-ish":
        response = client.post("/search", content=b"".join(payload),
                               headers={"content-type": "multipart/form-data; boundary=b"})
    else:
        response = client.post("/search", data={"k": payload}, files={"image": ("q.png", good)})
    assert response.status_code < 500, response.text
    if response.status_code != 200:
        assert 400 <= response.status_code < 500
        assert isinstance(response.json()["error"], str)


class BlockingSearcher:
    """A stand-in searcher whose searches wait until released (to fill the service's worker pool)."""

    def __init__(self, real: Searcher):
        self.manifest = real.manifest
        self.release = threading.Event()
        self.started = threading.Semaphore(0)

    def search_image(self, image, k):
        self.started.release()
        self.release.wait()
        return [Hit(0, self.manifest.name(0), 1.0)]


def test_saturation_and_timeouts_answer_503_json(searcher, gallery_index):
    good = gallery_index[1][0].read_bytes()
    blocking = BlockingSearcher(searcher)
    app = create_app(blocking, ServiceLimits(workers=1, queue=0, timeout_s=3600))
    with BackgroundServer(app) as server, httpx.Client(base_url=server.url) as http, ThreadPoolExecutor(1) as pool:
        first = pool.submit(http.post, "/search", files={"image": ("q.png", good)})
        blocking.started.acquire()  # the only worker is busy
        response = http.post("/search", files={"image": ("q.png", good)})
        assert_json_error(response, 503, "busy")
        assert response.headers["retry-after"] == "1"
        assert http.get("/health").status_code == 200  # cheap endpoints stay up
        blocking.release.set()
        assert first.result().status_code == 200

    blocking = BlockingSearcher(searcher)
    app = create_app(blocking, ServiceLimits(workers=1, queue=0, timeout_s=0.05))
    with TestClient(app, base_url="http://127.0.0.1:8000") as test_client:
        assert_json_error(post_image(test_client, good), 503, "took longer than 0.05 s")
        blocking.release.set()


def test_concurrent_clients_over_loopback(searcher, gallery_index):
    """8 clients x 6 rounds of search + thumbnail on a real uvicorn: every answer right, memory flat."""
    files = sorted(gallery_index[1])
    payloads = [f.read_bytes() for f in files]
    app = create_app(searcher, ServiceLimits(workers=2, queue=32))

    def client_session(url: str, worker: int, rounds: int) -> list[str]:
        problems = []
        with httpx.Client(base_url=url, timeout=None) as http:
            for r in range(rounds):
                target = (worker + r) % len(files)
                response = http.post("/search", params={"k": 3}, files={"image": ("q.png", payloads[target])})
                if response.status_code != 200 or response.json()["results"][0]["id"] != target:
                    problems.append(f"search {target}: {response.status_code} {response.text[:200]}")
                thumb = http.get(f"/images/{target}")
                if thumb.status_code != 200 or thumb.headers["content-type"] != "image/jpeg":
                    problems.append(f"image {target}: {thumb.status_code}")
        return problems

    with BackgroundServer(app) as server, ThreadPoolExecutor(8) as pool:
        def load(rounds: int) -> list[str]:
            return [p for f in [pool.submit(client_session, server.url, w, rounds) for w in range(8)]
                    for p in f.result()]

        assert load(2) == []  # warm-up: allocators, caches, thread pools reach their steady state
        before = rss_bytes()
        assert load(6) == []
        growth = rss_bytes() - before
    assert growth < 64 * 2**20, f"RSS grew {growth / 2**20:.1f} MB over 48 more requests"


def test_serve_binds_this_machine_only_by_default():
    from deepmetric.cli import build_parser

    args = build_parser().parse_args(["serve", "some.index"])
    assert args.host == "127.0.0.1"


def _wait_closed(sock, within: float) -> bytes:
    """All a socket receives until the server closes it; fails if the server keeps it open ``within`` seconds."""
    sock.settimeout(within)
    answer = b""
    try:
        while chunk := sock.recv(4096):
            answer += chunk
    except TimeoutError:
        raise AssertionError(f"the server kept the connection open for {within} s") from None
    return answer


def _address(server: BackgroundServer) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").split(":")
    return host, int(port)


def test_slow_clients_are_cut_off(searcher):
    """Partial headers and a body dripped one byte at a time: each gets a bounded answer (a slowloris held 40
    connections open for 75 s and more before)."""
    import socket
    import time

    limits = ServiceLimits(header_timeout_s=0.5, body_timeout_s=0.5, max_connections=4)
    with BackgroundServer(create_app(searcher, limits), limits=limits) as server:
        address = _address(server)
        slow_head = [socket.create_connection(address) for _ in range(3)]
        for sock in slow_head:
            sock.sendall(b"POST /search HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finishes its headers
        started = time.monotonic()
        assert all(_wait_closed(sock, 5.0) == b"" for sock in slow_head)
        assert time.monotonic() - started < 4.0
        drip = socket.create_connection(address)
        drip.sendall(b"POST /search HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: multipart/form-data; boundary=b\r\n"
                     b"Content-Length: 1000\r\n\r\n")
        try:
            for byte in b"--b\r\nCont":  # a valid start, one byte every 0.2 s: 1.8 s for 9 of the 1,000 bytes
                drip.sendall(bytes([byte]))
                time.sleep(0.2)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed while we dripped
        answer = _wait_closed(drip, 5.0)
        assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive within 0.5 s" in answer
        with httpx.Client(base_url=server.url) as http:
            assert http.get("/health").status_code == 200  # and the server still serves


def test_connections_beyond_the_bound_are_answered_503(searcher):
    """Six connections open at once against a bound of four: the first request the server reads finds six and is
    answered 503, the others 200 or 503, and the server still serves afterwards. The requests are sent only once
    the server has accepted all six, so the outcome does not depend on how fast this process runs (it did when
    each connection sent its request as it opened: under load the server answered each before the next came)."""
    import socket
    import time

    limits = ServiceLimits(header_timeout_s=30.0, max_connections=4)
    with BackgroundServer(create_app(searcher, limits), limits=limits) as server:
        crowd = [socket.create_connection(_address(server)) for _ in range(6)]
        deadline = time.monotonic() + 30.0
        while server.open_connections < len(crowd):
            assert time.monotonic() < deadline, f"the server accepted {server.open_connections} of 6 connections"
            time.sleep(0.01)
        for sock in crowd:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        statuses = sorted(_wait_closed(sock, 30.0).split(b" ", 2)[1] for sock in crowd)
        assert b"503" in statuses and set(statuses) <= {b"200", b"503"}, statuses
        with httpx.Client(base_url=server.url) as http:
            assert http.get("/health").status_code == 200


def test_requests_for_another_host_name_are_refused(searcher):
    """DNS rebinding: a page of evil.example whose name is made to resolve to 127.0.0.1 could read search results
    and thumbnails from the loopback service, which answered any ``Host:``. Only the bound names are served now
    (here the default 127.0.0.1: the loopback names), whatever the port; others get 421 JSON, before any body is
    read, over a real uvicorn as through the ASGI app."""
    with TestClient(create_app(searcher, LIMITS), base_url="http://127.0.0.1:8000") as test_client:
        for host in ("127.0.0.1:8000", "127.0.0.1", "localhost:8000", "LocalHost:9000", "localhost.", "[::1]:8000"):
            assert test_client.get("/health", headers={"host": host}).status_code == 200, host
        for host in ("evil.example", "evil.example:8000", "127.0.0.1.evil.example", "localhost.evil.example:8000",
                     "testserver", "[::2]:8000", "0.0.0.0:8000"):
            response = test_client.get("/images/0", headers={"host": host})
            assert_json_error(response, 421, "is not a name this service answers to")
            assert host.lower() in response.json()["error"] and response.headers["x-frame-options"] == "DENY"
            search = test_client.post("/search", headers={"host": host}, files={"image": ("q.png", b"\x89PNG")})
            assert_json_error(search, 421, "is not a name this service answers to")
        for host in ("localhost:80x", "[::1", "local host", "localhost:99999", "a@localhost"):
            assert_json_error(test_client.get("/health", headers={"host": host}), 400, "Host")
    import socket

    with BackgroundServer(create_app(searcher, LIMITS)) as server:
        host, port = server.url.removeprefix("http://").split(":")
        for name, status in ((b"evil.example:" + port.encode(), b"421"), (b"localhost:" + port.encode(), b"200")):
            with socket.create_connection((host, int(port))) as sock:
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: " + name + b"\r\nConnection: close\r\n\r\n")
                sock.settimeout(5.0)
                answer = b""
                while chunk := sock.recv(4096):
                    answer += chunk
            assert answer.split(b" ", 2)[1] == status, answer


def test_the_names_answered_follow_the_bound_host_and_allowed_hosts(searcher, gallery_index, monkeypatch, capsys):
    import deepmetric.retrieval.service as service
    from deepmetric.retrieval.service import HostCheck

    def statuses(check, hosts):
        with TestClient(create_app(searcher, LIMITS, check)) as test_client:
            return [test_client.get("/health", headers={"host": h}).status_code for h in hosts]

    # bound to a name: that name only (not the loopback names: the service is not on loopback)
    assert statuses(HostCheck.for_bind("search.internal"), ["search.internal:8000", "SEARCH.internal",
                                                             "localhost:8000", "evil.example"]) == [200, 200, 421, 421]
    # every interface: loopback names, this machine's names and IP addresses; other names still refused
    assert statuses(HostCheck.for_bind("0.0.0.0"), ["192.168.1.5:8000", "[fe80::1]:8000", "localhost",
                                                     "evil.example:8000"]) == [200, 200, 200, 421]
    # --allowed-hosts adds names (a proxy's); '*' turns the check off
    assert statuses(HostCheck.for_bind("127.0.0.1", ["search.example.org"]),
                    ["search.example.org", "127.0.0.1:8000", "evil.example"]) == [200, 200, 421]
    assert statuses(HostCheck.for_bind("127.0.0.1", ["*"]), ["evil.example", "testserver"]) == [200, 200]
    # from the command line, several names in one or more options; a bad one is one line before anything loads
    served = []
    monkeypatch.setattr(service.uvicorn, "Server", lambda config: served.append(config.app) or
                        type("NotRun", (), {"run": lambda self: None})())
    assert main(["serve", str(gallery_index[0]), "--allowed-hosts", "a.example,b.example", "--allowed-hosts",
                 "c.example"]) == 0
    with TestClient(served[0]) as test_client:
        assert [test_client.get("/health", headers={"host": h}).status_code
                for h in ("a.example", "b.example:80", "c.example", "localhost", "d.example")] == [200] * 4 + [421]
    capsys.readouterr()
    import deepmetric.retrieval.search as search

    monkeypatch.setattr(search, "Searcher", lambda *_: pytest.fail("the index was loaded before the names checked"))
    assert main(["serve", str(gallery_index[0]), "--allowed-hosts", "evil host"]) == 2
    err = capsys.readouterr().err
    assert err == "error: --allowed-hosts: 'evil host' is not a host name or address\n" and len(served) == 1


def test_serve_refuses_a_damaged_manifest_and_damaged_stored_data_is_json_without_a_traceback(
        gallery_index, tmp_path, monkeypatch, capsys, caplog):
    """Issue 39 item 17: ``serve`` loaded an index.json with an item's ``source: 7`` and answered ``GET /images/0``
    with a 500 and a traceback in its log. It refuses to start, naming the file and the key; and stored data that
    goes bad after the checks (a record changed in memory, a gallery file that became a FIFO, a folder or a file
    its decoder fails on in any way) answers JSON without a path, with one log line and no traceback."""
    import deepmetric.retrieval.service as service
    import deepmetric.retrieval.uploads as uploads

    index = tmp_path / "index"
    shutil.copytree(gallery_index[0], index)  # moved: its gallery is found from where it was written (item 30)
    pristine = json.loads((index / "index.json").read_text())
    started = []
    monkeypatch.setattr(service.uvicorn, "Server", lambda config: started.append(config.app) or
                        type("NotRun", (), {"run": lambda self: None})())
    edits = {"items[0].source is 7": lambda d: d["items"][0].update(source=7),
             "items[2].path is 5": lambda d: d["items"][2].update(path=5),
             "model.image_size is missing": lambda d: d["model"].pop("image_size"),
             "model.checkpoint_sha256 is missing": lambda d: d["model"].pop("checkpoint_sha256"),
             "sources is": lambda d: d.update(sources={"0": "gallery"})}
    for message, edit in edits.items():
        data = json.loads(json.dumps(pristine))
        edit(data)
        (index / "index.json").write_text(json.dumps(data))
        assert main(["serve", str(index)]) == 2
        err = capsys.readouterr().err
        assert f"{index / 'index.json'} is a damaged index manifest: {message}" in err and "Traceback" not in err
        assert len(err.strip().splitlines()) == 1 and not started, message
    (index / "index.json").write_text(json.dumps(pristine))
    assert main(["serve", str(index)]) == 0 and len(started) == 1

    damaged = Searcher(index)
    odd = tmp_path / "odd"
    odd.mkdir()
    os.mkfifo(odd / "fifo.png")  # opening it blocked a worker for good
    (odd / "folder.png").mkdir()
    damaged.manifest.sources.append(str(odd))
    damaged.manifest.items[0]["source"] = 7
    damaged.manifest.items[1]["path"] = 5
    damaged.manifest.items[2].update(source=1, path="fifo.png")
    damaged.manifest.items[3].update(source=1, path="folder.png")

    def decoder_bug(*_):
        raise ZeroDivisionError("a decoder's bug on a crafted file")

    monkeypatch.setattr(uploads, "thumbnail_jpeg", decoder_bug)
    caplog.set_level(logging.WARNING, logger="deepmetric.serve")
    with TestClient(create_app(damaged, ServiceLimits(timeout_s=5)), base_url="http://127.0.0.1:8000") as client:
        for item, status, fragment in ((0, 500, "stored data for this request is damaged"), (1, 500, "damaged"),
                                       (2, 404, "no longer readable"), (3, 404, "no longer readable"),
                                       (4, 404, "no longer readable")):
            response = client.get(f"/images/{item}")
            assert_json_error(response, status, fragment)
            assert str(tmp_path) not in response.text and "/" not in response.json()["error"], item
    assert all(record.exc_info is None for record in caplog.records), [r.getMessage() for r in caplog.records]
    assert "Traceback" not in caplog.text and len(caplog.records) == 5
    assert "item 0's record is damaged (IndexError" in caplog.text


def test_an_index_item_outside_its_gallery_folders_is_refused_and_never_served(gallery_index, tmp_path, monkeypatch,
                                                                              capsys):
    """Issue 53 item 12: ``index.json`` items still took an absolute ``path`` (indexes written before items were
    relative), so a hand-edited index made ``GET /images/0`` serve a thumbnail of any image the server could read.
    An absolute item is read only when it lies inside its gallery folder (then as relative to it); one outside,
    directly or through ``..``, stops ``serve`` and ``search`` with one line naming the item; a path changed in
    memory after the checks is not served either."""
    import deepmetric.retrieval.service as service

    index = tmp_path / "index"
    shutil.copytree(gallery_index[0], index)
    secret = make_gallery(tmp_path / "private", 1, seed=9)[0]  # an image of the server's, outside the gallery
    pristine = json.loads((index / "index.json").read_text())
    gallery = Searcher(index).manifest.sources[0]
    started = []
    monkeypatch.setattr(service.uvicorn, "Server", lambda config: started.append(config.app) or
                        type("NotRun", (), {"run": lambda self: None})())
    for path in (str(secret), f"{gallery}/../private/{secret.name}", f"{gallery}/./../private/{secret.name}", gallery):
        data = json.loads(json.dumps(pristine))
        data["items"][0]["path"] = path
        (index / "index.json").write_text(json.dumps(data))
        for command in (["serve", str(index)], ["search", str(index), "--image", str(secret)]):
            assert main(command) == 2, (path, command)
            err = capsys.readouterr().err
            assert "items[0].path" in err and "lies outside its gallery folder sources[0]" in err, err
            assert "rebuild it" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
        assert not started

    data = json.loads(json.dumps(pristine))
    inside = gallery_index[1][3]
    data["items"][0]["path"] = f"{gallery}/./{inside.name}"  # img003.png, at the gallery's top
    (index / "index.json").write_text(json.dumps(data))
    searcher = Searcher(index)  # a legacy absolute item inside its folder: read as relative to it
    assert searcher.manifest.items[0]["path"] == inside.name and searcher.manifest.image_path(0) == Path(gallery) / \
        inside.name

    searcher.manifest.items[1]["path"] = str(secret)  # changed in memory, after the checks
    searcher.manifest.items[2]["path"] = f"../private/{secret.name}"
    with TestClient(create_app(searcher, LIMITS), base_url="http://127.0.0.1:8000") as client:
        assert client.get("/images/0").status_code == 200
        for item in (1, 2):
            response = client.get(f"/images/{item}")
            assert_json_error(response, 500, "damaged")
            assert str(tmp_path) not in response.text


def test_a_moved_index_searches_and_serves_and_no_answer_holds_a_server_path(tiny_run, tmp_path, capsys):
    """Issue 39 item 30: an index kept its run, checkpoint and galleries as absolute paths (a moved index lost them)
    and results could carry absolute server paths. Its paths are kept relative to the index folder, and looked up
    from where it was written too: moved alone, or moved with what it refers to (with its run and galleries beside
    it, as on another machine), it searches and serves, and no answer names a folder of the old place."""
    site = tmp_path / "site"
    run_dir = site / "runs" / "r"
    shutil.copytree(tiny_run, run_dir)
    gallery = make_gallery(site / "gallery", 4)
    more = make_gallery(site / "more", 2, seed=1, start=4)
    (site / "lists").mkdir()
    listing = site / "lists" / "more.txt"  # entries outside the list's folder: relative to the folder holding them
    listing.write_text("".join(f"../more/{f.relative_to(site / 'more').as_posix()}\n" for f in more))
    index = site / "index"
    assert main(["index", str(run_dir), "--images", str(site / "gallery"), "--out", str(index), "--quiet"]) == 0
    assert main(["index", str(run_dir), "--images", str(listing), "--out", str(index), "--add", "--quiet"]) == 0
    capsys.readouterr()
    stored = json.loads((index / "index.json").read_text())
    assert stored["model"]["run_dir"] == "../runs/r"
    assert stored["model"]["checkpoint"] == "../runs/r/checkpoints/last.safetensors"
    assert stored["sources"] == ["../gallery", "../more"]
    names = [f.relative_to(site / "gallery").as_posix() for f in gallery] + [f.relative_to(site / "more").as_posix()
                                                                             for f in more]
    assert sorted(item["path"] for item in stored["items"]) == sorted(names)

    def answers(index_dir, files):
        """Every answer of ``search --json`` and of the service for ``index_dir``, queried with ``files``."""
        texts = []
        for file in files:
            assert main(["search", str(index_dir), "--image", str(file), "--k", "6", "--json"]) == 0
            results = json.loads(capsys.readouterr().out)["results"]
            assert results[0]["score"] == pytest.approx(1.0, abs=1e-4)
            texts.append(json.dumps(results))
        with TestClient(create_app(Searcher(index_dir), LIMITS), base_url="http://127.0.0.1:8000") as client:
            texts.append(client.get("/health").text)
            for file in files:
                response = post_image(client, file.read_bytes(), k=6)
                assert response.status_code == 200 and response.json()["results"][0]["score"] > 0.999
                texts.append(response.text)
            for item in range(6):
                response = client.get(f"/images/{item}")
                assert response.status_code == 200 and response.headers["content-type"] == "image/jpeg", item
        assert {r["name"] for r in json.loads(texts[0])} == set(names)
        return "\n".join(texts)

    alone = tmp_path / "elsewhere" / "deeper" / "index"  # the index alone: its run and galleries stayed
    alone.parent.mkdir(parents=True)
    shutil.move(index, alone)
    text = answers(alone, [gallery[0], more[1]])
    assert str(tmp_path) not in text and str(tmp_path.resolve()) not in text

    shutil.move(alone, index)
    moved = tmp_path / "another-machine" / "srv"  # everything, to a place where the old one does not exist
    moved.parent.mkdir()
    shutil.move(site, moved)
    assert not site.exists()
    text = answers(moved / "index", [moved / "gallery" / gallery[1].relative_to(site / "gallery"),
                                     moved / "more" / more[0].relative_to(site / "more")])
    assert str(site) not in text and str(site.resolve()) not in text and str(tmp_path) not in text
