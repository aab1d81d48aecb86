"""The fake DCMI library (dcmi_fake.h) for the Ascend adapter's tests: build it, write its state file, read it back.

The library is compiled once per test process with the system C compiler, as tests/native builds its fakes.
Tests point FAKE_DCMI_STATE at a state file of their own; `card_910b` / `card_310p` give the documented
defaults (training card: 32 AI Cores, 64 GiB HBM, 14 AI CPUs; 310P: 8 AI Cores, 24 GiB DDR, 7 AI CPUs).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CC_FLAGS = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared"]
STATE_ENV = "FAKE_DCMI_STATE"


def have_cc() -> bool:
    return shutil.which(os.environ.get("CC", "cc")) is not None


def build(out: Path) -> Path:
    """Compile libdcmi.so into `out`; returns its path. No compiler fails the test (a skip would fail the run
    anyway, tests/conftest.py), as in tests/native."""
    assert have_cc(), "no C compiler: the Ascend tests build the fake DCMI library with it (set CC)"
    out.mkdir(parents=True, exist_ok=True)
    library = out / "libdcmi.so"
    sources = [str(HERE / "fake_dcmi.c"), str(HERE / "fake_json.c")]
    subprocess.run([os.environ.get("CC", "cc"), *CC_FLAGS, "-o", str(library), *sources],
                   check=True, capture_output=True, text=True)
    return library


@functools.cache
def library() -> Path:
    """The library built once for this process (in a temporary folder that lives as long as the process)."""
    return build(Path(tempfile.mkdtemp(prefix="fake-dcmi-")))


def card_910b(phy_id: int = 0, **overrides: Any) -> dict[str, Any]:
    chip = {"chip_name": "910B", "phy_id": phy_id, "logic_id": phy_id, "aicore": 32, "aicpu": 14,
            "memory_mib": 65536, "pci": [0, 0xC1 + phy_id, 0, 0], "dynamic_vnpu": True}
    return {**chip, **overrides}


def card_310p(phy_id: int = 0, **overrides: Any) -> dict[str, Any]:
    chip = {"chip_name": "310P3", "phy_id": phy_id, "logic_id": phy_id, "aicore": 8, "aicpu": 7,
            "memory_mib": 24576, "pci": [0, 0x01 + phy_id, 0, 0]}
    return {**chip, **overrides}


def write_state(path: Path, cards: list[dict[str, Any]], **top: Any) -> Path:
    """`cards`: [{"card_id": n, "chips": [chip, ...]}, ...] (dcmi_fake.h's schema)."""
    path.write_text(json.dumps({"cards": cards, **top}))
    return path


def read_state(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def chip_state(path: Path, card_id: int, device_id: int = 0) -> dict[str, Any]:
    for card in read_state(path)["cards"]:
        if card["card_id"] == card_id:
            chip: dict[str, Any] = card["chips"][device_id]
            return chip
    raise KeyError(card_id)


def update_chip(path: Path, card_id: int, device_id: int = 0, **changes: Any) -> None:
    """Change one chip's state as the hardware would (health, errors, processes, in_use vNPUs)."""
    data = read_state(path)
    for card in data["cards"]:
        if card["card_id"] == card_id:
            card["chips"][device_id].update(changes)
    path.write_text(json.dumps(data))
