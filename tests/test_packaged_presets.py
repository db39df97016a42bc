"""The presets ship inside the package and are found by name from any directory (``deepmetric.presets``).

``--config``, ``deepmetric study`` and ``extends:`` take a path (which wins when it exists) or a preset's name;
``deepmetric presets`` lists them with the table each reproduces. The last test builds the wheel, installs it into a
fresh virtual environment outside the checkout and runs ``deepmetric presets``, ``--version`` and a two-step
``train --config demo-glyphs`` there.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import deepmetric
from deepmetric.cli import main
from deepmetric.config import build_config, load_yaml
from deepmetric.errors import ConfigError
from deepmetric.presets import PRESETS_DIR, find_preset, list_presets, preset_names, reproduces
from deepmetric.studies import load_study

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"


def test_the_root_configs_folder_is_the_packaged_one_and_every_file_is_named():
    assert CONFIGS.resolve() == PRESETS_DIR == ROOT / "src" / "deepmetric" / "configs"
    files = sorted(p.relative_to(CONFIGS).with_suffix("").as_posix() for p in CONFIGS.rglob("*.yaml"))
    studies = [f"studies/{n}" for n in preset_names("study")]
    assert sorted(preset_names() + studies) == files and len(preset_names()) > 90 and len(studies) > 10


@pytest.mark.parametrize("text", ["abe/cub-abe8", "abe/cub-abe8.yaml", "configs/abe/cub-abe8.yaml",
                                  "./configs/abe/cub-abe8.yaml"])
def test_a_preset_is_found_by_name_from_any_directory(text, tmp_path, monkeypatch):
    expected = load_yaml(CONFIGS / "abe" / "cub-abe8.yaml")
    monkeypatch.chdir(tmp_path)  # no configs/ here
    assert load_yaml(text) == expected
    assert expected["model"]["head"] == "abe" and expected["data"]["spec"].startswith("cub:")  # extends resolved


def test_a_path_that_exists_wins_over_the_preset_of_that_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("demo-glyphs").write_text("train: {steps: 7}\n")
    (tmp_path / "abe").mkdir()
    (tmp_path / "abe" / "cub-abe8.yaml").write_text("train: {steps: 8}\n")
    assert load_yaml("demo-glyphs") == {"train": {"steps": 7}}
    assert load_yaml("abe/cub-abe8.yaml") == {"train": {"steps": 8}}
    # issue 39 item 26: the name without .yaml reads the user's file too (it read the packaged preset)
    assert load_yaml("abe/cub-abe8") == {"train": {"steps": 8}}
    Path("demo-glyphs").unlink()
    Path("demo-glyphs.yml").write_text("train: {steps: 9}\n")
    assert load_yaml("demo-glyphs") == {"train": {"steps": 9}}
    assert load_yaml("abe/cars-abe8") == load_yaml(CONFIGS / "abe" / "cars-abe8.yaml")  # no such file: the preset


def test_extends_names_a_preset_when_no_file_of_that_name_is_beside(tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text("extends: abe/cub-abe8\ntrain: {steps: 3}\n")
    merged = load_yaml(mine)
    assert merged["model"]["head"] == "abe" and merged["train"]["steps"] == 3
    assert merged["loss"] == load_yaml("abe/cub-abe8")["loss"]
    (tmp_path / "abe").mkdir()
    (tmp_path / "abe" / "cub-abe8").write_text("model: {head: gap}\n")  # a file beside it wins
    assert load_yaml(mine)["model"] == {"head": "gap"}
    mine.write_text("extends: abe/cub-abe9\n")
    with pytest.raises(ConfigError, match=r"mine.yaml: extends 'abe/cub-abe9' does not exist .*abe/cub-abe8"):
        load_yaml(mine)


def test_unknown_names_are_refused_with_the_nearest_presets(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"nearest presets: abe/cub-abe8"):
        load_yaml("abe/cub-abe9")
    with pytest.raises(ConfigError, match=r"is a study, not a run config: run it with deepmetric study demo"):
        load_yaml("configs/studies/demo.yaml")
    with pytest.raises(ConfigError, match=r"'\.\./demo-glyphs' does not exist and is not a preset"):
        load_yaml("../demo-glyphs")
    assert main(["train", "--config", "demo-glyph"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: config file 'demo-glyph' does not exist") and "demo-glyphs" in err
    assert "Traceback" not in err and not Path("runs").exists()
    assert main(["study", "demoo", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "nearest presets: demo" in err and "(deepmetric presets --studies lists them)" in err


def test_a_study_is_found_by_name_and_its_base_inside_the_package(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = load_study("demo")
    assert spec.name == "demo" and len(spec.runs()) == 33
    assert spec.base == load_yaml("demo-glyphs")
    assert load_study("configs/studies/demo.yaml").variants == spec.variants
    assert load_study("studies/demo").base == spec.base


def test_every_preset_lists_the_tables_it_reproduces():
    listed = {p.name: p for p in list_presets()}
    assert set(listed) == set(preset_names())
    assert all(p.reproduces == reproduces(p.path) and p.reproduces for p in listed.values())
    assert listed["abe/cub-abe8"].reproduces[0].startswith("ABE (Kim et al., ECCV 2018) Table 4")
    assert [p.name for p in list_presets("abe/*")] == [n for n in preset_names() if n.startswith("abe/")]


def test_the_presets_command_prints_names_and_tables_without_importing_torch(capsys):
    assert main(["presets", "cub-abe8"]) == 0
    out = capsys.readouterr().out
    assert out.startswith('preset        reproduces\nabe/cub-abe8  ABE (Kim et al., ECCV 2018) Table 4, row "ABE-8⁵¹²"')
    assert "abe/cars-abe8" not in out and "1 preset in" in out and "deepmetric train --config NAME" in out
    assert main(["presets", "--studies", "--json"]) == 0
    studies = json.loads(capsys.readouterr().out)
    assert {s["name"] for s in studies} == set(preset_names("study")) and all(s["reproduces"] for s in studies)
    summary = {s["name"]: s["reproduces"] for s in studies}  # a study's "# Reproduces:" line does not lead it
    assert summary["emoji-160px"][0].startswith("The emoji comparison at 160 px: every method against the GAP")
    code = "import sys\nfrom deepmetric.cli import main\nmain(['presets'])\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "False" and "demo-glyphs" in out


def test_the_readme_shows_what_the_presets_command_prints_and_names_presets_that_exist(capsys):
    """README's ``$ deepmetric presets`` block is what the command prints (tests/test_docs.py checks every such block
    of docs/ too), and every preset README and the documentation pages name (``--config NAME``, ``study NAME``)
    exists."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    shown = re.search(r"\$ deepmetric presets (\S+)\n(.*?)```", readme, flags=re.S)
    assert shown and main(["presets", shown.group(1)]) == 0
    assert capsys.readouterr().out.startswith(shown.group(2))
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    docs = "\n".join(page.read_text(encoding="utf-8") for page in pages)
    named = re.findall(r"deepmetric\s+train\s+--config\s+([\w/.-]+)", docs)
    studies = re.findall(r"deepmetric\s+study\s+([\w/.-]+)", docs)
    files = set(re.findall(r"cat > (\S+)", docs))  # study files a page writes itself, then runs
    named = [n for n in named if not n.startswith(("/", "./"))]  # a file of the reader's (/tmp/..., ./x.yaml)
    by_name = [(n, "config") for n in named if not n.startswith("configs/") and n.islower()]  # not PLACEHOLDERS
    by_name += [(n, "study") for n in studies if not n.startswith("configs/") and n.islower() and n not in files]
    assert ("abe/cub-abe8", "config") in by_name and ("demo", "study") in by_name
    assert all(find_preset(name, kind) for name, kind in by_name), by_name


def test_a_preset_named_on_the_command_line_trains(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--config", "demo-glyphs", "--out", "run", "--no-test", "--quiet", "train.steps=1",
                 "data.spec=digits", "model.backbone=tiny", "model.pretrained=false", "data.image_size=16",
                 "data.classes_per_batch=3", "data.samples_per_class=4", "data.val_fraction=0",
                 "eval.baseline=false"]) == 0
    saved = build_config(yaml.safe_load(Path("run/config.yaml").read_text()))
    assert saved.train.lr == 1e-3 and saved.data.flip is False and saved.data.resize_range == (1.0, 1.3)


def _fresh_environment(tmp_path: Path) -> Path:
    """Build the wheel from a copy of the sources and install it (no dependencies) into a new virtual environment
    whose path reaches this one's site-packages (torch and the rest) by a .pth file, which adds the folders only:
    the .pth files inside them, such as an editable install of this checkout, are not run. Returns its bin/."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--wheel-dir", str(wheels), str(source)], check=True, capture_output=True)
    (wheel,) = wheels.glob("deepmetric-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    Path(purelib, "outer-site-packages.pth").write_text("".join(f"{p}\n" for p in site.getsitepackages()))
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                    "--no-index", str(wheel)], check=True, capture_output=True)
    return venv / "bin"


@pytest.mark.integration
def test_the_installed_wheel_runs_presets_version_and_a_preset_outside_the_checkout(tmp_path):
    bin_dir = _fresh_environment(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}

    def run(*argv: str) -> str:
        done = subprocess.run([str(bin_dir / argv[0]), *argv[1:]], cwd=elsewhere, env=env, capture_output=True,
                              text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout

    where = run("python", "-c", "import deepmetric.presets as p; print(p.PRESETS_DIR)").strip()
    assert where.startswith(str(tmp_path / "venv")) and where.endswith("deepmetric/configs")
    assert run("deepmetric", "--version").strip() == f"deepmetric {deepmetric.__version__}"  # its one place
    listed = run("deepmetric", "presets")
    assert "demo-glyphs" in listed and 'abe/cub-abe8' in listed and "Table 4" in listed and where in listed
    run("deepmetric", "train", "--config", "demo-glyphs", "--out", "run", "--no-test", "--quiet", "train.steps=2",
        "data.spec=digits", "data.image_size=32", "data.classes_per_batch=4", "data.samples_per_class=4",
        "data.val_fraction=0", "eval.baseline=false")
    saved = yaml.safe_load((elsewhere / "run" / "config.yaml").read_text())
    assert saved["model"]["backbone"] == "lite0" and saved["train"]["lr"] == 1e-3 and saved["data"]["flip"] is False
    assert (elsewhere / "run" / "checkpoints" / "last.safetensors").is_file()


def test_the_package_does_not_cap_torch_or_torchvision():
    """Issue 39 item 31: the wheel required torch<=2.14.1 and torchvision<=0.29.1, which pins a user's whole
    environment to this project's machines. Lower bounds only; the Makefile's pins install what these machines have."""
    import tomllib
    from pathlib import Path

    from packaging.requirements import Requirement

    root = Path(__file__).parents[1]
    requirements = [Requirement(r) for r in tomllib.loads((root / "pyproject.toml").read_text())["project"]
                    ["dependencies"]]
    for name in ("torch", "torchvision"):
        (requirement,) = [r for r in requirements if r.name == name]
        assert requirement.specifier, name
        assert all(spec.operator in (">=", ">") for spec in requirement.specifier), (name, str(requirement.specifier))
    assert "torch==2.14.1 torchvision==0.29.1" in (root / "Makefile").read_text()
