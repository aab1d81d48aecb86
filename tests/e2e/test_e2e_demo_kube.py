"""`gpupool demo --kube`'s helper end to end: its own control plane, the real kube-scheduler binding share
pods through the in-process extender, and a summary that says the ledger matches the API."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e


def test_kube_demo_binds_everything_and_reports_a_consistent_ledger(testbed) -> None:  # type: ignore[no-untyped-def]
    # (`testbed` only makes sure the binaries exist; the demo starts a control plane of its own.)
    code = ("import sys; from gpupool.commands.demo_kube import run_kube_demo; "
            "sys.exit(run_kube_demo(4, 24, None, False))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False,
                         env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "bound by kube-scheduler │ 24" in out.stdout
    assert "consistent" in out.stdout
