"""Training on several machines (docs/cli.md, "Training on several machines"): two torchrun "machines" of one process
each on this one, joined by torchrun's c10d rendezvous, each in its own folder with its own data home, as machines
that share no file system; and the guards that stop every rank when one fails (``distributed.on_main``, ``agreed``,
``same_on_every_rank``), under 2 gloo processes."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

import deepmetric
from deepmetric.config import save_config
from deepmetric.distributed import free_port
from deepmetric.io.tensors import unprefixed
from deepmetric.runs.checkpoint import load_checkpoint
from deepmetric.runs.folder import RunDir
from deepmetric.training import train
from helpers import tiny_config

SRC = Path(deepmetric.__file__).resolve().parents[1]
PAGE = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
MARKER = "<!-- run by tests/test_multinode.py"
TIMEOUT = 300  # seconds: only so that a hung rendezvous cannot hang the suite; a pair takes well under a minute


def _config(steps: int):
    return tiny_config(train={"steps": steps, "threads": 1}, loss={"name": "margin"},
                       model={"head": "abe", "head_options": {"num_learners": 2}})


def documented_commands() -> list[list[str]]:
    """The torchrun commands of docs/cli.md's example on 127.0.0.1 (the block after its ``run by`` marker), in
    order: machine 0 and machine 1 training, then both resuming."""
    text = PAGE.read_text(encoding="utf-8")
    block = text[text.index(MARKER):].split("```bash\n", 1)[1].split("```", 1)[0]
    lines = re.sub(r"\\\n\s*", " ", block).splitlines()
    return [shlex.split(line) for line in lines if line.startswith("torchrun ")]


def _machines(root: Path, commands: list[list[str]]) -> list[tuple[int, str, str]]:
    """Run the two machines' commands at once, each in its own folder ``root/machine-N`` with its own
    ``DEEPMETRIC_DATA``, on a free port; return each one's (exit status, stdout, stderr)."""
    endpoint = f"127.0.0.1:{free_port()}"
    started = []
    for machine, command in enumerate(commands):
        folder = root / f"machine-{machine}"
        env = {**os.environ, "DEEPMETRIC_DATA": str(folder / "data"),
               "PYTHONPATH": os.pathsep.join([str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])])}
        argv = [sys.executable, "-m", "torch.distributed.run",
                *(endpoint if arg == "127.0.0.1:29400" else arg for arg in command[1:])]
        started.append(subprocess.Popen(argv, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True))
    finished = []
    try:
        for process in started:
            out, err = process.communicate(timeout=TIMEOUT)
            finished.append((process.returncode, out, err))
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.communicate()
    return finished


def _swapped(commands: list[list[str]]) -> list[list[str]]:
    """The pair with their ``--local-addr`` values swapped: machine 1 becomes rank 0."""
    addresses = [command[command.index("--local-addr") + 1] for command in commands]
    return [[addresses[1 - i] if j and command[j - 1] == "--local-addr" else arg for j, arg in enumerate(command)]
            for i, command in enumerate(commands)]


def _model(path: Path) -> dict[str, torch.Tensor]:
    tensors, _ = load_checkpoint(path)
    return unprefixed("model", tensors)


def _same_weights(a: Path, b: Path) -> bool:
    x, y = _model(a), _model(b)
    return x.keys() == y.keys() and all(torch.allclose(x[k], y[k], atol=1e-6) for k in x)


def _losses(run: Path) -> list[float]:
    return [r["loss"] for r in RunDir(run).read_log() if "loss" in r]


def test_the_documented_commands_name_two_machines_then_both_resume():
    commands = documented_commands()
    assert len(commands) == 4
    assert [c[c.index("--local-addr") + 1] for c in commands] == ["127.0.0.1", "127.0.0.2"] * 2
    assert all("c10d" in c and "127.0.0.1:29400" in c for c in commands)
    assert "--resume" not in commands[0] + commands[1] and all("--resume" in c for c in commands[2:])
    assert _swapped(commands[2:])[0][commands[2].index("--local-addr") + 1] == "127.0.0.2"


