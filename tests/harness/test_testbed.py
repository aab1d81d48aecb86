"""The testbed's process handle: what a failed start shows."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.harness.testbed import Process


def _exited(tmp_path: Path, lines: list[str]) -> Process:
    log = tmp_path / "component.log"
    log.write_text("\n".join(lines) + "\n")
    popen = subprocess.Popen([sys.executable, "-c", "pass"])
    popen.wait()
    return Process("component", popen, log)


def test_tail_puts_the_fatal_line_before_the_goroutine_stacks(tmp_path: Path) -> None:
    # A Go component logs its reason once, then dumps every goroutine: 200 stack lines here.
    fatal = 'F1124 19:21:08.752805   27851 server.go:156] invalid argument "x_" for "--register-with-taints"'
    stacks = [f"\tvendor/k8s.io/klog/v2/klog.go:{i} +0x6a" for i in range(200)]
    proc = _exited(tmp_path, ["I1124 starting", fatal, "", "goroutine 1 [running]:", *stacks])
    shown = proc.tail(lines=10).splitlines()
    assert not proc.alive()
    assert shown[0] == fatal
    assert shown[1] == "..."
    assert shown[2:] == stacks[-10:]


def test_tail_without_a_fatal_line_is_the_last_lines(tmp_path: Path) -> None:
    lines = [f"I1124 line {i}" for i in range(50)]
    assert _exited(tmp_path, lines).tail(lines=5).splitlines() == lines[-5:]


def test_a_fatal_line_already_in_the_tail_is_shown_once(tmp_path: Path) -> None:
    lines = ["I1124 start", "panic: runtime error: index out of range", "goroutine 1 [running]:"]
    assert _exited(tmp_path, lines).tail(lines=25).splitlines() == lines
