"""The webhook's one configuration object, loaded by the services' one loader (gpupool.api.config):
flag > environment > file > default.

Environment variables are named GPUPOOL_WEBHOOK_<FIELD> (e.g. GPUPOOL_WEBHOOK_PORT); the file is YAML
with the field names as keys. Lists in the environment are comma-separated; `policies` is JSON (the chart
writes it with toJson). Nothing else in the webhook reads the environment.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpupool.api.config import ConfigError, ConfigLoader
from gpupool.api.isolation import IsolationMode
from gpupool.api.names import ISOLATION_MODES
from gpupool.webhook.admission import Settings
from gpupool.webhook.policy import DEFAULT_POLICY, AdmissionPolicy, make_policy

ENV_PREFIX = "GPUPOOL_WEBHOOK_"
_POLICY_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
CONFIG_VERSION = "webhook.gpupool.io/v1"

__all__ = ["CONFIG_VERSION", "ENV_PREFIX", "LOADER", "ConfigError", "PolicyConfig", "WebhookConfig", "load_config"]


class PolicyConfig(BaseModel):
    """One namespace admission policy (see gpupool.webhook.policy)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    default_isolation: str = IsolationMode.HOOK.value
    allowed_isolation: tuple[str, ...] = ()  # empty = the default and every stronger mode
    weaker_isolation: Literal["refuse", "raise"] = "refuse"
    strict: bool = False
    allow_host_access: bool = False
    allow_env_from: bool = False  # envFrom without a safe prefix (gpupool.webhook.forbidden)
    dra: bool = False  # GPU pods of this policy's namespaces are served through DRA claims (docs/claims.md)

    def build(self, name: str) -> AdmissionPolicy:
        return make_policy(name, self.default_isolation, self.allowed_isolation, self.weaker_isolation,
                           self.strict, self.allow_host_access, self.allow_env_from, self.dra)

    @model_validator(mode="after")
    def _consistent(self) -> PolicyConfig:
        self.build("this")  # raises ValueError naming what is inconsistent
        return self


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
    default_isolation: str = IsolationMode.HOOK.value
    # Users (e.g. system:serviceaccount:<ns>:<scheduler>) allowed to write gpupool.io/allocation.
    trusted_users: tuple[str, ...] = ()
    # A privileged container sees every GPU of the node, which defeats sharing: refused unless allowed.
    # (The default policy's host access: privileged, SYS_ADMIN/MKNOD, host mounts of /, /dev, /proc.)
    allow_privileged: bool = False
    # The default admission policy (namespaces without a policy label): isolation modes pods may choose
    # (empty = default_isolation and every stronger one), what a weaker choice gets, strict envFrom.
    allowed_isolation: tuple[str, ...] = ()
    weaker_isolation: Literal["refuse", "raise"] = "refuse"
    strict: bool = False
    allow_env_from: bool = False  # envFrom without a safe prefix (gpupool.webhook.forbidden)
    # The default policy's `dra`: GPU pods of every namespace without a policy label are served through DRA
    # claims (the cluster moved over at once; a named policy without `dra` keeps the device plugin there).
    dra: bool = False
    # DRA: put the scheduling gate gpu.gpupool.io/allocate on new pods with ResourceClaims, so that gpupool
    # places their claims (gpupool.scheduler.claims; the chart sends only pods of the namespaces it selects).
    dra_placement: bool = False
    # Named policies, picked per namespace by label through the webhook path /validate/<name>.
    policies: dict[str, PolicyConfig] = Field(default_factory=dict)
    # What one caller may hold (gpupool.scheduler.server.ConnectionLimits): the TLS handshake and the request
    # headers within header_timeout_s, the body within body_timeout_s of them; an idle connection closed
    # after keep_alive_s (the API server reuses its connections); at most max_connections open, at most
    # max_connections_per_peer from one address. The NetworkPolicy admits only the API server besides.
    header_timeout_s: float = Field(default=10.0, gt=0)
    body_timeout_s: float = Field(default=10.0, gt=0)
    keep_alive_s: int = Field(default=15, ge=1)
    max_connections: int = Field(default=1024, ge=1)
    max_connections_per_peer: int = Field(default=256, ge=1)
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

    @field_validator("policies")
    @classmethod
    def _policy_names(cls, v: dict[str, PolicyConfig]) -> dict[str, PolicyConfig]:
        for name in v:
            # The name is a URL path segment, a label value and part of a webhook's DNS name: an RFC 1123
            # label satisfies all three (the chart's schema has the same pattern).
            if not _POLICY_NAME.fullmatch(name):
                raise ValueError(f"policy name {name!r}: use up to 63 lower-case letters, digits and '-'")
            if name == DEFAULT_POLICY:
                raise ValueError(f"policy name {name!r} is the built-in default policy; set its fields at top level")
        return v

    @model_validator(mode="after")
    def _default_policy(self) -> WebhookConfig:
        self.default_policy()
        return self

    def default_policy(self) -> AdmissionPolicy:
        return make_policy(DEFAULT_POLICY, self.default_isolation or IsolationMode.HOOK.value, self.allowed_isolation,
                           self.weaker_isolation, self.strict, self.allow_privileged, self.allow_env_from, self.dra)

    def settings(self) -> Settings:
        """The admission settings this configuration describes."""
        return Settings(
            scheduler_name=self.scheduler_name,
            default_isolation=self.default_isolation,
            trusted_users=frozenset(self.trusted_users),
            allow_privileged=self.allow_privileged,
            dra_placement=self.dra_placement,
            default_policy=self.default_policy(),
            policies={name: p.build(name) for name, p in self.policies.items()},
        )

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


LOADER = ConfigLoader(WebhookConfig, ENV_PREFIX, "webhook")


load_config = LOADER.load
