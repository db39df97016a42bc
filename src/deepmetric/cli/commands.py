"""The commands of ``deepmetric <command>``: each builds the config or loads the run and calls the library
(``train`` has its own module, ``train_command``)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

import numpy as np

from ..config.layers import parse_settings
from ..errors import DeepMetricError
from ..io.strict import to_json

MAX_RANK = 1_000_000  # the largest K of Recall@K a command accepts


log = logging.getLogger(__name__)


def printable(text: str) -> str:
    """``text`` with control characters escaped (newlines kept): an error quoting user input must not drive the
    terminal (an ESC sequence in a head name reached it raw)."""
    return "".join(c if c == "\n" or c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def one_line(text: object) -> str:
    """``text`` as one field of one line: control characters escaped, line breaks too (an item named ``a\nb`` in an
    index made ``search`` print a line of its own, which read as one more hit)."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in str(text))


def say(text: object, flush: bool = False) -> None:
    """Print one result to standard output, control characters escaped (``printable``): every command's output
    goes through here, since results quote file names (``search`` printed an ESC sequence in one raw). ``flush``:
    a line of progress, shown at once even where standard output is a pipe."""
    print(printable(str(text)), flush=flush)


def check_paths(args: argparse.Namespace) -> None:
    """The paths a command reads, checked before it imports torch and the models (5-20 s on a loaded 2-core
    machine, then the message): the run or index folder, each ``--images`` / ``--image`` path, and the ``--data``
    spec of ``evaluate`` and ``explain`` (``train`` checks its own once its config is built)."""
    from ..data import check_data_path
    from ..folders import check_image_path, check_index_dir, check_run_dir

    if getattr(args, "run_dir", None) is not None:
        check_run_dir(args.run_dir)
    if getattr(args, "index_dir", None) is not None:
        check_index_dir(args.index_dir)
    for given in getattr(args, "images", None) or getattr(args, "image", None) or []:
        check_image_path(given)
    if args.command in ("evaluate", "explain") and isinstance(args.data, str):
        check_data_path(args.data)


def cmd_report(args: argparse.Namespace) -> int:
    from ..report import build_report

    say(f"wrote {build_report(args.run_dir, which=args.checkpoint, progress=not args.quiet, out=args.out)}")
    return 0


RERANK_FLAGS = {"k1": "--k1", "k2": "--k2", "lambda_value": "--lambda", "qe_n": "--qe-n", "dba_n": "--dba-n",
                "alpha": "--alpha"}


def rerank_from_args(args: argparse.Namespace) -> Any:
    """The ``--rerank`` settings (``evaluation/rerank.py``), or None; an option the method does not take is refused,
    naming the flag."""
    from ..evaluation.rerank import OPTIONS, rerank_settings

    given = [name for name in RERANK_FLAGS if getattr(args, name, None) is not None]
    if args.rerank is None:
        if given or args.rerank_max_items is not None:
            flag = RERANK_FLAGS[given[0]] if given else "--rerank-max-items"
            raise DeepMetricError(f"{flag} is an option of re-ranking: give --rerank too (one of "
                                  f"{', '.join(OPTIONS)})")
        return None
    foreign = [name for name in given if name not in OPTIONS[args.rerank]]
    if foreign:
        takes = " ".join(RERANK_FLAGS[name] for name in OPTIONS[args.rerank])
        raise DeepMetricError(f"--rerank {args.rerank} takes no {RERANK_FLAGS[foreign[0]]} (its options: {takes})")
    return rerank_settings(args.rerank, args.rerank_max_items, **{name: getattr(args, name) for name in given})


def cmd_evaluate(args: argparse.Namespace) -> int:
    from ..evaluation.table import format_table
    from ..workflows import evaluate_all_embeddings, evaluate_run, results_table

    rerank = rerank_from_args(args)
    if args.all_embeddings:
        if args.data:
            raise DeepMetricError("--all-embeddings evaluates the run's own data set; leave out --data")
        if rerank is not None:
            raise DeepMetricError("--rerank re-ranks the model's own embedding; leave out --all-embeddings")
        record = evaluate_all_embeddings(args.run_dir, which=args.checkpoint, pca_dim=args.pca_dim,
                                         progress=not args.quiet)
        say(to_json(record["embeddings"]) if args.json else format_table(record["embeddings"]))
        return 0
    record = evaluate_run(args.run_dir, data_spec=args.data, which=args.checkpoint, progress=not args.quiet,
                          rerank=rerank, amp=args.amp, compile=args.compile)
    say(to_json(record["metrics"]) if args.json else results_table(args.run_dir, record))
    return 0


