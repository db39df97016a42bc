"""The documentation's examples run as written: README.md and every page of docs/ (the site's pages).

A fenced block tagged ``bash``, ``sh``, ``shell``, ``console`` or ``python`` is either run here or preceded (on the
line right before its fence) by a marker saying why not::

    <!-- not run: needs the CUB images -->
    <!-- run by tests/test_export.py: against deepmetric embed -->

and a block left untagged (or ``text``) must not hold a command. What runs, page by page, in document order:

- ``python``: executed in one namespace per page;
- ``bash``: a block of ``deepmetric`` commands runs in this process (``deepmetric.cli.main``, each must exit 0);
  any other block runs under ``bash -euo pipefail`` with this environment's ``bin/`` first on PATH;
- ``console``: each ``$ command`` runs under bash and its output must begin with the lines shown below it.

Pages run in a scratch folder where docs/getting-started.md's blocks have already run (its digits folder and its
tiny run ``runs/digits``, which the other pages use), each page in its own copy; ``DEEPMETRIC_DATA`` points into
the scratch folder.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
FIRST = DOCS / "getting-started.md"  # its blocks make what the other pages use
RUNNABLE = {"bash", "sh", "shell", "console", "python"}
MARKER = re.compile(r"<!--\s*(?:not run:\s*(?P<why>\S[^>]*?)|run by (?P<test>tests/\S+\.py)(?::[^>]*)?)\s*-->")
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>[^\n`]*)\n(?P<body>.*?)"
                   r"^(?P=indent)(?P=fence)[ \t]*$", flags=re.M | re.S)
# the first word of a command, in a block that does not say it is one
COMMAND_START = re.compile(r"^\s*(?:\$ |deepmetric |make |python3? |pip |\.venv/|nohup |torchrun |cd |tools/\S|"
                           r"benchmarks/\S|[A-Z_]+=\S+ )")
BIN = Path(sys.executable).parent


@dataclass
class Block:
    page: Path
    line: int
    language: str
    body: str
    marker: re.Match | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def doc_pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        language = match["info"].strip().split(" ")[0].lower()
        body = "\n".join(row[len(match["indent"]):] for row in match["body"].split("\n"))
        found.append(Block(page, line, language, body, MARKER.fullmatch(before)))
    return found


def runnable(page: Path) -> list[Block]:
    return [b for b in blocks(page) if b.language in RUNNABLE and b.marker is None]


def commands(body: str) -> list[str]:
    """The logical lines of a shell block: continuation lines joined, blank and comment-only lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", body)
    return [line for line in joined.split("\n") if line.strip() and not line.lstrip().startswith("#")]


def test_every_command_block_is_run_or_says_why_not():
    """Every ```bash/```console/```python block of README and docs/ either runs here or carries a marker with its
    reason (or the test that runs it, which must exist and read that page); untagged blocks hold no command."""
    problems, run, marked = [], 0, 0
    for page in doc_pages():
        for block in blocks(page):
            if block.language in RUNNABLE:
                if block.marker is None:
                    run += 1
                    continue
                marked += 1
                test = block.marker["test"]
                if test and not ((ROOT / test).exists() and str(page.relative_to(ROOT)) in (ROOT / test).read_text()):
                    problems.append(f"{block.where}: the marker names {test}, which does not read this page")
            elif block.language in ("", "text") and any(COMMAND_START.match(line) for line in block.body.split("\n")):
                problems.append(f"{block.where}: an untagged block holds a command; tag it (```bash) and run it, or "
                                f"mark why not")
            elif block.marker is not None:
                problems.append(f"{block.where}: a marker before a ```{block.language} block, which never runs")
    assert not problems, "\n".join(problems)
    assert run >= 30 and marked >= 30, (run, marked)  # the mechanism sees the pages' blocks


def test_markers_name_a_reason_and_stand_right_before_a_block():
    """A marker that is not on the line right before a fence would silently stop counting: none is left over."""
    stray = []
    for page in doc_pages():
        text = page.read_text(encoding="utf-8")
        for match in re.finditer(r"<!--\s*(not run|run by)[^\n]*", text):
            line = text.count("\n", 0, match.start()) + 1
            following = text[match.end():].split("\n", 2)
            fenced = len(following) >= 2 and following[1].lstrip().startswith("```")
            if not MARKER.fullmatch(match[0].strip()) or not fenced:
                stray.append(f"{page.relative_to(ROOT)}:{line}: {match[0].strip()}")
    assert not stray, "markers without a reason or not right before a fence:\n" + "\n".join(stray)


def _environment(folder: Path) -> dict[str, str]:
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
               DEEPMETRIC_DATA=str(folder / ".deepmetric-data"), NO_MKDOCS_2_WARNING="1")
    env.pop("COLUMNS", None)
    return env


