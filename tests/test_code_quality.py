"""The project's static gates run as tests, so that CI fails when they fail."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_core_passes_mypy_strict() -> None:
    result = run("mypy", "--strict", "src/gpupool/core")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_is_clean() -> None:
    result = run("ruff", "check", "src", "tests", "benchmarks")
    assert result.returncode == 0, result.stdout + result.stderr


def test_core_imports_nothing_outside_the_domain() -> None:
    """ARCHITECTURE.md: core never imports I/O libraries or other gpupool layers."""
    forbidden = ("lightkube", "grpc", "pynvml", "starlette", "uvicorn", "httpx", "pydantic", "yaml", "os",
                 "gpupool.api", "gpupool.cluster", "gpupool.scheduler", "gpupool.agent", "gpupool.sim")
    offenders = []
    for path in (ROOT / "src/gpupool/core").rglob("*.py"):
        for line in path.read_text().splitlines():
            words = line.split()
            if len(words) >= 2 and words[0] in ("import", "from"):
                module = words[1]
                if any(module == f or module.startswith(f + ".") for f in forbidden):
                    offenders.append(f"{path.relative_to(ROOT)}: {line.strip()}")
    assert offenders == []
