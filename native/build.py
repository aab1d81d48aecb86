"""Compile gpupool's CUDA interception library with the system C compiler (no CUDA toolkit, no network),
its HIP memory cap (native/hip/, docs/hook-hip.md: no ROCm either), and remote mode's two programs
(native/remote/, docs/remote.md): the client library a container without a GPU loads as libcuda.so.1, and
the GPU server.

Used by setup.py (wheel and editable installs), the tests (also with sanitizers) and the benchmarks:
    python native/build.py OUT.so [extra cc flags...]        the interception library
    python native/build.py --hip OUT.so [cc flags...]        libgpupool_hip.so
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
HIP_LIBRARY_NAME = "libgpupool_hip.so"
HIP = NATIVE / "hip"
# The files of native/ that know no vendor (native/gp_core.h): the limits file, the tamper rules, the pod's
# accounting, the log and the lookup of libc's own functions. Both libraries are built from them.
SHARED = ["gp_sym.c", "gp_log.c", "gp_config.c", "gp_shared.c"]
# The HIP library honours none of usage.v1's extras (no squeeze, no host PIDs: it caps memory only).
HIP_DEFINES = ["-DGP_LIB_FEATURES=0"]


def sources() -> list[Path]:
    """The interception library's files (native/gp.h lists them, one concern each)."""
    return sorted(NATIVE.glob("gp_*.c"))


def shared_sources() -> list[Path]:
    return [NATIVE / name for name in SHARED]


def hip_sources() -> list[Path]:
    """The HIP library's files: the shared ones and native/hip/ (native/hip/gph.h lists them)."""
    return [*shared_sources(), *sorted(HIP.glob("gph_*.c"))]


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


def compile_hip_library(out: Path, extra: list[str] | None = None, cc: str | None = None) -> Path:
    """Build the HIP memory cap at `out`."""
    return _compile(out, [*FLAGS, *HIP_DEFINES, *(extra or [])], hip_sources(), HIP_LIBRARY_NAME, cc)


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
        sys.exit("usage: python native/build.py OUT.so [cc flags...] | --hip OUT.so [cc flags...] | "
                 "--remote OUT_DIR [cc flags...]")
    if sys.argv[1] == "--hip" and len(sys.argv) > 2:
        print(compile_hip_library(Path(sys.argv[2]), sys.argv[3:]))
    elif sys.argv[1] == "--remote" and len(sys.argv) > 2:
        print(*compile_remote(Path(sys.argv[2]), sys.argv[3:]))
    else:
        print(compile_library(Path(sys.argv[1]), sys.argv[2:]))
