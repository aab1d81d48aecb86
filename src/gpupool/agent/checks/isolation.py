"""Validation step `isolation`: what enforces shares on this node works.

- isolation `hook`: the interception library the agent installed for containers loads in a separate test
  process (a broken copy would make every hook container fail at start, or run unlimited);
- MPS daemons (where the agent runs them): every GPU's daemon answered its last probe;
- MIG (where a GPU is in MIG mode): NVML's instances were reconciled with the agent's MIG checkpoint.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpupool.agent.mps import DaemonHealth
from gpupool.agent.validation import Result

_LOAD = "import ctypes, sys; ctypes.CDLL(sys.argv[1])"


@dataclass(frozen=True, slots=True)
class Facts:
    hook_problem: str | None  # None: the library loaded, or the node does not use isolation hook
    mps: Mapping[str, DaemonHealth]  # empty: the agent runs no MPS daemons
    mig_reconciled: bool | None  # None: no MIG manager on this node


def judge(facts: Facts) -> Result:
    problems: list[str] = []
    if facts.hook_problem is not None:
        problems.append(f"interception library: {facts.hook_problem}")
    down = sorted(g for g, h in facts.mps.items() if not h.up)
    if down:
        first = facts.mps[down[0]]
        problems.append(f"MPS daemon down on {', '.join(down)} ({first.last_error or 'not started'})")
    if facts.mig_reconciled is False:
        problems.append("MIG instances not yet reconciled with the agent's MIG checkpoint")
    return Result.failed("; ".join(problems)) if problems else Result.passed()


def library_loads(path: Path, timeout_s: float = 20.0) -> str | None:
    """Load the library in a child process (never in the agent: it would interpose on the agent's own
    calls); None when it loads, else why not."""
    if not path.is_file():
        return f"{path} is missing"
    try:
        done = subprocess.run([sys.executable, "-c", _LOAD, str(path)], capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"loading {path} failed: {e}"
    if done.returncode != 0:
        return f"{path} does not load: {(done.stderr.strip().splitlines() or ['no output'])[-1]}"
    return None


def check(library: Path | None, mps: Mapping[str, DaemonHealth], mig_reconciled: Callable[[], bool] | None
          ) -> Result:
    """`library`: the installed interception library (None: the node does not use isolation hook)."""
    hook = None if library is None else library_loads(library)
    return judge(Facts(hook, dict(mps), None if mig_reconciled is None else mig_reconciled()))
