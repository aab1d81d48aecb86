"""The chart with `dra.enabled`: gpupool's DeviceClasses and the isolation each one names, the agent's
ResourceSlice and ResourceClaim rights, the admission policy that holds its ResourceSlice writes to its own
node (evaluated with cel-python on the slice the agent really builds, gpupool.api.dra.resource_slices), the
agent's settings and host directories, and placement (dra.placement): the webhook entry that gates new pods
with claims and the policy that lets the scheduler remove only that gate (evaluated on the patch
gpupool.scheduler.claims really sends). docs/claims.md is the user's side of the same objects."""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import celpy
import kubernetes_validate
import pytest

from gpupool.api import dra
from tests.deploy.conftest import CHART, NAMESPACE, Render, assert_valid_kubernetes, run_helm

Obj = dict[str, Any]

KUBE = ("--kube-version", "1.37.0")  # helm template's own default (1.35) is below what dra.enabled needs
ON: Obj = {"dra": {"enabled": True}}
AGENT = f"system:serviceaccount:{NAMESPACE}:gp-gpupool-agent"
NODE_CLAIM = "authentication.kubernetes.io/node-name"
CLASSES = {"gpu.gpupool.io": "hook", "mps.gpu.gpupool.io": "mps", "whole.gpu.gpupool.io": "none",
           "mig.gpu.gpupool.io": "mig", "remote.gpu.gpupool.io": "remote"}


def dra_on(render: Render, **values: Any) -> list[Obj]:
    merged = copy.deepcopy(ON)
    for key, value in values.items():
        if isinstance(value, dict):
            merged.setdefault(key, {}).update(value)
        else:
            merged[key] = value
    return render(merged, *KUBE)


def kinds(objs: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind]


def agent_pod(objs: list[Obj]) -> Obj:
    (daemonset,) = kinds(objs, "DaemonSet")
    spec: Obj = daemonset["spec"]["template"]["spec"]
    return spec


# --- DeviceClasses ----------------------------------------------------------------------------------------


def test_classes_are_rendered_only_when_enabled(render: Render) -> None:
    assert kinds(render(None, *KUBE), "DeviceClass") == []
    assert kinds(render({"dra": {"enabled": False}}, *KUBE), "DeviceClass") == []
    assert sorted(o["metadata"]["name"] for o in kinds(dra_on(render), "DeviceClass")) == sorted(CLASSES)


def test_each_class_selects_gpupools_devices_and_names_its_isolation(render: Render) -> None:
    for cls in kinds(dra_on(render), "DeviceClass"):
        name, spec = cls["metadata"]["name"], cls["spec"]
        assert cls["apiVersion"] == "resource.k8s.io/v1"
        kind = "mig" if CLASSES[name] == "mig" else "gpu"
        server = f' && "remoteServer" in device.attributes["{dra.DRIVER}"]' if CLASSES[name] == "remote" else ""
        assert spec["selectors"] == [{"cel": {"expression": f'device.driver == "{dra.DRIVER}" && '
                                              f'device.attributes["{dra.DRIVER}"].type == "{kind}"{server}'}}], name
        (config,) = spec["config"]
        assert config == {"opaque": {"driver": dra.DRIVER, "parameters": {
            "apiVersion": dra.CONFIG_API_VERSION, "kind": dra.CONFIG_KIND, "isolation": CLASSES[name]}}}, name
        assert "extendedResourceName" not in spec, name  # only when the values opt in
    assert sorted(CLASSES.values()) == sorted(dra.DRA_ISOLATIONS)


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_the_driver_reads_each_classs_isolation_from_an_allocation(render: Render, name: str) -> None:
    """The class's config as the scheduler copies it into a claim's allocation (source FromClass) is what
    the driver reads (api/dra.claim_shares): the chart and the driver agree on the parameters' shape."""
    (cls,) = [o for o in kinds(dra_on(render), "DeviceClass") if o["metadata"]["name"] == name]
    device = "gpu-0-3g40gb-4" if CLASSES[name] == "mig" else "gpu-0"
    claim = {
        "metadata": {"namespace": "ml", "name": "c", "uid": "u1"},
        "status": {"allocation": {"devices": {
            "results": [{"request": "gpu", "driver": dra.DRIVER, "pool": "gpu-1", "device": device}],
            "config": [{"source": "FromClass", "requests": ["gpu"], **c} for c in cls["spec"]["config"]],
        }}},
    }
    assert dra.claim_shares(claim).isolation == CLASSES[name]


def _device_cel(device: Obj) -> Any:
    """A device as DRA's CEL sees it: `device.driver`, attributes by domain, their values unwrapped."""
    values = {k: next(iter(v.values())) for k, v in device["attributes"].items()}
    return celpy.json_to_cel({"driver": dra.DRIVER, "attributes": {dra.DRIVER: values}})


def test_each_class_selects_exactly_its_own_kind_of_device(render: Render) -> None:
    """On a node with two shared GPUs, one of them with a GPU server, and one in MIG mode (the slices the agent
    really builds), the MIG class sees only the partitions, the remote class only the GPU with a server and
    every other class both shared GPUs."""
    gpus = [dra.SliceDevice(0, "GPU-0", "NVIDIA H100 80GB HBM3", 81559),
            dra.SliceDevice(1, "GPU-1", "NVIDIA H100 80GB HBM3", 81559, mig_mode=True),
            dra.SliceDevice(2, "GPU-2", "NVIDIA H100 80GB HBM3", 81559, remote_server="tcp:10.0.0.1:7070")]
    devices = [d for s in dra.resource_slices("n", "u", gpus, "", 1) for d in s["spec"].get("devices", [])]
    env = celpy.Environment()
    for cls in kinds(dra_on(render), "DeviceClass"):
        name = cls["metadata"]["name"]
        program = env.program(env.compile(cls["spec"]["selectors"][0]["cel"]["expression"]))
        chosen = {d["name"] for d in devices if bool(program.evaluate({"device": _device_cel(d)}))}
        if CLASSES[name] == "mig":
            assert len(chosen) == 25 and all(n.startswith("gpu-1-") for n in chosen), name
        elif CLASSES[name] == "remote":
            assert chosen == {"gpu-2"}, name
        else:
            assert chosen == {"gpu-0", "gpu-2"}, name


