"""The argument parser of ``deepmetric <command>``: every command, its options and their checks."""

from __future__ import annotations

import argparse
from typing import Any

from .. import __version__
from ..evaluation.engines import KNN_ENGINES
from ..evaluation.rerank import MAX_ITEMS, MAX_SEARCH_ITEMS, QE_N, RERANK_METHODS
from ..runs.folder import CHECKPOINTS
from . import commands, train_command


def _number(kind: type, low: float, high: float | None = None, low_open: bool = False) -> Any:
    """An argparse type: ``kind`` (int or float) within [low, high] (low excluded with ``low_open``), finite."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}"
                                             ) from None
        if value != value or value in (float("inf"), float("-inf")) or (value <= low if low_open else value < low) \
                or (high is not None and value > high):
            bound = f"> {low:g}" if low_open else f">= {low:g}"
            raise argparse.ArgumentTypeError(f"must be {bound}{f' and <= {high:g}' if high is not None else ''}, "
                                             f"got {text!r}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


POSITIVE_INT, COUNT, POSITIVE = _number(int, 1), _number(int, 0), _number(float, 0, low_open=True)


def _add_rerank_options(p: argparse.ArgumentParser) -> None:
    """The re-ranking options ``evaluate``, ``metrics`` and ``search`` share (``evaluation/rerank.py``)."""
    g = p.add_argument_group("re-ranking", "re-rank each query's neighbours: k-reciprocal encoding (Zhong et al. "
                             "2017), or α-weighted query expansion (qe) and database-side augmentation (dba) "
                             "(Radenović et al. 2018); docs/metrics.md, 'Re-ranking'")
    g.add_argument("--rerank", choices=RERANK_METHODS, help="the re-ranking (default: none)")
    g.add_argument("--k1", type=POSITIVE_INT, help="k-reciprocal: neighbours of the k-reciprocal sets (default 20)")
    g.add_argument("--k2", type=POSITIVE_INT, help="k-reciprocal: neighbours of the local query expansion (default 6)")
    g.add_argument("--lambda", dest="lambda_value", type=_number(float, 0, 1), metavar="LAMBDA",
                   help="k-reciprocal: weight of the original distance in the final one (default 0.3)")
    g.add_argument("--qe-n", type=POSITIVE_INT, help=f"qe: neighbours a query is expanded with (default {QE_N})")
    g.add_argument("--dba-n", type=POSITIVE_INT,
                   help=f"dba: neighbours a gallery item is augmented with (default {QE_N})")
    g.add_argument("--alpha", type=_number(float, 0), help="qe, dba: weights are similarity^alpha (default 3)")
    g.add_argument("--rerank-max-items", type=_number(int, 2), metavar="N",
                   help=f"refuse k-reciprocal and dba beyond N items (default {MAX_ITEMS:,}; in a search "
                   f"{MAX_SEARCH_ITEMS:,}): their time grows as the square of the items")

def _add_run_options(p: argparse.ArgumentParser, batch_size: bool = True) -> None:
    """The options every command that loads a run's model shares: checkpoint, batch size, progress."""
    p.add_argument("--checkpoint", default="auto", choices=CHECKPOINTS)
    if batch_size:
        p.add_argument("--batch-size", type=POSITIVE_INT)
    p.add_argument("--quiet", action="store_true")


def _add_inference_options(p: argparse.ArgumentParser, device: bool = False) -> None:
    """How a command that embeds images runs the model: autocast and torch.compile (``eval.amp``, ``eval.compile``),
    and for the commands that load an index's model, the device."""
    p.add_argument("--amp", choices=["bf16", "fp16"],
                   help="embed under bfloat16 or float16 autocast (eval.amp; default: the run's, float32 unless it "
                   "set one); embeddings stay float32. For GPUs: on a CPU without bfloat16 arithmetic it is several "
                   "times slower")
    p.add_argument("--compile", action="store_true", default=None,
                   help="compile the model with torch.compile before embedding (eval.compile): the first batch "
                   "compiles (a minute or more on a CPU), then faster for a large gallery; eager again, after one "
                   "warning, where the model cannot be compiled")
    if device:
        p.add_argument("--device", default="cpu",
                       help="where the model embeds the queries: cpu (default), cuda, cuda:1, or auto (a GPU when "
                       "torch sees one)")


