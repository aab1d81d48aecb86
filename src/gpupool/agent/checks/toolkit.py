"""Validation step `toolkit`: the NVIDIA Container Toolkit is present, new enough and configured so that
no pod can pick its GPUs with NVIDIA_VISIBLE_DEVICES.

- Version at least 1.17.8: 1.17.8 fixes the container escapes CVE-2025-23266 (a malicious image's
  LD_PRELOAD reaching the createContainer hook) and CVE-2025-23267; 1.16.2 fixed CVE-2024-0132.
- `accept-nvidia-visible-devices-envvar-when-unprivileged = false` (gpupool.agent.checks.toolkit_check).

The step fails on evidence only: a config the agent can read that accepts the variable, or a version it
can read that is too old. A config or `nvidia-ctk` the agent cannot see (the chart does not mount the
host's yet) passes with a note saying what was not checked: failing there would withhold every GPU of every
node of a default install, for a fact the agent cannot know.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from gpupool.agent.checks.toolkit_check import DEFAULT_CONFIG, ToolkitCheck, check_toolkit
from gpupool.agent.state.validation import Result

MIN_VERSION = (1, 17, 8)
CTK = "nvidia-ctk"  # prints "NVIDIA Container Toolkit CLI version 1.17.8"
_VERSION = re.compile(r"version\s+v?(\d+)\.(\d+)\.(\d+)")


def toolkit_version(text: str) -> tuple[int, int, int] | None:
    m = _VERSION.search(text)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def judge(config: ToolkitCheck, version_text: str | None) -> Result:
    """`version_text`: what `nvidia-ctk --version` printed (None: it could not be run)."""
    if config.found and config.problems:
        return Result.failed(config.problems[0])
    unseen = [] if config.found else [f"config {config.path} not visible to the agent"]
    if version_text is None:
        return Result.passed("; ".join([*unseen, f"{CTK} not visible to the agent"]) + ": not checked")
    version = toolkit_version(version_text)
    if version is None:
        return Result.failed(f"cannot read a version from {CTK}: {version_text.strip()[:100]!r}")
    if version < MIN_VERSION:
        wanted = ".".join(map(str, MIN_VERSION))
        return Result.failed(f"toolkit {'.'.join(map(str, version))} is older than {wanted} (container escape "
                             "CVE-2025-23266)")
    return Result.passed("; ".join(unseen) + ": not checked" if unseen else "")


def check(config_path: Path = DEFAULT_CONFIG, cdi: bool = False, ctk: str = CTK) -> Result:
    try:
        done = subprocess.run([ctk, "--version"], capture_output=True, text=True, timeout=10, check=False)
        version_text: str | None = done.stdout if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        version_text = None
    return judge(check_toolkit(config_path, cdi), version_text)
