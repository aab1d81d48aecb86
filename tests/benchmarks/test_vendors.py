"""benchmarks/vendors.py: its last line on a small trace, its medians, and bad arguments exiting 2."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "vendors.py"
NODES = "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(f"n{i},32000,131072,4,T4\n" for i in range(10))
PODS = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n" + "".join(
    f"p{i},2000,4096,{2 if i % 7 == 0 else 1},{1000 if i % 7 == 0 else (300, 600, 1000, 450)[i % 4]}\n"
    for i in range(60))


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vendors_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["vendors_bench"] = module
    spec.loader.exec_module(module)
    return module


vb = _load()


def _bench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(PODS)
    return subprocess.run([sys.executable, str(BENCH), "--trace", str(tmp_path / "pods.csv"), "--nodes",
                           str(tmp_path / "nodes.csv"), "--jobs", "1", *args],
                          capture_output=True, text=True, timeout=300, check=False)


def test_the_last_line_has_the_issues_keys_on_a_small_trace(tmp_path: Path) -> None:
    done = _bench(tmp_path, "--seeds", "42,43,44", "--mix", "amd=0.3,ascend=0.2,any=0.2")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("cores: ")
    line = json.loads(lines[-1])
    assert set(vb.RESULT_KEYS) <= set(line)
    assert {v: (d["nodes"], d["gpus"]) for v, d in line["vendors"].items()} == {
        "nvidia": (5, 20), "amd": (3, 12), "ascend": (2, 8)}
    assert line["pods"] == 60 and line["misrouted"] == 0 and line["seeds"] == [42, 43, 44]
    assert line["unallocated_pct_one_pool"] == round(sorted(line["one_pool_per_seed"])[1], 3)
    assert line["unallocated_pct_islands"] == round(sorted(line["islands_per_seed"])[1], 3)


def test_the_result_takes_medians_over_seeds() -> None:
    report = {"vendors": {"nvidia": {"nodes": 1}}, "pods": 9, "mix": "nvidia=1", "mix_seed": 0,
              "policies": {"gpupool": {"misrouted": 0, "one_pool_per_seed": [4.0, 1.0, 2.5],
                                       "islands_per_seed": [3.0, 9.0, 5.0], "unallocated_pct_per_island": {}}}}
    line = vb.result(report, "gpupool", [1, 2, 3], 2)
    assert (line["unallocated_pct_one_pool"], line["unallocated_pct_islands"]) == (2.5, 5.0)
    assert line["cores"] == 2 and json.loads(json.dumps(line)) == line


@pytest.mark.parametrize(("args", "message"), [
    (["--mix", "amd=2"], "'2' is not a fraction from 0 to 1"),
    (["--mix", "ascend=0.01"], "gives ascend no node"),
    (["--policy", "nope"], "--policy nope: unknown"),
    (["--seeds", "x"], "--mix/--seeds"),
])
def test_bad_arguments_exit_2_without_a_traceback(tmp_path: Path, args: list[str], message: str) -> None:
    done = _bench(tmp_path, *args)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr
