"""The suite's skip rule (tests/conftest.py): every kind of skip, and an xfail, fails a run; GPUPOOL_ALLOW_SKIPS=1
turns it back into a skip. Checked by running pytest on a small test file with the rule loaded as a plugin."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SKIPPING = '''
import pytest

def test_skip_call():
    pytest.skip("no frobnicator")

@pytest.mark.skipif(True, reason="marked")
def test_skipif():
    pass

@pytest.mark.xfail(reason="known bug")
def test_xfail():
    assert False

@pytest.fixture
def needs():
    pytest.skip("fixture skip")

def test_fixture_skip(needs):
    pass

def test_runs():
    pass
'''
SKIPPED_MODULE = 'import pytest\npytest.importorskip("no_such_module_for_the_skip_rule")\n'


def _pytest(tmp_path: Path, files: dict[str, str], allow: str | None) -> subprocess.CompletedProcess[str]:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "GPUPOOL_ALLOW_SKIPS"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    if allow is not None:
        env["GPUPOOL_ALLOW_SKIPS"] = allow
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-c", os.devnull,
         "--rootdir", str(tmp_path), "-rA", *files],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("allow", [None, "0", "yes"])
def test_every_kind_of_skip_fails_the_run_and_says_what_was_missing(tmp_path: Path, allow: str | None) -> None:
    done = _pytest(tmp_path, {"test_skipping.py": SKIPPING}, allow)
    assert done.returncode == 1, done.stdout
    assert "2 failed, 1 passed, 2 errors" in done.stdout, done.stdout
    for reason in ("no frobnicator", "marked", "xfail: known bug", "fixture skip"):
        assert f"({'Skipped: ' if 'xfail' not in reason else ''}{reason}), and a skipped test fails the run" \
            in done.stdout, done.stdout
    assert "GPUPOOL_ALLOW_SKIPS=1" in done.stdout


def test_a_module_skipped_at_collection_fails_the_run(tmp_path: Path) -> None:
    done = _pytest(tmp_path, {"test_skipped_module.py": SKIPPED_MODULE}, None)
    assert done.returncode != 0, done.stdout
    assert "no_such_module_for_the_skip_rule" in done.stdout and "a skipped test fails the run" in done.stdout


def test_gpupool_allow_skips_1_lets_a_developer_skip(tmp_path: Path) -> None:
    done = _pytest(tmp_path, {"test_skipping.py": SKIPPING, "test_skipped_module.py": SKIPPED_MODULE}, "1")
    assert done.returncode == 0, done.stdout
    assert "1 passed, 4 skipped, 1 xfailed" in done.stdout, done.stdout
