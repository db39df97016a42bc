"""Every preset in ``configs/`` and every run of every study builds and trains one step.

Each preset's config resolves; its model (random weights, 64-px images), objective, optimiser groups and, where
it has one, example generator build; and one training step runs on a tiny random batch. A new preset is checked
by adding its file. Study runs that resolve to a model, objective and optimiser already stepped are not
stepped again.

Each preset also says which published table it reproduces, in its first lines, one line per table:

    # Reproduces: PAPER (citation) Table N, row "ROW AS PRINTED IN docs/reproduce/<paper>.md"[, columns, remarks]
    # Reproduces: no published table (why)

PAPER is the first word of the title of the docs/reproduce/ page that gives the table's figures (DIABLO, ABE, DGML,
DeML, HORDE, MIRAGE: one page each); that page must name Table N and print the row. Every ``deepmetric train
--config configs/...`` and ``deepmetric study configs/...`` command in README.md, docs/ and the presets' comments
names a file that exists.
"""

from __future__ import annotations

import glob
import itertools
import json
import re
from pathlib import Path

import pytest
import torch

from deepmetric.config import RunConfig, build_config, load_yaml
from deepmetric.data import DATASETS
from deepmetric.generators import build_generator
from deepmetric.losses import build_objective
from deepmetric.studies import load_study
from deepmetric.training.optim import build_optimizer
from deepmetric.training.setup import build_model

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"
PRESETS = sorted(p for p in CONFIGS.rglob("*.yaml") if CONFIGS / "studies" not in p.parents)
STUDIES = sorted((CONFIGS / "studies").glob("*.yaml"))
# Random weights, small images and batches: what is checked is that the pieces fit, not what they learn.
SMALL = {"model": {"pretrained": False, "weights": None},
         "data": {"image_size": 64, "classes_per_batch": 3, "samples_per_class": 2}}
NUM_CLASSES = 5
_stepped: set[str] = set()


def _signature(config: RunConfig) -> str:
    """What decides the model, objective and optimiser groups (not the data, the schedule or the seed)."""
    plain = config.to_dict()
    return json.dumps({k: plain[k] for k in ("model", "loss", "generator")} | {"groups": plain["train"]["groups"]},
                      sort_keys=True)


def step_once(config: RunConfig) -> None:
    """Build the run's pieces as ``deepmetric train`` does and take one step on random images."""
    signature = _signature(config)
    if signature in _stepped:
        return
    torch.manual_seed(0)
    model = build_model(config)
    d = config.data
    generator = None
    if config.generator.name is not None:
        generator = build_generator(config.generator.name, config.generator.options, head=model.head,
                                    num_classes=NUM_CLASSES, batch_size=d.classes_per_batch * d.samples_per_class,
                                    lr=config.train.lr, seed=config.train.seed)
    extra = generator.extra_classes if generator is not None else 0
    objective = build_objective(config.loss, model.head, num_classes=NUM_CLASSES + extra)
    optimizer = build_optimizer(model, objective, config.train)
    labels = torch.arange(d.classes_per_batch).repeat_interleave(d.samples_per_class)
    model.train()
    output = model(torch.rand(len(labels), 3, d.image_size, d.image_size))
    generated = generator.generate(output, labels) if generator is not None else None
    loss, _ = objective(output, labels, generated.rows() if generated is not None else None)
    assert torch.isfinite(loss), f"loss {loss}"
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if generator is not None:
        generator.step(output, labels)
    _stepped.add(signature)


def test_the_presets_are_found():
    assert len(PRESETS) > 90 and len(STUDIES) > 10


@pytest.mark.parametrize("preset", PRESETS, ids=[str(p.relative_to(CONFIGS)) for p in PRESETS])
def test_every_preset_builds_and_steps(preset: Path):
    step_once(build_config(load_yaml(preset), SMALL))


@pytest.mark.parametrize("preset", PRESETS, ids=[str(p.relative_to(CONFIGS)) for p in PRESETS])
def test_a_preset_named_for_a_data_set_reads_that_data_set(preset: Path):
    """``cars-cropped-abe8.yaml`` must name ``cars-cropped:``: run without ``--data`` it trains on what it says."""
    named = [n for n in DATASETS if preset.stem.startswith(f"{n}-")]
    if named:
        loader = build_config(load_yaml(preset)).data.spec.partition(":")[0]
        assert loader == max(named, key=len), f"{preset.name} reads {loader}"


@pytest.mark.parametrize("study", STUDIES, ids=[p.name for p in STUDIES])
def test_every_study_run_builds_and_steps(study: Path):
    runs = load_study(study).runs()
    assert runs
    for run in runs:
        try:
            step_once(build_config(*run.layers, SMALL))
        except Exception as error:
            raise AssertionError(f"{study.name}, run {run.name}: {error}") from error


# --- Which table each preset reproduces, and the commands the documentation gives ---------------------------------

REPRODUCE = ROOT / "docs" / "reproduce"  # index.md (the common setting), then one page per paper
REPRODUCES = "# Reproduces: "
ENTRY = re.compile(r'(?P<paper>DIABLO|ABE|DGML|DeML|HORDE|MIRAGE) \([^()]+\) Table (?P<table>\d+(?:\.\d+)?)'
                   r'(?:, row "(?P<row>[^"]+)")?(?:, .+)?')