def test_extended_resource_name_is_opt_in_and_on_the_whole_class_only(render: Render) -> None:
    objs = dra_on(render, dra={"extendedResourceName": "gpu.gpupool.io/whole"})
    names = {o["metadata"]["name"]: o["spec"].get("extendedResourceName") for o in kinds(objs, "DeviceClass")}
    assert names == {"gpu.gpupool.io": None, "mps.gpu.gpupool.io": None, "mig.gpu.gpupool.io": None,
                     "remote.gpu.gpupool.io": None, "whole.gpu.gpupool.io": "gpu.gpupool.io/whole"}


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        # the device plugin's own resource, and any name the webhook would take for a gpupool pod
        ("dra.extendedResourceName=gpupool.io/gpu", "/dra/extendedResourceName"),
        ("dra.extendedResourceName=gpupool.io/gpu-whole", "/dra/extendedResourceName"),
        ("dra.extendedResourceName=no-domain", "/dra/extendedResourceName"),
        ("dra.cdiDir=var/run/cdi", "/dra/cdiDir"),
        ("dra.kubeletRoot=/var/lib/kubelet/", "/dra/kubeletRoot"),
        ("dra.devicePlugin=yes", "/dra/devicePlugin"),
        ("dra.enable=true", "additional properties 'enable' not allowed"),
        ("dra.placement.enable=false", "additional properties 'enable' not allowed"),
        ("dra.placement.namespaceSelector.matchLabel.team=a", "additional properties 'matchLabel' not allowed"),
        ("dra.placement.namespaceSelector.matchExpressions[0].key=team", "/dra/placement/namespaceSelector"),
    ],
)
def test_bad_dra_values_are_refused(helm: Path, setting: str, message: str) -> None:
    out = run_helm(helm, "template", "gp", str(CHART), *KUBE, "--set", "dra.enabled=true", "--set", setting)
    assert out.returncode != 0
    assert message in out.stderr, out.stderr


def test_dra_needs_kubernetes_1_36(helm: Path) -> None:
    """Without consumable capacity (on by default from 1.36) every claim would hold a whole GPU."""
    out = run_helm(helm, "template", "gp", str(CHART), "--kube-version", "1.35.4", "--set", "dra.enabled=true")
    assert out.returncode != 0 and "dra.enabled needs Kubernetes 1.36 or newer" in out.stderr, out.stderr
    # ... and only when asked for: the rest of the chart still installs on 1.34, its oldest.
    assert run_helm(helm, "template", "gp", str(CHART), "--kube-version", "1.34.0").returncode == 0


@pytest.mark.parametrize("version", ["1.36.0", "1.37.0"])
def test_every_object_is_valid_kubernetes_with_dra(render: Render, version: str) -> None:
    objs = dra_on(render, dra={"extendedResourceName": "gpu.gpupool.io/whole"})
    assert_valid_kubernetes(objs, version)


def test_lint_passes_with_dra(helm: Path, tmp_path: Path) -> None:
    out = run_helm(helm, "lint", "--strict", str(CHART), *KUBE, "--set", "dra.enabled=true")
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_doctor_recognises_the_charts_classes(render: Render) -> None:
    from gpupool.doctor.checks import Status, device_classes

    found = device_classes(kinds(dra_on(render), "DeviceClass"))
    assert (found.status, found.detail) == (
        Status.OK, "gpupool's classes: gpu.gpupool.io (hook), mig.gpu.gpupool.io (mig), mps.gpu.gpupool.io (mps), "
        "remote.gpu.gpupool.io (remote), whole.gpu.gpupool.io (none)")


# --- the agent's rights -----------------------------------------------------------------------------------


def agent_rules(objs: list[Obj]) -> list[tuple[tuple[str, ...], ...]]:
    (role,) = [o for o in kinds(objs, "ClusterRole") if o["metadata"]["name"] == "gp-gpupool-agent"]
    return sorted((tuple(r["apiGroups"]), tuple(r["resources"]), tuple(r["verbs"])) for r in role["rules"])


def test_agent_may_publish_slices_and_read_claims_only_with_dra(render: Render) -> None:
    base = agent_rules(render(None, *KUBE))
    assert not [r for r in base if "resource.k8s.io" in r[0]]
    assert agent_rules(dra_on(render)) == sorted([
        *base,
        (("resource.k8s.io",), ("resourceslices",), ("get", "create", "patch", "delete")),
        (("resource.k8s.io",), ("resourceclaims",), ("get",)),  # no list, watch or write of anyone's claims
    ])


# --- the own-node policy for ResourceSlices ---------------------------------------------------------------


