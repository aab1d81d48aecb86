"""A hostile tenant against the admission webhook, through the real HTTPS server on 127.0.0.1.

Each attack from issue 12 ("Tenants can leave isolation") is sent as the API server would send it, to
the path the chart gives the namespace's policy (`/mutate/<policy>`, `/validate/<policy>`); each test
asserts the refusal, its HTTP code and its reason, and that the honest variant of the same pod passes.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import jsonpatch
import pytest

from gpupool.api.names import ANN_ISOLATION, RESOURCE_CORES, RESOURCE_GPU
from gpupool.webhook.admission import Settings
from gpupool.webhook.policy import make_policy
from tests.webhook.helpers import (
    SCHEDULER_SA,
    TLSFiles,
    make_tls,
    pod,
    review,
    webhook_client,
)

SETTINGS = Settings(
    trusted_users=frozenset({SCHEDULER_SA}),
    policies={
        # An "mps namespace": the default is mps; hook and mig are as strong or stronger, none is weaker.
        "mps": make_policy("mps", "mps"),
        "mps-raise": make_policy("mps-raise", "mps", weaker="raise"),
        "strict": make_policy("strict", "hook", strict=True),
        "infra": make_policy("infra", "hook", allow_host_access=True),
    },
)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    return make_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture
async def client(tls: TLSFiles) -> AsyncIterator[httpx.AsyncClient]:
    async with webhook_client(tls, SETTINGS) as c:
        yield c


async def admit(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = await client.post(path, json=body)
    assert r.status_code == 200, r.text
    response: dict[str, Any] = r.json()["response"]
    return response


def gpu_pod(**kw: Any) -> dict[str, Any]:
    return pod({RESOURCE_GPU: "1", RESOURCE_CORES: "20"}, spec={"schedulerName": "gpupool-scheduler"}, **kw)


def plain_pod() -> dict[str, Any]:
    return pod({"cpu": "1"})


def refused(resp: dict[str, Any], fragment: str, code: int = 403) -> None:
    assert resp["allowed"] is False, resp
    assert resp["status"]["code"] == code, resp
    assert fragment in resp["status"]["message"], resp["status"]["message"]


# --- leaving isolation ------------------------------------------------------------------------------------


async def test_isolation_none_in_an_mps_namespace_is_refused(client: httpx.AsyncClient) -> None:
    weak = gpu_pod(annotations={ANN_ISOLATION: "none"})
    expected = (f"annotation {ANN_ISOLATION}='none': weaker than this namespace's policy 'mps' "
                "(allowed: mps, hook, mig; default: mps)")
    for path in ("/mutate/mps", "/validate/mps"):
        refused(await admit(client, path, review(weak)), expected)
    # The same pod in a namespace with the default policy (hook) is refused too: none is weaker than hook.
    refused(await admit(client, "/validate", review(weak)), "weaker than this namespace's policy 'default'")
    # Honest pods: no choice gets the namespace's default; mps itself passes unchanged.
    resp = await admit(client, "/mutate/mps", review(gpu_pod()))
    assert resp["allowed"]
    ops = json.loads(base64.b64decode(resp["patch"]))
    assert {"op": "add", "path": "/metadata/annotations", "value": {ANN_ISOLATION: "mps"}} in ops
    assert (await admit(client, "/validate/mps", review(gpu_pod(annotations={ANN_ISOLATION: "mps"}))))["allowed"]


async def test_weaker_isolation_is_raised_when_the_policy_says_so(client: httpx.AsyncClient) -> None:
    weak = gpu_pod(annotations={ANN_ISOLATION: "none"})
    resp = await admit(client, "/mutate/mps-raise", review(weak))
    assert resp["allowed"]
    assert any("'none' is weaker than the policy 'mps-raise'" in w and "runs with 'mps'" in w for w in resp["warnings"])
    raised = jsonpatch.apply_patch(weak, json.loads(base64.b64decode(resp["patch"])))
    assert raised["metadata"]["annotations"][ANN_ISOLATION] == "mps"
    assert (await admit(client, "/validate/mps-raise", review(raised)))["allowed"]
    # If the mutation was skipped, the validating webhook still refuses the weaker mode.
    refused(await admit(client, "/validate/mps-raise", review(weak)), "weaker than this namespace's policy")


async def test_isolation_cannot_be_changed_after_creation(client: httpx.AsyncClient) -> None:
    old = gpu_pod(annotations={ANN_ISOLATION: "mps"})
    new = copy.deepcopy(old)
    new["metadata"]["annotations"][ANN_ISOLATION] = "none"
    refused(await admit(client, "/validate/mps", review(new, "UPDATE", old)),
            f"annotation {ANN_ISOLATION} cannot change after the pod is created (it was 'mps')")
    relabelled = copy.deepcopy(old)
    relabelled["metadata"]["labels"] = {"team": "a"}
    assert (await admit(client, "/validate/mps", review(relabelled, "UPDATE", old)))["allowed"]


# --- environment ------------------------------------------------------------------------------------------

FORBIDDEN_ENV = [
    ("NVIDIA_VISIBLE_DEVICES", "all"),
    ("NVIDIA_DRIVER_CAPABILITIES", "all"),
    ("CUDA_VISIBLE_DEVICES", "0,1,2,3"),
    ("AMD_VISIBLE_DEVICES", "all"),  # the AMD and Ascend container runtimes hand over the cards these name
    ("ASCEND_VISIBLE_DEVICES", "0-7"),
    ("GPUPOOL_MEMORY_LIMIT_MIB", "999999"),
    ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=80G"),
    ("LD_PRELOAD", "/tmp/evil.so"),
]
WHERE = [("containers", "container"), ("initContainers", "init container"),
         ("ephemeralContainers", "ephemeral container")]


def with_container(obj: dict[str, Any], key: str, container: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    if key == "containers":
        out["spec"]["containers"][0].update(container)
    else:
        out["spec"][key] = [{"name": "extra", "image": "busybox", **container}]
    return out


@pytest.mark.parametrize(("var", "value"), FORBIDDEN_ENV, ids=[v for v, _ in FORBIDDEN_ENV])
@pytest.mark.parametrize(("key", "kind"), WHERE, ids=[k for k, _ in WHERE])
async def test_runtime_and_gpupool_variables_are_refused_everywhere(
    client: httpx.AsyncClient, var: str, value: str, key: str, kind: str
) -> None:
    name = "main" if key == "containers" else "extra"
    expected = f"{kind} {name}: environment variable {var} is set by gpupool or the NVIDIA runtime only"
    for base, path in ((gpu_pod(), "/mutate"), (gpu_pod(), "/validate"), (plain_pod(), "/validate")):
        obj = with_container(base, key, {"env": [{"name": "HOME", "value": "/home"}, {"name": var, "value": value}]})
        refused(await admit(client, path, review(obj)), expected)
    # Neighbouring names are not interpreted by anyone, and pass.
    ok = with_container(gpu_pod(), key, {"env": [{"name": "MY_" + var, "value": "x"}, {"name": "CUDA_HOME",
                                                                                           "value": "/usr"}]})
    assert (await admit(client, "/validate", review(ok)))["allowed"]


@pytest.mark.parametrize(("var", "value"), FORBIDDEN_ENV[:2], ids=["visible-devices", "capabilities"])
async def test_kubectl_debug_cannot_add_the_variables(client: httpx.AsyncClient, var: str, value: str) -> None:
    old = gpu_pod()
    new = with_container(old, "ephemeralContainers", {"env": [{"name": var, "value": value}]})
    refused(await admit(client, "/validate", review(new, "UPDATE", old, sub_resource="ephemeralcontainers")),
            f"ephemeral container extra: environment variable {var}")
    debug = with_container(old, "ephemeralContainers", {"env": [{"name": "TERM", "value": "xterm"}]})
    resp = await admit(client, "/validate", review(debug, "UPDATE", old, sub_resource="ephemeralcontainers"))
    assert resp["allowed"]


async def test_kubectl_debug_sysadmin_profile_is_refused(client: httpx.AsyncClient) -> None:
    # `kubectl debug --profile=sysadmin` adds a privileged ephemeral container, on any pod.
    for old in (gpu_pod(), plain_pod()):
        new = with_container(old, "ephemeralContainers", {"securityContext": {"privileged": True}})
        refused(await admit(client, "/validate", review(new, "UPDATE", old, sub_resource="ephemeralcontainers")),
                "ephemeral container extra: privileged containers see every GPU of the node")
    # One that was already there (added before this policy) is not judged again when another is added.
    old = with_container(gpu_pod(), "ephemeralContainers", {"securityContext": {"privileged": True}})
    new = copy.deepcopy(old)
    new["spec"]["ephemeralContainers"].append({"name": "second", "image": "busybox"})
    assert (await admit(client, "/validate", review(new, "UPDATE", old, sub_resource="ephemeralcontainers")))["allowed"]


async def test_env_from_is_refused_in_strict_namespaces(client: httpx.AsyncClient) -> None:
    # (and in every pod elsewhere unless its prefix is safe: test_webhook_runtime_state)
    for base in (gpu_pod(), plain_pod()):
        obj = with_container(base, "initContainers", {"envFrom": [{"configMapRef": {"name": "settings"}}]})
        refused(await admit(client, "/validate/strict", review(obj)),
                "init container extra: envFrom is not allowed in this namespace (strict policy)")
    plain = with_container(plain_pod(), "initContainers",
                           {"envFrom": [{"prefix": "APP_", "configMapRef": {"name": "settings"}}]})
    assert (await admit(client, "/validate", review(plain)))["allowed"]
    listed = with_container(gpu_pod(), "containers", {"env": [{"name": "MODE", "valueFrom": {
        "configMapKeyRef": {"name": "settings", "key": "mode"}}}]})
    assert (await admit(client, "/validate/strict", review(listed)))["allowed"]


# --- host access ------------------------------------------------------------------------------------------

BAD_HOST_PATHS = ["/", "//", "///", "/dev", "//dev", "/./dev", "/dev/../dev", "/dev/", "/dev//nvidia0",
                  "/var/../dev/nvidia0", "/dev/nvidiactl", "/proc", "/proc/1/root"]
GOOD_HOST_PATHS = ["/var/log", "/devices", "/opt/dev", "/var/lib/dev/../data"]


@pytest.mark.parametrize("path", BAD_HOST_PATHS)
async def test_host_paths_to_root_dev_or_proc_are_refused(client: httpx.AsyncClient, path: str) -> None:
    for base in (gpu_pod(), plain_pod()):
        obj = copy.deepcopy(base)
        obj["spec"]["volumes"] = [{"name": "host", "hostPath": {"path": path}}]
        refused(await admit(client, "/validate", review(obj)), f"volume host: hostPath {path}")
        # A namespace whose policy allows host access (node infrastructure) may mount it.
        assert (await admit(client, "/validate/infra", review(obj)))["allowed"]


@pytest.mark.parametrize("path", GOOD_HOST_PATHS)
async def test_other_host_paths_pass(client: httpx.AsyncClient, path: str) -> None:
    obj = gpu_pod()
    obj["spec"]["volumes"] = [{"name": "host", "hostPath": {"path": path}}]
    assert (await admit(client, "/validate", review(obj)))["allowed"]


@pytest.mark.parametrize("cap", ["SYS_ADMIN", "CAP_SYS_ADMIN", "sys_admin", "Cap_Sys_Admin", "MKNOD", "cap_mknod",
                                 "ALL"])
async def test_device_capabilities_are_refused(client: httpx.AsyncClient, cap: str) -> None:
    name = cap.upper().removeprefix("CAP_")
    for base in (gpu_pod(), plain_pod()):
        obj = with_container(base, "initContainers", {"securityContext": {"capabilities": {"add": ["NET_ADMIN", cap]}}})
        expected = f"init container extra: capabilities {name} are not allowed"
        refused(await admit(client, "/validate", review(obj)), expected)
    fine = with_container(gpu_pod(), "containers", {"securityContext": {"capabilities": {"add": ["NET_BIND_SERVICE"],
                                                                                         "drop": ["ALL"]}}})
    assert (await admit(client, "/validate", review(fine)))["allowed"]


async def test_privileged_is_refused_in_any_pod(client: httpx.AsyncClient) -> None:
    for base in (gpu_pod(), plain_pod()):
        obj = with_container(base, "containers", {"securityContext": {"privileged": True}})
        refused(await admit(client, "/validate", review(obj)), "container main: privileged containers see every GPU")
        assert (await admit(client, "/validate/infra", review(obj)))["allowed"]
    unprivileged = with_container(gpu_pod(), "containers", {"securityContext": {"privileged": False}})
    assert (await admit(client, "/validate", review(unprivileged)))["allowed"]


@pytest.mark.parametrize(("key", "what"), [("hostPID", "processes"), ("hostIPC", "IPC namespace")])
async def test_gpu_pods_may_not_share_host_pid_or_ipc(client: httpx.AsyncClient, key: str, what: str) -> None:
    obj = gpu_pod()
    obj["spec"][key] = True
    for path in ("/mutate", "/validate"):
        refused(await admit(client, path, review(obj)), f"spec.{key}: a GPU pod may not share the host's {what}")
    plain = plain_pod()
    plain["spec"][key] = True
    assert (await admit(client, "/validate", review(plain)))["allowed"]  # not a GPU pod: not gpupool's business


async def test_every_problem_is_listed_at_once_and_names_are_escaped(client: httpx.AsyncClient) -> None:
    obj = with_container(gpu_pod(name="evil\x1b]8;;http://x\x1b\\"), "containers", {
        "env": [{"name": "LD_PRELOAD", "value": "x"}], "securityContext": {"privileged": True}})
    obj["spec"]["hostIPC"] = True
    resp = await admit(client, "/validate", review(obj))
    message = resp["status"]["message"]
    assert "LD_PRELOAD" in message and "privileged" in message and "spec.hostIPC" in message
    assert "\x1b" not in message and "evil\\x1b]8;;http://x\\x1b\\\\" in message


async def test_unknown_policy_path_is_an_error_not_a_decision(client: httpx.AsyncClient) -> None:
    r = await client.post("/validate/nosuch", json=review(gpu_pod()))
    assert r.status_code == 404 and "no admission policy named 'nosuch'" in r.json()["error"]
    assert (await admit(client, "/validate", review(gpu_pod())))["allowed"]  # and the server keeps serving
