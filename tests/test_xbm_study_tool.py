"""tools/xbm_study.py --seeds: the replicate commands, the record shared by one process per data set, the table."""

import json
import multiprocessing
import sys
from pathlib import Path

import pytest

from helpers import load_tool


def test_a_replicate_is_the_seed_0_command_with_train_seed_added():
    tool = load_tool("xbm_study")
    for data in ("emoji", "icons"):
        for size in (0, 1024):
            base = tool.command(data, size, Path("runs/xbm/x"))
            assert tool.command(data, size, Path("runs/xbm/x"), 2) == [*base, "train.seed=2"]
    assert tool.parse_seeds("1,2") == [1, 2]
    for bad in ("0,1", "1,1", "x", "-1", ""):
        with pytest.raises(SystemExit):
            tool.parse_seeds(bad)


def _update_many(record: str, data: str, count: int) -> None:
    tool = load_tool("xbm_study")
    for i in range(count):
        tool.update_record(Path(record), lambda r, i=i: r[data].setdefault("seeds", {}).__setitem__(str(i), i))


def test_two_processes_keep_each_others_data_set_entries(tmp_path):
    record = tmp_path / "xbm.json"
    record.write_text(json.dumps({"emoji": {"chosen_size": 2048}, "icons": {"chosen_size": 1024}}))
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_update_many, args=(str(record), data, 40)) for data in ("emoji", "icons")]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    written = json.loads(record.read_text())
    for data, size in (("emoji", 2048), ("icons", 1024)):
        assert written[data]["chosen_size"] == size
        assert written[data]["seeds"] == {str(i): i for i in range(40)}


def test_the_table_pairs_each_seed_and_refuses_a_record_without_a_chosen_size(tmp_path, monkeypatch):
    tool = load_tool("xbm_study")

    def test(r1, map_r):
        return {"recall@1": r1, "map@r": map_r}

    entry = {"chosen_size": 2048, "test": {"0": test(0.60, 0.40), "2048": test(0.62, 0.41)},
             "seeds": {"2": {"test": {"0": test(0.61, 0.42), "2048": test(0.62, 0.42)}},
                       "1": {"test": {"0": test(0.60, 0.40), "2048": test(0.63, 0.43)}}}}
    table = tool.replicate_table("emoji", entry).splitlines()
    assert [row.split(" | ")[0] for row in table[4:7]] == ["| 0", "| 1", "| 2"]
    assert table[4] == "| 0 | 60.00 | 62.00 | +2.00 | 40.00 | 41.00 | +1.00 |"
    assert table[7] == "| mean Δ ± std (n = 3) | | | +2.00 ± 1.00 | | | +1.33 ± 1.53 |"
    record = tmp_path / "xbm.json"
    record.write_text(json.dumps({"emoji": {}}))
    monkeypatch.setattr(sys, "argv", ["xbm_study.py", "--seeds", "1", "--data", "emoji", "--record", str(record)])
    with pytest.raises(SystemExit, match="no chosen_size for emoji"):
        tool.main()
