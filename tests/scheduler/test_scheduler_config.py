"""Configuration precedence and validation of the scheduler service, and the command's error path."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from gpupool.commands.scheduler import scheduler
from gpupool.scheduler.config import ConfigError, load_config


def test_flag_beats_env_beats_file(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("port: 9000\ndefault_policy: random\nlock_wait_s: 1\n")
    env = {"GPUPOOL_SCHEDULER_PORT": "9100", "GPUPOOL_SCHEDULER_LOCK_WAIT_S": "2.5"}
    cfg = load_config(f, {"port": 9200, "host": None}, env)
    assert cfg.port == 9200  # flag
    assert cfg.lock_wait_s == 2.5  # env over file
    assert cfg.default_policy == "random"  # file
    assert cfg.host == "127.0.0.1"  # default (a None flag does not count)


def test_bad_values_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match="default_policy"):
        load_config(None, {"default_policy": "nope"}, {})
    with pytest.raises(ConfigError, match="port"):
        load_config(None, {}, {"GPUPOOL_SCHEDULER_PORT": "-1"})
    f = tmp_path / "c.yaml"
    f.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(f, {}, {})
    f.write_text("unknown_key: 1")
    with pytest.raises(ConfigError, match="unknown_key"):
        load_config(f, {}, {})


def test_command_reports_config_errors_as_usage_errors(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("assume_timeout_s: -5\n")
    result = CliRunner().invoke(scheduler, ["--config", str(f)])
    assert result.exit_code == 2 and "assume_timeout_s" in result.output


def test_command_exits_with_the_reason_when_the_api_server_is_unreachable(tmp_path):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
    )
    result = CliRunner().invoke(scheduler, ["--kubeconfig", str(kubeconfig), "--no-leader-elect", "--port", "0"])
    assert result.exit_code == 1
    assert "cannot start: listing nodes and pods from the API server failed" in result.output
