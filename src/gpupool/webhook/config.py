"""The webhook's one configuration object, loaded in one place: flag > environment > file > default.

Environment variables are named GPUPOOL_WEBHOOK_<FIELD> (e.g. GPUPOOL_WEBHOOK_PORT); the file is YAML
with the field names as keys. Nothing else in the webhook reads the environment.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpupool.api.names import ISOLATION_MODES

ENV_PREFIX = "GPUPOOL_WEBHOOK_"
CONFIG_VERSION = "webhook.gpupool.io/v1"


class ConfigError(ValueError):
    pass


class WebhookConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    apiVersion: str = CONFIG_VERSION  # noqa: N815 (the versioned-config key, as in Kubernetes)
    host: str = "0.0.0.0"
    port: int = Field(default=8443, ge=1, le=65535)
    cert_file: Path | None = None  # PEM serving certificate (chain); required to serve
    key_file: Path | None = None
    # How often (seconds) the certificate files are checked for a renewal (cert-manager rewrites them).
    cert_reload_s: float = Field(default=30.0, gt=0)
    scheduler_name: str = Field(default="gpupool-scheduler", min_length=1)
    # Isolation written into pods that do not choose one; "" leaves them without the annotation.
    default_isolation: str = "hook"
    # Users (e.g. system:serviceaccount:<ns>:<scheduler>) allowed to write gpupool.io/allocation.
    trusted_users: tuple[str, ...] = ()
    # A privileged container sees every GPU of the node, which defeats sharing: refused unless allowed.
    allow_privileged: bool = False
    # An AdmissionReview carries the object and the old object (each at most ~1.5 MiB in etcd).
    max_body_bytes: int = Field(default=3 * 1024 * 1024, ge=1024)
    # Read node inventories from the cluster (to refuse memory larger than any GPU); off for local runs.
    watch_inventory: bool = True
    kubeconfig: str | None = None  # None = in-cluster service account
    context: str | None = None
    log_level: str = "info"

    @field_validator("default_isolation")
    @classmethod
    def _isolation(cls, v: str) -> str:
        if v and v not in ISOLATION_MODES:
            raise ValueError(f"must be one of {', '.join(ISOLATION_MODES)} or empty")
        return v

    @field_validator("apiVersion")
    @classmethod
    def _version(cls, v: str) -> str:
        if v != CONFIG_VERSION:
            raise ValueError(f"unsupported config version {v!r}; this webhook reads {CONFIG_VERSION}")
        return v

    @field_validator("log_level")
    @classmethod
    def _level(cls, v: str) -> str:
        if v.lower() not in ("critical", "error", "warning", "info", "debug"):
            raise ValueError("use one of critical, error, warning, info, debug")
        return v.lower()

    def summary(self) -> str:
        """One line for the start-up log (no secrets here: only file paths)."""
        fields = self.model_dump(mode="json")
        return " ".join(f"{k}={v}" for k, v in fields.items())


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in WebhookConfig.model_fields:
        raw = env.get(ENV_PREFIX + name.upper())
        if raw is None:
            continue
        # Lists come as comma-separated text; pydantic converts the rest from strings itself.
        out[name] = tuple(p.strip() for p in raw.split(",") if p.strip()) if name == "trusted_users" else raw
    return out


def load_config(flags: Mapping[str, Any], env: Mapping[str, str], file: Path | None = None) -> WebhookConfig:
    """Merge the sources (None in `flags` means "not given") and validate once."""
    merged: dict[str, Any] = {}
    if file is not None:
        try:
            loaded = yaml.safe_load(file.read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError(f"config file {file}: {e}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {file}: expected a mapping of settings, got {type(loaded).__name__}")
        merged.update(loaded)
    merged.update(_from_env(env))
    merged.update({k: v for k, v in flags.items() if v is not None and v != ()})
    try:
        return WebhookConfig(**merged)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'config'}: {err['msg']}" for err in e.errors())
        raise ConfigError(f"invalid webhook configuration: {problems}") from None