def _run_shell(block: Block, script: str, folder: Path) -> str:
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=folder, env=_environment(folder),
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"{block.where}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def _check_excerpt(block: Block, command: str, out: str, expected: list[str]) -> None:
    """What a ```console block shows below ``$ command``: the output's first lines, up to its end or a blank line
    (the presets' table without its footer), never a paragraph cut short (`deepmetric --help` showed the first line
    of a usage that went on to list the commands)."""
    got = [line.rstrip() for line in out.split("\n")]
    shown = [line.rstrip() for line in expected]
    assert got[:len(shown)] == shown, (
        f"{block.where}: `{command}` printed\n{out}\nnot what the page shows:\n" + "\n".join(expected))
    assert len(got) == len(shown) or got[len(shown)] == "", (
        f"{block.where}: the page shows `{command}`'s output cut inside a paragraph, before:\n"
        + "\n".join(got[len(shown):len(shown) + 3]))


def _showing_discarded_values(source: str, where: str) -> ast.Module:
    """``source`` with each top-level expression statement passed to ``__discarded__(value, line)``: a value that a
    REPL would show and a script throws away silently (Getting started's last line computed the metrics it
    described, and printed nothing)."""
    tree = ast.parse(source, where)
    for i, node in enumerate(tree.body):
        if isinstance(node, ast.Expr):
            call = ast.Call(func=ast.Name("__discarded__", ast.Load()), args=[node.value, ast.Constant(node.lineno)],
                            keywords=[])
            tree.body[i] = ast.copy_location(ast.Expr(ast.copy_location(call, node.value)), node)
    return ast.fix_missing_locations(tree)


def _discarded(block: Block, value, line: int) -> None:
    assert value is None, (
        f"{block.where}: line {line} of the block computes a {type(value).__name__} and throws it away; run as a "
        f"script it shows nothing (a REPL would): print it, or assign it")


def _run_block(block: Block, folder: Path, namespace: dict, monkeypatch) -> str:
    """Run one block in ``folder``; returns what it printed."""
    from deepmetric.cli import main

    monkeypatch.chdir(folder)
    monkeypatch.setenv("DEEPMETRIC_DATA", str(folder / ".deepmetric-data"))
    printed = io.StringIO()
    if block.language == "python":
        namespace["__discarded__"] = functools.partial(_discarded, block)
        with contextlib.redirect_stdout(printed):
            exec(compile(_showing_discarded_values(block.body, block.where), block.where, "exec"), namespace)
        return printed.getvalue()
    if block.language == "console":
        for shown in re.split(r"^\$ ", block.body, flags=re.M)[1:]:
            command, *expected = shown.rstrip("\n").split("\n")
            out = _run_shell(block, command, folder)
            _check_excerpt(block, command, out, expected)
        return ""
    lines = commands(block.body)
    if all(line.startswith("deepmetric ") for line in lines):
        for line in lines:
            with contextlib.redirect_stdout(printed):
                code = main(shlex.split(line, comments=True)[1:])
            assert code == 0, f"{block.where}: `{line}` exited {code}\n{printed.getvalue()}"
        return printed.getvalue()
    return _run_shell(block, block.body, folder)


def test_a_python_block_may_not_compute_a_value_and_show_nothing(tmp_path, monkeypatch):
    """A ```python block runs as a script: an expression statement whose value is not None (shown by a REPL, lost in
    a script) fails its page, as Getting started's `retrieval_metrics(...)` on its last line did; a call that
    returns None (print, np.save) and a value assigned or printed pass."""
    page = DOCS / "probe.md"

    def run(body: str) -> str:
        return _run_block(Block(page, 1, "python", body, None), tmp_path, {"__name__": "__docs__"}, monkeypatch)

    assert run("values = {'recall@1': 1.0}\nprint(values)\n[].append(1)\n") == "{'recall@1': 1.0}\n"
    with pytest.raises(AssertionError, match=r"docs/probe.md:1: line 2 of the block computes a dict and throws it"):
        run("import math\n{'recall@1': math.pi}\n")


def test_the_help_excerpt_shows_every_command(tmp_path):
    """docs/cli.md opens with `deepmetric --help` as it prints: the usage and every command with its summary (the
    page showed the usage's first line alone, which names no command: an excerpt was checked as a prefix only)."""
    from deepmetric.cli.parser import build_parser

    page = DOCS / "cli.md"
    [block] = [b for b in runnable(page) if b.language == "console" and b.body.startswith("$ deepmetric --help\n")]
    command, *expected = block.body.removeprefix("$ ").rstrip("\n").split("\n")
    out = _run_shell(block, command, tmp_path)
    _check_excerpt(block, command, out, expected)
    parser = build_parser()
    [subparsers] = [action for action in parser._actions if action.choices and action.dest != "help"]
    shown = "\n".join(expected)
    for name in subparsers.choices:
        assert re.search(rf"^    {name}\b", shown, flags=re.M), f"{block.where}: --help's excerpt lacks {name}"


