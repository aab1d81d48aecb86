"""The chart with `dra.enabled`: gpupool's DeviceClasses and the isolation each one names, the agent's
ResourceSlice and ResourceClaim rights, the admission policy that holds its ResourceSlice writes to its own
node (evaluated with cel-python on the slice the agent really builds, gpupool.api.dra.resource_slice), and
the agent's settings and host directories. docs/claims.md is the user's side of the same objects."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import celpy
import kubernetes_validate
import pytest

from gpupool.api import dra
from tests.deploy.conftest import CHART, NAMESPACE, Render, run_helm

Obj = dict[str, Any]

KUBE = ("--kube-version", "1.37.0")  # helm template's own default (1.35) is below what dra.enabled needs
ON: Obj = {"dra": {"enabled": True}}
AGENT = f"system:serviceaccount:{NAMESPACE}:gp-gpupool-agent"
NODE_CLAIM = "authentication.kubernetes.io/node-name"
CLASSES = {"gpu.gpupool.io": "hook", "mps.gpu.gpupool.io": "mps", "whole.gpu.gpupool.io": "none"}


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
        assert spec["selectors"] == [{"cel": {"expression": f'device.driver == "{dra.DRIVER}"'}}], name
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
    claim = {
        "metadata": {"namespace": "ml", "name": "c", "uid": "u1"},
        "status": {"allocation": {"devices": {
            "results": [{"request": "gpu", "driver": dra.DRIVER, "pool": "gpu-1", "device": "gpu-0"}],
            "config": [{"source": "FromClass", "requests": ["gpu"], **c} for c in cls["spec"]["config"]],
        }}},
    }
    assert dra.claim_shares(claim).isolation == CLASSES[name]


def test_extended_resource_name_is_opt_in_and_on_the_whole_class_only(render: Render) -> None:
    objs = dra_on(render, dra={"extendedResourceName": "gpu.gpupool.io/whole"})
    names = {o["metadata"]["name"]: o["spec"].get("extendedResourceName") for o in kinds(objs, "DeviceClass")}
    assert names == {"gpu.gpupool.io": None, "mps.gpu.gpupool.io": None,
                     "whole.gpu.gpupool.io": "gpu.gpupool.io/whole"}


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        # the device plugin's own resource, and any name the webhook would take for a gpupool pod
        ("dra.extendedResourceName=gpupool.io/gpu", "/dra/extendedResourceName"),
        ("dra.extendedResourceName=gpupool.io/gpu-whole", "/dra/extendedResourceName"),
        ("dra.extendedResourceName=no-domain", "/dra/extendedResourceName"),
        ("dra.cdiDir=var/run/cdi", "/dra/cdiDir"),
        ("dra.kubeletRoot=/var/lib/kubelet/", "/dra/kubeletRoot"),
        ("dra.enable=true", "additional properties 'enable' not allowed"),
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
    # ... and only when asked for: the rest of the chart still installs on 1.30.
    assert run_helm(helm, "template", "gp", str(CHART), "--kube-version", "1.30.0").returncode == 0


@pytest.mark.parametrize("version", ["1.36.0", "1.37.0"])
def test_every_object_is_valid_kubernetes_with_dra(render: Render, version: str) -> None:
    objs = dra_on(render, dra={"extendedResourceName": "gpu.gpupool.io/whole"})
    for obj in objs:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} invalid for {version}: {str(e).splitlines()[0]}")


def test_lint_passes_with_dra(helm: Path, tmp_path: Path) -> None:
    out = run_helm(helm, "lint", "--strict", str(CHART), *KUBE, "--set", "dra.enabled=true")
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_doctor_recognises_the_charts_classes(render: Render) -> None:
    from gpupool.doctor.checks import Status, device_classes

    found = device_classes(kinds(dra_on(render), "DeviceClass"))
    assert (found.status, found.detail) == (
        Status.OK, "gpupool's classes: gpu.gpupool.io (hook), mps.gpu.gpupool.io (mps), whole.gpu.gpupool.io (none)")


# --- the agent's rights -----------------------------------------------------------------------------------


def agent_rules(objs: list[Obj]) -> list[tuple[tuple[str, ...], ...]]:
    (role,) = [o for o in kinds(objs, "ClusterRole") if o["metadata"]["name"] == "gp-gpupool-agent"]
    return sorted((tuple(r["apiGroups"]), tuple(r["resources"]), tuple(r["verbs"])) for r in role["rules"])


def test_agent_may_publish_slices_and_read_claims_only_with_dra(render: Render) -> None:
    base = agent_rules(render(None, *KUBE))
    assert not [r for r in base if "resource.k8s.io" in r[0]]
    assert agent_rules(dra_on(render)) == sorted([
        *base,
        (("resource.k8s.io",), ("resourceslices",), ("get", "create", "patch")),
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
    """The slice the agent publishes (api/dra.resource_slice), optionally bent into one it must not write."""
    gpu = dra.SliceDevice(index=0, uuid="GPU-0", model="NVIDIA H100 80GB HBM3", memory_mib=81559)
    out = dra.resource_slice(node, "uid-" + node, [gpu], "580.65.06", 1, "2026-09-01T00:00:00Z")
    out["spec"]["driver"] = driver
    out["spec"]["pool"]["name"] = pool if pool is not None else node
    return out


def decide(policy: Obj, operation: str, new: Obj | None, old: Obj | None, user: str = AGENT,
           node_claim: str | None = "gpu-1") -> str:
    """'skip' when the policy does not apply, 'allow', or the first failing validation's message (an
    evaluation error counts as a failure: failurePolicy Fail)."""
    env = celpy.Environment()
    activation: dict[str, Any] = {
        "object": celpy.json_to_cel(new),
        "oldObject": celpy.json_to_cel(old),
        "request": celpy.json_to_cel({
            "operation": operation,
            "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceslices"},
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


def test_without_dra_the_agent_has_no_dra_settings_or_directories(render: Render) -> None:
    pod = agent_pod(render(None, *KUBE))
    assert not {"GPUPOOL_AGENT_DRA", "GPUPOOL_AGENT_KUBELET_ROOT", "GPUPOOL_AGENT_CDI_DIR"} & set(env(pod))
    assert sorted(host_mounts(pod)) == ["/run/gpupool/hook", "/run/gpupool/mps", "/var/lib/kubelet/device-plugins"]


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
    assert len(templates) == 5 and len(pods) == 4
    classes = {o["metadata"]["name"] for o in kinds(dra_on(render), "DeviceClass")}
    attributes = set(dra.slice_device(dra.SliceDevice(0, "GPU-0", "m", 1024, "9.0", 0, (1,)), "580.65.06",
                                      "t")["attributes"])
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
