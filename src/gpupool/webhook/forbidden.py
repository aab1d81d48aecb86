"""What no container may bring into a pod, GPU pod or not: the ways around the pool's grant.

Every check looks at every container: `containers`, `initContainers` (sidecars included) and
`ephemeralContainers` (added later through the `pods/ephemeralcontainers` subresource, e.g. by
`kubectl debug`). Why each one:

* Environment variables the NVIDIA container runtime or gpupool interpret. With the toolkit's default
  `accept-nvidia-visible-devices-envvar-when-unprivileged = true`, `NVIDIA_VISIBLE_DEVICES=all` in *any*
  pod on a GPU node hands it every GPU; `GPUPOOL_*`, `CUDA_MPS_*` and `LD_PRELOAD` would override the
  limits and the interception library the agent hands the container; `CUDA_VISIBLE_DEVICES` re-maps
  which GPU a process uses.
* `envFrom`: a ConfigMap or Secret can carry any of those names, and the webhook cannot see its content
  (it may not exist yet, and it can change after admission). Refused in every pod, GPU pod or not (a pod
  without GPUs that lands on a GPU node gets every GPU from `NVIDIA_VISIBLE_DEVICES=all` where the toolkit
  accepts the variable from unprivileged containers), unless every entry has a `prefix` no key can complete
  into a refused name (`APP_` is safe; none, `NVIDIA_`, `G` or `LD_` are not), or the namespace's policy
  sets allowEnvFrom. Strict namespaces: refused in every pod whatever the prefix.
* hostPath volumes at `/`, `/dev` or `/proc`, or below them, after normalising the path (`//dev`, `/./dev`,
  `/dev/../dev`, trailing slashes): the device files of every GPU, or the host's root through
  `/proc/1/root`.
* `privileged: true`, capabilities `SYS_ADMIN`, `MKNOD` or `ALL` (with or without `CAP_`, any case): a
  privileged container sees every device; MKNOD creates device nodes; SYS_ADMIN mounts.
* `hostPID` / `hostIPC` for GPU pods: the host's processes (including other tenants' CUDA processes and
  the MPS control daemons) and their shared memory.
* GPU pods, host mounts of the state gpupool and the runtime keep (RUNTIME_STATE: the kubelet's
  device-plugin, plugin and pod-resources directories, where the agent's socket and Allocate checkpoint
  live; the container runtimes' sockets and state; the agent's hook root and MPS pipes under /run/gpupool;
  the NVIDIA runtime's /run/nvidia-container-devices), or of any directory above one of them (`/var`,
  `/run`); `/var/run` is read as `/run` (a symlink on every current distribution). And the capabilities
  that reach devices or other processes without a mount: SYS_RAWIO (raw I/O ports and /dev/mem),
  SYS_PTRACE (other processes' memory, the agent's included where PIDs are shared), SYS_MODULE,
  DAC_READ_SEARCH (open_by_handle_at reaches any host file), BPF and PERFMON. What the webhook cannot see:
  a hostPath through a host symlink elsewhere (refuse hostPath altogether with Pod Security Admission's
  baseline level where no pod needs it).
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.api.logsafe import shown

FORBIDDEN_ENV = frozenset({
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "NVIDIA_MIG_CONFIG_DEVICES",
    "NVIDIA_MIG_MONITOR_DEVICES",
    "CUDA_VISIBLE_DEVICES",
    # the AMD and Ascend container runtimes hand a container the cards these name (docs/install.md, "Device
    # access"): set by a tenant on a node whose default runtime is the vendor's, they would hand it every card
    "AMD_VISIBLE_DEVICES",
    "ASCEND_VISIBLE_DEVICES",
    "LD_PRELOAD",
})
FORBIDDEN_ENV_PREFIXES = ("GPUPOOL_", "CUDA_MPS_")
FORBIDDEN_CAPABILITIES = frozenset({"SYS_ADMIN", "MKNOD", "ALL"})
GPU_FORBIDDEN_CAPABILITIES = FORBIDDEN_CAPABILITIES | {"SYS_RAWIO", "SYS_PTRACE", "SYS_MODULE", "DAC_READ_SEARCH",
                                                       "BPF", "PERFMON"}
HOST_ROOTS = ("/dev", "/proc")  # and "/" itself
# The state of gpupool's agent and of the container runtime on a node (the agent's defaults: its
# device_plugin_dir holds its socket and checkpoint, hook_root and mps_root lie under /run/gpupool).
RUNTIME_STATE = (
    "/var/lib/kubelet/device-plugins",
    "/var/lib/kubelet/plugins",
    "/var/lib/kubelet/plugins_registry",
    "/var/lib/kubelet/pod-resources",
    "/run/containerd",
    "/var/lib/containerd",
    "/run/crio",
    "/var/lib/containers",
    "/run/docker.sock",
    "/var/lib/docker",
    "/run/cri-dockerd.sock",
    "/run/gpupool",
    "/run/nvidia-container-devices",
    "/run/nvidia",
)

_KINDS = (("containers", "container"), ("initContainers", "init container"),
          ("ephemeralContainers", "ephemeral container"))


@dataclass(frozen=True, slots=True)
class Container:
    kind: str  # "container", "init container" or "ephemeral container"
    name: str
    body: Mapping[str, Any]

    @property
    def where(self) -> str:
        return f"{self.kind} {shown(self.name)}"


def containers(pod: Mapping[str, Any], only: frozenset[str] | None = None) -> Iterator[Container]:
    """Every container of the pod; with `only`, just the ephemeral containers of those names."""
    spec = pod.get("spec") or {}
    for key, kind in _KINDS:
        if only is not None and key != "ephemeralContainers":
            continue
        for i, c in enumerate(spec.get(key) or []):
            if not isinstance(c, Mapping):
                continue
            name = str(c.get("name", i))
            if only is None or name in only:
                yield Container(kind, name, c)


def env_forbidden(name: str) -> bool:
    return name in FORBIDDEN_ENV or name.startswith(FORBIDDEN_ENV_PREFIXES)


def normal_host_path(path: str) -> str:
    """The path as the kernel resolves it (without symlinks): `//dev`, `/./dev/`, `/x/../dev` -> `/dev`.
    posixpath keeps a leading `//` (POSIX leaves it implementation-defined); Linux treats it as `/`."""
    return posixpath.normpath("/" + path.lstrip("/"))


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root + "/")


def host_path_forbidden(path: str) -> bool:
    norm = normal_host_path(path)
    return norm == "/" or any(_within(norm, root) for root in HOST_ROOTS)


def runtime_state_reached(path: str) -> str | None:
    """The runtime or gpupool state a GPU pod's hostPath `path` reaches (at or below it, or above it),
    or None."""
    norm = normal_host_path(path)
    if _within(norm, "/var/run"):
        norm = "/run" + norm.removeprefix("/var/run")
    for state in RUNTIME_STATE:
        if _within(norm, state) or _within(state, norm):
            return state
    return None


def env_from_safe(prefix: object) -> bool:
    """Whether no ConfigMap or Secret key (non-empty) appended to `prefix` can make a refused name."""
    if not isinstance(prefix, str) or not prefix:
        return False
    if any(name.startswith(prefix) and name != prefix for name in FORBIDDEN_ENV):
        return False
    return not any(p.startswith(prefix) or prefix.startswith(p) for p in FORBIDDEN_ENV_PREFIXES)


def _capability(value: object) -> str:
    return str(value).strip().upper().removeprefix("CAP_")


def env_problems(c: Container, strict: bool, allow_env_from: bool = False) -> list[str]:
    out: list[str] = []
    for var in c.body.get("env") or []:
        name = str(var.get("name", "")) if isinstance(var, Mapping) else ""
        if env_forbidden(name):
            out.append(
                f"{c.where}: environment variable {shown(name)} is set by gpupool or the NVIDIA runtime only "
                "(it could reach GPUs or limits outside the pool's grant)"
            )
    sources = c.body.get("envFrom") or []
    if strict and sources:
        out.append(
            f"{c.where}: envFrom is not allowed in this namespace (strict policy): the webhook cannot check "
            "which variables a ConfigMap or Secret sets; list them under env instead"
        )
    elif not allow_env_from and isinstance(sources, list):
        unsafe = [s for s in sources if not (isinstance(s, Mapping) and env_from_safe(s.get("prefix")))]
        if unsafe:
            out.append(
                f"{c.where}: envFrom without a safe prefix is not allowed: a ConfigMap or Secret could set "
                "NVIDIA_VISIBLE_DEVICES, GPUPOOL_* or LD_PRELOAD, which the webhook cannot see (in any pod: "
                "a pod without GPUs on a GPU node could take every GPU); give each envFrom entry a prefix "
                "such as APP_, list the variables under env, or ask for a policy with allowEnvFrom"
            )
    return out


def host_problems(c: Container, gpu: bool = False) -> list[str]:
    out: list[str] = []
    security = c.body.get("securityContext") or {}
    if not isinstance(security, Mapping):
        return out
    if security.get("privileged") is True:
        out.append(f"{c.where}: privileged containers see every GPU of the node, which defeats sharing")
    added = (security.get("capabilities") or {}).get("add") or []
    if not isinstance(added, list):
        return out
    refused = GPU_FORBIDDEN_CAPABILITIES if gpu else FORBIDDEN_CAPABILITIES
    bad = sorted({_capability(a) for a in added if isinstance(a, str)} & refused)
    if bad:
        out.append(
            f"{c.where}: capabilities {', '.join(bad)} are not allowed (they give access to devices "
            f"{'or other processes ' if gpu else ''}outside the pool's grant)"
        )
    return out


def volume_problems(pod: Mapping[str, Any], gpu: bool = False) -> list[str]:
    out: list[str] = []
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        if not isinstance(volume, Mapping):
            continue
        host = volume.get("hostPath")
        if not isinstance(host, Mapping):
            continue
        path = str(host.get("path", ""))
        if host_path_forbidden(path):
            norm = normal_host_path(path)
            same = norm == path.rstrip("/") or norm == path
            out.append(
                f"volume {shown(str(volume.get('name', '?')))}: hostPath {shown(path)}"
                f"{'' if same else f' (= {shown(norm)})'} exposes GPU devices outside the pool's grant"
            )
        elif gpu and (state := runtime_state_reached(path)) is not None:
            out.append(
                f"volume {shown(str(volume.get('name', '?')))}: hostPath {shown(path)} reaches {state}, state "
                "of the container runtime or of gpupool's node agent (devices, grants and limits of every pod "
                "on the node)"
            )
    return out


def pod_problems(pod: Mapping[str, Any], strict: bool, host_access: bool, gpu: bool,
                 only_ephemeral: frozenset[str] | None = None, allow_env_from: bool = False) -> list[str]:
    """Everything forbidden in `pod` (or, with `only_ephemeral`, in those newly added ephemeral containers)."""
    out: list[str] = []
    for c in containers(pod, only_ephemeral):
        out.extend(env_problems(c, strict, allow_env_from))
        if not host_access:
            out.extend(host_problems(c, gpu))
    if only_ephemeral is None and not host_access:
        out.extend(volume_problems(pod, gpu))
        spec = pod.get("spec") or {}
        if gpu:
            for key in ("hostPID", "hostIPC"):
                if spec.get(key) is True:
                    out.append(f"spec.{key}: a GPU pod may not share the host's "
                               f"{'processes' if key == 'hostPID' else 'IPC namespace'} (other tenants' CUDA and "
                               "MPS processes live there)")
    return out
