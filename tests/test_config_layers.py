"""Config files a hostile user writes (issue 39 items 6 and 25): YAML alias bombs, endless extends: chains, and files
that are not configs at all. Each is one short ConfigError, quickly, quoting nothing of a file that is not a config."""

from __future__ import annotations

import pytest

from deepmetric.cli import main
from deepmetric.config import load_yaml, parse_override
from deepmetric.errors import ConfigError
from deepmetric.io.strict import MAX_YAML_NODES, expanded_size

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8))


def test_the_expanded_size_counts_shared_parts_each_time_and_stops_early():
    shared = [1, 2, 3]
    assert expanded_size({"a": shared, "b": [shared, shared]}) == 1 + 2 + 4 + (1 + 2 * 4)
    deep = [0] * 9
    for _ in range(12):  # 9^13 values once expanded: answered at once
        deep = [deep] * 9
    assert expanded_size(deep, limit=1000) > 1000
    cycle: list = []
    cycle.append(cycle)
    assert expanded_size(cycle, limit=10) > 10


@pytest.mark.parametrize("where", ["train", "train.steps", "loss.options"])
def test_an_alias_bomb_is_one_short_error(tmp_path, capsys, where):
    """The 9-level bomb above (about 400 bytes; 9^9 values) as a whole file, under a section, or in loss.options."""
    section, _, key = where.partition(".")
    body = "\n".join("  " + line for line in BOMB.splitlines())
    text = f"{section}:\n{body}\n" if not key else f"{section}:\n  {key}:\n" + "\n".join(
        "    " + line for line in BOMB.splitlines()) + "\n"
    config = tmp_path / "bomb.yaml"
    config.write_text(text)
    with pytest.raises(ConfigError, match=f"expands to more than {MAX_YAML_NODES:,} values"):
        load_yaml(config)
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert len(err) < 500 and "expands to more than" in err and not (tmp_path / "run").exists()


def test_an_alias_bomb_in_an_override_and_a_self_containing_value_are_refused():
    with pytest.raises(ConfigError, match="override 'loss.options'"):
        parse_override("loss.options=" + "{" + BOMB.replace("\n", ", ").rstrip(", ") + "}")
    with pytest.raises(ConfigError, match="contains itself"):
        parse_override("model.head_options=&a [*a]")


def test_an_endless_extends_chain_is_refused_naming_its_start(tmp_path):
    for i in range(40):
        (tmp_path / f"c{i}.yaml").write_text(f"extends: c{i + 1}.yaml\ntrain: {{steps: {i + 1}}}\n")
    (tmp_path / "c40.yaml").write_text("train: {steps: 1}\n")
    with pytest.raises(ConfigError, match=r"c0.yaml: its extends: chain is longer than 32 files"):
        load_yaml(tmp_path / "c0.yaml")
    assert load_yaml(tmp_path / "c20.yaml")["train"] == {"steps": 21}  # 21 files: fine


def test_a_file_that_is_not_a_config_is_refused_without_quoting_it(tmp_path, capsys):
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$SECRETHASH:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n")
    mine = tmp_path / "mine.yaml"
    mine.write_text(f"extends: {secret}\ntrain: {{steps: 2}}\n")
    assert main(["train", "--config", str(mine), "--out", str(tmp_path / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "is not a deepmetric config" in err and "SECRETHASH" not in err and "daemon" not in err
    typo = tmp_path / "typo.yaml"
    typo.write_text("train: {steps: 2}\ntrian: {lr: 1}\n")  # a config with a typo still names the key
    assert main(["train", "--config", str(typo), "--out", str(tmp_path / "run"), "--quiet"]) == 2
    assert "trian" in capsys.readouterr().err


def test_an_alias_bomb_in_a_study_file_is_one_short_error(tmp_path, capsys):
    study = tmp_path / "bomb.yaml"
    study.write_text("name: bomb\nvariants:\n  gap: {}\nseeds: [0]\nbomb:\n" + "\n".join(
        "  " + line for line in BOMB.splitlines()) + "\n")
    assert main(["study", str(study), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "expands to more than" in err and len(err) < 500