@pytest.fixture(scope="module")
def slice_policy(render: Render) -> Obj:
    objs = dra_on(render)
    (vap,) = [o for o in kinds(objs, "ValidatingAdmissionPolicy") if o["metadata"]["name"].endswith("-resourceslice")]
    (binding,) = [o for o in kinds(objs, "ValidatingAdmissionPolicyBinding")
                  if o["spec"]["policyName"] == vap["metadata"]["name"]]
    assert binding["spec"]["validationActions"] == ["Deny"]
    spec: Obj = vap["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["matchPolicy"] == "Equivalent"  # writes through v1beta* versions too
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule == {"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"],
                    "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["resourceslices"]}
    return spec


def gpu_slice(node: str, driver: str = dra.DRIVER, pool: str | None = None) -> Obj:
    """The slice the agent publishes (api/dra.resource_slices), optionally bent into one it must not write."""
    gpu = dra.SliceDevice(index=0, uuid="GPU-0", model="NVIDIA H100 80GB HBM3", memory_mib=81559)
    (out,) = dra.resource_slices(node, "uid-" + node, [gpu], "580.65.06", 1)
    out["spec"]["driver"] = driver
    out["spec"]["pool"]["name"] = pool if pool is not None else node
    return out


def decide(policy: Obj, operation: str, new: Obj | None, old: Obj | None, user: str = AGENT,
           node_claim: str | None = "gpu-1", resource: tuple[str, str] = ("resource.k8s.io", "resourceslices")) -> str:
    """'skip' when the policy does not apply, 'allow', or the first failing validation's message (an
    evaluation error counts as a failure: failurePolicy Fail)."""
    env = celpy.Environment()
    activation: dict[str, Any] = {
        "object": celpy.json_to_cel(new),
        "oldObject": celpy.json_to_cel(old),
        "request": celpy.json_to_cel({
            "operation": operation,
            "resource": {"group": resource[0], "version": "v1", "resource": resource[1]},
            "userInfo": {"username": user, "extra": {NODE_CLAIM: [node_claim]} if node_claim else {}},
        }),
    }

    def run(expression: str) -> Any:
        return env.program(env.compile(expression)).evaluate(activation)

    for condition in policy["matchConditions"]:
        if not bool(run(condition["expression"])):
            return "skip"
    activation["variables"] = celpy.celtypes.MapType(
        {celpy.celtypes.StringType(v["name"]): run(v["expression"]) for v in policy.get("variables", [])})
    for validation in policy["validations"]:
        try:
            ok = bool(run(validation["expression"]))
        except celpy.CELEvalError:
            ok = False
        if not ok:
            return str(validation["message"])
    return "allow"


OWN_ONLY = "the gpupool agent may write only the ResourceSlice of its own node (spec.nodeName and spec.pool.name)"


def test_agent_may_create_update_and_delete_its_own_nodes_slice(slice_policy: Obj) -> None:
    own = gpu_slice("gpu-1")
    newer = copy.deepcopy(own)
    newer["spec"]["pool"]["generation"] = 2
    assert decide(slice_policy, "CREATE", own, None) == "allow"
    assert decide(slice_policy, "UPDATE", newer, own) == "allow"
    assert decide(slice_policy, "DELETE", None, own) == "allow"


def test_agent_may_not_write_another_nodes_slice(slice_policy: Obj) -> None:
    other = gpu_slice("gpu-2")
    assert decide(slice_policy, "CREATE", other, None) == OWN_ONLY
    assert decide(slice_policy, "DELETE", None, other) == OWN_ONLY  # withdrawing another node's GPUs
    taken = gpu_slice("gpu-1")
    assert decide(slice_policy, "UPDATE", taken, other) == OWN_ONLY  # taking over another node's slice
    # its own node, but another node's pool: the newest generation of a pool wins, so this would hide gpu-2's
    assert decide(slice_policy, "CREATE", gpu_slice("gpu-1", pool="gpu-2"), None) == OWN_ONLY
    for spread in ({"allNodes": True}, {"nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": []}]}}):
        everywhere = gpu_slice("gpu-1")
        del everywhere["spec"]["nodeName"]
        everywhere["spec"].update(spread)
        assert decide(slice_policy, "CREATE", everywhere, None) == OWN_ONLY


def test_agent_may_not_write_another_drivers_slice(slice_policy: Obj) -> None:
    message = "the gpupool agent may write only ResourceSlices of driver gpu.gpupool.io"
    nvidia = gpu_slice("gpu-1", driver="gpu.nvidia.com")
    assert decide(slice_policy, "CREATE", nvidia, None) == message
    assert decide(slice_policy, "DELETE", None, nvidia) == message
    assert decide(slice_policy, "UPDATE", gpu_slice("gpu-1"), nvidia) == message


def test_token_without_node_claim_is_refused_and_others_are_not_held(slice_policy: Obj) -> None:
    assert "names no node" in decide(slice_policy, "CREATE", gpu_slice("gpu-1"), None, node_claim=None)
    kubelet = "system:node:gpu-2"  # kubelet wipes its node's slices at start: not the agent, not held here
    assert decide(slice_policy, "DELETE", None, gpu_slice("gpu-1"), user=kubelet, node_claim=None) == "skip"


def test_no_slice_policy_without_dra_or_without_the_own_node_restriction(render: Render) -> None:
    def policies(objs: list[Obj]) -> list[str]:
        return [o["metadata"]["name"] for o in objs
                if o["kind"].startswith("ValidatingAdmissionPolicy") and "resourceslice" in o["metadata"]["name"]]

    assert policies(render(None, *KUBE)) == []
    assert policies(dra_on(render, agent={"restrictToOwnNode": False})) == []
    assert len(policies(dra_on(render))) == 2  # the policy and its binding


# --- the agent's settings and host directories ------------------------------------------------------------


def env(pod: Obj) -> dict[str, str]:
    (agent,) = pod["containers"]
    return {e["name"]: e["value"] for e in agent["env"] if "value" in e}


def host_mounts(pod: Obj) -> dict[str, tuple[str, str]]:
    """mount path -> (host path, hostPath type) for the agent container's host directories."""
    (agent,) = pod["containers"]
    volumes = {v["name"]: v["hostPath"] for v in pod["volumes"] if "hostPath" in v}
    return {m["mountPath"]: (volumes[m["name"]]["path"], volumes[m["name"]]["type"])
            for m in agent["volumeMounts"] if m["name"] in volumes and not m.get("readOnly")}


