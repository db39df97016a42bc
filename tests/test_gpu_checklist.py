"""``benchmarks/gpu_checklist.sh`` is only ever run on a lent GPU, minutes at a time: a mistyped flag there costs a
lease's call. Every command of every section is checked here on the CPU, without running it: each benchmark's
arguments go through that script's own parser, each ``deepmetric train`` through the CLI's parser and the config's
checks, each ``pytest -k`` expression must select tests of the files it names, every file a command names exists,
and a study's ``--only`` names its variants."""

from __future__ import annotations

import argparse
import ast
import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _pytest.mark.expression import Expression

ROOT = Path(__file__).resolve().parents[1]
CHECKLIST = ROOT / "benchmarks" / "gpu_checklist.sh"
SCRIPTS = [CHECKLIST, ROOT / "tools" / "gpu_pack.sh", ROOT / "tools" / "gpu_study.sh"]
SHELL_END = re.compile(r"\s(?:\d?>|\||&&|;)")  # where a command's own arguments end: a redirection, pipe or list


def sections() -> dict[str, str]:
    """Each ``case`` branch of the checklist, its continuation lines joined: name -> body."""
    text = CHECKLIST.read_text().replace("\\\n", " ")
    body = text.split("case $s in", 1)[1].split("esac", 1)[0]
    found = dict(re.findall(r"^  ([a-z][a-z-]*)\)(.*?)^    ;;", body, flags=re.M | re.S))
    assert found, "no sections found in gpu_checklist.sh"
    return found


def expand(line: str, loops: dict[str, list[str]]) -> list[str]:
    """The line once per value of the loop variables it uses, each ``${NAME:-default}`` as its default (what a call
    without that variable set runs) and any other variable (``$RES``, a scratch run folder) as a path."""
    line = re.sub(r"\$\{(\w+):-([^}]*)\}", r"\2", line)
    lines = [line]
    for name, values in loops.items():
        if re.search(rf"\${{?{name}\b", line):
            lines = [re.sub(rf"\${{?{name}(?:\}}|\b)", value, each) for each in lines for value in values]
    return [re.sub(r"\$\{?[A-Za-z_]\w*\}?", "/scratch", each) for each in lines]


def commands(body: str) -> list[str]:
    """The section's command lines, loops unrolled (``for NAME in VALUES; do``)."""
    loops: dict[str, list[str]] = {}
    for name, values in re.findall(r"for (\w+) in (.*?); do", body):
        values = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", values)
        loops[name] = shlex.split(values) or [""]
    out = []
    for line in body.splitlines():
        if line.strip() and not line.strip().startswith(("for ", "done", "#", "section ")):
            out.extend(expand(line, loops))
    return out


def arguments_after(line: str, marker: str) -> list[str]:
    """The words after ``marker`` up to the end of the command's own arguments."""
    rest = line.split(marker, 1)[1]
    end = SHELL_END.search(rest)
    return shlex.split(rest[:end.start()] if end else rest)


class Parsed(Exception):
    """Raised by the patched parser once a script's arguments parsed."""

    def __init__(self, namespace: argparse.Namespace):
        self.namespace = namespace


def parse_with_script(script: Path, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    """``script``'s own parser applied to ``argv``, its ``main`` stopped there (nothing is measured)."""
    for method in ("parse_args", "parse_intermixed_args"):
        original = getattr(argparse.ArgumentParser, method)

        def stop(self: argparse.ArgumentParser, *args: Any, _original: Any = original, **kwargs: Any) -> None:
            raise Parsed(_original(self, *args, **kwargs))

        monkeypatch.setattr(argparse.ArgumentParser, method, stop)
    monkeypatch.setattr(sys, "argv", [str(script), *argv])
    monkeypatch.syspath_prepend(str(script.parent))
    try:
        runpy.run_path(str(script), run_name="__main__")
    except Parsed as parsed:
        return parsed.namespace
    except SystemExit as exit_:
        raise AssertionError(f"{script.name} refused {argv}: exit {exit_.code}") from None
    raise AssertionError(f"{script.name} never parsed its arguments")


def test_the_scripts_are_valid_shell():
    for script in SCRIPTS:
        result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert result.returncode == 0, f"{script.name}: {result.stderr}"


def test_the_sections_named_in_its_usage_and_in_the_gpu_page_exist():
    names = set(sections())
    usage = CHECKLIST.read_text().split("sections:", 1)[1].split("(default", 1)[0]
    assert set(usage.replace("#", " ").split()) == names
    default = re.search(r"SECTIONS=\$\{\*:-([^}]*)\}", CHECKLIST.read_text())
    assert default and set(default.group(1).split()) <= names
    page = (ROOT / "docs" / "benchmarks" / "gpu.md").read_text().split("## 7.", 1)[1]
    rows = re.findall(r"^\|[^|]*\| `([a-z-]+)`(?:, `([a-z-]+)`)? \(", page, flags=re.M)
    assert len(rows) >= 5
    for row in rows:
        assert {name for name in row if name} <= names, row


@pytest.mark.parametrize("section", sorted(sections()))
def test_every_command_of_the_section_would_start(section, monkeypatch):
    checked = 0
    for line in commands(sections()[section]):
        for script in re.findall(r"benchmarks/(\w+)\.py", line):
            argv = arguments_after(line, f"benchmarks/{script}.py")
            parsed = parse_with_script(ROOT / "benchmarks" / f"{script}.py", argv, monkeypatch)
            for word in argv:
                if re.fullmatch(r"(configs|tests|benchmarks)/[\w./-]+", word):
                    assert (ROOT / word).is_file(), f"{section}: {word} does not exist"
            if script == "compile_curves":  # the variants it trains are the study's
                from deepmetric.studies import load_study

                load_study(parsed.study).runs(parsed.only.split(",") if parsed.only else ())
            checked += 1
        if "-m deepmetric train" in line:
            check_train_command(arguments_after(line, "-m deepmetric"))
            checked += 1
        if "-m pytest" in line:
            check_pytest_command(arguments_after(line, "-m pytest"), section)
            checked += 1
    if section != "setup":
        assert checked, f"section {section} runs nothing this test knows"


def check_train_command(argv: list[str]) -> None:
    from deepmetric.cli import build_parser
    from deepmetric.cli.train_command import _settings, _train_layers
    from deepmetric.config import build_config

    args, extra = build_parser().parse_known_args(argv)
    assert not [word for word in extra if word.startswith("-")], extra
    overrides = [*args.overrides, *extra]
    build_config({}, *_train_layers(args, {}, _settings(overrides)))


def function_names(path: Path) -> list[str]:
    """The test functions (``test_*``) of ``path``."""
    tree = ast.parse(path.read_text())
    return [node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name.startswith("test")]


def check_pytest_command(argv: list[str], section: str) -> None:
    files = [word for word in argv if word.startswith("tests/")]
    assert files and all((ROOT / f).is_file() for f in files), f"{section}: {files}"
    if "-k" in argv:
        expression = Expression.compile(argv[argv.index("-k") + 1])
        selected = [name for f in files for name in function_names(ROOT / f)
                    if expression.evaluate(lambda word, name=name, **_: word in name)]
        assert selected, f"{section}: -k {argv[argv.index('-k') + 1]!r} selects no test of {files}"