def _allow_positional_after_list(p: argparse.ArgumentParser, positional: str, listed: str) -> None:
    """Let ``p``'s one positional (declared ``nargs="?"``) also come after its list option, as it could before that
    option took several values: ``index --images photos/ RUN`` gave argparse's "required: run_dir", since ``+`` took
    RUN as an image. ``take_trailing_positional`` moves the list's last value to the positional when it is missing;
    the usage line shows it required, as it is. Call once ``p``'s arguments are all added."""
    p.set_defaults(positional_after_list=(positional, listed, p))
    p.usage = p.format_usage().removeprefix("usage: ").rstrip().replace(f"[{positional}]", positional)


def take_trailing_positional(args: argparse.Namespace) -> None:
    """The positional of a command set up by ``_allow_positional_after_list``: given, or the list's last value when
    the list holds two or more; otherwise argparse's own error (exit status 2)."""
    setting = getattr(args, "positional_after_list", None)
    if setting is None:
        return
    positional, listed, command = setting
    if getattr(args, positional) is not None:
        return
    values = getattr(args, listed) or []  # explain's --images is optional
    if len(values) < 2:
        command.error(f"the following arguments are required: {positional}")
    setattr(args, positional, values.pop())


# The plug-ins' names as --help lists them, written out so that --help imports no torch; tests/test_cli.py checks that
# they name every registered data set, backbone, head, loss, regulariser and generator.
DATA_HELP = ("glyphs", "fashion-mnist", "digits", "emoji", "emoji-skin", "emoji:PATH", "icons", "icons:PATH",
             "folder:PATH", "csv:PATH", "cub:PATH", "cars:PATH", "sop:PATH", "inshop:PATH", "cub-cropped:PATH",
             "cars-cropped:PATH")
BACKBONE_HELP = ("lite0", "googlenet", "inception-v1", "bn-inception", "resnet50", "timm:<name>", "tiny (tests)")
HEAD_HELP = ("gap", "diablo", "abe", "mheads", "dgml", "n-grouping", "m-grouping", "g-grouping", "c-grouping", "deml",
             "bilinear", "jcf")
LOSS_HELP = ("binomial", "contrastive", "contrastive-euclidean", "triplet", "multi-similarity", "margin",
             "pml:<Class> (pytorch-metric-learning's, e.g. pml:ProxyAnchorLoss)")
REGULARIZER_HELP = ("horde", "divergence", "diversity", "deml-adversary", "deml-hinge", "activation-decay",
                    "learner-row-norm")
