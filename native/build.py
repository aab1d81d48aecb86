"""Compile gpupool's CUDA interception library with the system C compiler (no CUDA toolkit, no network),
and remote mode's two programs (native/remote/, docs/remote.md): the client library a container without a
GPU loads as libcuda.so.1, and the GPU server.

Used by setup.py (wheel and editable installs), the tests (also with sanitizers) and the benchmarks:
    python native/build.py OUT.so [extra cc flags...]        the interception library
    python native/build.py --remote OUT_DIR [cc flags...]    libgpupool_remote.so and gpupool-gpu-server
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
REMOTE_CLIENT_NAME = "libgpupool_remote.so"
SERVER_NAME = "gpupool-gpu-server"
REMOTE = NATIVE / "remote"


def sources() -> list[Path]:
    """The interception library's files (native/gp.h lists them, one concern each)."""
    return sorted(NATIVE.glob("gp_*.c"))


def client_sources() -> list[Path]:
    return [REMOTE / "gpr_client.c"]


def server_sources() -> list[Path]:
    """The GPU server's files: its options (gpr_server.c) and one file per concern (native/remote/gpr_srv.h)."""
    return [REMOTE / "gpr_server.c", *sorted(REMOTE.glob("gpr_srv_*.c"))]


def _compile(out: Path, flags: list[str], inputs: list[Path], what: str, cc: str | None) -> Path:
    """Build `out` (written atomically, so a concurrent reader never loads half a file)."""
    compiler = cc or os.environ.get("CC") or shutil.which("cc") or "gcc"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    cmd = [compiler, *flags, "-o", str(tmp), *map(str, inputs), "-ldl", "-lpthread"]
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True)
    except FileNotFoundError:
        raise RuntimeError(f"no C compiler ({compiler}): install gcc or set CC") from None
    except subprocess.CalledProcessError as e:
        raise RuntimeError(f"compiling {what} failed:\n{' '.join(cmd)}\n{e.stderr}") from None
    os.replace(tmp, out)
    return out


def compile_library(out: Path, extra: list[str] | None = None, cc: str | None = None) -> Path:
    """Build the interception library at `out`."""
    return _compile(out, [*FLAGS, *(extra or [])], sources(), LIBRARY_NAME, cc)


def compile_remote(out_dir: Path, extra: list[str] | None = None, cc: str | None = None) -> tuple[Path, Path]:
    """Build remote mode's client library and GPU server into `out_dir`: (library, server)."""
    client = _compile(out_dir / REMOTE_CLIENT_NAME, [*FLAGS, *(extra or [])], client_sources(),
                      REMOTE_CLIENT_NAME, cc)
    server_flags = [f for f in FLAGS if f not in ("-fPIC", "-shared", "-fvisibility=hidden")]
    server = _compile(out_dir / SERVER_NAME, [*server_flags, *(extra or [])], server_sources(),
                      SERVER_NAME, cc)
    return client, server


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python native/build.py OUT.so [cc flags...] | --remote OUT_DIR [cc flags...]")
    if sys.argv[1] == "--remote" and len(sys.argv) > 2:
        print(*compile_remote(Path(sys.argv[2]), sys.argv[3:]))
    else:
        print(compile_library(Path(sys.argv[1]), sys.argv[2:]))