def test_the_pages_send_readers_to_nothing_a_clone_lacks():
    """README, docs/ and the site pointed to the papers in `../shared/papers/`, a folder beside the authors'
    checkout that a clone does not have: the papers are cited, with their arXiv pages, in docs/methods/index.md."""
    for page in [*doc_pages(), ROOT / "mkdocs.yml"]:
        text = page.read_text(encoding="utf-8")
        assert not re.search(r"shared/papers|\.\./shared/", text), f"{page.relative_to(ROOT)} names a shared/ folder"
    methods = (DOCS / "methods" / "index.md").read_text(encoding="utf-8")
    _, heading, papers = methods.partition("\n## The papers\n")
    assert heading, "docs/methods/index.md has no section 'The papers'"
    # ABE, DeML, DGML, DIABLO, HORDE
    for arxiv in ("1804.00382", "1907.11832", "2011.08877", "2004.14644", "1908.02735"):
        assert f"https://arxiv.org/abs/{arxiv}" in papers, arxiv
    for page in (README, DOCS / "index.md", DOCS / "reproduce" / "index.md"):
        assert "methods/index.md#the-papers" in page.read_text(encoding="utf-8"), page.name


CPU_TORCH = "pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu"


def test_the_install_says_how_to_leave_out_torchs_cuda_libraries():
    """PyPI's Linux torch wheels pull CUDA's libraries (5.9 GB) even on a machine without a GPU: README and Getting
    started say to install torch's CPU build first, in a block that then installs deepmetric (`pip install -e .`
    or a wheel), and how to do the same under `make install` (its torch pin kept: a local `+cpu` version meets
    it)."""
    for page in (README, FIRST):
        shown = [b for b in blocks(page) if CPU_TORCH in b.body]
        assert shown, f"{page.relative_to(ROOT)} does not say how to install torch's CPU build"
        lines = shown[0].body.splitlines()
        first = next(i for i, line in enumerate(lines) if CPU_TORCH in line)
        assert any(re.match(r"\s*pip install (-e \.|\S*deepmetric)", line) for line in lines[first + 1:]), lines
        make = [b for b in blocks(page) if "make install" in b.body and "whl/cpu" in b.body]
        assert make, f"{page.relative_to(ROOT)} does not say how to keep make install on torch's CPU build"
        body = make[0].body
        assert "torch==2.14.1 torchvision==0.29.1 --index-url https://download.pytorch.org/whl/cpu" in body, body
        assert body.index("whl/cpu") < body.index("make install"), body
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "TORCH := torch==2.14.1 torchvision==0.29.1\n" in makefile  # the pins the pages repeat


def _run_page(page: Path, folder: Path, monkeypatch) -> list[str]:
    namespace: dict = {"__name__": "__docs__"}
    return [_run_block(block, folder, namespace, monkeypatch) for block in runnable(page)]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A scratch folder where docs/getting-started.md ran, and what each of its blocks printed."""
    folder = tmp_path_factory.mktemp("docs-workspace")
    with pytest.MonkeyPatch.context() as monkeypatch:
        printed = _run_page(FIRST, folder, monkeypatch)
    return folder, printed


@pytest.mark.integration
def test_getting_started_runs_and_its_python_example_prints_the_metrics(workspace):
    """Getting started's blocks: the digits folder, the tiny run on it, and the Python example on the real offline
    backbone, which prints the metrics of ``evaluate`` and then those of ``retrieval_metrics`` (README's Python
    example until the documentation site; its last line computed them and printed nothing)."""
    folder, printed = workspace
    assert (folder / "runs/digits/checkpoints/last.safetensors").exists()
    assert (folder / "runs/digits/report.html").exists()
    assert sorted(p.name for p in (folder / "digits").iterdir()) == [str(d) for d in range(10)]
    python = [out for block, out in zip(runnable(FIRST), printed, strict=True) if block.language == "python"]
    shown = [line for line in python[-1].splitlines() if "'recall@1'" in line and "'map@r'" in line]
    assert len(shown) == 2, python[-1]


PAGES = [page for page in doc_pages() if page != FIRST and runnable(page)]


@pytest.mark.integration
@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_the_page_examples_run(page, workspace, tmp_path, monkeypatch):
    """Every block of the page that is not marked, in order, in a copy of the workspace."""
    folder = tmp_path / "work"
    shutil.copytree(workspace[0], folder, symlinks=True)
    _run_page(page, folder, monkeypatch)


def test_the_pages_that_run_cover_the_main_commands():
    """Each main command runs from some page (not only from a marked block)."""
    ran = "\n".join(b.body for page in doc_pages() for b in runnable(page) if b.language != "python")
    for command in ("train", "evaluate", "embed", "metrics", "index", "search", "study", "export", "report",
                    "explain", "presets"):
        assert re.search(rf"(^|\n|\$ )deepmetric {command}\b", ran), command
