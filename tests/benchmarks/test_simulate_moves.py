"""benchmarks/simulate_moves.py: the defragmenter settings it parses, and a bad one refused with exit 2."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from gpupool.sim.replay import DefragPolicy

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "simulate_moves.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("simulate_moves_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["simulate_moves_bench"] = module
    spec.loader.exec_module(module)
    return module


sm = _load()


def test_defragmenter_settings_are_parsed() -> None:
    assert sm.parse_defrag("50:0.5:16,25:0:32:40") == [DefragPolicy(50, 0.5, 16), DefragPolicy(25, 0.0, 32, 40.0)]
    assert sm.parse_defrag("") == []


@pytest.mark.parametrize(("entry", "why"), [("50:0.5", "expected INTERVAL:THRESHOLD:MOVES[:GIB]"),
                                            ("0:0.5:16", "defragmenter: interval 0"),
                                            ("50:x:16", "could not convert")])
def test_a_bad_setting_exits_2_naming_it(entry: str, why: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        sm.parse_defrag(entry)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"--defrag {entry!r}: ") and why in err