def test_two_machines_train_and_resume_as_one_process_with_the_run_on_rank_0_alone(tmp_path):
    """docs/cli.md's example: two machines of one process each, through torchrun's c10d rendezvous on 127.0.0.1,
    each in its own folder with its own data home: rank 0's machine holds the run (checkpoint, log, test metrics),
    the other writes nothing, and the weights are those of one process on the same global batch. Then both resume:
    the other machine has no run folder, so it resumes from what rank 0 read and sent. Last, a launch where the
    machine without the run becomes rank 0 stops both machines at once with one message naming the missing folder
    and the host, instead of leaving one waiting."""
    commands = documented_commands()
    one = tmp_path / "one"
    train(_config(3), one, progress=False)
    for machine in ("machine-0", "machine-1"):  # the config file is copied to each machine
        (tmp_path / machine).mkdir()
        save_config(_config(3), tmp_path / machine / "tiny.yaml")

    first = _machines(tmp_path, commands[:2])
    assert [status for status, _, _ in first] == [0, 0], [err[-3000:] for _, _, err in first]
    run, elsewhere = tmp_path / "machine-0" / "run", tmp_path / "machine-1" / "run"
    assert not elsewhere.exists()  # rank 1 wrote nothing, not even an empty folder
    assert [s.get("processes") for s in RunDir(run).sessions()] == [2]
    assert _same_weights(one / "checkpoints/last.safetensors", RunDir(run).last)
    assert _losses(run) == pytest.approx(_losses(one), abs=1e-6)  # the objective saw the same global batch

    train(_config(6), one, resume=True, progress=False)
    resumed = _machines(tmp_path, commands[2:])
    assert [status for status, _, _ in resumed] == [0, 0], [err[-3000:] for _, _, err in resumed]
    assert not elsewhere.exists()
    assert "trained 3 steps (steps 4-6, resumed)" in resumed[0][1] and "R@1" in resumed[0][1]  # rank 0 evaluated
    assert resumed[1][1] == ""  # the other machine says nothing on standard output
    assert (run / "metrics.json").is_file()
    _, state = load_checkpoint(RunDir(run).last)
    assert state["step"] == 6 and [r["step"] for r in RunDir(run).read_log() if "loss" in r] == [1, 2, 3, 4, 5, 6]
    assert _same_weights(one / "checkpoints/last.safetensors", RunDir(run).last)
    assert _losses(run) == pytest.approx(_losses(one), abs=1e-6)

    swapped = _machines(tmp_path, _swapped(commands[2:]))
    assert all(status != 0 for status, _, _ in swapped), [err[-3000:] for _, _, err in swapped]
    lost, holder = swapped[1][2], swapped[0][2]  # machine-1 was rank 0: it has no run folder
    assert "error: no such run directory: run on rank 0 (host " in lost
    assert "run rank 0 on the machine that holds it" in lost
    assert "error: rank 0 of 2 (host " in holder and "failed: no such run directory: run on rank 0" in holder
    assert load_checkpoint(RunDir(run).last)[1]["step"] == 6 and not elsewhere.exists()


def _rank(rank: int, world: int, port: int, root: str) -> None:
    """One rank of the guards' test: each guard fails on one rank; what each rank saw goes to ``root/rank-N.json``."""
    from deepmetric.distributed import agreed, context_from_env, on_main, same_on_every_rank, shutdown
    from deepmetric.errors import DeepMetricError

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK="0")  # as on two machines of one process each: each is process 0 of its machine
    torch.set_num_threads(1)
    context = context_from_env()
    seen: dict[str, object] = {"context": [context.rank, context.local_rank]}  # a GPU is cuda:LOCAL_RANK

    def attempt(name: str, work) -> None:
        try:
            seen[name] = {"result": work()}
        except DeepMetricError as error:
            seen[name] = {"error": type(error).__name__, "message": str(error)}

    def fail_on(which: int, message: str) -> dict:
        if rank == which:
            raise DeepMetricError(message)
        return {"rank": rank, "pi": 3.25, "list": [1, "two"]}

    attempt("on_main", lambda: on_main(context, lambda: fail_on(1, "unreached")))
    attempt("on_main_fails", lambda: on_main(context, lambda: fail_on(0, "the run folder is not here")))
    attempt("agreed", lambda: agreed(context, lambda: fail_on(-1, "unreached")))
    attempt("agreed_fails", lambda: agreed(context, lambda: fail_on(1, "no such data folder")))
    attempt("same", lambda: same_on_every_rank(context, "a", f"rank {rank}'s table", "the data set"))
    attempt("differs", lambda: same_on_every_rank(context, "ab"[rank], f"table {rank}", "the data set"))
    # train() itself: a data folder missing on one machine, then another split of the data on one machine
    folder = Path(root) / f"rank-{rank}"
    data = {"spec": "folder:" + str(Path(root) / "nowhere")} if rank == 1 else {}
    attempt("missing_data", lambda: train(tiny_config(train={"steps": 1}, data=data), folder / "a", progress=False))
    attempt("other_data", lambda: train(tiny_config(train={"steps": 1}, data={"val_fraction": 0.4 * rank}),
                                        folder / "b", progress=False))
    seen["folders"] = sorted(p.name for p in folder.iterdir()) if folder.exists() else []
    (Path(root) / f"rank-{rank}.json").write_text(json.dumps(seen))
    shutdown()