@pytest.mark.parametrize(
    ("values", "root", "cdi"),
    [({}, "/var/lib/kubelet", "/var/run/cdi"),
     ({"kubeletRoot": "/var/lib/k0s/kubelet", "cdiDir": "/etc/cdi"}, "/var/lib/k0s/kubelet", "/etc/cdi")],
)
def test_agent_serves_dra_from_the_kubelets_directories(render: Render, values: Obj, root: str, cdi: str) -> None:
    from gpupool.agent.config import load_config

    pod = agent_pod(dra_on(render, dra=values))
    settings = env(pod)
    assert {k: settings[k] for k in settings if k in ("GPUPOOL_AGENT_DRA", "GPUPOOL_AGENT_KUBELET_ROOT",
                                                       "GPUPOOL_AGENT_CDI_DIR")} == {
        "GPUPOOL_AGENT_DRA": "true", "GPUPOOL_AGENT_KUBELET_ROOT": root, "GPUPOOL_AGENT_CDI_DIR": cdi}
    # The variables are the agent's configuration fields (an unknown one would be ignored).
    config = load_config(env={**settings, "NODE_NAME": "gpu-1"})
    assert (config.dra, str(config.kubelet_root), str(config.cdi_dir)) == (True, root, cdi)
    # Mounted read-write at the host's own paths: kubelet dials the socket path the plugin registers, and
    # the runtime reads the CDI specs where the agent wrote them. Of plugins/, only the driver's directory.
    mounts = host_mounts(pod)
    for path in (f"{root}/plugins_registry", f"{root}/plugins/{dra.DRIVER}", cdi):
        assert mounts.get(path) == (path, "DirectoryOrCreate"), (path, mounts)
    assert f"{root}/plugins" not in mounts


@pytest.mark.parametrize(("device_plugin", "served"), [(None, True), (True, True), (False, False)],
                         ids=["default", "on", "off"])
def test_the_agent_keeps_the_device_plugin_beside_dra_unless_told_not_to(render: Render, device_plugin: bool | None,
                                                                          served: bool) -> None:
    """dra.devicePlugin (default true): pods still asking for gpupool.io/gpu keep a node to run on."""
    from gpupool.agent.config import load_config

    pod = agent_pod(dra_on(render, dra={} if device_plugin is None else {"devicePlugin": device_plugin}))
    config = load_config(env={**env(pod), "NODE_NAME": "gpu-1"})
    assert (config.dra, config.device_plugin_with_dra, config.serves_device_plugin) == (True, served, served)
    # kubelet's device-plugin directory: the plugin's socket, and the checkpoints the agent keeps there
    assert host_mounts(pod)["/var/lib/kubelet/device-plugins"] == ("/var/lib/kubelet/device-plugins", "Directory")


def test_without_dra_the_agent_has_no_dra_settings_or_directories(render: Render) -> None:
    pod = agent_pod(render(None, *KUBE))
    assert not {"GPUPOOL_AGENT_DRA", "GPUPOOL_AGENT_KUBELET_ROOT", "GPUPOOL_AGENT_CDI_DIR",
                "GPUPOOL_AGENT_DEVICE_PLUGIN_WITH_DRA"} & set(env(pod))
    assert sorted(host_mounts(pod)) == ["/run/gpupool/hook", "/run/gpupool/mps", "/var/lib/kubelet/device-plugins"]


# --- placement: the webhook gates new pods with claims ----------------------------------------------------

SCHEDULER = f"system:serviceaccount:{NAMESPACE}:gp-gpupool-scheduler"
CLAIMS_ENTRY = "claims.mutate.gpupool.io"
GATE_PATCH = [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": dra.SCHEDULING_GATE}]}]
SECURE: Obj = {"admission": {"policies": {"secure": {"strict": True}}}}  # a named admission policy


def mutating(objs: list[Obj]) -> dict[str, Obj]:
    (config,) = kinds(objs, "MutatingWebhookConfiguration")
    return {w["name"]: w for w in config["webhooks"]}


def claims_entries(objs: list[Obj]) -> dict[str, Obj]:
    return {name: w for name, w in mutating(objs).items() if name.endswith(CLAIMS_ENTRY)}


def webhook_env(objs: list[Obj]) -> dict[str, str]:
    (deployment,) = [o for o in kinds(objs, "Deployment") if o["metadata"]["name"] == "gp-gpupool-webhook"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def claim_pod(limits: dict[str, str] | None = None, claims: int = 1) -> Obj:
    """A pod taking its GPU through a claim template (as in docs/claims.md), optionally also asking for
    `limits` (e.g. gpupool.io/gpu, which makes it a device-plugin pod)."""
    container: Obj = {"name": "main", "image": "cuda", "resources": {"claims": [{"name": "gpu"}][:claims]}}
    if limits:
        container["resources"]["limits"] = limits
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train", "namespace": "team-a"},
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "share-8g-30"}][:claims],
                     "containers": [container]}}


@pytest.mark.parametrize(
    "values",
    [None, {"dra": {"enabled": False, "placement": {"enabled": True}}},
     {"dra": {"enabled": True, "placement": {"enabled": False}}}],
    ids=["no-dra", "placement-without-dra", "dra-without-placement"],
)
def test_nothing_is_gated_without_dra_and_placement(render: Render, values: Obj | None) -> None:
    objs = render(values, *KUBE)
    assert claims_entries(objs) == {}
    assert "GPUPOOL_WEBHOOK_DRA_PLACEMENT" not in webhook_env(objs)
    assert len(mutating(objs)) == 1  # the device-plugin entry alone


def test_placement_is_on_by_default_with_dra(render: Render) -> None:
    objs = dra_on(render)
    assert sorted(claims_entries(objs)) == [CLAIMS_ENTRY]
    assert webhook_env(objs)["GPUPOOL_WEBHOOK_DRA_PLACEMENT"] == "true"


def test_the_claims_entry_fails_open_and_reaches_the_same_webhook(render: Render) -> None:
    """failurePolicy Ignore even where the device-plugin entry fails closed: a pod admitted ungated only has
    its claims allocated by kube-scheduler's own allocator."""
    entries = mutating(dra_on(render, webhook={"failurePolicy": "Fail"}))
    claims, plugin = entries[CLAIMS_ENTRY], entries["mutate.gpupool.io"]
    assert (plugin["failurePolicy"], claims["failurePolicy"]) == ("Fail", "Ignore")
    assert claims["sideEffects"] == "None"
    assert claims["rules"] == [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                                "resources": ["pods"], "scope": "Namespaced"}]
    for key in ("clientConfig", "namespaceSelector", "timeoutSeconds", "admissionReviewVersions"):
        assert claims[key] == plugin[key], key


