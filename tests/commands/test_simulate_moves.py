"""`gpupool simulate --moves`: both figures in the table and results.json; usage errors exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpupool.cli import main

NODES = "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(f"n{i},32000,131072,2,T4\n" for i in range(5))
PODS = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n" + "".join(
    f"p{i},2000,4096,1,{(300, 600, 1000, 450)[i % 4]}\n" for i in range(20))


def test_moves_report_with_and_without(tmp_path: Path) -> None:
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(PODS)
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["simulate", "--trace", str(tmp_path / "pods.csv"), "--nodes",
                                       str(tmp_path / "nodes.csv"), "--policies", "bestfit,gpupool", "--seeds",
                                       "42,43", "--moves", "2", "--move-cost-per-gib", "0.5", "--jobs", "1",
                                       "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "with at most 2 move(s)" in result.output
    doc = json.loads((out / "results.json").read_text())
    for res in doc["policies"].values():
        moves = res["moves"]
        assert moves["max_moves"] == 2 and moves["cost_per_gib"] == 0.5
        assert 0 <= moves["unallocated_pct_at_100"] <= 100 and moves["moves_at_100"] >= 0
        assert moves["moved_gib_at_130"] >= moves["moved_gib_at_100"] >= 0
    # bestfit leaves a pod that moves can place on seed 42 or 43 (tests/sim/test_replay_moves.py's kind)
    bestfit = doc["policies"]["bestfit"]
    assert bestfit["moves"]["unallocated_pct_at_130"] <= bestfit["unallocated_pct_at_130"]


@pytest.mark.parametrize(("args", "message"), [
    (["--moves", "-1"], "--moves -1: expected a number of moves from 0 to 8"),
    (["--moves", "9"], "--moves 9: expected a number of moves from 0 to 8"),
    (["--moves", "1", "--move-cost-per-gib", "nan"], "--move-cost-per-gib nan"),
    (["--moves", "1", "--movable", "1.5"], "--movable 1.5: expected a fraction from 0 to 1"),
    (["--moves", "2", "--timeline"], "--moves applies to the static replay"),
])
def test_usage_errors_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["simulate", *args, "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
