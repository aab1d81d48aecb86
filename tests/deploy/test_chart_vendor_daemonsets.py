"""One release for a cluster that mixes NVIDIA, AMD and Ascend nodes: `agent.vendors` renders one agent
DaemonSet per vendor, each with its backend, its vendor's host mounts and a node affinity that picks its
vendor's nodes (an admin's label, or Node Feature Discovery's PCI labels), while everything else of the
agent (its ServiceAccount, RBAC, own-node admission policies, network policy) covers every one of them.
The default, NVIDIA alone, is the single DaemonSet of before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import CHART, NAMESPACE, Render, assert_valid_kubernetes, run_helm
from tests.deploy.test_chart_agent_policy import annotated, decide, node
from tests.deploy.test_chart_render import K8S_VERSIONS, env_of

Obj = dict[str, Any]

MIXED: Obj = {"agent": {"vendors": ["nvidia", "amd", "ascend"], "ascend": {"chips": [0, 3]}}}
MIXED_NFD: Obj = {"agent": {"vendors": ["nvidia", "amd", "ascend"], "vendorNodes": {"by": "nfd"}}}
# everything a vendor could differ in switched on: DRA with remote shares, the RuntimeClass, the watchdog
MIXED_FULL: Obj = {
    "agent": {"vendors": ["nvidia", "amd", "ascend"], "runtimeClassName": "nvidia", "watchdog": {"enabled": True}},
    "dra": {"enabled": True, "remote": {"enabled": True}},
}
KUBE = ("--kube-version", "1.37.0")  # what dra.enabled needs; the same render as 1.34's otherwise
NAMES = {"nvidia": "gp-gpupool-agent", "amd": "gp-gpupool-agent-amd", "ascend": "gp-gpupool-agent-ascend"}
BACKENDS = {"nvidia": "nvml", "amd": "amdsmi", "ascend": "dcmi"}
GPU_NODE = {"gpupool.io/gpu-node": "true"}
NFD = {"nvidia": "feature.node.kubernetes.io/pci-10de.present",
       "amd": "feature.node.kubernetes.io/pci-1002.present",
       "ascend": "feature.node.kubernetes.io/pci-19e5.present"}


def daemonsets(objs: list[Obj]) -> dict[str, Obj]:
    """The agent DaemonSets by vendor (gpupool.io/agent-vendor; the default's one has none: nvidia)."""
    found = [o for o in objs if o["kind"] == "DaemonSet"]
    by_vendor = {o["metadata"]["labels"].get("gpupool.io/agent-vendor", "nvidia"): o for o in found}
    assert len(by_vendor) == len(found), [o["metadata"]["name"] for o in found]
    return by_vendor


def agent_container(ds: Obj) -> Obj:
    (agent,) = ds["spec"]["template"]["spec"]["containers"]
    found: Obj = agent
    return found


def selects(selector: Obj, labels: dict[str, str]) -> bool:
    """A label selector (matchLabels only, as the chart writes them) against an object's labels."""
    assert set(selector) == {"matchLabels"}, selector
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def runs_on(ds: Obj, node_labels: dict[str, str]) -> bool:
    """Whether the DaemonSet's pod may run on a node with these labels: nodeSelector and the required node
    affinity, evaluated as the scheduler does (terms ORed, expressions ANDed; In, NotIn, Exists)."""
    spec = ds["spec"]["template"]["spec"]
    if any(node_labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    affinity = (spec.get("affinity") or {}).get("nodeAffinity", {})
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return True

    def holds(e: Obj) -> bool:
        value = node_labels.get(e["key"])
        if e["operator"] == "In":
            return value in e["values"]
        if e["operator"] == "NotIn":
            return value not in e["values"]
        assert e["operator"] == "Exists", e
        return value is not None

    return any(all(holds(e) for e in term["matchExpressions"]) for term in required["nodeSelectorTerms"])


def agents_on(objs: list[Obj], node_labels: dict[str, str]) -> list[str]:
    return sorted(v for v, ds in daemonsets(objs).items() if runs_on(ds, node_labels))


def vendor_host_paths(ds: Obj) -> set[str]:
    """The DaemonSet's hostPath volumes of a vendor library (device nodes, the Ascend driver)."""
    spec = ds["spec"]["template"]["spec"]
    return {v["hostPath"]["path"] for v in spec["volumes"] if v["name"].startswith(("amd-", "ascend-"))}


# --- lint and schemas -------------------------------------------------------------------------------------


@pytest.mark.parametrize("values", [MIXED, MIXED_NFD, MIXED_FULL], ids=["label", "nfd", "full"])
def test_lint_strict(helm: Path, tmp_path: Path, values: Obj) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    out = run_helm(helm, "lint", "--strict", str(CHART), "--values", str(path), *KUBE)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize(("values", "version"), [
    *((MIXED, v) for v in K8S_VERSIONS), *((MIXED_NFD, v) for v in K8S_VERSIONS),
    # DRA (resource.k8s.io/v1) needs 1.36
    (MIXED_FULL, "1.36.0"), (MIXED_FULL, "1.37.0"),
])
def test_every_object_is_valid_kubernetes(render: Render, values: Obj, version: str) -> None:
    assert_valid_kubernetes(render(values, *KUBE), version)


# --- the DaemonSets ---------------------------------------------------------------------------------------


def test_three_vendors_three_daemonsets_each_with_its_backend(render: Render) -> None:
    from gpupool.agent.config import load_config

    sets = daemonsets(render(MIXED))
    assert {v: ds["metadata"]["name"] for v, ds in sets.items()} == NAMES
    for vendor, ds in sets.items():
        config = load_config(env=env_of(agent_container(ds)))
        assert config.backend == BACKENDS[vendor], vendor
        # every one is an agent to gpupool doctor and `kubectl get ds -l app.kubernetes.io/component=agent`
        assert ds["metadata"]["labels"]["app.kubernetes.io/component"] == "agent"
        assert ds["metadata"]["labels"]["gpupool.io/agent-vendor"] == vendor


def test_each_vendor_mounts_only_its_own_library_paths(render: Render) -> None:
    sets = daemonsets(render(MIXED))
    assert vendor_host_paths(sets["nvidia"]) == set()
    assert vendor_host_paths(sets["amd"]) == {"/dev/kfd", "/dev/dri", "/opt/rocm"}  # ROCm: libamd_smi.so
    assert vendor_host_paths(sets["ascend"]) == {"/dev/davinci0", "/dev/davinci3", "/dev/davinci_manager",
                                                 "/dev/devmm_svm", "/dev/hisi_hdc", "/usr/local/Ascend/driver"}
    mounts = {m["mountPath"]: m for m in agent_container(sets["ascend"])["volumeMounts"]}
    assert mounts["/usr/local/Ascend/driver"]["readOnly"] is True
    assert "LD_LIBRARY_PATH" in env_of(agent_container(sets["ascend"]))
    assert "LD_LIBRARY_PATH" not in env_of(agent_container(sets["amd"]))


def test_no_pod_is_selected_by_two_daemonsets(render: Render) -> None:
    """A DaemonSet claims the pods its selector matches: each vendor's pods must match its own only."""
    sets = list(daemonsets(render(MIXED)).values())
    for ds in sets:
        for other in sets:
            labels = other["spec"]["template"]["metadata"]["labels"]
            assert selects(ds["spec"]["selector"], labels) is (ds is other), (
                ds["metadata"]["name"], other["metadata"]["name"])


def test_nvidia_keeps_the_name_and_selector_of_the_single_daemonset(render: Render) -> None:
    """An upgrade from NVIDIA alone to several vendors rolls the existing DaemonSet (a selector is
    immutable: a changed one would make helm upgrade fail)."""
    before = daemonsets(render(None))["nvidia"]
    after = daemonsets(render(MIXED))["nvidia"]
    assert after["metadata"]["name"] == before["metadata"]["name"] == NAMES["nvidia"]
    assert after["spec"]["selector"] == before["spec"]["selector"]


def test_only_nvidia_agents_get_the_nvidia_runtime_and_remote_gpu_servers(render: Render) -> None:
    sets = daemonsets(render(MIXED_FULL, *KUBE))
    nvidia = sets.pop("nvidia")
    spec = nvidia["spec"]["template"]["spec"]
    assert spec["runtimeClassName"] == "nvidia"
    env = {e["name"]: e.get("value") for e in agent_container(nvidia)["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and "GPUPOOL_AGENT_REMOTE_LISTEN" in env
    assert {p["name"] for p in agent_container(nvidia)["ports"]} == {"metrics", "gpu-server"}
    for vendor, ds in sets.items():
        spec = ds["spec"]["template"]["spec"]
        names = {e["name"] for e in agent_container(ds)["env"]}
        assert "runtimeClassName" not in spec, vendor
        assert not {n for n in names if n.startswith("NVIDIA_") or "REMOTE" in n}, vendor
        assert {p["name"] for p in agent_container(ds)["ports"]} == {"metrics"}, vendor
        assert "remote-key" not in {v["name"] for v in spec["volumes"]}, vendor
        # DRA and the watchdog are the agent's own, for every vendor
        assert {"GPUPOOL_AGENT_DRA", "GPUPOOL_AGENT_WATCHDOG"} <= names, vendor


# --- which node runs which agent --------------------------------------------------------------------------


@pytest.mark.parametrize(("labels", "agents"), [
    ({}, ["nvidia"]),  # a GPU node of a release that served NVIDIA alone: no new label needed
    ({"gpupool.io/gpu-vendor": "nvidia"}, ["nvidia"]),
    ({"gpupool.io/gpu-vendor": "amd"}, ["amd"]),
    ({"gpupool.io/gpu-vendor": "ascend"}, ["ascend"]),
])
def test_by_label_each_gpu_node_runs_its_own_vendor_agent(render: Render, labels: dict[str, str],
                                                          agents: list[str]) -> None:
    objs = render(MIXED)
    assert agents_on(objs, GPU_NODE | labels) == agents
    # gpupool.io/gpu-node stays what makes a node a GPU node at all
    assert agents_on(objs, labels) == []


@pytest.mark.parametrize("vendor", ["nvidia", "amd", "ascend"])
def test_by_nfd_each_gpu_node_runs_the_agent_of_its_pci_vendor(render: Render, vendor: str) -> None:
    objs = render(MIXED_NFD)
    assert agents_on(objs, GPU_NODE | {NFD[vendor]: "true"}) == [vendor]
    assert agents_on(objs, {NFD[vendor]: "true"}) == []
    # NFD mode ignores the admin's vendor label: a node no PCI label names runs no agent
    assert agents_on(objs, GPU_NODE | {"gpupool.io/gpu-vendor": vendor}) == []


def test_the_nfd_label_names_can_be_changed(render: Render) -> None:
    """For an NFD left at its default (class and vendor in the label): the names are values."""
    values = {"agent": {"vendors": ["nvidia", "amd"], "vendorNodes": {"by": "nfd", "nfd": {
        "nvidia": "feature.node.kubernetes.io/pci-0302_10de.present",
        "amd": "feature.node.kubernetes.io/pci-1200_1002.present",
        "ascend": "feature.node.kubernetes.io/pci-1200_19e5.present"}}}}
    objs = render(values)
    assert agents_on(objs, GPU_NODE | {"feature.node.kubernetes.io/pci-1200_1002.present": "true"}) == ["amd"]
    assert agents_on(objs, GPU_NODE | {NFD["amd"]: "true"}) == []


def test_node_selector_and_tolerations_apply_to_every_vendor(render: Render) -> None:
    values = {"agent": {"vendors": ["nvidia", "amd", "ascend"], "nodeSelector": {"pool": "gpu"},
                        "tolerations": [{"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}}
    for vendor, ds in daemonsets(render(values)).items():
        spec = ds["spec"]["template"]["spec"]
        assert spec["nodeSelector"] == {"gpupool.io/gpu-node": "true", "pool": "gpu"}, vendor
        assert spec["tolerations"] == values["agent"]["tolerations"], vendor


def test_one_vendor_alone_needs_no_vendor_label(render: Render) -> None:
    """With one vendor, agent.nodeSelector alone decides (as before vendors existed)."""
    sets = daemonsets(render({"agent": {"vendors": ["amd"], "vendorNodes": {"by": "nfd"}}}))
    assert list(sets) == ["amd"] and sets["amd"]["metadata"]["name"] == NAMES["amd"]
    assert runs_on(sets["amd"], GPU_NODE)


# --- the default is what it was ---------------------------------------------------------------------------


def test_the_default_is_one_nvidia_daemonset_without_vendor_selection(render: Render) -> None:
    objs = render(None)
    (ds,) = [o for o in objs if o["kind"] == "DaemonSet"]
    assert ds["metadata"]["name"] == NAMES["nvidia"]
    assert "gpupool.io/agent-vendor" not in ds["spec"]["template"]["metadata"]["labels"]
    assert "affinity" not in ds["spec"]["template"]["spec"]
    (policy,) = [o for o in objs if o["kind"] == "NetworkPolicy" and o["metadata"]["name"].startswith(NAMES["nvidia"])]
    assert policy["metadata"]["name"] == NAMES["nvidia"]


@pytest.mark.parametrize("values", [
    {"agent": {"vendors": ["nvidia"]}},
    {"agent": {"vendors": ["nvidia"], "vendorNodes": {"by": "nfd", "label": "example.com/vendor"}}},
], ids=["explicit", "nfd-ignored"])
def test_nvidia_alone_renders_exactly_the_default(helm: Path, tmp_path: Path, values: Obj) -> None:
    """Byte for byte (the Helm-generated certificates aside, which differ on every render)."""
    def text(*extra: str) -> str:
        out = run_helm(helm, "template", "gp", str(CHART), "--namespace", NAMESPACE, *extra)
        assert out.returncode == 0, out.stderr
        secret = ("ca.crt:", "tls.crt:", "tls.key:", "key:", "caBundle:")
        return "\n".join(line for line in out.stdout.splitlines() if not line.strip().startswith(secret))

    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    assert text("--values", str(path)) == text()


# --- what covers every agent ------------------------------------------------------------------------------


def test_every_agent_is_held_to_its_own_node_by_the_admission_policies(render: Render) -> None:
    objs = render(MIXED_FULL, *KUBE)
    vaps = {o["spec"]["matchConstraints"]["resourceRules"][0]["resources"][0]: o["spec"]
            for o in objs if o["kind"] == "ValidatingAdmissionPolicy"
            and o["metadata"]["name"].startswith(f"{NAMES['nvidia']}-own-")}
    assert {"nodes", "pods", "resourceslices"} <= set(vaps)
    (binding,) = [o for o in objs if o["kind"] == "ClusterRoleBinding" and o["roleRef"]["name"] == NAMES["nvidia"]]
    for vendor, ds in daemonsets(objs).items():
        account = ds["spec"]["template"]["spec"]["serviceAccountName"]
        user = f"system:serviceaccount:{NAMESPACE}:{account}"
        # the policies match this agent's user: its own node passes, another node is refused
        assert decide(vaps, "nodes", annotated(node("gpu-1")), node("gpu-1"), user, "gpu-1") == "allow", vendor
        assert decide(vaps, "nodes", annotated(node("gpu-2")), node("gpu-2"), user, "gpu-1") != "allow", vendor
        for policy in vaps.values():
            assert f"'{user}'" in policy["matchConditions"][0]["expression"], vendor
        # and its RBAC is the agent's
        assert {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE} in binding["subjects"], vendor


def test_every_agent_pod_has_exactly_one_network_policy(render: Render) -> None:
    objs = render(MIXED_FULL, *KUBE)
    policies = [o for o in objs if o["kind"] == "NetworkPolicy" and "-agent" in o["metadata"]["name"]]
    for vendor, ds in daemonsets(objs).items():
        labels = ds["spec"]["template"]["metadata"]["labels"]
        (policy,) = [p for p in policies if selects(p["spec"]["podSelector"], labels)]
        ports = [port["port"] for rule in policy["spec"]["ingress"] for port in rule["ports"]]
        # remote shares' GPU servers (CUDA) run in NVIDIA's agents only
        assert ports == (["metrics", "gpu-server"] if vendor == "nvidia" else ["metrics"]), vendor


# --- values refused ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("settings", "message"), [
    (("--set-json", 'agent.vendors=["intel"]'), "/agent/vendors/0"),
    (("--set-json", "agent.vendors=[]"), "/agent/vendors"),
    (("--set-json", 'agent.vendors=["amd","amd"]'), "/agent/vendors"),
    (("--set", "agent.vendorNodes.by=pci"), "/agent/vendorNodes/by"),
    (("--set", "agent.vendorNodes.label=not a label"), "/agent/vendorNodes/label"),
    (("--set", "agent.vendorNodes.nfd.amd=/pci-1002.present"), "/agent/vendorNodes/nfd/amd"),
    (("--set", "agent.vendorNodes.nfd.intel=x"), "additional properties 'intel' not allowed"),
    # with AMD or Ascend beside it, agent.backend is NVIDIA's: amdsmi/dcmi there would be two AMD agents
    (("--set-json", 'agent.vendors=["nvidia","amd"]', "--set", "agent.backend=amdsmi"), "/agent/backend"),
    (("--set-json", 'agent.vendors=["ascend"]', "--set", "agent.backend=dcmi"), "/agent/backend"),
])
def test_bad_vendor_values_are_refused(helm: Path, settings: tuple[str, ...], message: str) -> None:
    out = run_helm(helm, "template", "gp", str(CHART), *settings)
    assert out.returncode != 0
    assert message in out.stderr, out.stderr


def test_the_vendor_choices_match_the_code() -> None:
    import json

    from gpupool.core.vendors import VENDORS

    agent = json.loads((CHART / "values.schema.json").read_text())["properties"]["agent"]["properties"]
    assert sorted(agent["vendors"]["items"]["enum"]) == sorted(VENDORS)
    assert sorted(agent["vendorNodes"]["properties"]["nfd"]["required"]) == sorted(VENDORS)
