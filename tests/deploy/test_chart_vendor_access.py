"""The AMD and Ascend agents as the chart runs them: their own backend (the vendor library, or fake cards for
testbeds and demos), the node's ROCm for AMD SMI (Debian packages no libamd_smi.so), and how they reach their
device nodes without being privileged: a hostPath node is not in the container's allowed devices, so the
vendor's container runtime (a RuntimeClass) hands them out instead, and the host's group that owns them
(Ascend's HwHiAiUser) is joined through supplementalGroups (docs/install.md, "AMD and Ascend nodes")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import CHART, Render, assert_valid_kubernetes, run_helm
from tests.deploy.test_chart_render import K8S_VERSIONS, env_of
from tests.deploy.test_chart_vendor_daemonsets import GPU_NODE, agent_container, daemonsets, runs_on, vendor_host_paths

Obj = dict[str, Any]
THREE = ["nvidia", "amd", "ascend"]
CARDS = {"nvidia": ("GPU-{node}", "L40S", 46068), "amd": ("amd-{node}", "MI300X", 196_592),
         "ascend": ("npu-{node}", "Ascend910B", 65_536)}


def fake_doc(vendor: str) -> Obj:
    prefix, model, mib = CARDS[vendor]
    return {"gpus": [{"count": 2, "uuid_prefix": prefix, "model": model, "memory_mib": mib}]}


# every vendor on fake cards: what the testbed (tests/e2e/test_e2e_chart_vendors.py) and a demo install
ALL_FAKE: Obj = {"agent": {"vendors": THREE, "backend": "fake", "fakeGpus": fake_doc("nvidia"),
                           "amd": {"backend": "fake", "fakeGpus": fake_doc("amd")},
                           "ascend": {"backend": "fake", "fakeGpus": fake_doc("ascend")}}}
RUNTIMES: Obj = {"agent": {"vendors": THREE,
                           "amd": {"runtimeClassName": "amd", "supplementalGroups": [109]},
                           "ascend": {"runtimeClassName": "ascend", "chips": [0, 3], "supplementalGroups": [1000]}}}


def fake_configmaps(objs: list[Obj]) -> dict[str, Obj]:
    return {o["metadata"]["name"]: o for o in objs
            if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-fake")}


def volume(ds: Obj, name: str) -> Obj:
    return next(v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == name)


@pytest.mark.parametrize("values", [ALL_FAKE, RUNTIMES], ids=["fake", "runtimes"])
def test_lint_strict(helm: Path, tmp_path: Path, values: Obj) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    out = run_helm(helm, "lint", "--strict", str(CHART), "--values", str(path))
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("version", [K8S_VERSIONS[0], K8S_VERSIONS[-1]])
@pytest.mark.parametrize("values", [ALL_FAKE, RUNTIMES], ids=["fake", "runtimes"])
def test_every_object_is_valid_kubernetes(render: Render, values: Obj, version: str) -> None:
    assert_valid_kubernetes(render(values), version)


# --- fake cards per vendor --------------------------------------------------------------------------------


def test_each_vendor_runs_fake_cards_of_its_own_from_its_own_configmap(render: Render) -> None:
    from gpupool.agent.config import load_config
    from gpupool.agent.devices.fake import parse_fake_description

    objs = render(ALL_FAKE)
    maps = fake_configmaps(objs)
    assert sorted(maps) == ["gp-gpupool-agent-amd-fake", "gp-gpupool-agent-ascend-fake", "gp-gpupool-agent-fake"]
    for vendor, ds in daemonsets(objs).items():
        env = env_of(agent_container(ds))
        config = load_config(env=env)
        assert config.backend == "fake", vendor
        name = volume(ds, "fake-gpus")["configMap"]["name"]
        # the document the agent reads, parsed by the agent's own parser on a node named n1
        found = parse_fake_description(yaml.safe_load(maps[name]["data"]["gpus.yaml"]), name, node="n1")
        prefix, model, mib = CARDS[vendor]
        assert found.vendor == vendor, name
        assert [(d.uuid, d.model, d.memory_mib) for d in found.devices] == [
            (f"{prefix.replace('{node}', 'n1')}-{i}", model, mib) for i in range(2)], name
        # fake cards need nothing of the host's vendor library, nor its container runtime
        assert vendor_host_paths(ds) == set(), vendor
        assert "runtimeClassName" not in ds["spec"]["template"]["spec"], vendor
        assert not {"ROCM_PATH", "LD_LIBRARY_PATH", "AMD_VISIBLE_DEVICES", "ASCEND_VISIBLE_DEVICES"} & set(env), vendor


def test_a_fake_vendor_daemonset_still_runs_only_on_its_vendors_nodes(render: Render) -> None:
    sets = daemonsets(render(ALL_FAKE))
    for vendor in THREE:
        labels = GPU_NODE | ({} if vendor == "nvidia" else {"gpupool.io/gpu-vendor": vendor})
        assert sorted(v for v, ds in sets.items() if runs_on(ds, labels)) == [vendor]


def test_one_vendor_fake_beside_the_real_libraries_of_the_others(render: Render) -> None:
    from gpupool.agent.config import load_config

    values = {"agent": {"vendors": THREE, "amd": {"backend": "fake", "fakeGpus": fake_doc("amd")}}}
    objs = render(values)
    sets = daemonsets(objs)
    assert {v: load_config(env=env_of(agent_container(ds))).backend for v, ds in sets.items()} == {
        "nvidia": "nvml", "amd": "fake", "ascend": "dcmi"}
    assert list(fake_configmaps(objs)) == ["gp-gpupool-agent-amd-fake"]
    assert vendor_host_paths(sets["amd"]) == set() and "/dev/davinci0" in vendor_host_paths(sets["ascend"])


@pytest.mark.parametrize(("settings", "message"), [
    (("--set", "agent.amd.backend=fake"), "agent.amd.fakeGpus needs its gpus"),
    (("--set", "agent.ascend.backend=fake", "--set-json", 'agent.ascend.fakeGpus={"vendor": "nvidia", "gpus": '
      '[{"uuid": "a", "model": "Ascend910B", "memory_mib": 1}]}'), "agent.ascend.fakeGpus.vendor is nvidia"),
    (("--set", "agent.amd.backend=nvml"), "/agent/amd/backend"),
    (("--set", "agent.ascend.backend=amdsmi"), "/agent/ascend/backend"),
    (("--set", "agent.amd.rocmPath=opt/rocm"), "/agent/amd/rocmPath"),
    (("--set-json", "agent.ascend.supplementalGroups=[-1]"), "/agent/ascend/supplementalGroups/0"),
    (("--set-json", 'agent.amd.supplementalGroups=["render"]'), "/agent/amd/supplementalGroups/0"),
    (("--set", "agent.amd.privileged=true"), "additional properties 'privileged' not allowed"),
])
def test_bad_vendor_agent_values_are_refused(helm: Path, settings: tuple[str, ...], message: str) -> None:
    out = run_helm(helm, "template", "gp", str(CHART), "--set-json", f"agent.vendors={THREE}".replace("'", '"'),
                   *settings)
    assert out.returncode != 0
    assert message in out.stderr, out.stderr


# --- AMD SMI's library: the node's ROCm -------------------------------------------------------------------


@pytest.mark.parametrize(("path", "mounted"), [("/opt/rocm-7.0.2", True), ("", False)], ids=["versioned", "none"])
def test_rocm_path_is_the_nodes_rocm_read_only_or_nothing(render: Render, path: str, mounted: bool) -> None:
    ds = daemonsets(render({"agent": {"vendors": THREE, "amd": {"rocmPath": path}}}))["amd"]
    env = env_of(agent_container(ds))
    mounts = {m["mountPath"]: m for m in agent_container(ds)["volumeMounts"]}
    if mounted:
        assert volume(ds, "amd-rocm")["hostPath"] == {"path": path, "type": "Directory"}
        assert mounts["/opt/rocm"] == {"name": "amd-rocm", "mountPath": "/opt/rocm", "readOnly": True}
        assert env["ROCM_PATH"] == "/opt/rocm"
    else:  # an image that carries libamd_smi.so itself
        assert "/opt/rocm" not in mounts and "ROCM_PATH" not in env
        assert vendor_host_paths(ds) == {"/dev/kfd", "/dev/dri"}


# --- device access ----------------------------------------------------------------------------------------


def test_with_the_vendors_runtime_the_device_nodes_come_from_it_not_from_host_paths(render: Render) -> None:
    sets = daemonsets(render(RUNTIMES))
    amd, ascend = sets["amd"], sets["ascend"]
    assert amd["spec"]["template"]["spec"]["runtimeClassName"] == "amd"
    assert env_of(agent_container(amd))["AMD_VISIBLE_DEVICES"] == "all"
    assert vendor_host_paths(amd) == {"/opt/rocm"}  # the library still comes from the node
    assert ascend["spec"]["template"]["spec"]["runtimeClassName"] == "ascend"
    assert env_of(agent_container(ascend))["ASCEND_VISIBLE_DEVICES"] == "0,3"  # the chips, physical ids
    assert vendor_host_paths(ascend) == {"/usr/local/Ascend/driver"}
    # NVIDIA's agent keeps what it had: no runtime of another vendor, no other vendor's variables
    nvidia = sets["nvidia"]
    assert "runtimeClassName" not in nvidia["spec"]["template"]["spec"]
    assert not {"AMD_VISIBLE_DEVICES", "ASCEND_VISIBLE_DEVICES"} & set(env_of(agent_container(nvidia)))


def test_supplemental_groups_are_each_vendors_own(render: Render) -> None:
    sets = daemonsets(render(RUNTIMES))
    groups = {v: ds["spec"]["template"]["spec"]["securityContext"].get("supplementalGroups")
              for v, ds in sets.items()}
    assert groups == {"nvidia": None, "amd": [109], "ascend": [1000]}


def test_the_single_vendor_backend_reads_the_vendor_block_too(render: Render) -> None:
    """agent.backend: dcmi (one vendor, the NVIDIA DaemonSet's slot) takes agent.ascend's runtime and groups."""
    ds = daemonsets(render({"agent": {"backend": "dcmi", "ascend": {"runtimeClassName": "ascend",
                                                                    "supplementalGroups": [1000]}}}))["nvidia"]
    spec = ds["spec"]["template"]["spec"]
    assert spec["runtimeClassName"] == "ascend" and spec["securityContext"]["supplementalGroups"] == [1000]
    assert env_of(agent_container(ds))["ASCEND_VISIBLE_DEVICES"] == ",".join(str(i) for i in range(8))


@pytest.mark.parametrize("values", [ALL_FAKE, RUNTIMES, {"agent": {"vendors": THREE}}],
                         ids=["fake", "runtimes", "host-paths"])
def test_no_agent_is_privileged_or_gains_capabilities(render: Render, values: Obj) -> None:
    for vendor, ds in daemonsets(render(values)).items():
        sc = agent_container(ds)["securityContext"]
        assert sc.get("privileged") is not True and sc["capabilities"] == {"drop": ["ALL"]}, vendor
        assert sc["allowPrivilegeEscalation"] is False and sc["runAsUser"] == 0, vendor


def test_the_vendor_values_in_docs_install_render(render: Render) -> None:
    """docs/install.md's helm values for AMD and Ascend nodes (every vendor, with the vendors' runtimes or on
    fake cards) are values this chart takes, and do what the text says."""
    import re

    text = (CHART.parents[2] / "docs" / "install.md").read_text()
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, re.S)]
    vendor_blocks = [b for b in blocks if isinstance(b, dict) and "amd" in (b.get("agent") or {})]
    assert len(vendor_blocks) == 2, len(vendor_blocks)
    for values in vendor_blocks:
        sets = daemonsets(render(values))
        assert sorted(sets) == sorted(THREE)
    runtimes, fake = vendor_blocks
    sets = daemonsets(render(runtimes))
    assert sets["amd"]["spec"]["template"]["spec"]["runtimeClassName"] == "amd"
    assert sets["ascend"]["spec"]["template"]["spec"]["securityContext"]["supplementalGroups"] == [1000]
    assert {v: env_of(agent_container(ds))["GPUPOOL_AGENT_BACKEND"] for v, ds in daemonsets(render(fake)).items()} \
        == dict.fromkeys(THREE, "fake")
