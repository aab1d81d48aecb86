"""Compile gpupool's CUDA interception library with the system C compiler (no CUDA toolkit, no network).

Used by setup.py (wheel and editable installs), the tests (also with sanitizers) and the benchmarks:
    python native/build.py OUT.so [extra cc flags...]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

NATIVE = Path(__file__).resolve().parent
LIBRARY_NAME = "libgpupool_hook.so"
FLAGS = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared", "-O2", "-fvisibility=hidden"]


def sources() -> list[Path]:
    return sorted(NATIVE.glob("gp_*.c"))


def compile_library(out: Path, extra: list[str] | None = None, cc: str | None = None) -> Path:
    """Build the library at `out` (written atomically, so a concurrent reader never loads half a file)."""
    compiler = cc or os.environ.get("CC") or shutil.which("cc") or "gcc"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    cmd = [compiler, *FLAGS, *(extra or []), "-o", str(tmp), *map(str, sources()), "-ldl", "-lpthread"]
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True)
    except FileNotFoundError:
        raise RuntimeError(f"no C compiler ({compiler}): install gcc or set CC") from None
    except subprocess.CalledProcessError as e:
        raise RuntimeError(f"compiling {LIBRARY_NAME} failed:\n{' '.join(cmd)}\n{e.stderr}") from None
    os.replace(tmp, out)
    return out


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python native/build.py OUT.so [cc flags...]")
    print(compile_library(Path(sys.argv[1]), sys.argv[2:]))
