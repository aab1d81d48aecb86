"""The node-side half of the NVIDIA_VISIBLE_DEVICES defence: the agent reads the NVIDIA Container
Toolkit's config.toml at start and warns when any unprivileged pod may choose its GPUs by variable."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gpupool.agent.checks.toolkit_check import ENVVAR_KEY, check_toolkit, warn_if_unsafe

SAFE = f"""
disable-require = false
{ENVVAR_KEY} = false
accept-nvidia-visible-devices-as-volume-mounts = true

[nvidia-container-runtime]
mode = "auto"
"""


@pytest.mark.parametrize(
    ("text", "safe", "fragment"),
    [
        (SAFE, True, ""),
        (SAFE.replace(f"{ENVVAR_KEY} = false", f"{ENVVAR_KEY} = true"), False, f"{ENVVAR_KEY} is true"),
        # The toolkit's shipped file leaves the key commented out: the default (true) applies.
        (SAFE.replace(f"{ENVVAR_KEY} = false", f"#{ENVVAR_KEY} = false"), False, "not set (the toolkit's default"),
        # Under a table it is another key: the toolkit reads it at the top level only.
        ("[nvidia-container-runtime]\n" + f"{ENVVAR_KEY} = false\n", False, "not set"),
        ("this is = = not toml", False, "not valid TOML"),
    ],
    ids=["false", "true", "commented-out", "wrong-table", "broken"],
)
def test_toolkit_setting_is_judged(tmp_path: Path, text: str, safe: bool, fragment: str) -> None:
    path = tmp_path / "config.toml"
    path.write_text(text)
    result = check_toolkit(path, cdi=True)
    assert result.found and result.safe is safe
    assert all(fragment in p for p in result.problems) and (safe or result.problems)


def test_safe_setting_needs_the_agents_cdi_mode(tmp_path: Path) -> None:
    # With the variable ignored for unprivileged containers, the agent's own NVIDIA_VISIBLE_DEVICES is
    # ignored too: without CDI, gpupool's pods would get no GPU.
    path = tmp_path / "config.toml"
    path.write_text(SAFE)
    (problem,) = check_toolkit(path, cdi=False).problems
    assert "GPU pods would start without their GPUs; run the agent with --cdi" in problem


def test_warning_is_logged_and_a_missing_file_is_not_an_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "config.toml"
    path.write_text(f"{ENVVAR_KEY} = true\n")
    with caplog.at_level(logging.INFO, logger="gpupool.agent.toolkit"):
        warn_if_unsafe(path)
        missing = warn_if_unsafe(tmp_path / "absent.toml")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "NVIDIA_VISIBLE_DEVICES=all gets every GPU" in warnings[0].getMessage()
    assert not missing.found and not missing.problems
    assert any("not visible to the agent" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)
