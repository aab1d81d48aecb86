"""`gpupool mig`: models, layouts (text and JSON), what-if, and usage errors (exit 2, no traceback)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpupool.cli import main


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["mig", *args])
    return result.exit_code, result.output


def test_models_lists_every_model_and_marks_inferred_rows() -> None:
    code, out = run("models")
    assert code == 0
    for name in ("A100-40GB", "A100-80GB", "A30-24GB", "H100-80GB", "H100-NVL", "H200", "GH200-96GB",
                 "GH200-144GB", "B200"):
        assert f"{name}:" in out
    assert "* start slots assumed equal to A100/H100" in out
    code, out = run("models", "--json")
    doc = json.loads(out)
    a100 = next(m for m in doc["models"] if m["model"] == "A100-40GB")
    assert {"profile": "4g.20gb", "starts": [0], "max": 1}.items() <= next(
        p for p in a100["profiles"] if p["profile"] == "4g.20gb").items()


def test_layouts_json_has_the_documented_shape() -> None:
    code, out = run("layouts", "--model", "A100-40GB", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["model"] == "A100-40GB"
    assert [{"profile": "4g.20gb", "start": 0}, {"profile": "3g.20gb", "start": 4}] in doc["layouts"]
    assert [{"profile": "7g.40gb", "start": 0}] in doc["layouts"]
    # a layout with a free 1g slot is not maximal, so never listed
    assert [{"profile": "4g.20gb", "start": 0}] not in doc["layouts"]


def test_layouts_text_and_without_media() -> None:
    code, out = run("layouts", "--model", "a30-24gb", "--without-media")
    assert code == 0
    # A30 (4 slices): 4x1g, 2x1g+2g, 2g+2x1g, 2g+2g, 4g
    assert out.splitlines()[0] == "A30-24GB: 5 maximal layouts (profile@start slot)"
    assert "  2g.12gb@0 + 2g.12gb@2" in out and "+me" not in out


def test_unknown_model_lists_known_ones_and_exits_2() -> None:
    code, out = run("layouts", "--model", "T4")
    assert code == 2
    assert "unknown GPU model 'T4'" in out and "H100-80GB" in out and "Traceback" not in out


def test_whatif_on_a_small_trace(tmp_path: Path) -> None:
    (tmp_path / "nodes.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,32000,131072,2,T4\n")
    (tmp_path / "pods.csv").write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
                                       + "".join(f"p{i},1000,1024,1,250\n" for i in range(4)))
    code, out = run("whatif", "--trace", str(tmp_path / "pods.csv"), "--nodes", str(tmp_path / "nodes.csv"),
                    "--gpu-model", "A100-40GB", "--json")
    assert code == 0, out
    rows = {r["isolation"]: r for r in json.loads(out)["rows"]}
    # hand-computed in tests/core/test_mig_whatif.py: whole 75 %, mig (2g.10gb x3 per GPU) 25 %, hook 0 %
    assert [rows[k]["unallocated_pct"] for k in ("whole", "mig", "hook")] == [75.0, 25.0, 0.0]
    assert [rows[k]["gpus_needed"] for k in ("whole", "mig", "hook")] == [4, 2, 1]


def test_whatif_usage_errors_exit_2(tmp_path: Path) -> None:
    code, out = run("whatif", "--gpu-model", "H100-80GB", "--isolation", "whole,mps")
    assert code == 2 and "unknown isolation mps" in out
    code, out = run("whatif", "--gpu-model", "H100-80GB", "--trace", str(tmp_path / "missing.csv"))
    assert code == 2 and "no such file" in out and "Traceback" not in out


@pytest.mark.parametrize(("nodes", "pods", "args", "says"), [
    # issue 26: each of these gave a traceback or, for the node shapes, gigabytes and a hang
    ("n0,32000,131072,100000,T4", "p0,1000,1024,1,250", [], "column gpu: 100000 is over the limit of 32"),
    ("n0,32000,131072,1" + "0" * 26 + ",T4", "p0,1000,1024,1,250", [], "is over the limit of 32"),
    ("n0,32000,131072,2,T4", "p0,1000,1024,1" + "0" * 26 + ",1000", [], "column num_gpu"),
    ("n0,32000,131072,2,T4", "p0,1000,1024,1,250,\"" + "x" * 140_000 + "\"", [], "field larger than field limit"),
    ("n0,32000,131072,2,T4", "p0,1000,1024,1,250", ["--seed", "-1"], "0<=x<=4294967295"),
])
def test_whatif_refuses_absurd_input_with_a_message_and_exit_2(tmp_path: Path, nodes: str, pods: str,
                                                               args: list[str], says: str) -> None:
    (tmp_path / "nodes.csv").write_text(f"sn,cpu_milli,memory_mib,gpu,model\n{nodes}\n")
    (tmp_path / "pods.csv").write_text(f"name,cpu_milli,memory_mib,num_gpu,gpu_milli\n{pods}\n")
    code, out = run("whatif", "--trace", str(tmp_path / "pods.csv"), "--nodes", str(tmp_path / "nodes.csv"),
                    "--gpu-model", "A100-40GB", *args)
    assert code == 2 and says in out and "Traceback" not in out, out