def test_each_admission_policy_has_its_own_claims_entry(render: Render) -> None:
    """The webhook judges the pod under the policy its path names (it may refuse it), so a namespace's pods
    must reach its own policy's path, as on the device-plugin entries."""
    entries = mutating(dra_on(render, webhook=SECURE))
    assert sorted(claims_entries(dra_on(render, webhook=SECURE))) == [CLAIMS_ENTRY, f"secure.{CLAIMS_ENTRY}"]
    for prefix in ("", "secure."):
        claims, plugin = entries[prefix + CLAIMS_ENTRY], entries[prefix + "mutate.gpupool.io"]
        assert claims["clientConfig"]["service"]["path"] == plugin["clientConfig"]["service"]["path"]
        assert claims["namespaceSelector"] == plugin["namespaceSelector"]
    assert entries[f"secure.{CLAIMS_ENTRY}"]["clientConfig"]["service"]["path"] == "/mutate/secure"


def test_the_namespace_selector_narrows_each_claims_entry(render: Render) -> None:
    chosen = {"matchLabels": {"gpupool.io/dra-placement": "true"},
              "matchExpressions": [{"key": "team", "operator": "In", "values": ["a", "b"]}]}
    entries = mutating(dra_on(render, webhook=SECURE, dra={"placement": {"namespaceSelector": chosen}}))
    for prefix in ("", "secure."):
        plugin = entries[prefix + "mutate.gpupool.io"]["namespaceSelector"]
        assert entries[prefix + CLAIMS_ENTRY]["namespaceSelector"] == {
            "matchLabels": chosen["matchLabels"],
            "matchExpressions": plugin["matchExpressions"] + chosen["matchExpressions"]}
        assert "matchLabels" not in plugin  # the device-plugin entries are not narrowed


@pytest.mark.parametrize(
    ("obj", "user", "to_claims", "to_plugin"),
    [
        pytest.param(claim_pod(), "alice", True, False, id="claim-pod"),
        pytest.param(claim_pod({"gpupool.io/gpu": "1"}), "alice", False, True, id="device-plugin-pod-with-a-claim"),
        pytest.param(claim_pod(claims=0), "alice", False, False, id="no-claims"),
        pytest.param(claim_pod(), SCHEDULER, False, False, id="gpupools-own-account"),
    ],
)
def test_the_claims_entry_sends_pods_with_claims_and_nothing_from_the_device_plugin(
        render: Render, obj: Obj, user: str, to_claims: bool, to_plugin: bool) -> None:
    from tests.deploy.test_chart_match_conditions import matches

    entries = mutating(dra_on(render))
    assert matches(entries[CLAIMS_ENTRY]["matchConditions"], obj, user=user) is to_claims
    assert matches(entries["mutate.gpupool.io"]["matchConditions"], obj, user=user) is to_plugin
    without_key = copy.deepcopy(obj)
    without_key["spec"].pop("resourceClaims", None)  # absent, not empty: the guard must hold
    assert matches(entries[CLAIMS_ENTRY]["matchConditions"], without_key, user=user) is False


@pytest.mark.parametrize("placement", [True, False])
def test_the_webhook_gates_what_the_claims_entry_sends_it(render: Render, placement: bool) -> None:
    """The chart's variable sets the webhook's dra_placement, and a pod the entry sends (claims, no gpupool
    resources) gets the gate from /mutate and /mutate/<policy> alike; without placement, no gate."""
    from gpupool.webhook.admission import Request, decide
    from gpupool.webhook.config import load_config

    on = dra_on(render, webhook=SECURE)
    objs = on if placement else dra_on(render, webhook=SECURE, dra={"placement": {"enabled": False}})
    config = load_config(env=webhook_env(objs))
    assert config.dra_placement is placement
    settings = config.settings()
    for entry in claims_entries(on).values():
        policy = settings.policy(entry["clientConfig"]["service"]["path"].removeprefix("/mutate").strip("/"))
        answer = decide(Request("u1", "CREATE", "Pod", "alice", claim_pod(), None), True, settings, None, policy)
        assert answer.allowed and answer.patch == (GATE_PATCH if placement else []), entry["name"]


# --- the scheduler may only remove its scheduling gate ----------------------------------------------------

UNGATE_ONLY = "gp-gpupool-scheduler-ungate-only"
ADD = "the gpupool scheduler may not add scheduling gates"
OTHER_GATE = f"the gpupool scheduler may remove only its own scheduling gate {dra.SCHEDULING_GATE}"
METADATA = "the gpupool scheduler may not change a pod's labels, annotations, owners or finalizers"
SPEC = "the gpupool scheduler may change nothing of a pod's spec but remove its scheduling gate"
QUEUE_GATE = "kueue.x-k8s.io/admission"  # another controller's gate


@pytest.fixture(scope="module")
def ungate_policy(render: Render) -> Obj:
    objs = dra_on(render)
    (vap,) = [o for o in kinds(objs, "ValidatingAdmissionPolicy") if o["metadata"]["name"] == UNGATE_ONLY]
    (binding,) = [o for o in kinds(objs, "ValidatingAdmissionPolicyBinding") if o["spec"]["policyName"] == UNGATE_ONLY]
    assert binding["spec"]["validationActions"] == ["Deny"]
    spec: Obj = vap["spec"]
    assert spec["failurePolicy"] == "Fail"
    # The pod itself: kube-scheduler, under the same account, writes pods/status and pods/binding, not held here.
    assert spec["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods"]}]
    return spec


