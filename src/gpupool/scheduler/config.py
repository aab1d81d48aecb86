"""The scheduler service's one configuration object: defaults < file (YAML) < environment < flags, loaded by
the services' one loader (gpupool.api.config) from GPUPOOL_SCHEDULER_<FIELD> variables."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpupool.api.config import ConfigError, ConfigLoader
from gpupool.core.policies import DEFAULT_POLICY, policy_names

ENV_PREFIX = "GPUPOOL_SCHEDULER_"
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
DEFAULT_NAMESPACE = "gpupool-system"  # the chart's documented install namespace

__all__ = ["ENV_PREFIX", "LOADER", "ConfigError", "SchedulerConfig", "load_config"]


class SchedulerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = 1
    host: str = "127.0.0.1"  # kube-scheduler calls the extender over loopback (same pod) by default
    port: int = Field(default=8888, ge=0, le=65535)  # 0 = any free port
    default_policy: str = DEFAULT_POLICY
    assume_timeout_s: float = Field(default=30.0, gt=0)  # assumed entry forgotten if not confirmed
    nominate_timeout_s: float = Field(default=10.0, gt=0)  # reservation made at prioritize, awaiting bind
    # A pod bound to a node holds it (no other GPU pod is bound there) until its device allocation, or
    # at most this long (gpupool.scheduler.busy).
    lock_timeout_s: float = Field(default=300.0, gt=0)
    lock_wait_s: float = Field(default=5.0, ge=0)  # how long a bind waits for such a node
    expire_interval_s: float = Field(default=1.0, gt=0)
    # Prioritize passes over nodes with a pod awaiting device allocation when another node fits: bursts
    # spread instead of queueing on one node (gpupool.scheduler.busy).
    avoid_busy_nodes: bool = True
    # /filter answers a GPU pod that states no soft scheduling preference with the policy's node alone:
    # kube-scheduler then skips its scoring and /prioritize (gpupool.scheduler.extender). Off: filter
    # answers every feasible node and the pick is made in /prioritize, weighed with kube-scheduler's scores.
    decide_in_filter: bool = True
    max_body_bytes: int = Field(default=8 * 1024 * 1024, gt=0)  # larger request bodies get 413
    # Who may call the extender (checked by gpupool.scheduler.auth): "none" is allowed on a loopback host
    # only; "tls" serves HTTPS and requires a client certificate signed by tls_client_ca_file (what
    # kube-scheduler's extender tlsConfig sends); "token" requires "Authorization: Bearer <token_file>".
    auth: Literal["none", "tls", "token"] = "none"
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_client_ca_file: str | None = None
    token_file: str | None = None  # a mounted Secret; read at start
    # A slow client must not hold a connection: headers within header_timeout_s, the body within
    # body_timeout_s of the headers, else the connection is closed (408 for a late body).
    header_timeout_s: float = Field(default=10.0, gt=0)
    body_timeout_s: float = Field(default=10.0, gt=0)
    # Only pods with this spec.schedulerName are placed or bound (and it is the source of Events).
    scheduler_name: str = "gpupool-scheduler"
    # Trust boundary (gpupool.scheduler.pods, pending, framework.plugins.nominate): a pod missing from the
    # watch cache is read once within this time; at most this many nominations at once; pending pods kept
    # for the pool views, each for this long after its last filter.
    pod_lookup_timeout_s: float = Field(default=2.0, gt=0)
    max_nominations: int = Field(default=512, ge=0)
    # A pod that does not bind holds reservations made by filter/prioritize for at most this long in any
    # window of the second (framework.plugins.nominate; docs/scheduler.md, "Reservations").
    nomination_budget_s: float = Field(default=10.0, gt=0)
    nomination_budget_window_s: float = Field(default=300.0, gt=0)
    max_pending_pods: int = Field(default=10_000, gt=0)
    pending_ttl_s: float = Field(default=900.0, gt=0)
    # Team queues (GPUQueue objects; off while none exists): namespaces without the gpupool.io/queue label
    # join this queue.
    default_queue: str = Field(default="default", min_length=1, max_length=253)
    queue_status_interval_s: float = Field(default=5.0, gt=0)  # how often GPUQueue status is brought up to date
    # Cluster access (the `gpupool scheduler` command).
    kubeconfig: str | None = None  # None = in-cluster config, else this file
    context: str | None = None
    # Leader election through a coordination.k8s.io Lease.
    leader_elect: bool = True
    # Place the DRA claims of pods the webhook gated (scheduler/claims.py; chart: dra.enabled with
    # dra.placement.enabled). Off, gated pods are left alone: one scheduler per cluster does this.
    dra_placement: bool = False
    lease_namespace: str = "kube-system"
    # Where gpupool's own ConfigMaps live (the remote shares' moves, gpupool.api.moves): the chart passes its
    # release namespace; unset, the namespace this pod runs in (its service account's), else gpupool-system.
    gpupool_namespace: str | None = None
    # Moves of remote shares (gpupool.scheduler.moves): the leader cancels a move still unfinished past its
    # deadline, looking every move_check_s; an entry without a deadline of its own gets move_deadline_s after
    # its request.
    move_deadline_s: float = Field(default=600.0, gt=0)
    move_check_s: float = Field(default=10.0, gt=0)
    # A pending remote claim that fits nowhere may have room made for it by moving at most this many remote
    # shares, the fewest GiB moved (gpupool.scheduler.moves.MakeRoom); 0: never (the default).
    make_room_moves: int = Field(default=0, ge=0, le=8)
    # The background defragmenter (gpupool.scheduler.defrag), on the leader: every defrag_interval_s, when
    # more than defrag_threshold of the GPU servers' free compute is off whole free GPUs, at most
    # defrag_moves moves of remote shares (0: off, the default) and defrag_gib GiB moved (0: no limit) that
    # empty GPUs into fuller ones.
    defrag_moves: int = Field(default=0, ge=0, le=64)
    defrag_threshold: float = Field(default=0.5, ge=0, le=1)
    defrag_interval_s: float = Field(default=60.0, gt=0)
    defrag_gib: float = Field(default=0.0, ge=0)
    lease_name: str = "gpupool-scheduler"
    identity: str = Field(default_factory=lambda: os.uname().nodename + f"-{os.getpid()}")
    lease_duration_s: float = Field(default=15.0, gt=0)
    renew_deadline_s: float = Field(default=10.0, gt=0)
    retry_period_s: float = Field(default=2.0, gt=0)

    @field_validator("default_policy")
    @classmethod
    def _known_policy(cls, v: str) -> str:
        if v not in policy_names():
            raise ValueError(f"unknown policy {v!r}; valid: {', '.join(policy_names())}")
        return v

    def own_namespace(self) -> str:
        if self.gpupool_namespace:
            return self.gpupool_namespace
        try:
            return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or DEFAULT_NAMESPACE
        except OSError:
            return DEFAULT_NAMESPACE

    def describe(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.model_dump().items())


LOADER = ConfigLoader(SchedulerConfig, ENV_PREFIX, "scheduler")
# flag > env > file > defaults, validated once; errors (ConfigError) name the field and its source.
load_config = LOADER.load
