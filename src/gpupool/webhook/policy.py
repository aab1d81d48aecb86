"""Admission policies an administrator sets per namespace: which isolation modes pods may choose, which
one they get by default, and how strict the webhook is with what a container may bring.

A namespace picks its policy with a label (the chart's `webhook.admission.policyLabel`, by default
`gpupool.io/admission-policy=<name>`); the chart turns each policy into webhook entries whose
namespaceSelector matches that label and whose URL path names the policy (`/validate/<name>`), so the API
server, not the webhook, decides which namespace has which policy: the webhook needs no right to read
namespaces and never sees a stale copy of their labels. Namespaces without the label (or with a name no
policy has) get the default policy.

Isolation strength, weakest first: none < hook = mps < mig. `hook` and `mps` rank the same: each enforces
limits the other does not (MPS caps memory and SMs per client process in the driver but shares one
fault domain; the interception library caps each process's allocations in user space), and neither is
a security boundary. Only `mig` partitions the hardware.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from gpupool.api.isolation import IsolationMode
from gpupool.api.names import ANN_ISOLATION, DEFAULT_ISOLATION, ISOLATION_MODES

STRENGTH: Mapping[str, int] = {IsolationMode.NONE: 0, IsolationMode.HOOK: 1, IsolationMode.MPS: 1, IsolationMode.MIG: 2}
DEFAULT_POLICY = "default"

WeakerAction = Literal["refuse", "raise"]


def at_least_as_strong(mode: str) -> frozenset[str]:
    """Every isolation mode as strong as `mode` or stronger."""
    return frozenset(m for m in ISOLATION_MODES if STRENGTH[m] >= STRENGTH[mode])


@dataclass(frozen=True, slots=True)
class AdmissionPolicy:
    """One namespace policy. `allowed_isolation` empty = the default mode and every stronger one."""

    name: str = DEFAULT_POLICY
    default_isolation: str = DEFAULT_ISOLATION
    allowed_isolation: frozenset[str] = frozenset()
    # What a pod that asks for a mode weaker than the default gets: refused, or raised to the default by
    # the mutating webhook (with a warning that says so).
    weaker: WeakerAction = "refuse"
    # Strict namespaces refuse envFrom: the webhook cannot see what a ConfigMap or Secret will put into
    # the environment (e.g. NVIDIA_VISIBLE_DEVICES), so only explicit variables can be checked.
    strict: bool = False
    # Privileged containers, SYS_ADMIN/MKNOD, host mounts of /, /dev or /proc, hostPID/hostIPC: refused
    # unless the namespace runs node infrastructure that needs them.
    allow_host_access: bool = False
    # envFrom without a safe prefix (gpupool.webhook.forbidden.env_from_safe) is refused in every pod unless
    # the namespace's administrators vouch for its ConfigMaps and Secrets (who can write them can then
    # set NVIDIA_VISIBLE_DEVICES or GPUPOOL_* in its pods).
    allow_env_from: bool = False
    # Serve this namespace's GPU pods through DRA claims (gpupool.webhook.admission.to_claims): their
    # gpupool.io/* requests become a ResourceClaimTemplate of gpupool's classes, for clusters moving over.
    dra: bool = False
    problems: tuple[str, ...] = field(default=(), compare=False)

    @property
    def allowed(self) -> frozenset[str]:
        return self.allowed_isolation or at_least_as_strong(self.default_isolation)


def make_policy(
    name: str,
    default_isolation: str = DEFAULT_ISOLATION,
    allowed_isolation: tuple[str, ...] | frozenset[str] = (),
    weaker: str = "refuse",
    strict: bool = False,
    allow_host_access: bool = False,
    allow_env_from: bool = False,
    dra: bool = False,
) -> AdmissionPolicy:
    """Build a policy, raising ValueError that names the field when it is inconsistent."""
    unknown = sorted(set(allowed_isolation) - set(ISOLATION_MODES))
    if unknown:
        modes = ", ".join(ISOLATION_MODES)
        raise ValueError(f"policy {name}: allowed isolation {', '.join(unknown)} unknown (use {modes})")
    if default_isolation not in ISOLATION_MODES:
        raise ValueError(f"policy {name}: default isolation {default_isolation!r} unknown")
    if allowed_isolation and default_isolation not in allowed_isolation:
        raise ValueError(f"policy {name}: default isolation {default_isolation!r} is not among the allowed ones")
    if weaker not in ("refuse", "raise"):
        raise ValueError(f"policy {name}: weaker isolation must be 'refuse' or 'raise', not {weaker!r}")
    action: WeakerAction = "raise" if weaker == "raise" else "refuse"
    if strict and allow_env_from:
        raise ValueError(f"policy {name}: strict refuses every envFrom; allowEnvFrom contradicts it")
    if dra and default_isolation == IsolationMode.MIG:
        raise ValueError(f"policy {name}: dra serves isolation hook, mps and none; not the default mig")
    return AdmissionPolicy(name, default_isolation, frozenset(allowed_isolation), action, strict, allow_host_access,
                           allow_env_from, dra)


@dataclass(frozen=True, slots=True)
class IsolationVerdict:
    mode: str  # what the pod will run with
    error: str = ""  # non-empty = refuse
    raised_from: str = ""  # non-empty = the mutating webhook writes `mode` over this weaker choice


def judge_isolation(annotations: Mapping[str, object], policy: AdmissionPolicy, mutating: bool) -> IsolationVerdict:
    """The isolation a GPU pod gets under `policy`. Unknown names are the reader's error (parse_pod)."""
    raw = annotations.get(ANN_ISOLATION)
    chosen = str(raw).strip() if raw is not None else ""
    if not chosen:
        return IsolationVerdict(policy.default_isolation)
    if chosen not in STRENGTH or chosen in policy.allowed:
        return IsolationVerdict(chosen)
    allowed = ", ".join(m for m in ISOLATION_MODES if m in policy.allowed)
    weaker = STRENGTH[chosen] < STRENGTH[policy.default_isolation]
    if weaker and policy.weaker == "raise" and mutating:
        return IsolationVerdict(policy.default_isolation, raised_from=chosen)
    why = "weaker than this namespace's policy" if weaker else "not allowed by this namespace's policy"
    return IsolationVerdict(
        chosen,
        error=f"annotation {ANN_ISOLATION}={chosen!r}: {why} {policy.name!r} (allowed: {allowed}; "
        f"default: {policy.default_isolation})",
    )