def cmd_embed(args: argparse.Namespace) -> int:
    from ..workflows import embed_images

    out, paths, n = embed_images(args.run_dir, args.images, args.out, which=args.checkpoint,
                                 batch_size=args.batch_size, progress=not args.quiet, amp=args.amp,
                                 compile=args.compile)
    say(f"wrote {n} embeddings to {out} (image paths in {paths})")
    return 0


def cmd_presets(args: argparse.Namespace) -> int:
    from ..presets import format_presets, list_presets

    kind = "study" if args.studies else "config"
    presets = list_presets(args.pattern, kind)
    if args.json:
        say(to_json([{"name": p.name, "kind": p.kind, "path": str(p.path), "reproduces": p.reproduces}
                       for p in presets], indent=2))
    else:
        say(format_presets(presets, kind))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from ..export import export_run

    result = export_run(args.run_dir, args.out, format=args.format, which=args.checkpoint)
    say(f"exported {result.format} to {result.model} ({result.embedding_dim}-d embeddings of "
          f"{result.image_size} x {result.image_size} RGB images, any batch size; input size and normalisation in "
          f"{result.metadata}); its embeddings differ from PyTorch's by at most {result.max_error:.1e}")
    return 0


def cmd_index(args: argparse.Namespace) -> int:
    from ..retrieval import index_images

    result = index_images(args.run_dir, args.images, args.out, kind="ivf-pq" if args.ivf_pq else "flat",
                          add=args.add, nlist=args.nlist, pq_m=args.pq_m, which=args.checkpoint,
                          batch_size=args.batch_size, progress=not args.quiet, amp=args.amp,
                          compile=args.compile)
    skipped = f" ({result.skipped} already indexed, skipped)" if result.skipped else ""
    if result.repeated:
        skipped += f" ({result.repeated} given more than once, indexed once)"
    say(f"{'added' if args.add else 'indexed'} {result.added} images{skipped}; {result.index_dir} now holds "
          f"{result.count} images ({result.kind} index)")
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    from ..data.listing import list_images_of
    from ..retrieval import Searcher

    rerank = rerank_from_args(args)
    queries = list_images_of(args.image)
    searcher = Searcher(args.index_dir, args.device, amp=args.amp, compile=args.compile)
    if args.k > searcher.count:  # a note on stderr (not with --json or --quiet): the results are all there are
        log.info("the index holds %d items: printing all of them (--k %d)", searcher.count, args.k)
    found = searcher.search_files(queries, args.k, not args.quiet, rerank)
    for number, (query, hits) in enumerate(zip(queries, found, strict=True)):
        if args.json:  # one object a line (JSON Lines): one line for one query
            say(to_json({"query": str(query), "results": [h.to_dict() for h in hits]}))
            continue
        if len(queries) > 1:
            say(("\n" if number else "") + f"query {one_line(query)}")
        names = [one_line(h.name) for h in hits]
        width = max(map(len, names))
        say(f"{'rank':>4}  {'score':>7}  {'id':>7}  name")
        for rank, (hit, name) in enumerate(zip(hits, names, strict=True), 1):
            say(f"{rank:>4}  {hit.score:>7.4f}  {hit.id:>7}  {name:<{width}}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from ..retrieval.service import ServiceLimits, serve
    except ImportError as missing:
        raise DeepMetricError(f"serving needs fastapi, uvicorn and python-multipart ({missing.name} is missing): "
                              "pip install 'deepmetric[serve]'") from None
    limits = ServiceLimits(max_body_bytes=int(args.max_body_mb * 2**20), max_pixels=int(args.max_megapixels * 1e6),
                           workers=args.workers, queue=args.queue, timeout_s=args.timeout, max_k=args.max_k)
    allowed = [name for names in args.allowed_hosts for name in names.split(",") if name.strip()]
    serve(args.index_dir, args.host, args.port, limits, allowed, device=args.device, amp=args.amp,
          compile=args.compile)
    return 0


def cmd_study(args: argparse.Namespace) -> int:
    modes = [flag for flag, given in (("--verify", args.verify), ("--dry-run", args.dry_run),
                                      ("--tables", args.tables), ("--tuning-only", args.tuning_only)) if given]
    if len(modes) > 1:
        raise DeepMetricError(f"study: {' and '.join(modes)} do different things; give one of them")
    if args.dry_run:  # reading the study checks each run's config against the models' code: torch loads first
        log.info("study %s: loading the models' code, then each run is checked in turn", args.file)
    from ..studies import load_study, run_study

    spec = load_study(args.file, settings=parse_settings(args.overrides))
    if args.out:
        spec.out = Path(args.out)
    only = [name.strip() for name in (args.only or "").split(",") if name.strip()]
    if args.only is not None and not only:
        raise DeepMetricError(f"--only names no variant ({args.only!r}); give one or more, e.g. --only "
                              + ",".join(list(spec.variants)[:2]))
    if args.verify:
        return _verify_study(spec)
    if args.dry_run:
        from ..studies.dry_run import dry_run, format_header, format_row, format_summary

        say(format_header(spec, spec.runs(only)), flush=True)  # then each run as it is checked (33 runs: 35 s silent)
        rows = dry_run(spec, only, on_row=lambda row: say(format_row(row), flush=True))
        say(format_summary(spec, rows))
        failing = [f"{row.run} / {row.repeat}" for row in rows if not row.ok]
        if failing:
            raise DeepMetricError(f"study {spec.name}: {len(failing)} of {len(rows)} runs would fail: "
                                  + ", ".join(failing))
        return 0
    if args.tuning_only and spec.tune is None:
        raise DeepMetricError(f"study {spec.name} has no tune: section; --tuning-only goes with a study that tunes")
    if args.tables:
        from ..studies import write_tables_now

        paths = write_tables_now(spec)
    else:
        paths = run_study(spec, progress=not args.quiet, only=only, retrain_changed=args.retrain_changed,
                          tuning_only=args.tuning_only)
    say(paths["md"].read_text())
    if args.tuning_only:
        say(f"tuning: {paths['csv']}, {paths['md']}")
        return 0
    say(f"results: {paths['csv']}, {paths['md']}, {paths['png']}")
    if "embeddings_md" in paths:
        say(f"every embedding: {paths['embeddings_csv']}, {paths['embeddings_md']}")
    return 0


def _verify_study(spec: Any) -> int:
    """``study FILE --verify``: the summary and notes on stdout, one ``error:`` line per problem on stderr; 1 when
    there is any."""
    import sys

    from ..studies.verify import verify

    found = verify(spec)
    say(found.summary(spec))
    for note in found.notes:
        say(f"note: {note}")
    for problem in found.problems:  # on stderr, escaped, as main's one error line
        sys.stderr.write(f"error: {printable(problem)}\n")
    return 1 if found.problems else 0


def cmd_explain(args: argparse.Namespace) -> int:
    from ..viz import explain_dataset, explain_images

    if not args.images and not args.data:
        raise DeepMetricError("explain needs --images PATH (overlays per image) and/or --data [SPEC] (top images "
                              "per group over a data set split)")
    if args.images:
        written = explain_images(args.run_dir, args.images, args.out, which=args.checkpoint,
                                 batch_size=args.batch_size, progress=not args.quiet)
        say(f"wrote {len(written)} attention overlays to {args.out}")
    if args.data:
        spec = None if args.data is True else args.data
        path = explain_dataset(args.run_dir, args.out, data_spec=spec, split=args.split, top=args.top,
                               which=args.checkpoint, batch_size=args.batch_size, progress=not args.quiet)
        say(f"wrote the top {args.top} {args.split} images per group to {path}")
    return 0


def _load_array(path: str, what: str) -> np.ndarray:
    file = Path(path)
    if not file.is_file():
        raise DeepMetricError(f"{what} file {file} does not exist")
    magic = np.lib.format.MAGIC_PREFIX
    with file.open("rb") as handle:
        if handle.read(len(magic)) != magic:  # np.load calls any other file "pickled (object) data"
            raise DeepMetricError(f"{what} file {file} is not a .npy file (numpy.save writes one; text, CSV and "
                                  ".npz files are not read)")
        handle.seek(0)
        try:
            return np.load(handle, allow_pickle=False)
        except ValueError as error:
            raise DeepMetricError(f"{what} file {file} is not a plain .npy array (pickled arrays are refused): "
                                  f"{error}") from None


def _parse_ranks(text: str) -> list[int]:
    try:
        ranks = [int(k) for k in text.split(",") if k.strip()]
    except ValueError:
        raise DeepMetricError(f"--recall-at must be comma-separated integers, got '{text}'") from None
    if not ranks or min(ranks) < 1 or max(ranks) > MAX_RANK:
        raise DeepMetricError(f"--recall-at must hold ranks from 1 to {MAX_RANK:,}, got '{text}'")
    return ranks


def cmd_metrics(args: argparse.Namespace) -> int:
    from ..evaluation import retrieval_metrics
    from ..evaluation.table import format_table

    rerank = rerank_from_args(args)
    query = _load_array(args.embeddings, "embeddings")
    labels = _load_array(args.labels, "labels")
    gallery = gallery_labels = None
    if args.gallery:
        gallery = _load_array(args.gallery[0], "gallery embeddings")
        gallery_labels = _load_array(args.gallery[1], "gallery labels")
    metrics = retrieval_metrics(query, labels, gallery, gallery_labels, recall_at=_parse_ranks(args.recall_at),
                                nmi=not args.no_nmi, engine=args.engine, progress=not args.quiet, rerank=rerank)
    say(to_json(metrics) if args.json else format_table({"embeddings": metrics}))
    return 0
