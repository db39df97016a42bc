"""``--data cub`` with no path: the publisher's archive fetched, checked, resumed and unpacked, against a local HTTP
server on 127.0.0.1 serving a small replica of ``CUB_200_2011.tgz`` with the real layout; nothing reaches the
internet."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import http.server
import io
import json
import os
import tarfile
import threading

import pytest
from PIL import Image

from deepmetric.data import download as download_module
from deepmetric.data import load_dataset
from deepmetric.errors import DataError
from helpers import twice_at_once, waits_announced

CLASSES = {1: "001.Black_footed_Albatross", 2: "002.Laysan_Albatross", 101: "101.White_Pelican",
           102: "102.Western_Wood_Pewee"}


def replica_archive() -> bytes:
    """A CUB_200_2011.tgz with the real files: two images in each of two training and two test classes."""
    files = {}
    images, labels, split = [], [], []
    for number, (label, folder) in enumerate([(c, f) for c, f in CLASSES.items() for _ in range(2)], 1):
        name = f"{folder}/{folder[4:]}_{number:04d}_{number}.jpg"
        buffer = io.BytesIO()
        Image.new("RGB", (12, 10), (number * 20, 40, 200 - number * 10)).save(buffer, "JPEG")
        files[f"CUB_200_2011/images/{name}"] = buffer.getvalue()
        images.append(f"{number} {name}")
        labels.append(f"{number} {label}")
        split.append(f"{number} {number % 2}")
    files["CUB_200_2011/images.txt"] = "\n".join(images).encode() + b"\n"
    files["CUB_200_2011/image_class_labels.txt"] = "\n".join(labels).encode() + b"\n"
    files["CUB_200_2011/train_test_split.txt"] = "\n".join(split).encode() + b"\n"
    files["CUB_200_2011/classes.txt"] = "".join(f"{c} {f}\n" for c, f in CLASSES.items()).encode()
    files["attributes.txt"] = b"1 has_bill_shape::curved_(up_or_down)\n"  # the real archive has it at the top
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for folder in ("CUB_200_2011", "CUB_200_2011/images", *(f"CUB_200_2011/images/{f}" for f in CLASSES.values())):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


ARCHIVE = replica_archive()


class Server:
    """A local server of ``data`` at ``/CUB_200_2011.tgz`` that honours ``Range: bytes=N-``; ``cut`` responses are
    sent half and the connection closed; every request's Range header is logged; with a ``gate``, each answer waits
    for it (10 s at most)."""

    def __init__(self, data: bytes = ARCHIVE, cut: int = 0, status: int = 200, gate: threading.Event | None = None,
                 length: int | None | str = "exact", tail: int = 0):
        self.data, self.cut, self.status, self.ranges, self.gate = data, cut, status, [], gate
        self.length, self.tail, self.sent = length, tail, 0  # a Content-Length to announce (None: none); junk after
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                server.ranges.append(self.headers.get("Range"))
                if server.gate is not None:
                    server.gate.wait(10.0)
                if server.status != 200:
                    self.send_error(server.status)
                    return
                start = 0
                if self.headers.get("Range"):
                    start = int(self.headers["Range"].removeprefix("bytes=").rstrip("-"))
                    if start >= len(server.data):
                        self.send_error(416)
                        return
                body = server.data[start:]
                self.send_response(206 if start else 200)
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(server.data) - 1}/{len(server.data)}")
                if server.length is not None:
                    self.send_header("Content-Length", str(len(body) if server.length == "exact" else server.length))
                self.send_header("Content-Type", "application/x-tar")
                self.end_headers()
                if server.tail:  # the body, then junk, without a length: the client must stop reading
                    self.close_connection = True
                    try:
                        for start in range(0, len(body) + server.tail, 1 << 16):
                            chunk = (body + b"\0" * server.tail)[start:start + (1 << 16)]
                            self.wfile.write(chunk)
                            server.sent += len(chunk)
                    except OSError:
                        pass
                    return
                if server.cut:
                    server.cut -= 1
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/CUB_200_2011.tgz"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve(tmp_path, monkeypatch):
    """Start a ``Server`` and point ``ARCHIVES['cub']`` at it (the replica's MD5 and size); DEEPMETRIC_DATA is
    ``tmp_path/data``; no proxy is used."""
    for variable in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("no_proxy", "*")
    monkeypatch.setenv("DEEPMETRIC_DATA", str(tmp_path / "data"))
    monkeypatch.setattr(download_module, "RETRY_WAIT_S", 0.0)
    monkeypatch.setattr(download_module, "TIMEOUT_S", 10.0)
    servers, published = [], download_module.ARCHIVES["cub"]

    def start(md5: str | None = None, bounds: dict | None = None, **options) -> Server:
        server = Server(**options)
        servers.append(server)
        archive = dataclasses.replace(published, url=server.url, size=len(server.data),
                                      md5=md5 or hashlib.md5(server.data).hexdigest(), **(bounds or {}))
        monkeypatch.setitem(download_module.ARCHIVES, "cub", archive)
        return server

    yield start
    for server in servers:
        server.stop()


def leftovers(tmp_path) -> list[str]:
    """What is in DEEPMETRIC_DATA besides a built ``cub`` folder."""
    data = tmp_path / "data"
    return sorted(p.name for p in data.iterdir() if p.name != "cub") if data.exists() else []


def test_cub_without_a_path_is_fetched_checked_unpacked_and_loaded(tmp_path, serve):
    server = serve()
    table = load_dataset("cub", check_counts=False)
    root = tmp_path / "data" / "cub"
    assert len(table.images) == 8 and sorted(set(table.labels.tolist())) == [1, 2, 101, 102]
    assert set(table.classes("train")) == {1, 2} and set(table.classes("test")) == {101, 102}
    assert all(p.startswith(str(root / "CUB_200_2011" / "images")) for p in table.images)
    assert table.class_names[101] == "101.White_Pelican"
    assert download_module.is_built(root, download_module.ARCHIVES["cub"])
    assert (root / "CUB_200_2011" / "train_test_split.txt").is_file() and (root / "attributes.txt").is_file()
    assert leftovers(tmp_path) == []  # no .part, no archive, no temporary folder
    assert server.ranges == [None]


def test_a_second_call_uses_the_built_folder_without_network(tmp_path, serve):
    server = serve()
    load_dataset("cub", check_counts=False)
    server.stop()
    table = load_dataset("cub", check_counts=False)  # the server is gone: a request would fail
    assert len(table.images) == 8 and server.ranges == [None]


def test_two_processes_fetching_at_once_download_once(tmp_path, serve):
    """Two trainings started together with ``--data cub`` both appended the download to one ``.part`` (whose MD5
    then failed, after 1.1 GB). Now the second waits for the first, saying so, and uses its build. The server holds
    its answer until the second fetch has announced that it waits (without the lock: until 10 s have passed, and
    then both requests are answered)."""
    with waits_announced() as waiting:
        server = serve(gate=waiting)
        roots, errors = twice_at_once(lambda: download_module.fetch("cub", progress=False), 30.0)
    assert errors == [] and waiting.is_set()
    assert roots == [tmp_path / "data" / "cub"] * 2 and server.ranges == [None]
    assert download_module.is_built(roots[0], download_module.ARCHIVES["cub"])
    assert leftovers(tmp_path) == []  # the lock file is gone with the archive and the .part


def test_a_checksum_mismatch_deletes_the_file_and_builds_nothing(tmp_path, serve):
    server = serve(md5="0" * 32)
    with pytest.raises(DataError, match=rf"^cub: {server.url} sent a file whose MD5 is "
                                        rf"{hashlib.md5(ARCHIVE).hexdigest()} .*not the published 0{{32}}; it was "
                                        "deleted"):
        load_dataset("cub", check_counts=False)
    assert leftovers(tmp_path) == [] and not (tmp_path / "data" / "cub").exists()


def test_a_cut_download_is_kept_and_resumed_with_a_range_request(tmp_path, serve, monkeypatch):
    monkeypatch.setattr(download_module, "ATTEMPTS", 1)
    server = serve(cut=1)
    with pytest.raises(DataError, match=rf"cut after .* bytes.*{len(ARCHIVE) // 2:,} bytes received are kept in "
                                        r".*CUB_200_2011\.tgz\.part and the download resumes when run again"):
        load_dataset("cub", check_counts=False)
    part = tmp_path / "data" / "CUB_200_2011.tgz.part"
    assert part.read_bytes() == ARCHIVE[: len(ARCHIVE) // 2]
    assert not (tmp_path / "data" / "cub").exists()
    table = load_dataset("cub", check_counts=False)
    assert len(table.images) == 8
    assert server.ranges == [None, f"bytes={len(ARCHIVE) // 2}-"]
    assert leftovers(tmp_path) == []


def test_a_cut_connection_is_resumed_within_the_same_call(tmp_path, serve):
    server = serve(cut=2)
    table = load_dataset("cub", check_counts=False)
    half = len(ARCHIVE) // 2
    assert len(table.images) == 8
    assert server.ranges == [None, f"bytes={half}-", f"bytes={half + (len(ARCHIVE) - half) // 2}-"]


def test_a_full_disk_is_one_error_naming_the_folder_and_the_bytes(tmp_path, serve, monkeypatch):
    serve()

    def full(handle, block):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(download_module, "_write_block", full)
    with pytest.raises(DataError) as caught:
        load_dataset("cub", check_counts=False)
    assert str(caught.value) == (f"cub: no space left in {tmp_path / 'data'}: the download of CUB_200_2011.tgz "
                                 f"needs {len(ARCHIVE):,} bytes more; free some space (or point DEEPMETRIC_DATA at "
                                 "a larger disk) and run again")
    assert not (tmp_path / "data" / "cub").exists()


def test_a_full_disk_while_unpacking_leaves_no_half_unpacked_folder(tmp_path, serve, monkeypatch):
    server = serve()
    calls, real_extract = [], download_module._extract

    def extract(tar, member, folder):
        calls.append(member.name)
        if len(calls) > 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        tar.extract(member, folder, filter="data")

    monkeypatch.setattr(download_module, "_extract", extract)
    with pytest.raises(DataError, match=rf"^cub: no space left in {tmp_path / 'data'}: unpacking CUB_200_2011.tgz "
                                        r"needs [0-9,]+ bytes more"):
        load_dataset("cub", check_counts=False)
    assert leftovers(tmp_path) == ["CUB_200_2011.tgz"]  # the checked archive is kept, no temporary folder
    assert not (tmp_path / "data" / "cub").exists()
    monkeypatch.setattr(download_module, "_extract", real_extract)  # space freed: unpacked with no second download
    assert len(load_dataset("cub", check_counts=False).images) == 8 and server.ranges == [None]


def test_a_users_own_folder_or_link_or_archive_is_refused_before_any_download_and_kept(tmp_path, serve):
    """Issue 53 item 11: a ``$DEEPMETRIC_DATA/cub`` without the project's marker (a user's own folder) was taken as a
    damaged build: the archive was downloaded and unpacked, then the folder deleted with ``rmtree``; with ``cub`` a
    symbolic link the whole archive was downloaded before an error. Each is refused with one message naming it,
    before any request, and left as it was; so is a ``CUB_200_2011.tgz`` beside it that is not the published one
    (it was deleted as "left by an earlier run")."""
    server = serve()
    data = tmp_path / "data"
    own = data / "cub"
    (own / "CUB_200_2011" / "images").mkdir(parents=True)
    (own / "CUB_200_2011" / "images.txt").write_text("1 a/b.jpg\n")
    (own / "my-notes.txt").write_text("mine")
    (own / "meta.json").write_text('{"author": "me"}')  # a meta.json, not ours
    with pytest.raises(DataError, match=rf"^cub: {own} exists but was not built by deepmetric .* never deletes "
                                        rf"what it did not create\. If it holds the data set, use it with --data "
                                        rf"cub:{own};"):
        load_dataset("cub", check_counts=False)
    assert (own / "my-notes.txt").read_text() == "mine" and server.ranges == [] and leftovers(tmp_path) == []

    elsewhere = tmp_path / "elsewhere"
    os.rename(own, elsewhere)
    for target in (elsewhere, tmp_path / "nowhere"):  # a link to a folder that is not a build, a dangling link
        own.symlink_to(target)
        with pytest.raises(DataError, match=rf"^cub: {own} is a symbolic link \(to {target}\) that does not lead to "
                                            "a complete CUB_200_2011 build; deepmetric never replaces"):
            load_dataset("cub", check_counts=False)
        assert own.is_symlink() and server.ranges == []
        own.unlink()
    assert (elsewhere / "my-notes.txt").read_text() == "mine"

    foreign = data / "CUB_200_2011.tgz"
    foreign.write_bytes(b"a user's own archive of another version")
    with pytest.raises(DataError, match=rf"^cub: {foreign} exists but is not the published CUB_200_2011.tgz .* "
                                        "leaves it alone"):
        load_dataset("cub", check_counts=False)
    assert foreign.read_bytes() == b"a user's own archive of another version" and server.ranges == []
    foreign.unlink()
    table = load_dataset("cub", check_counts=False)
    assert len(table.images) == 8 and server.ranges == [None]


def test_a_build_of_ours_that_is_damaged_or_of_another_archive_is_replaced(tmp_path, serve):
    """A folder with the project's marker was built by it: when its files were removed since, or it holds another
    archive's build, it is fetched anew and replaced (the only folder ever replaced)."""
    server = serve()
    load_dataset("cub", check_counts=False)
    root = tmp_path / "data" / "cub"
    (root / "CUB_200_2011" / "image_class_labels.txt").unlink()
    assert len(load_dataset("cub", check_counts=False).images) == 8 and server.ranges == [None, None]
    meta = json.loads((root / "meta.json").read_text())
    (root / "meta.json").write_text(json.dumps({**meta, "md5": "0" * 32}))
    assert len(load_dataset("cub", check_counts=False).images) == 8 and len(server.ranges) == 3
    assert download_module.is_built(root, download_module.ARCHIVES["cub"]) and leftovers(tmp_path) == []