def gated_pod(*gates: str, bare: bool = False) -> Obj:
    """A pod as admitted with the gate: with every field an update may change set, or (bare) none of the
    optional ones, which the policy must then read through its guards."""
    out = claim_pod()
    out["spec"]["schedulingGates"] = [{"name": g} for g in gates or (dra.SCHEDULING_GATE,)]
    if not bare:
        out["metadata"].update(labels={"app": "train"}, annotations={"team": "a"}, finalizers=["example.com/keep"],
                               ownerReferences=[{"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u"}])
        out["spec"].update(initContainers=[{"name": "fetch", "image": "busybox"}], activeDeadlineSeconds=3600,
                           terminationGracePeriodSeconds=30, nodeSelector={"pool": "gpu"},
                           tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
                           affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                               "nodeSelectorTerms": [{"matchExpressions": [
                                   {"key": "zone", "operator": "In", "values": ["a"]}]}]}}})
    return out


def merge_patch(target: Any, patch: Any) -> Any:
    """`patch` applied to `target` as the API server applies a JSON merge patch (RFC 7386)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


async def ungated(pod: Obj) -> Obj:
    """The pod after the patch gpupool's scheduler really sends to remove its gate (ClaimAllocator._ungate)."""
    from typing import cast

    from gpupool.cluster.port import Kind
    from gpupool.scheduler.claims import ClaimAllocator
    from gpupool.scheduler.framework.interface import Handle

    sent: list[tuple[str, Any]] = []

    class Cluster:
        async def patch_object(self, kind: Kind, name: str, patch: Any, **_: Any) -> Obj:
            sent.append((kind.plural, patch))
            return {}

    class Stub:
        cluster = Cluster()

    assert await ClaimAllocator(cast(Handle, Stub()), lambda: True)._ungate(pod) is None
    ((plural, patch),) = sent
    assert plural == "pods"
    out: Obj = merge_patch(pod, patch)
    return out


def update(policy: Obj, new: Obj, old: Obj, user: str = SCHEDULER) -> str:
    return decide(policy, "UPDATE", new, old, user=user, node_claim=None, resource=("", "pods"))


@pytest.mark.parametrize("bare", [False, True], ids=["full", "bare"])
async def test_the_scheduler_may_remove_its_gate(ungate_policy: Obj, bare: bool) -> None:
    alone = gated_pod(bare=bare)
    done = await ungated(alone)
    assert "schedulingGates" not in done["spec"]  # the last gate gone: the field is dropped
    assert update(ungate_policy, done, alone) == "allow"
    with_queue = gated_pod(QUEUE_GATE, dra.SCHEDULING_GATE, bare=bare)
    done = await ungated(with_queue)
    assert done["spec"]["schedulingGates"] == [{"name": QUEUE_GATE}]
    assert update(ungate_policy, done, with_queue) == "allow"
    assert update(ungate_policy, alone, alone) == "allow"  # an update that changes nothing


def test_the_scheduler_may_not_add_gates_or_remove_anothers(ungate_policy: Obj) -> None:
    with_queue = gated_pod(QUEUE_GATE, dra.SCHEDULING_GATE)
    released = copy.deepcopy(with_queue)
    released["spec"]["schedulingGates"] = [{"name": dra.SCHEDULING_GATE}]
    assert update(ungate_policy, released, with_queue) == OTHER_GATE
    released["spec"].pop("schedulingGates")
    assert update(ungate_policy, released, with_queue) == OTHER_GATE
    alone = gated_pod()
    added = copy.deepcopy(alone)
    added["spec"]["schedulingGates"].append({"name": QUEUE_GATE})
    assert update(ungate_policy, added, alone) == ADD
    ungated_before = copy.deepcopy(alone)
    del ungated_before["spec"]["schedulingGates"]
    assert update(ungate_policy, alone, ungated_before) == ADD  # gating a pod again


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda p: p["metadata"]["labels"].update(app="web"), METADATA),
        (lambda p: p["metadata"].pop("labels"), METADATA),
        (lambda p: p["metadata"]["annotations"].update(extra="x"), METADATA),
        (lambda p: p["metadata"].pop("finalizers"), METADATA),
        (lambda p: p["metadata"].pop("ownerReferences"), METADATA),
        (lambda p: p["spec"]["containers"][0].update(image="evil"), SPEC),
        (lambda p: p["spec"]["initContainers"][0].update(image="evil"), SPEC),
        (lambda p: p["spec"].update(activeDeadlineSeconds=1), SPEC),
        (lambda p: p["spec"].pop("activeDeadlineSeconds"), SPEC),
        (lambda p: p["spec"]["tolerations"].append({"operator": "Exists"}), SPEC),
        (lambda p: p["spec"].update(terminationGracePeriodSeconds=0), SPEC),
        (lambda p: p["spec"]["nodeSelector"].update(pool="other"), SPEC),
        (lambda p: p["spec"].pop("affinity"), SPEC),
    ],
    ids=["label", "labels-removed", "annotation", "finalizers", "owners", "image", "init-image", "deadline",
         "deadline-removed", "toleration", "grace", "node-selector", "affinity"],
)
async def test_the_scheduler_may_change_nothing_else(ungate_policy: Obj, change: Any, message: str) -> None:
    """Each change, made alongside a legitimate removal of the gate, is refused."""
    old = gated_pod()
    new = await ungated(old)
    change(new)
    assert update(ungate_policy, new, old) == message


@pytest.mark.parametrize(
    ("part", "field", "value"),
    [("metadata", "labels", {"app": "web"}), ("metadata", "annotations", {"x": "y"}),
     ("metadata", "finalizers", ["f"]), ("metadata", "ownerReferences", [{"kind": "Job", "name": "j"}]),
     ("spec", "activeDeadlineSeconds", 1), ("spec", "tolerations", [{"operator": "Exists"}]),
     ("spec", "nodeSelector", {"a": "b"}), ("spec", "initContainers", [{"name": "i", "image": "evil"}]),
     ("spec", "affinity", {"nodeAffinity": {}}), ("spec", "terminationGracePeriodSeconds", 0)],
)
async def test_a_field_absent_before_may_not_appear(ungate_policy: Obj, part: str, field: str, value: Any) -> None:
    old = gated_pod(bare=True)
    new = await ungated(old)
    new[part][field] = value
    assert update(ungate_policy, new, old) == (METADATA if part == "metadata" else SPEC)


