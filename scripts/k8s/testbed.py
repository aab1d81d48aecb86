"""The testbed lives with the test harness (tests/harness/testbed.py, outside the installed package). This
module keeps `import testbed` working for the stand-alone scripts in this directory, and adds what only a
source checkout has: `build()` runs build.sh. Standard library only, like the harness module."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.harness.testbed import *  # noqa: E402, F403
from tests.harness.testbed import Binaries, Process, Testbed, TestbedError  # noqa: E402, F401

BUILD_SCRIPT = Path(__file__).resolve().parent / "build.sh"


def build(timeout_s: float | None = None) -> None:
    """Run build.sh (installs Debian build deps when missing, builds once into the cache)."""
    subprocess.run(["bash", str(BUILD_SCRIPT)], check=True, timeout=timeout_s)