NO_TABLE = re.compile(r"no published table \(.+\)")
TABLES = re.compile(r"\bTables? (\d+(?:\.\d+)?)((?:\s*(?:[–-]|and)\s*\d+(?:\.\d+)?)*)")
COMMAND = re.compile(r"deepmetric\s+(?:train\s+--config|study)\s+(configs/[^\s`'\"),;]+)")


def reproduces(preset: Path) -> list[str]:
    """The preset's ``# Reproduces:`` lines, which must be the first lines of the file."""
    lines = preset.read_text(encoding="utf-8").splitlines()
    entries = [line.removeprefix(REPRODUCES) for line in itertools.takewhile(lambda x: x.startswith(REPRODUCES), lines)]
    assert not any("Reproduces:" in line for line in lines[len(entries):]), "a Reproduces line below the first lines"
    return entries


def paper_sections(folder: Path) -> dict[str, str]:
    """The pages of a folder (its index.md aside) by the first word of their title (``# `` heading, the first line),
    each whole."""
    sections: dict[str, str] = {}
    for page in sorted(folder.glob("*.md")):
        if page.name == "index.md":
            continue
        text = page.read_text(encoding="utf-8")
        assert text.startswith("# "), f"{page.relative_to(ROOT)} does not start with its title"
        paper = text.removeprefix("# ").split(maxsplit=1)[0]
        assert paper not in sections, f"two pages of {folder.relative_to(ROOT)} are headed '{paper}'"
        sections[paper] = text
    return sections


def test_every_paper_has_its_reproduce_page():
    """docs/reproduce/ has the common setting (index.md) and one page per paper."""
    assert (REPRODUCE / "index.md").exists()
    assert set(paper_sections(REPRODUCE)) == {"DIABLO", "ABE", "DGML", "DeML", "HORDE", "MIRAGE"}


def tables_named(text: str) -> set[str]:
    """Table numbers a text names: "Table 4", "Tables 3 and 4", "Tables 1–3" (1, 2, 3), "Tables 6.1–6.6"."""
    named: set[str] = set()
    for first, rest in TABLES.findall(text):
        named.add(first)
        previous = first
        for separator, number in re.findall(r"\s*([–-]|and)\s*(\d+(?:\.\d+)?)", rest):
            if separator != "and" and previous.count(".") == number.count("."):
                head, _, low = previous.rpartition(".")
                same_head, _, high = number.rpartition(".")
                if same_head == head:
                    named.update(f"{head}.{k}" if head else str(k) for k in range(int(low), int(high) + 1))
            named.add(number)
            previous = number
    return named


def test_tables_named_reads_single_tables_lists_and_ranges():
    assert tables_named("Table 4 and Tables 1–3; Tables 5.1–5.2, Tables 3 and 4.") == {"1", "2", "3", "4", "5.1", "5.2"}
    assert tables_named("Table 5. Tables 6.1-6.3") == {"5", "6.1", "6.2", "6.3"}


@pytest.mark.parametrize("preset", PRESETS, ids=[str(p.relative_to(CONFIGS)) for p in PRESETS])
def test_a_preset_names_the_table_it_reproduces(preset: Path):
    """Its first lines say which table (and row) it reproduces, or that it reproduces none; that paper's page of
    docs/reproduce/ names the table and prints the row."""
    entries = reproduces(preset)
    assert entries, f"{preset.name} does not start with a '{REPRODUCES.strip()}' line"
    if any(NO_TABLE.fullmatch(entry) for entry in entries):
        assert len(entries) == 1, "'no published table' cannot stand beside a table"
        return
    sections = paper_sections(REPRODUCE)
    for entry in entries:
        match = ENTRY.fullmatch(entry)
        assert match, f"'{entry}' is neither 'PAPER (citation) Table N, row \"ROW\"...' nor 'no published table (why)'"
        paper, table, row = match["paper"], match["table"], match["row"]
        assert paper in sections, f"docs/reproduce/ has no page headed '# {paper}'"
        section = sections[paper]
        assert table in tables_named(section), f"docs/reproduce/'s {paper} page does not name Table {table}"
        assert row is None or row in section, f"docs/reproduce/'s {paper} page does not print row '{row}'"


def test_every_command_in_the_docs_names_a_file_that_exists():
    """``deepmetric train --config configs/X.yaml`` and ``deepmetric study configs/studies/X.yaml`` in README.md,
    every page of docs/ and the presets' and studies' comments; ``<placeholder>`` matches any name, ``{a,b}``
    expands."""
    sources = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *PRESETS, *STUDIES]
    commands = [(source, path) for source in sources for path in COMMAND.findall(source.read_text(encoding="utf-8"))]
    assert len(commands) > 100
    missing = []
    for source, path in commands:
        alternatives = re.findall(r"\{([^{}]*)\}", path)
        template = re.sub(r"\{[^{}]*\}", "{}", re.sub(r"<[^<>]*>", "*", path))
        for choice in itertools.product(*(a.split(",") for a in alternatives)):
            name = template.format(*choice)
            if not glob.glob(str(ROOT / name)):
                missing.append(f"{source.relative_to(ROOT)}: {name}")
    assert not missing, "commands name files that do not exist:\n" + "\n".join(missing)