def test_the_policy_holds_only_the_schedulers_account(ungate_policy: Obj) -> None:
    old = gated_pod()
    relabelled = copy.deepcopy(old)
    relabelled["metadata"]["labels"]["app"] = "web"
    assert update(ungate_policy, relabelled, old) == METADATA
    for user in ("alice", AGENT, SCHEDULER.replace(NAMESPACE, "team-a")):  # an account of the same name elsewhere
        assert update(ungate_policy, relabelled, old, user=user) == "skip"


def test_the_ungate_policy_only_with_dra(render: Render) -> None:
    def names(objs: list[Obj]) -> list[str]:
        return [o["kind"] for o in objs if o["kind"].startswith("ValidatingAdmissionPolicy")
                and o["metadata"]["name"] == UNGATE_ONLY]

    assert names(render(None, *KUBE)) == []
    # With dra.enabled even when placement is off: gated pods from before must still be released, and the
    # scheduler keeps its pod patch for that.
    for objs in (dra_on(render), dra_on(render, dra={"placement": {"enabled": False}}),
                 dra_on(render, agent={"restrictToOwnNode": False})):
        assert sorted(names(objs)) == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]


# --- docs/claims.md ---------------------------------------------------------------------------------------


def test_the_examples_in_the_claims_doc_are_valid_and_use_the_charts_classes(render: Render) -> None:
    """Every YAML example of docs/claims.md is a valid 1.37 object; its claims name the chart's classes and
    ask only for the capacities the driver publishes; its pods name claim templates the page defines."""
    import re

    import yaml

    doc = (CHART.parents[2] / "docs" / "claims.md").read_text()
    objs = [o for block in re.findall(r"```yaml\n(.*?)```", doc, re.S) for o in yaml.safe_load_all(block) if o]
    templates = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ResourceClaimTemplate"}
    pods = [o for o in objs if o["kind"] == "Pod"]
    assert len(templates) == 7 and len(pods) == 4
    classes = {o["metadata"]["name"] for o in kinds(dra_on(render), "DeviceClass")}
    # the attributes of a shared GPU and of a MIG partition, as the agent publishes them
    gpus = [dra.SliceDevice(0, "GPU-0", "m", 1024, "9.0", 0, (1,)),
            dra.SliceDevice(1, "GPU-1", "H100-80GB", 81920, "9.0", 0, (), True, mig_mode=True)]
    attributes = {a for s in dra.resource_slices("n", "u", gpus, "580.65.06", 1) for d in s["spec"].get("devices", [])
                  for a in d["attributes"]}
    for obj in objs:
        kubernetes_validate.validate(obj, "1.37.0", strict=True)
    for name, template in templates.items():
        devices = template["spec"]["spec"]["devices"]
        for request in devices["requests"]:
            exactly = request["exactly"]
            assert exactly["deviceClassName"] in classes, name
            assert set(exactly.get("capacity", {}).get("requests", {})) <= {dra.CAPACITY_MEMORY, dra.CAPACITY_CORES}
            for selector in exactly.get("selectors", []):
                used = set(re.findall(r'attributes\["gpu\.gpupool\.io"\]\.(\w+)', selector["cel"]["expression"]))
                used |= set(re.findall(r'"(\w+)" in device\.attributes', selector["cel"]["expression"]))
                assert used <= attributes, (name, used - attributes)
        for constraint in devices.get("constraints", []):
            assert constraint["matchAttribute"].removeprefix(f"{dra.DRIVER}/") in attributes, name
    for pod in pods:
        refs = {c["name"]: c["resourceClaimTemplateName"] for c in pod["spec"]["resourceClaims"]}
        assert set(refs.values()) <= set(templates), pod["metadata"]["name"]
        for container in pod["spec"]["containers"]:
            assert {c["name"] for c in container["resources"]["claims"]} <= set(refs)


# --- device-plugin manifests served through claims --------------------------------------------------------


def test_a_policy_with_dra_reaches_the_webhooks_configuration(render: Render) -> None:
    import json

    from gpupool.webhook.config import WebhookConfig

    objs = dra_on(render, webhook={"admission": {"policies": {"moved": {"dra": True}, "kept": {}}}})
    policies = json.loads(webhook_env(objs)["GPUPOOL_WEBHOOK_POLICIES"])
    settings = WebhookConfig(policies=policies).settings()
    assert (settings.policy("moved").dra, settings.policy("kept").dra) == (True, False)


def test_the_scheduler_may_make_claim_templates_only_with_dra(render: Render) -> None:
    def rules(objs: list[Obj]) -> list[tuple[str, ...]]:
        (role,) = [o for o in kinds(objs, "ClusterRole") if o["metadata"]["name"] == "gp-gpupool-scheduler"]
        return [tuple(r["resources"]) + tuple(r["verbs"]) for r in role["rules"]]

    assert ("resourceclaimtemplates", "create") in rules(dra_on(render))
    assert not any("resourceclaimtemplates" in r for r in rules(render({}, *KUBE)))


def test_only_the_scheduler_of_a_release_with_dra_placement_places_claims(render: Render) -> None:
    def scheduler_env(objs: list[Obj]) -> dict[str, str]:
        (deployment,) = [o for o in kinds(objs, "Deployment") if o["metadata"]["name"] == "gp-gpupool-scheduler"]
        return {e["name"]: e.get("value", "") for c in deployment["spec"]["template"]["spec"]["containers"]
                for e in c.get("env") or []}

    assert scheduler_env(dra_on(render)).get("GPUPOOL_SCHEDULER_DRA_PLACEMENT") == "true"
    assert "GPUPOOL_SCHEDULER_DRA_PLACEMENT" not in scheduler_env(dra_on(render, dra={"placement": {"enabled": False}}))
    assert "GPUPOOL_SCHEDULER_DRA_PLACEMENT" not in scheduler_env(render({}, *KUBE))


