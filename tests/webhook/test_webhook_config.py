"""The webhook's configuration: flag > environment > file > default, validated once, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.webhook.config import ConfigError, load_config


def test_defaults() -> None:
    config = load_config(None, {}, {})
    assert (config.port, config.scheduler_name, config.default_isolation) == (8443, "gpupool-scheduler", "hook")
    assert config.allow_privileged is False and config.trusted_users == ()


def test_precedence_flag_over_env_over_file(tmp_path: Path) -> None:
    file = tmp_path / "webhook.yaml"
    file.write_text("port: 9000\nscheduler_name: from-file\ndefault_isolation: none\n")
    env = {"GPUPOOL_WEBHOOK_PORT": "9100", "GPUPOOL_WEBHOOK_TRUSTED_USERS": "system:serviceaccount:a:b, u2"}
    config = load_config(file, {"port": 9200, "scheduler_name": None}, env)
    assert config.port == 9200  # flag
    assert config.scheduler_name == "from-file"  # flag not given, no env: file
    assert config.default_isolation == "none"
    assert config.trusted_users == ("system:serviceaccount:a:b", "u2")  # env, comma-separated
    assert load_config(file, {}, env).port == 9100  # env over file


@pytest.mark.parametrize(
    ("flags", "env", "message"),
    [
        ({"default_isolation": "vfio"}, {}, "default_isolation: Value error, must be one of mps, hook, mig, none"),
        ({}, {"GPUPOOL_WEBHOOK_PORT": "http"}, "port: Input should be a valid integer"),
        ({"port": 70000}, {}, "port: Input should be less than or equal to 65535"),
        ({"log_level": "loud"}, {}, "log_level"),
        ({"max_body_bytes": 10}, {}, "max_body_bytes"),
    ],
)
def test_bad_values_name_the_field(flags: dict[str, object], env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match="^webhook config ") as e:
        load_config(None, flags, env)
    assert message in str(e.value)


def test_bad_file(tmp_path: Path) -> None:
    file = tmp_path / "w.yaml"
    file.write_text("prot: 1\n")
    with pytest.raises(ConfigError, match="prot: Extra inputs are not permitted"):
        load_config(file, {}, {})
    file.write_text("- a list\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(file, {}, {})
    file.write_text("apiVersion: webhook.gpupool.io/v9\n")
    with pytest.raises(ConfigError, match="unsupported config version"):
        load_config(file, {}, {})
