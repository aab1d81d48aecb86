"""`gpupool simulate --vendor-mix`: one pool against per-vendor islands in the table and results.json; bad mixes
exit 2 with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpupool.cli import main

NODES = "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(f"n{i},32000,131072,2,T4\n" for i in range(10))
PODS = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n" + "".join(
    f"p{i},2000,4096,1,{(300, 600, 1000, 450)[i % 4]}\n" for i in range(40))


def files(tmp_path: Path) -> list[str]:
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(PODS)
    return ["--trace", str(tmp_path / "pods.csv"), "--nodes", str(tmp_path / "nodes.csv")]


def test_one_pool_and_islands_are_reported(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["simulate", *files(tmp_path), "--policies", "bestfit,gpupool", "--seeds",
                                       "42,43", "--vendor-mix", "amd=0.3,ascend=0.2,any=0.1", "--jobs", "1",
                                       "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "one pool against per-vendor islands" in result.output
    doc = json.loads((out / "results.json").read_text())
    for res in doc["policies"].values():
        mix = res["vendor_mix"]
        assert mix["mix"] == "nvidia=0.5,amd=0.3,ascend=0.2,any=0.1" and mix["pods"] == 40
        # 10 nodes of 2 GPUs: 5 NVIDIA, 3 AMD, 2 Ascend.
        assert {v: (d["nodes"], d["gpus"]) for v, d in mix["vendors"].items()} == {
            "nvidia": (5, 10), "amd": (3, 6), "ascend": (2, 4)}
        assert mix["vendors"]["amd"]["models"] == ["MI300X"]
        assert mix["misrouted"] == 0
        assert 0 <= mix["unallocated_pct_one_pool"] <= 100 and 0 <= mix["unallocated_pct_islands"] <= 100
        assert len(mix["islands_per_seed"]) == 2


@pytest.mark.parametrize(("args", "message"), [
    (["--vendor-mix", "amd=0.7,ascend=0.5"], "--vendor-mix amd=0.7,ascend=0.5: the vendors' shares add up to 1.2"),
    (["--vendor-mix", "intel=0.1"], "unknown vendor 'intel'"),
    (["--vendor-mix", "amd=x"], "'x' is not a fraction from 0 to 1"),
    (["--vendor-mix", ""], "empty; expected vendor=fraction"),
    (["--vendor-mix", "ascend=0.01"], "ascend=0.01 of 10 GPU nodes gives ascend no node"),
    (["--vendor-mix", "amd=0.3", "--timeline"], "--vendor-mix applies to the static replay"),
    (["--vendor-mix", "amd=0.3", "--moves", "1"], "--vendor-mix is not combined with --moves"),
])
def test_bad_mixes_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["simulate", *files(tmp_path), *args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()) and "Traceback" not in result.output
