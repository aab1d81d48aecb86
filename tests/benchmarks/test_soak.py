"""benchmarks/soak.py's pure parts: what a GPU holds, read from a limits file and from the API's objects, the
over-capacity lines on hand-computed cases, Kubernetes quantities, and the JSON line's figures. The soak
itself needs the chart's pods on real nodes (tests/e2e/test_e2e_soak.py runs a short one)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from gpupool.agent.state.hookdir import HookLimits, limits_bytes

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("soak", ROOT / "benchmarks" / "soak.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["soak"] = module
    spec.loader.exec_module(module)
    return module


soak = _load()
H = soak.Holding


def test_a_limits_file_reads_back_as_its_shares() -> None:
    # Written by the agent's own writer: 2 GPUs, 4096 MiB / 20 % on the first, 1024 MiB / the whole GPU (100 %,
    # stored as 0 ppm) on the second.
    data = limits_bytes(HookLimits(memory_mib=(4096, 1024), cores=(20.0, 100.0), gpus=("GPU-a", "GPU-b")))
    assert soak.limits_holdings(data, "p") == [H("p", "GPU-a", 4096, 20.0), H("p", "GPU-b", 1024, 100.0)]
    assert soak.limits_holdings(b"\0" * 2048, "p") == []  # no magic: not a limits file
    assert soak.limits_holdings(data[:100], "p") == []


def test_over_capacity_names_each_full_gpu_once() -> None:
    ok = [H("a", "G0", 40000, 60.0), H("b", "G0", 6068, 40.0)]  # exactly full: 46068 MiB, 100 %
    assert soak.over_capacity(ok, "x") == []
    memory = [*ok, H("c", "G1", 100, 1.0), H("d", "G0", 1, 0.0)]  # one MiB over on G0
    (line,) = soak.over_capacity(memory, "limits files")
    assert line.startswith("limits files: GPU G0 holds 46069 MiB / 100% in 3 shares") and "a, b, d" in line
    cores = [H("a", "G2", 10, 70.0), H("b", "G2", 10, 31.0)]
    (line,) = soak.over_capacity(cores, "API")
    assert "101%" in line
    eleven = [H(str(i), "G3", 1, 1.0) for i in range(11)]  # 11 shares, the split is 10
    assert len(soak.over_capacity(eleven, "API")) == 1 and soak.over_capacity(eleven[:10], "API") == []


@given(st.lists(st.tuples(st.sampled_from(["G0", "G1", "G2"]), st.integers(0, 20000), st.integers(0, 50)),
                max_size=12))
def test_over_capacity_flags_exactly_the_gpus_over_a_limit(shares: list[tuple[str, int, int]]) -> None:
    holdings = [H(f"p{i}", g, m, float(c)) for i, (g, m, c) in enumerate(shares)]
    flagged = {line.split()[2] for line in soak.over_capacity(holdings, "x")}
    want = {g for g in {s[0] for s in shares}
            if sum(m for gg, m, _ in shares if gg == g) > 46068 or sum(c for gg, _, c in shares if gg == g) > 100
            or sum(1 for s in shares if s[0] == g) > 10}
    assert flagged == want


def test_quantities_in_mib() -> None:
    assert [soak.quantity_mib(q) for q in ("8Gi", "512Mi", "1048576", "2G", "1536Ki")] == [8192, 512, 1, 1907, 1]


def test_the_api_holdings_of_pods_and_claims() -> None:
    def pod(uid: str, node: str | None, phase: str, for_uid: str) -> dict[str, Any]:
        ann = json.dumps({"version": 1, "pod_uid": for_uid, "node": "n1", "gpus": [
            {"uuid": "GPU-n1-0", "index": 0, "memory_mib": 4096, "cores": 20}]})
        return {"metadata": {"name": uid, "uid": uid, "annotations": {"gpupool.io/allocation": ann}},
                "spec": {"nodeName": node}, "status": {"phase": phase}}

    pods = [pod("u1", "n1", "Running", "u1"), pod("u2", "n1", "Succeeded", "u2"),  # ended: holds nothing
            pod("u3", "n1", "Running", "u-old"),  # an earlier pod's annotation
            pod("u4", None, "Pending", "u4")]  # not bound
    claim = {"metadata": {"name": "c1"}, "status": {"allocation": {"devices": {"results": [
        {"driver": "gpu.gpupool.io", "pool": "n2", "device": "gpu-2",
         "consumedCapacity": {"memory": "8Gi", "cores": "30"}},
        {"driver": "other.example.com", "pool": "n2", "device": "gpu-0"}]}}}}
    assert soak.api_holdings(pods, [claim, {"metadata": {"name": "unallocated"}}]) == [
        H("pod u1", "GPU-n1-0", 4096, 20.0), H("claim c1", "GPU-n2-2", 8192, 30.0)]


def test_the_summary_line() -> None:
    line = soak.summary({"agent-pod": [10.0, 20.04], "kubelet-restart": [3.0], "node-down": []}, faults=3,
                        pods=120, claims=60, violations=["x"], minutes=10.123, version="v1.37.2", cores=2)
    assert line == {"kubernetes_version": "v1.37.2", "minutes": 10.12, "faults": 3, "pods": 120, "claims": 60,
                    "violations": 1, "settle_s_max": 20.0, "chart_pods": True, "cores": 2,
                    "settle_s": {"agent-pod": {"count": 2, "max": 20.0, "mean": 15.0},
                                 "kubelet-restart": {"count": 1, "max": 3.0, "mean": 3.0}}}
    assert soak.summary({}, 0, 0, 0, [], 1, "v", 2)["settle_s_max"] == 0.0


def test_bad_arguments_exit_2(capsys: Any) -> None:
    assert soak.main(["--faults", "reboot"]) == 2
    assert "reboot" in capsys.readouterr().err
    assert soak.main(["--minutes", "0"]) == 2