# --- remote shares (dra.remote) ----------------------------------------------------------------------------


def test_remote_serving_is_off_by_default(render: Render) -> None:
    objs = dra_on(render)
    assert [o for o in kinds(objs, "Secret") if o["metadata"]["name"] == "gp-gpupool-remote-key"] == []
    container = agent_pod(objs)["containers"][0]
    assert not any(e["name"].startswith("GPUPOOL_AGENT_REMOTE_") for e in container["env"])
    assert ((("resource.k8s.io",), ("resourceclaims",), ("get",)) in agent_rules(objs))
    assert not any(e["name"] == "GPUPOOL_AGENT_MOVES_NAMESPACE" for e in container["env"])
    assert [o for o in objs if o["metadata"]["name"] == "gp-gpupool-agent-moves"] == []


def test_remote_serving_gives_the_agent_the_key_its_server_port_and_the_claims_it_serves(render: Render) -> None:
    objs = dra_on(render, dra={"remote": {"enabled": True, "port": 7171}})
    (secret,) = [o for o in kinds(objs, "Secret") if o["metadata"]["name"] == "gp-gpupool-remote-key"]
    assert len(base64.b64decode(secret["data"]["key"])) == 64  # random, made once (lookup keeps it on upgrade)
    pod = agent_pod(objs)
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["HOST_IP"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    assert env["GPUPOOL_AGENT_REMOTE_LISTEN"] == "tcp:0.0.0.0:7171"
    assert env["GPUPOOL_AGENT_REMOTE_ADDRESS"] == "tcp:$(HOST_IP):7171"
    assert env["GPUPOOL_AGENT_REMOTE_KEY_FILE"] == "/etc/gpupool/remote/key"
    names = [e["name"] for e in container["env"]]
    assert names.index("HOST_IP") < names.index("GPUPOOL_AGENT_REMOTE_ADDRESS")  # $(HOST_IP) expands
    assert {"name": "gpu-server", "containerPort": 7171, "hostPort": 7171, "protocol": "TCP"} in container["ports"]
    assert {"name": "remote-key", "mountPath": "/etc/gpupool/remote", "readOnly": True} in container["volumeMounts"]
    assert {"name": "remote-key", "secret": {"secretName": "gp-gpupool-remote-key", "defaultMode": 0o400}} \
        in pod["volumes"]
    assert "SYS_ADMIN" in container["securityContext"]["capabilities"]["add"]
    assert (("resource.k8s.io",), ("resourceclaims",), ("get", "list", "watch")) in agent_rules(objs)
    (policy,) = [o for o in kinds(objs, "NetworkPolicy") if o["metadata"]["name"] == "gp-gpupool-agent"]
    assert {"ports": [{"port": "gpu-server", "protocol": "TCP"}]} in policy["spec"]["ingress"]


def test_remote_agents_follow_moves_in_the_releases_namespace_with_a_role_for_that_one_configmap(
        render: Render) -> None:
    from gpupool.api.moves import MOVES_CONFIGMAP

    objs = dra_on(render, dra={"remote": {"enabled": True}})
    (container,) = agent_pod(objs)["containers"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["GPUPOOL_AGENT_MOVES_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    (role,) = [o for o in kinds(objs, "Role") if o["metadata"]["name"] == "gp-gpupool-agent-moves"]
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["gpupool-remote-moves"],
                              "verbs": ["get", "list", "watch", "update", "patch"]}]
    assert MOVES_CONFIGMAP == "gpupool-remote-moves"  # the chart names the contract's ConfigMap
    (binding,) = [o for o in kinds(objs, "RoleBinding") if o["metadata"]["name"] == "gp-gpupool-agent-moves"]
    assert binding["metadata"]["namespace"] == NAMESPACE
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": "gp-gpupool-agent-moves"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gp-gpupool-agent", "namespace": NAMESPACE}]


def test_the_whole_cluster_moves_to_claims_with_the_default_policys_dra(render: Render, helm: Path) -> None:
    """webhook.admission.dra: a gpupool.io/gpu pod of a namespace without a policy label is served through a
    claim (the default policy's dra); a named policy without dra keeps the device plugin; without the
    value nothing is translated; without dra.enabled the chart refuses the value."""
    from gpupool.webhook.admission import Request, decide
    from gpupool.webhook.config import load_config

    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train", "namespace": "team-a"},
           "spec": {"containers": [{"name": "main", "image": "cuda",
                                    "resources": {"limits": {"gpupool.io/gpu": "1", "gpupool.io/gpu-cores": "30"}}}]}}

    def claims_of(objs: list[Obj], policy: str) -> list[Obj]:
        settings = load_config(env=webhook_env(objs)).settings()
        answer = decide(Request("u1", "CREATE", "Pod", "alice", copy.deepcopy(pod), None), True, settings, None,
                        settings.policy(policy))
        assert answer.allowed, answer.message
        return [p["value"] for p in answer.patch if p["path"] == "/spec/resourceClaims"]

    moved = dra_on(render, webhook={"admission": {"dra": True, "policies": {"secure": {"strict": True}}}})
    assert claims_of(moved, "") == [[{"name": "gpupool", "resourceClaimTemplateName": "gpupool-hook-1xwhole-30c"}]]
    assert claims_of(moved, "secure") == []
    assert claims_of(dra_on(render, webhook=SECURE), "") == []
    out = run_helm(helm, "template", "gp", str(CHART), *KUBE, "--set", "webhook.admission.dra=true")
    assert out.returncode != 0 and "webhook.admission.dra serves GPU pods through DRA claims: it needs dra.enabled" \
        in out.stderr, out.stderr
