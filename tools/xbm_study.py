"""The cross-batch memory on emoji and icons (docs/studies/xbm.md; issue 55, item 1).

For each data set, the demo's run (``configs/demo-emoji.yaml``: Lite0 + GAP + binomial deviance, 64 px, P x K = 16 x 4,
validation every 50 steps; icons: ``data.spec=icons data.val_fraction=0.2``, its 290 training names' 20% for
validation as in ``configs/studies/icons-tuned.yaml``), shortened to 200 steps for a 2-core CPU shared with other work
(one thread: ``train.threads=1``), without a memory and with memories of two sizes (about a seventh and a half or more
of the training images), warm-up 50 steps, weight 1, the same seed. Every run trains with
``--no-test``: the memory size is chosen on validation only (the best validation checkpoint of each run, ranked as
``train.select_by`` ranks checkpoints: Recall@1, then MAP@R, then R-precision); then the test split is evaluated once,
for the chosen size and for the run without a memory.

    .venv/bin/python tools/xbm_study.py [--out runs/xbm] [--record docs/studies/xbm.json] [--data emoji,icons]

Run it again after a stop: finished runs are kept, an interrupted one resumes from its ``last`` checkpoint. Prints a
Markdown table and writes the record (every command, every run's validation figures, the two test evaluations).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "configs/demo-emoji.yaml"
STEPS, WARMUP = 200, 50
DATA = {
    "emoji": {"overrides": [], "sizes": [512, 2048]},  # of 3,675 training drawings
    "icons": {"overrides": ["data.spec=icons", "data.val_fraction=0.2"], "sizes": [256, 1024]},  # of ~1,370
}


def command(data: str, size: int, out: Path) -> list[str]:
    """The ``deepmetric train`` command of one run."""
    memory = [f"loss.memory.size={size}", f"loss.memory.warmup_steps={WARMUP}"] if size else []
    return ["deepmetric", "train", "--config", CONFIG, "--out", str(out), "--no-test", "--quiet",
            "eval.baseline=false", f"train.steps={STEPS}", "train.threads=1", *DATA[data]["overrides"], *memory]


def last_state(out: Path) -> dict | None:
    from deepmetric.runs.checkpoint import load_checkpoint

    path = out / "checkpoints" / "last.safetensors"
    return load_checkpoint(path)[1] if path.is_file() else None


def train(data: str, size: int, out: Path) -> dict:
    """Train (or resume, or keep) one run; its command, seconds of this session and best validation figures."""
    args = command(data, size, out)
    state = last_state(out)
    seconds = None
    if state is None or state["step"] < STEPS:
        run_args = args + (["--resume"] if state is not None else [])
        run_args = [a for a in run_args if a not in ("--config", CONFIG)] if state is not None else run_args
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "deepmetric", *run_args[1:]], cwd=ROOT, check=True)
        seconds = round(time.perf_counter() - started, 1)
        state = last_state(out)
    best = state["best"]
    return {"command": shlex.join(args), "session_seconds": seconds, "best_step": best["step"],
            "val": best["metrics"], "key": best["key"]}


def evaluate(out: Path) -> dict:
    """``deepmetric evaluate RUN``: the test split, once, with the run's best validation checkpoint."""
    from deepmetric.workflows import evaluate_run

    return evaluate_run(out, progress=False)["metrics"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/xbm")
    parser.add_argument("--record", default="docs/studies/xbm.json")
    parser.add_argument("--data", default="emoji,icons")
    args = parser.parse_args()
    record_path = ROOT / args.record
    record = json.loads(record_path.read_text()) if record_path.is_file() else {}
    for data in args.data.split(","):
        runs = {}
        for size in [0, *DATA[data]["sizes"]]:
            out = Path(args.out) / data / (f"memory-{size}" if size else "none")
            runs[size] = train(data, size, out)
            runs[size]["out"] = str(out)
        chosen = max(DATA[data]["sizes"], key=lambda s: runs[s]["key"])  # on validation only
        tests = {}
        for size in (0, chosen):
            out = Path(runs[size]["out"])
            done = out / "metrics.json"
            tests[size] = json.loads(done.read_text())["metrics"] if done.is_file() else evaluate(out)
        record[data] = {"warmup_steps": WARMUP, "steps": STEPS, "runs": {str(k): v for k, v in runs.items()},
                        "chosen_size": chosen, "test": {str(k): v for k, v in tests.items()}}
        record_path.write_text(json.dumps(record, indent=2) + "\n")
        print(f"\n{data}: memory size chosen on validation: {chosen}\n")
        print("| memory | best val step | val R@1 | val MAP@R | test R@1 | test MAP@R |\n|---|---|---|---|---|---|")
        for size, run in runs.items():
            test = tests.get(size)
            shown = f"{100 * test['recall@1']:.2f} | {100 * test['map@r']:.2f}" if test else "— | —"
            print(f"| {size or 'none'} | {run['best_step']} | {100 * run['val']['recall@1']:.2f} | "
                  f"{100 * run['val']['map@r']:.2f} | {shown} |")


if __name__ == "__main__":
    main()