def test_a_step_that_fails_on_one_rank_stops_every_rank_with_its_message(tmp_path):
    """2 gloo processes: ``on_main`` hands rank 0's result (JSON) or its error to every rank; ``agreed`` fails on
    every rank when it fails on one, naming that rank and its host; ``same_on_every_rank`` refuses on every rank what
    differs; ``train`` uses them, so a data folder missing on one machine, or another split of the data on one,
    stops both ranks before anything is written, instead of leaving one waiting in a collective."""
    mp.spawn(_rank, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    zero, one = (json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1))
    assert zero["context"] == [0, 0] and one["context"] == [1, 0]  # rank 1 would train on its machine's GPU 0
    expected = {"rank": 0, "pi": 3.25, "list": [1, "two"]}
    assert zero["on_main"] == one["on_main"] == {"result": expected}  # rank 1 got rank 0's result, not its own
    assert zero["on_main_fails"] == {"error": "DeepMetricError", "message": "the run folder is not here"}
    assert one["on_main_fails"]["error"] == "RankFailed"
    assert one["on_main_fails"]["message"].startswith("rank 0 of 2 (host ")
    assert one["on_main_fails"]["message"].endswith(") failed: the run folder is not here")
    assert zero["agreed"] == {"result": expected} and one["agreed"] == {"result": {**expected, "rank": 1}}
    assert one["agreed_fails"] == {"error": "DeepMetricError", "message": "no such data folder"}
    assert zero["agreed_fails"]["error"] == "RankFailed"
    assert zero["agreed_fails"]["message"].endswith(") failed: no such data folder")
    assert zero["same"] == one["same"] == {"result": None}
    for seen in (zero, one):
        assert seen["differs"]["error"] == "DeepMetricError"
        assert "the data set differs between the ranks: rank 0 (host " in seen["differs"]["message"]
        assert "table 0; rank 1 (host " in seen["differs"]["message"]
    assert one["missing_data"]["error"] == "MissingDataPath" and "nowhere" in one["missing_data"]["message"]
    assert zero["missing_data"]["error"] == "RankFailed" and "nowhere" in zero["missing_data"]["message"]
    for seen in (zero, one):
        assert seen["other_data"]["error"] == "DeepMetricError"
        assert "the data set differs between the ranks" in seen["other_data"]["message"]
        assert "val " in seen["other_data"]["message"]  # rank 1's table has a validation split
    assert zero["folders"] == one["folders"] == []  # nothing was written, on either rank


@pytest.mark.parametrize("outcome", ["trains", "fails"])
def test_under_torchrun_train_leaves_the_process_group_before_it_exits(monkeypatch, outcome):
    """A torchrun worker that exited with its process group still up was now and then aborted by the exit's
    destructors ("terminate called without an active exception", SIGABRT), and torchrun failed both machines (the
    two-machine test above, about one pair in eight on 2 busy cores). ``deepmetric train`` now leaves the group on
    every rank, whether it trained or failed."""
    import argparse

    import deepmetric.distributed as distributed
    from deepmetric.cli import train_command
    from deepmetric.errors import DeepMetricError

    left = []

    def train(args, settings, context):
        if outcome == "fails":
            raise DeepMetricError("a bad setting")
        return 0

    monkeypatch.setattr(train_command, "_torchrun_context", lambda: "a rank of a process group")
    monkeypatch.setattr(train_command, "_train", train)
    monkeypatch.setattr(distributed, "shutdown", lambda: left.append(True))
    args = argparse.Namespace(overrides=[])
    if outcome == "fails":
        with pytest.raises(DeepMetricError, match="a bad setting"):
            train_command.cmd_train(args)
    else:
        assert train_command.cmd_train(args) == 0
    assert left == [True]
    monkeypatch.setattr(train_command, "_torchrun_context", lambda: None)  # no torchrun: no group to leave
    if outcome == "trains":
        train_command.cmd_train(args)
        assert left == [True]
