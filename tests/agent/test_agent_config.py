from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.agent.config import APPLICATION_XIDS, ConfigError, load_config


def test_precedence_flag_over_env_over_file(tmp_path: Path) -> None:
    file = tmp_path / "agent.yaml"
    file.write_text("node_name: from-file\nsplit: 2\nisolation: none\nreprobe_interval_s: 7\n")
    env = {"NODE_NAME": "from-env", "GPUPOOL_AGENT_SPLIT": "5", "GPUPOOL_AGENT_IGNORED_XIDS": "13, 31"}
    config = load_config(file, flags={"split": 8, "isolation": None}, env=env)
    assert config.node_name == "from-env"  # env beats file
    assert config.split == 8  # flag beats env
    assert config.isolation == "none"  # an unset flag (None) does not override
    assert config.reprobe_interval_s == 7.0
    assert config.ignored_xids == (13, 31)
    assert "split=8" in config.describe()


def test_defaults() -> None:
    config = load_config(env={"NODE_NAME": "n1"})
    assert (config.backend, config.split, config.isolation) == ("nvml", 10, "hook")
    assert config.ignored_xids == APPLICATION_XIDS
    assert str(config.kubelet_socket_path) == "/var/lib/kubelet/device-plugins/kubelet.sock"


@pytest.mark.parametrize(
    ("flags", "env", "message"),
    [
        ({}, {}, "node_name: Field required (set NODE_NAME or --node-name)"),
        ({"split": 0}, {"NODE_NAME": "n"}, "agent config split: Input should be greater than or equal to 1"),
        ({"backend": "fake"}, {"NODE_NAME": "n"}, "backend fake needs fake_file"),
        ({"isolation": "magic"}, {"NODE_NAME": "n"}, "agent config isolation: Input should be 'mps', 'hook' or 'none'"),
        ({}, {"NODE_NAME": "n", "GPUPOOL_AGENT_IGNORED_XIDS": "13,x"}, "GPUPOOL_AGENT_IGNORED_XIDS='13,x'"),
        ({"socket_name": "../evil"}, {"NODE_NAME": "n"}, "agent config socket_name"),
    ],
)
def test_errors_name_the_field(flags: dict[str, object], env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(flags=flags, env=env)
    assert message in str(err.value)


def test_bad_file(tmp_path: Path) -> None:
    file = tmp_path / "agent.yaml"
    file.write_text("- a\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(file, env={"NODE_NAME": "n"})


@pytest.mark.parametrize(
    ("isolation", "env", "runs"),
    [
        ("mps", {}, True),  # default: daemons where MPS is the default isolation
        ("hook", {}, False),
        ("hook", {"GPUPOOL_AGENT_MPS_DAEMONS": "true"}, True),  # a hook node that also serves MPS shares
        ("mps", {"GPUPOOL_AGENT_MPS_DAEMONS": "false"}, False),
    ],
)
def test_mps_daemons_follow_the_default_isolation_unless_set(isolation: str, env: dict[str, str], runs: bool) -> None:
    config = load_config(flags={"isolation": isolation}, env={"NODE_NAME": "n", **env})
    assert config.runs_mps_daemons is runs