def test_an_archive_without_the_layout_is_refused(tmp_path, serve):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        info = tarfile.TarInfo("CUB_200_2011/images.txt")
        tar.addfile(info, io.BytesIO(b""))
    serve(data=out.getvalue())
    with pytest.raises(DataError, match=r"does not hold CUB_200_2011/\{images.txt, image_class_labels.txt, "
                                        r"images/\}: image_class_labels.txt, images/ missing"):
        load_dataset("cub", check_counts=False)
    assert not (tmp_path / "data" / "cub").exists()
    assert [p.name for p in (tmp_path / "data").iterdir()] == ["CUB_200_2011.tgz"]


def test_an_http_error_names_the_url(tmp_path, serve):
    server = serve(status=404)
    with pytest.raises(DataError, match=rf"^cub: {server.url} answered HTTP 404 Not Found; download "
                                        r"CUB_200_2011.tgz from https://data.caltech.edu/records/65de6-vp158 "
                                        "yourself, unpack it and use --data cub:PATH$"):
        load_dataset("cub", check_counts=False)
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize(("spec", "page", "layout"), [
    ("cars", "https://ai.stanford.edu/~jkrause/cars/car_dataset.html", "cars_annos.mat and car_ims/"),
    ("cars-cropped", "https://ai.stanford.edu/~jkrause/cars/car_dataset.html", "cars_annos.mat and car_ims/"),
    ("sop", "https://cvgl.stanford.edu/projects/lifted_struct/", "Ebay_train.txt, Ebay_test.txt"),
    ("inshop", "https://mmlab.ie.cuhk.edu.hk/projects/DeepFashion/InShopRetrieval.html",
     "Eval/list_eval_partition.txt and Img/img/")])
