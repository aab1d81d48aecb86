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

    async def busy(config: object, backend: object, vendors: object) -> None:
        raise NodeStateBusy("another gpupool agent (pid 4242) holds the node state in /x")

    monkeypatch.setattr(command, "_run", busy)
    result = CliRunner().invoke(
        main, ["agent", "--node-name", "n", "--backend", "fake", "--fake-file", str(FIXTURE)],
        env={"GPUPOOL_AGENT_HOOK_ROOT": str(tmp_path / "hook")},
    )
    assert result.exit_code == 1, result.output
    assert "Error: another gpupool agent (pid 4242) holds the node state in /x" in result.output
    assert "Traceback" not in result.output


# --- other vendors' backends (issue 40) ---------------------------------------------------------------------
def test_dcmi_backend_discovers_ascend_chips_and_hands_the_agent_their_container_devices(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpupool.agent.config import AgentConfig
    from gpupool.agent.devices.discovery import DeviceInfo
    from gpupool.agent.isolation.vendors import devices_source
    from gpupool.commands import agent as command
    from tests.agent.fakes import ascend as dcmi_fake

    state = dcmi_fake.write_state(tmp_path / "dcmi.json", [{"card_id": 0, "chips": [dcmi_fake.card_910b(2)]}])
    monkeypatch.setenv(dcmi_fake.STATE_ENV, str(state))
    monkeypatch.setenv("GPUPOOL_DCMI_LIBRARY", str(dcmi_fake.library()))
    result = CliRunner().invoke(main, ["agent", "--node-name", "n", "--backend", "dcmi", "--dry-run"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output[result.output.index("{"):])
    assert [(g["model"], g["vendor"]) for g in plan["inventory"]["gpus"]] == [("Ascend910B", "ascend")]

    handed: list[object] = []  # what the command gives the Agent it would run (the Agent itself is not started)

    async def run(config: object, backend: object, vendors: object) -> None:
        handed.append(vendors)

    monkeypatch.setattr(command, "_run", run)
    result = CliRunner().invoke(main, ["agent", "--node-name", "n", "--backend", "dcmi"],
                                env={"GPUPOOL_AGENT_HOOK_ROOT": str(tmp_path / "hook")})
    assert result.exit_code == 0, result.output
    [vendors] = handed
    assert isinstance(vendors, dict) and set(vendors) == {"ascend"}
    source = devices_source(AgentConfig(node_name="n", backend="dcmi"), "ascend", vendors)
    assert source is not None
    chip = DeviceInfo(uuid=plan["inventory"]["gpus"][0]["uuid"], index=0, model="Ascend910B", memory_mib=1,
                      vendor="ascend")
    assert source.container_devices(chip).env == {"ASCEND_VISIBLE_DEVICES": "2"}  # physical id 2


def test_dcmi_backend_without_the_library_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPOOL_DCMI_LIBRARY", str(tmp_path / "libdcmi.so"))
    result = CliRunner().invoke(main, ["agent", "--node-name", "n", "--backend", "dcmi", "--dry-run"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "the Ascend DCMI library (libdcmi.so) cannot be loaded" in result.output


def test_amdsmi_backend_discovers_amd_cards_through_the_binding(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.agent.fakes.amd import amd_fake

    amd_fake.load_binding(tmp_path / "rocm")
    state = amd_fake.write_state(tmp_path / "amd.json", [amd_fake.card("MI300X", 0)])
    monkeypatch.setenv(amd_fake.STATE_ENV, str(state))
    result = CliRunner().invoke(main, ["agent", "--node-name", "n", "--backend", "amdsmi", "--dry-run"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output[result.output.index("{"):])
    assert [(g["model"], g["vendor"]) for g in plan["inventory"]["gpus"]] == [("MI300X", "amd")]


def test_an_unknown_backend_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["agent", "--node-name", "n", "--backend", "rocm", "--dry-run"])
    assert result.exit_code == 2 and "'nvml', 'amdsmi', 'dcmi', 'fake'" in result.output
