"""`gpupool agent` as a user runs it: bad input gets a clear message and the right exit code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpupool.cli import main

FIXTURE = Path(__file__).parent / "fixtures_two_gpus.yaml"


def test_dry_run_prints_what_would_be_advertised() -> None:
    result = CliRunner().invoke(
        main, ["agent", "--backend", "fake", "--fake-file", str(FIXTURE), "--split", "3", "--dry-run"],
        env={"NODE_NAME": "n7"},
    )
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output[result.output.index("{"):])
    assert plan["node"] == "n7" and plan["resource"] == "gpupool.io/gpu"
    assert plan["slots"] == ["GPU-f-0::0", "GPU-f-0::1", "GPU-f-0::2", "GPU-f-1::0", "GPU-f-1::1", "GPU-f-1::2"]
    assert plan["labels"]["gpupool.io/gpu.count"] == "2"
    assert [g["uuid"] for g in plan["inventory"]["gpus"]] == ["GPU-f-0", "GPU-f-1"]


def test_missing_node_name_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["agent", "--dry-run"], env={"NODE_NAME": ""})
    assert result.exit_code == 2
    assert "node_name: Field required (set NODE_NAME or --node-name)" in result.output


def test_malformed_fake_file_names_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "gpus.yaml"
    bad.write_text("gpus:\n  - uuid: G-1\n    model: m\n    memory_mib: zero\n")
    result = CliRunner().invoke(
        main, ["agent", "--node-name", "n", "--backend", "fake", "--fake-file", str(bad), "--dry-run"]
    )
    assert result.exit_code == 1
    assert f"fake GPU file {bad}: gpus[0].memory_mib: Input should be a valid integer" in result.output


def test_node_state_another_agent_holds_is_a_clear_error_not_a_traceback(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Agent.start raises NodeStateBusy (or CheckpointError for a damaged checkpoint) before it serves; the
    command prints it as an error (exit 1). The agent's own part is tests/agent/state/test_agent_node_state.py."""
    from gpupool.agent.state.node_state import NodeStateBusy
    from gpupool.commands import agent as command

    async def busy(config: object, backend: object) -> None:
        raise NodeStateBusy("another gpupool agent (pid 4242) holds the node state in /x")

    monkeypatch.setattr(command, "_run", busy)
    result = CliRunner().invoke(
        main, ["agent", "--node-name", "n", "--backend", "fake", "--fake-file", str(FIXTURE)],
        env={"GPUPOOL_AGENT_HOOK_ROOT": str(tmp_path / "hook")},
    )
    assert result.exit_code == 1, result.output
    assert "Error: another gpupool agent (pid 4242) holds the node state in /x" in result.output
    assert "Traceback" not in result.output
