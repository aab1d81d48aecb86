"""Builds the fake libamd_smi.so and writes its state file (the format is in fake_amdsmi.c's header comment).

The amdsmi binding loads `$ROCM_PATH/lib/libamd_smi.so` once, when it is first imported, and resolves every
name in symbols.txt then; the fake defines the ones gpupool uses and a weak stub returning
AMDSMI_STATUS_NOT_SUPPORTED for each of the others.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CC_FLAGS = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared"]
STATE_ENV = "FAKE_AMDSMI_STATE"
NOT_SUPPORTED = 2  # AMDSMI_STATUS_NOT_SUPPORTED


def binding_symbols() -> list[str]:
    """The committed list of entry points the binding resolves at import."""
    lines = (HERE / "symbols.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def stub_source(names: list[str]) -> str:
    """Weak definitions: the fake's own (strong) definitions win at link time, the rest answer NOT_SUPPORTED.
    `int f(void)` is safe for a caller passing arguments on the x86-64 and AArch64 C calling conventions."""
    out = ["/* generated from symbols.txt by amd_fake.py */"]
    for name in names:
        out.append(f"__attribute__((weak)) int {name}(void);")
        out.append(f"__attribute__((weak)) int {name}(void) {{ return {NOT_SUPPORTED}; }}")
    return "\n".join(out) + "\n"


def build(rocm_path: Path) -> Path:
    """Compile the fake into `rocm_path`/lib/libamd_smi.so (the path the binding looks in) and return it."""
    lib_dir = rocm_path / "lib"
    lib_dir.mkdir(parents=True, exist_ok=True)
    stubs = rocm_path / "amdsmi_stubs.c"
    stubs.write_text(stub_source(binding_symbols()))
    target = lib_dir / "libamd_smi.so"
    cc = os.environ.get("CC", "cc")
    sources = [str(HERE / "fake_amdsmi.c"), str(HERE / "fake_json.c"), str(stubs)]
    subprocess.run([cc, *CC_FLAGS, "-o", str(target), *sources], check=True, capture_output=True, text=True)
    return target


def card(model: str, index: int, **fields: Any) -> dict[str, Any]:
    """One card of the state file with distinct UUID, BDF and NUMA node per index."""
    entry: dict[str, Any] = {
        "model": model,
        "uuid": f"{0x10 + index:02x}ff74a1-0000-1000-80c2-1b7a3e0c4d{index:02x}",
        "bdf": f"0000:{0x0C + 0x10 * index:02x}:00.0",
        "numa": index // 4,
        "compute": "SPX",
        "memory": "NPS1",
    }
    entry.update(fields)
    return entry


def write_state(path: Path, cards: list[dict[str, Any]], **top: Any) -> Path:
    path.write_text(json.dumps({"cards": cards, **top}))
    return path


def read_state(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def load_binding(rocm_path: Path) -> Any:
    """Build the fake into `rocm_path` and import the real binding over it (once per process: the binding
    keeps the library it loaded first)."""
    import sys

    loaded = sys.modules.get("amdsmi")
    if loaded is not None:
        return loaded
    build(rocm_path)
    os.environ["ROCM_PATH"] = str(rocm_path)
    import importlib

    return importlib.import_module("amdsmi")