GENERATOR_HELP = ("mirage",)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="deepmetric", description="Zero-shot image retrieval by deep metric "
                                     "learning: train, evaluate, embed, explain.")
    parser.add_argument("--version", action="version", version=f"deepmetric {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a model; evaluates it on the test split at the end",
                       description="Train a model. Settings come from the defaults, then --config, then the "
                       "flags, then key=value overrides (e.g. train.lr=1e-4 data.image_size=64).")
    p.add_argument("--data", help="data set spec: " + ", ".join(DATA_HELP))
    p.add_argument("--backbone", help="lite0 (default), " + ", ".join(BACKBONE_HELP[1:]))
    p.add_argument("--head", help="gap (default), " + ", ".join(HEAD_HELP[1:]))
    p.add_argument("--loss", help="binomial (default), " + ", ".join(n for n in LOSS_HELP if n != "binomial"))
    p.add_argument("--steps", type=COUNT, help="number of training steps")
    p.add_argument("--regularizer", action="append", metavar="NAME",
                   help="add a regulariser with its default options (repeatable): " + ", ".join(REGULARIZER_HELP)
                   + "; options and weight come from loss.regularizers.NAME.* overrides or the config")
    p.add_argument("--generator", help="add synthetic examples to every batch: " + ", ".join(GENERATOR_HELP)
                   + " (thesis ch. 6); options come from generator.options.* overrides or the config")
    p.add_argument("--out", help="run directory (default runs/<time>-<data>-<backbone>-<head>)")
    p.add_argument("--config", help="YAML file of settings, or the name of a preset that ships with deepmetric "
                   "(e.g. demo-glyphs, abe/cub-abe8: deepmetric presets lists them); a file that exists wins")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument("--skip-bad-images", action="store_true",
                   help="leave corrupt/missing images out (listed in RUN/bad_images.txt) instead of stopping")
    p.add_argument("--trust-pickle", action="store_true",
                   help="allow model.weights to be a legacy pickled torch file (.pt/.pth) you trust")
    p.add_argument("--no-test", action="store_true", help="skip the test evaluation at the end")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--nproc", type=POSITIVE_INT, default=1,
                   help="train with N local processes on torch.distributed (gloo on CPU, NCCL on GPU)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. train.lr=1e-4")
    p.set_defaults(func=train_command.cmd_train)

    p = sub.add_parser("evaluate", help="evaluate a run on its test split; writes RUN_DIR/metrics.json")
    p.add_argument("run_dir")
    p.add_argument("--data", help="evaluate on another data set spec instead of the run's")
    p.add_argument("--checkpoint", default="auto", choices=CHECKPOINTS,
                   help="auto: best if the run had a validation split, else last")
    p.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    p.add_argument("--all-embeddings", action="store_true",
                   help="also evaluate the embeddings the objective computes (HORDE: one per order) and their "
                   "concatenation reduced by a PCA fitted on the training split, and those the head computes "
                   "(DeML: each scale alone; ABE, M-heads: each learner alone, then their mean and std); writes "
                   "RUN_DIR/metrics-all-embeddings.json")
    p.add_argument("--pca-dim", type=POSITIVE_INT, default=512, help="dimension kept by that PCA (default 512)")
    p.add_argument("--quiet", action="store_true")
    _add_rerank_options(p)
    _add_inference_options(p)
    p.set_defaults(func=commands.cmd_evaluate)

    p = sub.add_parser("embed", help="embed images with a trained run; writes an (N, D) .npy")
    p.add_argument("run_dir", nargs="?")
    p.add_argument("--images", required=True, nargs="+", action="extend", metavar="IMAGES",
                   help="an image file, a folder of images, or a .txt file listing image paths (as index takes); or "
                   "several, one row each in the order given")
    p.add_argument("--out", required=True,
                   help="the .npy file to write (the image paths go beside it: feat.npy, feat.paths.txt)")
    _add_run_options(p)
    _add_inference_options(p)
    p.set_defaults(func=commands.cmd_embed)
    _allow_positional_after_list(p, "run_dir", "images")

    p = sub.add_parser("presets", help="list the presets that ship with deepmetric and the paper table each "
                       "reproduces", description="List the run configs that ship inside the package (use one with "
                       "deepmetric train --config NAME, from any directory) with the published table each reproduces, "
                       "or with --studies the study files (deepmetric study NAME).")
    p.add_argument("pattern", nargs="?", help="keep names matching this shell-style pattern or holding this text "
                   "(e.g. 'abe/*', cub)")
    p.add_argument("--studies", action="store_true", help="list the study files instead of the run configs")
    p.add_argument("--json", action="store_true", help="print a JSON list of {name, kind, path, reproduces}")
    p.set_defaults(func=commands.cmd_presets)

    p = sub.add_parser("export", help="export a run's embedder to ONNX (or TorchScript) for deployment",
                       description="Write the run's embedder (eval mode, the checkpoint evaluate uses) as an ONNX "
                       "graph with a free batch dimension: RGB images in [0, 1] of the run's data.image_size -> "
                       "embeddings, the normalisation inside. OUT.json beside it (model.onnx.json) gives the input "
                       "size, the normalisation and the whole preprocessing deepmetric embed applies first (any image "
                       "mode to RGB with transparency on white, the resize, pad and crop, / 255), as README's "
                       "onnxruntime snippet repeats it. The file is checked against PyTorch "
                       "(onnxruntime, 1e-4) before it is written; a head ONNX cannot express is refused with the "
                       "reason (try --format torchscript). An OUT inside RUN/checkpoints or over another file of the "
                       "run is refused. Needs pip install 'deepmetric[onnx]'.")
    p.add_argument("run_dir")
    p.add_argument("--out", required=True, help="the model file, e.g. model.onnx (its JSON goes to "
                   "model.onnx.json); never one of the run's own files")
    p.add_argument("--format", default="onnx", choices=["onnx", "torchscript"],
                   help="onnx (default; onnxruntime and every ONNX runtime) or torchscript (torch.jit.load)")
    p.add_argument("--checkpoint", default="auto", choices=CHECKPOINTS,
                   help="auto: best if the run had a validation split, else last")
    p.set_defaults(func=commands.cmd_export)

    p = sub.add_parser("index", help="embed a gallery with a trained run into a faiss index (or --add to one)",
                       description="Embed every image of a gallery (a folder, one image, or a .txt list of paths) "
                       "and write INDEX_DIR: index.json (ids, paths, model), embeddings (safetensors) and a faiss "
                       "index, atomically. Exact inner-product search by default; --ivf-pq for large galleries.")
    p.add_argument("run_dir", nargs="?")
    p.add_argument("--images", required=True, nargs="+", action="extend", metavar="IMAGES",
                   help="a folder of images, an image, or a .txt file listing image paths; or several (an image "
                   "given twice is indexed once; names are paths below the folder that holds them all)")
    p.add_argument("--out", required=True, help="index folder to create (or to extend with --add)")
    p.add_argument("--add", action="store_true", help="append the images to the existing index in --out (same model)")
    p.add_argument("--ivf-pq", action="store_true", help="approximate IVF-PQ index (at least 1,000 images)")
    p.add_argument("--nlist", type=POSITIVE_INT, help="IVF-PQ cells (default about 4 sqrt(N), at most N / 39)")
    p.add_argument("--pq-m", type=POSITIVE_INT,
                   help="IVF-PQ codes per vector; must divide the dimension (default D / 8)")
    _add_run_options(p)
    _add_inference_options(p)
    p.set_defaults(func=commands.cmd_index)
    _allow_positional_after_list(p, "run_dir", "images")

    p = sub.add_parser("search", help="print the gallery images of an index nearest to a query image")
    p.add_argument("index_dir", nargs="?")
    p.add_argument("--image", required=True, nargs="+", action="extend", metavar="IMAGE",
                   help="the query image; or several, a folder (every image below it) or a .txt list of images, "
                   "each query's results under a 'query PATH' line")
    p.add_argument("--k", "-k", type=POSITIVE_INT, default=10,
                   help="number of results (default 10; every item when the index holds fewer, with a note on stderr)")
    p.add_argument("--json", action="store_true", help="print one JSON object a query (one a line): query, "
                   "results [{id, name, score}]")
    p.add_argument("--quiet", action="store_true", help="no progress bar while several queries are embedded")
    _add_rerank_options(p)
    _add_inference_options(p, device=True)
    p.set_defaults(func=commands.cmd_search)
    _allow_positional_after_list(p, "index_dir", "image")

    p = sub.add_parser("serve", help="serve an index over HTTP: search page, POST /search, GET /images/{id}",
                       description="Serve INDEX_DIR with FastAPI + uvicorn: GET / (search page), GET /health, "
                       "POST /search (multipart field 'image', optional k), GET /images/{id} (thumbnails). "
                       "Errors are JSON {\"error\": ...}; bad input gets a 4xx. Only requests for the bound name "
                       "(Host: header) are answered, others 421: a site whose name resolves to this machine (DNS "
                       "rebinding) cannot read the service from a browser.")
    p.add_argument("index_dir")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--allowed-hosts", action="append", default=[], metavar="NAMES",
                   help="more Host: names to answer, comma-separated (e.g. search.example.org behind a proxy; '*' "
                   "for any). Always answered: the --host value; localhost, 127.0.0.1 and [::1] when it is a "
                   "loopback address; also this machine's names and any IP address when it is 0.0.0.0 or ::")
    p.add_argument("--port", type=_number(int, 0, 65535), default=8000)
    p.add_argument("--max-body-mb", type=POSITIVE, default=10.0, help="largest request body in MiB (default 10)")
    p.add_argument("--max-megapixels", type=POSITIVE, default=40.0,
                   help="largest query image in megapixels, checked before decoding (default 40)")
    p.add_argument("--workers", type=POSITIVE_INT, default=2, help="searches running at once (default 2)")
    p.add_argument("--queue", type=COUNT, default=16, help="requests waiting beyond those before 503 (default 16)")
    p.add_argument("--timeout", type=POSITIVE, default=30.0, help="seconds before a request is answered 503 (30)")
    p.add_argument("--max-k", type=POSITIVE_INT, default=100, help="largest k a client may ask for (default 100)")
    _add_inference_options(p, device=True)
    p.set_defaults(func=commands.cmd_serve)

    p = sub.add_parser("study", help="run a grid of runs (resumable) and aggregate their test metrics",
                       description="Run every unfinished run of a study file (or of a packaged study by name: "
                       "deepmetric presets --studies) and write results.csv, results.md (mean ± std) and results.png.")
    p.add_argument("file", help="study YAML, or a packaged study's name (e.g. demo); a file that exists wins")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="config overrides for every run, e.g. data.spec=cub:/data/CUB_200_2011")
    p.add_argument("--out", help="override the study's output folder")
    p.add_argument("--dry-run", action="store_true",
                   help="list every run with its state (finished, recorded, training now, stopped at step N, "
                   "trained, to train) and build its config, model, objective and optimiser groups without "
                   "reading images or writing anything, printing each run as it is checked; exit 2 naming the "
                   "runs that would fail")
    p.add_argument("--only", metavar="VARIANT[,VARIANT...]",
                   help="train only these variants now (every seed or split of each; with --dry-run, list only "
                   "them); the results still hold every finished run of the study")
    p.add_argument("--retrain-changed", action="store_true",
                   help="train again the finished runs whose saved config differs from what the study file now "
                   "gives (without it the study stops and names them); their old folders are kept as "
                   "<repeat>.replaced-<time>")
    p.add_argument("--tuning-only", action="store_true",
                   help="with a study that tunes (tune:), run its trials and stop before the seeds (several "
                   "processes may share the trials); without it the seeds follow once each variant's tuning ends")
    p.add_argument("--verify", action="store_true",
                   help="train nothing: check the study's record (its MANIFEST.sha256 hashes, each run's files, each "
                   "run's per-query results against its metrics.json) and recompute every figure of the tables kept "
                   "in it; exit 1 with one line per problem")
    p.add_argument("--tables", action="store_true",
                   help="train nothing: write results.csv, results.md and results.png in the study's out folder "
                   "from the runs finished so far (recorded ones included), while other processes train the rest; "
                   "each row's runs column says how many repeats it holds (the record's tables are left to the "
                   "study's processes)")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=commands.cmd_study)
    p = sub.add_parser("report", help="write RUN_DIR/report.html: curves, Recall@K, retrieval grid, attention, "
                       "embedding map, config",
                       description="Write one self-contained HTML page about a run (figures embedded as PNG): "
                       "training curves, test metrics and the Recall@K curve, random test queries with their top 8, "
                       "attention overlays (heads with attention), a t-SNE map of test embeddings, the config. "
                       "deepmetric train writes it after the test evaluation (eval.report=false turns that off).")
    p.add_argument("run_dir")
    p.add_argument("--out", help="the HTML file to write (default RUN_DIR/report.html); the page is self-contained")
    _add_run_options(p, batch_size=False)
    p.set_defaults(func=commands.cmd_report)

    p = sub.add_parser("explain", help="overlay each group's attention map on images (heads with attention)",
                       description="Draw what a run's head attends to: per image, every group's attention map "
                       "upsampled and overlaid (--images), and per group the images of a data set split with the "
                       "highest attention peak (--data). Works for every head that returns attention maps.")
    p.add_argument("run_dir", nargs="?")
    p.add_argument("--images", nargs="+", action="extend", metavar="IMAGES",
                   help="an image file, a folder of images or a .txt file listing image paths, or several: writes "
                   "OUT/<image>.png each (for several, named by the path below the folder holding them all; an "
                   "image given twice is drawn once)")
    p.add_argument("--data", nargs="?", const=True, metavar="SPEC",
                   help="a data set spec, or nothing for the run's own: writes OUT/top<K>-<split>.png")
    p.add_argument("--split", default="test", choices=["train", "val", "test"], help="split of --data (test)")
    p.add_argument("--top", type=POSITIVE_INT, default=12, help="images per group for --data (12, as DGML's figures)")
    p.add_argument("--out", required=True, help="output folder")
    _add_run_options(p)
    p.set_defaults(func=commands.cmd_explain)
    _allow_positional_after_list(p, "run_dir", "images")

    p = sub.add_parser("metrics", help="Recall@K, MAP@R, R-precision and NMI of precomputed embeddings")
    p.add_argument("embeddings", help="(N, D) .npy of query embeddings")
    p.add_argument("labels", help="(N,) .npy of integer labels")
    p.add_argument("--gallery", nargs=2, metavar=("EMB.npy", "LABELS.npy"),
                   help="rank queries against this gallery instead of against each other")
    p.add_argument("--recall-at", default="1,2,4,8", help="ranks K of Recall@K (default 1,2,4,8)")
    p.add_argument("--no-nmi", action="store_true", help="skip NMI (k-means)")
    p.add_argument("--engine", default="auto", choices=KNN_ENGINES,
                   help="kNN engine (auto: cuda where torch sees a GPU, else numpy's BLAS products on non-Intel CPUs, "
                        "where torch's MKL is slow, torch otherwise); all exact, equal up to float rounding")
    p.add_argument("--json", action="store_true", help="print one JSON object: recall@K, map@r, r_precision, nmi")
    p.add_argument("--quiet", action="store_true", help="no progress bar on a large ranking, no k-means line")
    _add_rerank_options(p)
    p.set_defaults(func=commands.cmd_metrics)
    return parser
