"""`gpupool hook path`: where the built interception library lies, or a clear refusal."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import gpupool.hook
from gpupool.cli import main


def test_hook_path_prints_the_built_library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = tmp_path / gpupool.hook.LIBRARY_NAME
    lib.write_bytes(b"\x7fELF")
    monkeypatch.setattr(gpupool.hook, "library_path", lambda: lib)
    result = CliRunner().invoke(main, ["hook", "path"])
    assert result.exit_code == 0
    assert result.output.strip() == str(lib)
    assert Path(result.output.strip()).is_absolute()


def test_hook_path_without_a_built_library_exits_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpupool.hook, "library_path", lambda: tmp_path / "missing.so")
    result = CliRunner().invoke(main, ["hook", "path"])
    assert result.exit_code == 2
    assert "missing" in result.output and "pip install" in result.output
    assert "Traceback" not in result.output


def test_the_default_path_is_inside_the_package() -> None:
    assert gpupool.hook.library_path().parent == Path(gpupool.hook.__file__).resolve().parent
