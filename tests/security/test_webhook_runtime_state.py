"""Issue 26 against the real HTTPS webhook: a GPU pod may not take its environment from a ConfigMap or
Secret that could set the variables the webhook refuses in `env`, nor mount the state of the container
runtime or of gpupool's node agent, nor take the capabilities that reach devices or other processes."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from gpupool.webhook.admission import Settings
from gpupool.webhook.policy import make_policy
from tests.security.test_webhook_tenant_attacks import admit, gpu_pod, plain_pod, refused, with_container
from tests.webhook.helpers import SCHEDULER_SA, TLSFiles, make_tls, review, webhook_client

SETTINGS = Settings(
    trusted_users=frozenset({SCHEDULER_SA}),
    policies={
        "strict": make_policy("strict", "hook", strict=True),
        "infra": make_policy("infra", "hook", allow_host_access=True),
        "vouched": make_policy("vouched", "hook", allow_env_from=True),
    },
)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    return make_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture
async def client(tls: TLSFiles) -> AsyncIterator[httpx.AsyncClient]:
    async with webhook_client(tls, SETTINGS) as c:
        yield c


def with_volume(obj: dict[str, Any], path: str) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["spec"]["volumes"] = [{"name": "host", "hostPath": {"path": path}}]
    return out


# --- envFrom ------------------------------------------------------------------------------------------------

CONFIG_MAP = {"configMapRef": {"name": "settings"}}
SECRET = {"secretRef": {"name": "creds"}}
# Each could produce a refused name from some key: none, the refused prefixes, a start of one, a start of a
# refused name (LD_ + PRELOAD, CUDA_ + VISIBLE_DEVICES), or a prefix that is not a string.
UNSAFE_PREFIXES = [None, "", "NVIDIA", "NVIDIA_", "GPUPOOL_", "GPUPOOL_X_", "G", "GPU", "CUDA_", "CUDA_MPS_", "LD_",
                   "L", 7]
SAFE_PREFIXES = ["APP_", "MY_GPUPOOL_", "CUDAX_", "LD_PRELOADX", "X"]


def env_from(*sources: dict[str, Any]) -> dict[str, Any]:
    return {"envFrom": list(sources)}


@pytest.mark.parametrize("prefix", UNSAFE_PREFIXES)
@pytest.mark.parametrize("source", [CONFIG_MAP, SECRET], ids=["configmap", "secret"])
async def test_env_from_without_a_safe_prefix_is_refused_in_every_pod(client: httpx.AsyncClient, prefix: Any,
                                                                      source: dict[str, Any]) -> None:
    entry = {**source, **({} if prefix is None else {"prefix": prefix})}
    for key, where in (("containers", "container main"), ("initContainers", "init container extra")):
        obj = with_container(gpu_pod(), key, env_from(entry))
        for path in ("/validate", "/mutate"):
            refused(await admit(client, path, review(obj)), f"{where}: envFrom without a safe prefix is not allowed")
        # A namespace whose administrators vouch for its ConfigMaps and Secrets may allow it.
        assert (await admit(client, "/validate/vouched", review(obj)))["allowed"]
        # A pod without GPUs too: on a GPU node whose toolkit accepts NVIDIA_VISIBLE_DEVICES from unprivileged
        # containers, prefix NVIDIA_ and a key VISIBLE_DEVICES=all would hand it every GPU.
        plain = with_container(plain_pod(), key, env_from(entry))
        refused(await admit(client, "/validate", review(plain)),
                f"{where}: envFrom without a safe prefix is not allowed")
        assert (await admit(client, "/validate/vouched", review(plain)))["allowed"]


@pytest.mark.parametrize("prefix", SAFE_PREFIXES)
async def test_a_prefix_no_key_can_complete_into_a_refused_name_is_admitted(client: httpx.AsyncClient,
                                                                            prefix: str) -> None:
    obj = with_container(gpu_pod(), "containers", env_from({**CONFIG_MAP, "prefix": prefix},
                                                           {**SECRET, "prefix": prefix}))
    assert (await admit(client, "/validate", review(obj)))["allowed"]
    # One unsafe entry among safe ones is enough to refuse.
    mixed = with_container(gpu_pod(), "containers", env_from({**CONFIG_MAP, "prefix": prefix}, SECRET))
    refused(await admit(client, "/validate", review(mixed)), "envFrom without a safe prefix")
    assert (await admit(client, "/validate", review(with_container(plain_pod(), "containers", env_from(
        {**CONFIG_MAP, "prefix": prefix})))))["allowed"]


async def test_kubectl_debug_cannot_add_env_from_to_any_pod(client: httpx.AsyncClient) -> None:
    for old in (gpu_pod(), plain_pod()):
        new = with_container(old, "ephemeralContainers", env_from({**CONFIG_MAP, "prefix": "NVIDIA_"}))
        refused(await admit(client, "/validate", review(new, "UPDATE", old, sub_resource="ephemeralcontainers")),
                "ephemeral container extra: envFrom without a safe prefix")


async def test_strict_still_refuses_every_env_from(client: httpx.AsyncClient) -> None:
    for base in (gpu_pod(), plain_pod()):
        obj = with_container(base, "containers", env_from({**CONFIG_MAP, "prefix": "APP_"}))
        refused(await admit(client, "/validate/strict", review(obj)), "envFrom is not allowed in this namespace")


# --- the state of the runtime and of the agent ----------------------------------------------------------------

RUNTIME_PATHS = [
    "/var/lib/kubelet/device-plugins", "/var/lib/kubelet/device-plugins/",
    "/var/lib/kubelet/device-plugins/gpupool-agent",
    "/var/lib/kubelet/device-plugins/kubelet.sock", "/var/lib/kubelet/pod-resources",
    "/var/lib/kubelet/plugins_registry", "/run/containerd/containerd.sock", "/var/run/containerd/containerd.sock",
    "/run/containerd", "/var/lib/containerd", "/run/gpupool/hook", "/run/gpupool/hook/pod-1", "/run/gpupool/mps",
    "/var/run/nvidia-container-devices/GPU-1234", "/run/nvidia-container-devices", "/var/run/crio/crio.sock",
    "/var/run/docker.sock",
    # above them: every directory that holds one
    "/var", "/var/lib", "/var/lib/kubelet", "/run", "/var/run", "/var/run/", "//run/./gpupool",
    "/opt/../var/lib/kubelet/device-plugins",
]
STILL_FINE = ["/var/log", "/var/lib/data", "/run/user-data", "/data/run/containerd", "/opt/gpupool",
              "/var/lib/kubelet-backup"]


@pytest.mark.parametrize("path", RUNTIME_PATHS)
async def test_gpu_pods_may_not_mount_runtime_or_agent_state(client: httpx.AsyncClient, path: str) -> None:
    obj = with_volume(gpu_pod(), path)
    for url in ("/validate", "/mutate"):
        refused(await admit(client, url, review(obj)), f"volume host: hostPath {path} reaches /")
    assert (await admit(client, "/validate/infra", review(obj)))["allowed"]  # node infrastructure may


@pytest.mark.parametrize("path", STILL_FINE)
async def test_other_host_paths_stay_admitted(client: httpx.AsyncClient, path: str) -> None:
    assert (await admit(client, "/validate", review(with_volume(gpu_pod(), path))))["allowed"]


@pytest.mark.parametrize("cap", ["SYS_RAWIO", "CAP_SYS_RAWIO", "sys_ptrace", "SYS_MODULE", "DAC_READ_SEARCH", "BPF",
                                 "PERFMON", "SYS_ADMIN"])
async def test_gpu_pods_may_not_take_capabilities_that_reach_devices_or_processes(client: httpx.AsyncClient,
                                                                                   cap: str) -> None:
    name = cap.upper().removeprefix("CAP_")
    for key, where in (("containers", "container main"), ("initContainers", "init container extra")):
        obj = with_container(gpu_pod(), key, {"securityContext": {"capabilities": {"add": [cap]}}})
        refused(await admit(client, "/validate", review(obj)), f"{where}: capabilities {name} are not allowed")
        assert (await admit(client, "/validate/infra", review(obj)))["allowed"]
    old = gpu_pod()
    debug = with_container(old, "ephemeralContainers", {"securityContext": {"capabilities": {"add": [cap]}}})
    refused(await admit(client, "/validate", review(debug, "UPDATE", old, sub_resource="ephemeralcontainers")),
            f"ephemeral container extra: capabilities {name}")
