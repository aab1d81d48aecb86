"""benchmarks/isolation_gpu.py on the simulated GPU (--fake): the whole pipeline runs (build, calibration,
saturation, cases, overhead, summary), and its independent measure of each tenant (the tenant's own CUDA
events) agrees with the simulated device's own kernel log."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.native.native_helpers import busy_share, have_cc, kernel_log

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "isolation_gpu.py"
FIELDS = {"gpu", "driver", "cuda", "saturation_pct", "max_error_points_10s", "max_error_points_1s",
          "overhead_pct_small", "overhead_pct_matmul", "cases", "all_within_tolerance"}


def _bench(*args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=timeout,
                          check=False, cwd=ROOT)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path, str]:
    assert have_cc(), "no C compiler: the benchmark builds the library and the simulated GPU (set CC)"
    out = tmp_path_factory.mktemp("isolation-gpu")
    done = _bench("--quick", "--fake", "--only", "30 alone,30/70", "--workloads", "small,graphs", "--window", "1",
                  "--settle", "0.5", "--rounds", "1", "--out", str(out), "--keep-device-log")
    assert done.returncode == 0, done.stderr[-3000:]
    summary: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return summary, out, done.stdout


def test_the_last_line_has_every_field_and_a_case_per_planned_run(run: tuple[dict[str, Any], Path, str]) -> None:
    summary, out, _ = run
    assert summary.keys() >= FIELDS
    # time-sliced tenants: the events alone count a neighbour's time as theirs, the measure does not
    pair = next(c for c in summary["cases"] if c["case"] == "30/70")
    assert sum(p["events_raw"] for p in pair["pods"]) > sum(p["measured"] for p in pair["pods"])
    assert summary["gpu"] == "gpupool fake GPU" and summary["cuda"] == "12.4"
    assert set(summary["saturation_by_workload"]) == {"small", "graphs"}
    assert summary["saturation_pct"] == min(summary["saturation_by_workload"].values())
    assert summary["overhead_pct_matmul"] is None and isinstance(summary["overhead_pct_small"], float)
    # --quick: every chosen case on the first workload, then 30 alone and 30/70 on the others
    assert [(c["case"], c["workload"]) for c in summary["cases"]] == [
        ("30 alone", "small"), ("30/70", "small"), ("30 alone", "graphs"), ("30/70", "graphs")]
    for case in summary["cases"]:
        assert case["window"][1] - case["window"][0] == 1_000_000_000
        for pod in case["pods"]:
            # the library's own estimate beside the measure: its accounting and the NVML samples it traced
            assert pod["library"]["accounting"] is not None and pod["library"]["trace"] is not None
            assert len(pod["per_second"]) == 1 and pod["error"] == pytest.approx(pod["measured"] - pod["expected"],
                                                                                  abs=0.011)
    errors = [abs(p["error"]) for c in summary["cases"] for p in c["pods"]]
    assert summary["max_error_points_10s"] == pytest.approx(max(errors), abs=0.011)
    assert json.loads((out / "summary.json").read_text()) == summary


def test_the_independent_measure_matches_the_simulated_devices_kernel_log(
        run: tuple[dict[str, Any], Path, str]) -> None:
    summary, _, _ = run
    for case in summary["cases"]:
        w0, w1 = case["window"]
        state = Path(case["device_log"])
        for pod in case["pods"]:
            truth = 100 * busy_share(state, set(pod["pids"]), w0, w1)
            assert pod["measured"] == pytest.approx(truth, abs=0.75), (case["case"], case["workload"])
            # the tenant ran in the window: one that ran nothing would match trivially
            assert any(pid in pod["pids"] and end > w0 and start < w1 for pid, start, end in kernel_log(state))


def test_it_prints_each_case_and_keeps_spans_and_calibration(run: tuple[dict[str, Any], Path, str]) -> None:
    summary, out, stdout = run
    assert "saturation (one uncapped tenant" in stdout and "30/70" in stdout and "library:" in stdout
    calibration = json.loads((out / "calibration.json").read_text())
    assert calibration["per_us"] == 1.0  # the simulated GPU takes microseconds as they are
    spans = sorted(out.glob("runs/*/spans-*.csv.gz"))
    assert spans
    with gzip.open(spans[0], "rt") as f:
        rows = [line.split(",") for line in f if not line.startswith("#")]
    assert rows and all(int(end) >= int(start) for start, end, _, _ in rows)


@pytest.mark.parametrize("args", [["--window", "0"], ["--only", "42 alone"], ["--workloads", "gemm"],
                                  ["--rounds", "x"]])
def test_bad_arguments_exit_2_without_a_traceback(args: list[str]) -> None:
    done = _bench(*args, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr and done.stderr.startswith("isolation_gpu:")