def test_the_benchmarks_not_fetched_say_where_their_official_files_are(spec, page, layout):
    with pytest.raises(DataError) as caught:
        load_dataset(spec)
    message = str(caught.value)
    assert message.startswith(f"data set '{spec}' needs a path: {spec}:PATH. ")
    assert page in message and layout in message and f"--data {spec.removesuffix('-cropped')}:PATH" in message


def test_a_data_folder_that_cannot_be_written_is_one_error_naming_it(tmp_path, serve, monkeypatch):
    """``DEEPMETRIC_DATA`` pointing below a file (or a read-only place) ended in an ``OSError`` traceback from the
    lock or the folder's creation; now one error names the folder and the two ways out."""
    server = serve()
    (tmp_path / "a-file").write_text("x")
    monkeypatch.setenv("DEEPMETRIC_DATA", str(tmp_path / "a-file" / "data"))
    with pytest.raises(DataError, match=r"^cub: cannot write to .*a-file/data: .*; set DEEPMETRIC_DATA to a folder "
                                        r"you can write, or download it yourself and use --data cub:PATH$"):
        load_dataset("cub", check_counts=False)
    assert server.ranges == []  # nothing was requested


def test_what_a_server_sends_is_capped_at_the_published_size_and_the_unpack_at_the_tables_bound(serve, tmp_path):
    """Issue 53 item 24: a server streaming without a length wrote 31.5 MB for a 1.3 kB archive before the MD5 check;
    a ``Content-Length`` of 10**15 was reported as "no space left"; a 293 kB archive unpacked to 300 MB. The download
    stops at the published size (what came is deleted), an announced length beyond it is refused before anything is
    written, and the unpack stops at the Archive table's bound, before the member that crosses it is written."""
    cub = download_module.ARCHIVES["cub"]
    assert cub.size < cub.max_unpacked and cub.max_files >= 12_000  # the published archive fits its own bounds

    server = serve(length=None, tail=8 << 20)  # the archive, then 8 MB more, with no length announced
    with pytest.raises(DataError, match=rf"^cub: {server.url} sent more than the published {len(ARCHIVE):,} bytes "
                                        "of CUB_200_2011.tgz: it is not the published archive; what it sent was "
                                        "deleted"):
        load_dataset("cub", check_counts=False)
    assert leftovers(tmp_path) == [] and server.ranges == [None]

    serve(length=10**15)
    with pytest.raises(DataError, match=rf"announces {10**15:,} bytes, more than the published {len(ARCHIVE):,} of "
                                        "CUB_200_2011.tgz: it is not the published archive, and nothing of it was "
                                        "written"):
        load_dataset("cub", check_counts=False)
    assert leftovers(tmp_path) == []

    bomb = io.BytesIO()  # the replica's files, then one of 3 MB of zeros (a few kB compressed)
    with tarfile.open(fileobj=io.BytesIO(ARCHIVE)) as replica, tarfile.open(fileobj=bomb, mode="w:gz") as tar:
        for member in replica:
            tar.addfile(member, replica.extractfile(member) if member.isfile() else None)
        zeros = tarfile.TarInfo("CUB_200_2011/zeros.bin")
        zeros.size = 3 << 20
        tar.addfile(zeros, io.BytesIO(bytes(zeros.size)))
    serve(data=bomb.getvalue(), bounds={"max_unpacked": 1 << 20})
    with pytest.raises(DataError, match=r"unpacks to more than 1,048,576 bytes or 50,000 entries \(reached "
                                        r"[\d,]+ bytes in \d+ at 'CUB_200_2011/zeros.bin'\)"):
        load_dataset("cub", check_counts=False)
    assert not (tmp_path / "data" / "cub").exists() and not any((tmp_path / "data").glob(".cub.*.tmp"))
    (tmp_path / "data" / "CUB_200_2011.tgz").unlink()  # the checked archive is kept, as after any failed unpack
    serve(bounds={"max_files": 5})
    with pytest.raises(DataError, match=r"or 5 entries \(reached [\d,]+ bytes in 6 at"):
        load_dataset("cub", check_counts=False)
    (tmp_path / "data" / "CUB_200_2011.tgz").unlink()
    serve()  # the replica itself, within its bounds
    assert load_dataset("cub", check_counts=False).count("test") == 4
