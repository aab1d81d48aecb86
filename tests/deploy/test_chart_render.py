"""The Helm chart: lint, render with default and non-default values, and check every rendered object
against the Kubernetes schemas of 1.34-1.35 (kubernetes-validate) and against what the components
actually read (their configuration loaders, the CLI commands, the resource names)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtensionOID

from gpupool.api.names import RESOURCE_CORES, RESOURCE_GPU, RESOURCE_MEMORY
from tests.deploy.conftest import CHART, NAMESPACE, Render, assert_valid_kubernetes, run_helm

# kubernetes-validate 1.37 ships schemas for 1.25-1.37; the chart supports 1.34 and newer (its kubeVersion).
K8S_VERSIONS = ["1.34.0", "1.35.0"]
# CRDs that kubernetes-validate has no schema for; checked field by field below instead.
CERT_MANAGER = "cert-manager.io/v1"

NON_DEFAULT: dict[str, Any] = {
    "image": {"repository": "registry.example.com/ml/gpupool", "tag": "0.1.0-rc1", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "regcred"}],
    "schedulerName": "shared-gpu",
    "defaultPolicy": "fgd",
    "isolation": "mps",
    "splitCount": 4,
    "scheduler": {
        "replicas": 2,
        "kubeScheduler": {"image": {"repository": "registry.k8s.io/kube-scheduler", "tag": "v1.32.3"}},
        "extender": {"port": 9999, "httpTimeout": "20s", "decideInFilter": False},
    },
    "agent": {
        "backend": "fake",
        "fakeGpus": {"gpus": [{"count": 4, "uuid_prefix": "GPU-fake", "model": "A10", "memory_mib": 23028}]},
        "runtimeClassName": "nvidia",
        # Helm merges maps with the defaults: null removes the default label.
        "nodeSelector": {"gpupool.io/gpu-node": None, "nvidia.com/gpu.present": "true"},
    },
    "webhook": {
        "replicas": 3,
        "excludeNamespaces": ["monitoring"],
        "certs": {"mode": "certManager"},
        "allowPrivileged": True,
        "timeoutSeconds": 3,
    },
    "networkPolicy": {"enabled": False},
    "podDisruptionBudget": {"enabled": False},
}

VARIANTS: dict[str, tuple[dict[str, Any] | None, tuple[str, ...]]] = {
    "default": (None, ()),
    "non-default": (NON_DEFAULT, ()),
    # certs.mode=auto on a cluster that serves the cert-manager API
    "auto-cert-manager": (None, ("--api-versions", "cert-manager.io/v1")),
}


def objects(render: Render, variant: str) -> list[dict[str, Any]]:
    values, extra = VARIANTS[variant]
    return render(values, *extra)


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    found = [o for o in by_kind(objs, kind) if o["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, [o["metadata"]["name"] for o in by_kind(objs, kind)]
    return found[0]


def pod_specs(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        o["metadata"]["labels"]["app.kubernetes.io/component"]: o["spec"]["template"]["spec"]
        for o in objs
        if o["kind"] in ("Deployment", "DaemonSet")
    }


def container(objs: list[dict[str, Any]], component: str, name: str) -> dict[str, Any]:
    return next(c for c in pod_specs(objs)[component]["containers"] if c["name"] == name)


def env_of(c: dict[str, Any]) -> dict[str, str]:
    """Container env as the process would see it (fieldRefs resolved to sample values)."""
    samples = {"spec.nodeName": "gpu-node-1", "metadata.name": "gp-gpupool-scheduler-5d8f7-abcde"}
    return {
        e["name"]: e["value"] if "value" in e else samples[e["valueFrom"]["fieldRef"]["fieldPath"]] for e in c["env"]
    }


# --- lint and schemas -------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["default", "non-default"])
def test_helm_lint_strict(helm: Path, tmp_path: Path, variant: str) -> None:
    args = ["lint", "--strict", str(CHART)]
    if VARIANTS[variant][0]:
        values = tmp_path / "values.yaml"
        values.write_text(yaml.safe_dump(VARIANTS[variant][0]))
        args += ["--values", str(values)]
    out = run_helm(helm, *args)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_object_is_valid_kubernetes(render: Render, variant: str, version: str) -> None:
    objs = objects(render, variant)
    unchecked = [obj["kind"] for obj in objs if obj["apiVersion"] == CERT_MANAGER]
    assert_valid_kubernetes((obj for obj in objs if obj["apiVersion"] != CERT_MANAGER), version)
    # Only the cert-manager objects escape schema validation, and only when cert-manager is used.
    expected = [] if variant == "default" else ["Issuer", "Certificate", "Issuer", "Certificate"]
    assert sorted(unchecked) == sorted(expected)


def test_default_render_has_each_component_once(render: Render) -> None:
    objs = objects(render, "default")
    kinds = sorted(
        (o["kind"], o["metadata"]["name"]) for o in objs if o["kind"] in ("Deployment", "DaemonSet", "Service")
    )
    assert kinds == [
        ("DaemonSet", "gp-gpupool-agent"),
        ("Deployment", "gp-gpupool-scheduler"),
        ("Deployment", "gp-gpupool-webhook"),
        ("Service", "gp-gpupool-webhook"),
    ]
    for obj in objs:
        if "namespace" in obj["metadata"] and obj["kind"] != "RoleBinding":
            assert obj["metadata"]["namespace"] == NAMESPACE, obj["metadata"]


# --- scheduler --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variant", "port", "name"), [("default", 8888, "gpupool-scheduler"), ("non-default", 9999, "shared-gpu")]
)
def test_kube_scheduler_uses_the_loopback_extender(render: Render, variant: str, port: int, name: str) -> None:
    objs = objects(render, variant)
    config = yaml.safe_load(one(objs, "ConfigMap", "-scheduler")["data"]["scheduler-config.yaml"])
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert [p["schedulerName"] for p in config["profiles"]] == [name]
    assert config["leaderElection"]["resourceNamespace"] == NAMESPACE
    (extender,) = config["extenders"]
    assert extender["urlPrefix"] == f"http://127.0.0.1:{port}"
    assert (extender["filterVerb"], extender["prioritizeVerb"], extender["bindVerb"], extender["preemptVerb"]) == (
        "filter",
        "prioritize",
        "bind",
        "preempt",
    )
    assert extender["nodeCacheCapable"] is True and extender["ignorable"] is False and extender["weight"] > 0
    # Slots are real node resources; shares are accounted by the extender alone.
    assert extender["managedResources"] == [
        {"name": RESOURCE_GPU, "ignoredByScheduler": False},
        {"name": RESOURCE_MEMORY, "ignoredByScheduler": True},
        {"name": RESOURCE_CORES, "ignoredByScheduler": True},
    ]
    # The extender binds where kube-scheduler calls it and nowhere else.
    env = env_of(container(objs, "scheduler", "extender"))
    assert env["GPUPOOL_SCHEDULER_HOST"] == "127.0.0.1" and env["GPUPOOL_SCHEDULER_PORT"] == str(port)
    assert "ports" not in container(objs, "scheduler", "extender")


def test_kube_scheduler_image_follows_the_cluster(helm: Path) -> None:
    out = run_helm(helm, "template", "gp", str(CHART), "--kube-version", "v1.34.4-eks-1a2b3c")
    assert out.returncode == 0, out.stderr
    assert "image: registry.k8s.io/kube-scheduler:v1.34.4\n" in out.stdout


def test_kube_scheduler_retries_extender_refusals_as_the_testbed_does(render: Render) -> None:
    """The e2e testbed starts kube-scheduler with the chart's retry bound, so the suite sees what a cluster
    running the chart sees."""
    from tests.harness.testbed import UNSCHEDULABLE_RETRY

    command = container(objects(render, "default"), "scheduler", "kube-scheduler")["command"]
    assert f"--pod-max-in-unschedulable-pods-duration={UNSCHEDULABLE_RETRY}" in command


def test_nothing_outside_the_pod_reaches_the_extender(render: Render) -> None:
    for variant in VARIANTS:
        objs = objects(render, variant)
        services = by_kind(objs, "Service")
        assert [s["metadata"]["name"] for s in services] == ["gp-gpupool-webhook"]
        assert all(s["spec"]["type"] == "ClusterIP" for s in services)
        assert services[0]["spec"]["selector"]["app.kubernetes.io/component"] == "webhook"
        for component, spec in pod_specs(objs).items():
            assert not spec.get("hostNetwork"), component
            for c in spec["containers"]:
                assert all("hostPort" not in p for p in c.get("ports", [])), (component, c["name"])
    policy = one(objects(render, "default"), "NetworkPolicy", "-scheduler")
    assert policy["spec"]["policyTypes"] == ["Ingress"] and policy["spec"]["ingress"] == []


# --- agent and hardening ----------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_host_paths_are_only_the_device_plugin_mps_and_hook_dirs(render: Render, variant: str) -> None:
    specs = pod_specs(objects(render, variant))
    for component, spec in specs.items():
        host_paths = sorted(v["hostPath"]["path"] for v in spec.get("volumes", []) if "hostPath" in v)
        expected = ["/run/gpupool/hook", "/run/gpupool/mps", "/var/lib/kubelet/device-plugins"] \
            if component == "agent" else []
        assert host_paths == expected, component
        if component == "agent":  # the agent is told where the host's hook directory is mounted
            (agent,) = spec["containers"]
            env = {e["name"]: e.get("value") for e in agent["env"]}
            mounts = {m["mountPath"] for m in agent["volumeMounts"]}
            assert env["GPUPOOL_AGENT_HOOK_ROOT"] == "/run/gpupool/hook" and "/run/gpupool/hook" in mounts
            # ... and serves its per-pod GPU metrics on the port the pod declares.
            assert env["GPUPOOL_AGENT_METRICS_PORT"] == "9400"
            assert agent["ports"] == [{"name": "metrics", "containerPort": 9400}]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_containers_are_hardened(render: Render, variant: str) -> None:
    for component, spec in pod_specs(objects(render, variant)).items():
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in spec["containers"]:
            sc = c["securityContext"]
            where = f"{component}/{c['name']}"
            assert sc.get("privileged") is not True, where
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True, where
            assert sc["capabilities"] == {"drop": ["ALL"]}, where
            assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"], where
            assert c["resources"]["limits"]["memory"], where
            # Only the agent runs as root (the kubelet's device-plugin directory is root-owned).
            if component == "agent":
                assert sc["runAsUser"] == 0
            else:
                assert spec["securityContext"]["runAsNonRoot"] is True and "runAsUser" not in sc, where


def test_agent_gets_its_node_and_the_fake_gpus(render: Render) -> None:
    objs = objects(render, "non-default")
    env = env_of(container(objs, "agent", "agent"))
    assert env["NODE_NAME"] == "gpu-node-1"
    spec = pod_specs(objs)["agent"]
    assert spec["runtimeClassName"] == "nvidia" and spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    fake = yaml.safe_load(one(objs, "ConfigMap", "-agent-fake")["data"]["gpus.yaml"])
    assert fake == NON_DEFAULT["agent"]["fakeGpus"]
    assert env["GPUPOOL_AGENT_FAKE_FILE"] == "/etc/gpupool/fake/gpus.yaml"


# --- the settings each component reads --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variant", "policy", "isolation", "split", "scheduler_name"),
    [("default", "gpupool", "hook", 10, "gpupool-scheduler"), ("non-default", "fgd", "mps", 4, "shared-gpu")],
)
def test_rendered_env_is_a_valid_configuration_for_each_component(
    render: Render, variant: str, policy: str, isolation: str, split: int, scheduler_name: str
) -> None:
    from gpupool.agent.config import load_config as agent_config
    from gpupool.scheduler.config import load_config as scheduler_config
    from gpupool.webhook.config import load_config as webhook_config

    objs = objects(render, variant)
    sched = scheduler_config(env=env_of(container(objs, "scheduler", "extender")))
    assert (sched.host, sched.default_policy, sched.scheduler_name) == ("127.0.0.1", policy, scheduler_name)
    assert sched.decide_in_filter is (variant == "default")
    # kube-scheduler's election decides which replica's extender is called; the extender has none of its own.
    assert sched.leader_elect is False
    agent = agent_config(env=env_of(container(objs, "agent", "agent")))
    assert (agent.node_name, agent.isolation, agent.split) == ("gpu-node-1", isolation, split)
    assert str(agent.device_plugin_dir) == "/var/lib/kubelet/device-plugins"
    hook = webhook_config(env=env_of(container(objs, "webhook", "webhook")))
    assert (hook.scheduler_name, hook.default_isolation) == (scheduler_name, isolation)
    assert hook.trusted_users == (
        f"system:serviceaccount:{NAMESPACE}:gp-gpupool-scheduler",
        f"system:serviceaccount:{NAMESPACE}:gp-gpupool-agent",
    )
    # Every GPUPOOL_* variable the chart sets is one the component reads (a typo would be ignored).
    for comp, cname, prefix, model in (
        ("scheduler", "extender", "GPUPOOL_SCHEDULER_", type(sched)),
        ("agent", "agent", "GPUPOOL_AGENT_", type(agent)),
        ("webhook", "webhook", "GPUPOOL_WEBHOOK_", type(hook)),
    ):
        for key in env_of(container(objs, comp, cname)):
            if key.startswith(prefix):
                assert key[len(prefix) :].lower() in model.model_fields, key


def test_container_roles_are_gpupool_commands(render: Render) -> None:
    from click import Context

    from gpupool.cli import main

    objs = objects(render, "default")
    roles = {
        (component, c["name"]): c.get("args") for component, spec in pod_specs(objs).items() for c in spec["containers"]
    }
    assert roles == {
        ("scheduler", "kube-scheduler"): None,
        ("scheduler", "extender"): ["scheduler"],
        ("agent", "agent"): ["agent"],
        ("webhook", "webhook"): ["webhook"],
    }
    for args in roles.values():
        if args:
            assert main.get_command(Context(main), args[0]) is not None, f"gpupool {args[0]} does not exist"


# --- values are checked -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("isolation=vfio", "/isolation"),
        ("defaultPolicy=fastest", "/defaultPolicy"),
        ("splitCount=0", "/splitCount"),
        ("webhook.failurePolicy=Sometimes", "/webhook/failurePolicy"),
        ("webhok.replicas=2", "additional properties 'webhok' not allowed"),
        ("scheduler.extender.httpTimeout=soon", "/scheduler/extender/httpTimeout"),
    ],
)
def test_bad_values_are_refused(helm: Path, setting: str, message: str) -> None:
    out = run_helm(helm, "template", "gp", str(CHART), "--set", setting)
    assert out.returncode != 0
    assert message in out.stderr, out.stderr


def test_values_choices_match_the_code() -> None:
    """The schema's enums and the defaults follow the policy registry and the agent's isolation modes."""
    import json
    import typing

    from gpupool.agent.config import AgentConfig
    from gpupool.core.policies import DEFAULT_POLICY, policy_names

    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert sorted(schema["defaultPolicy"]["enum"]) == sorted(policy_names())
    assert values["defaultPolicy"] == DEFAULT_POLICY
    agent_modes = typing.get_args(AgentConfig.model_fields["isolation"].annotation)
    assert sorted(schema["isolation"]["enum"]) == sorted(agent_modes)
    assert values["isolation"] == AgentConfig.model_fields["isolation"].default


def test_kubernetes_older_than_1_34_is_refused(helm: Path) -> None:
    """kubeVersion is the oldest minor the chart's pods were run on (docs/install.md), not the oldest whose
    APIs would do: the last patch of 1.33 is refused, 1.34.0 itself installs."""
    out = run_helm(helm, "template", "gp", str(CHART), "--kube-version", "v1.33.9")
    assert out.returncode != 0 and "requires kubeVersion: >=1.34.0-0" in out.stderr
    assert run_helm(helm, "template", "gp", str(CHART), "--kube-version", "v1.34.0").returncode == 0


# --- disruption budgets -----------------------------------------------------------------------------------


def test_disruption_budgets(render: Render) -> None:
    default = objects(render, "default")
    # webhook: 2 replicas, keep 1; scheduler: 1 replica, so no PDB (it would block every drain)
    assert [(p["metadata"]["name"], p["spec"]["minAvailable"]) for p in by_kind(default, "PodDisruptionBudget")] == [
        ("gp-gpupool-webhook", 1)
    ]
    two = render({"scheduler": {"replicas": 2}})
    names = sorted(p["metadata"]["name"] for p in by_kind(two, "PodDisruptionBudget"))
    assert names == ["gp-gpupool-scheduler", "gp-gpupool-webhook"]
    assert by_kind(objects(render, "non-default"), "PodDisruptionBudget") == []


# --- webhook configurations and certificates --------------------------------------------------------------


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_webhooks_fail_closed_and_skip_system_namespaces(render: Render, variant: str) -> None:
    objs = objects(render, variant)
    for kind, path, ops in (
        ("MutatingWebhookConfiguration", "/mutate", ["CREATE"]),
        ("ValidatingWebhookConfiguration", "/validate", ["CREATE", "UPDATE"]),
    ):
        # The GPU-pod entry (the one that fails closed); the other pods' entry is in tests/security.
        (hook,) = [h for h in one(objs, kind)["webhooks"] if h["name"] == f"{path[1:]}.gpupool.io"]
        assert hook["failurePolicy"] == "Fail" and hook["sideEffects"] == "None"
        assert hook["admissionReviewVersions"] == ["v1"]
        assert hook["clientConfig"]["service"] == {
            "name": "gp-gpupool-webhook",
            "namespace": NAMESPACE,
            "path": path,
            "port": 443,
        }
        resources = ["pods"] if path == "/mutate" else ["pods", "pods/ephemeralcontainers"]  # kubectl debug
        assert hook["rules"] == [
            {"operations": ops, "apiGroups": [""], "apiVersions": ["v1"], "resources": resources, "scope": "Namespaced"}
        ]
        (expr,) = hook["namespaceSelector"]["matchExpressions"]
        assert expr["key"] == "kubernetes.io/metadata.name" and expr["operator"] == "NotIn"
        extra = ["monitoring"] if variant == "non-default" else []
        assert expr["values"] == ["kube-system", NAMESPACE, *extra]
        assert "objectSelector" not in hook  # a pod label must not be a way around validation


def test_helm_generated_certificate_matches_the_ca_bundles(render: Render) -> None:
    objs = objects(render, "default")
    secret = one(objs, "Secret", "-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    leaf = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    leaf.verify_directly_issued_by(ca)  # raises if the CA did not sign the serving certificate
    names = leaf.extensions.get_extension_for_oid(ExtensionOID.SUBJECT_ALTERNATIVE_NAME).value
    assert f"gp-gpupool-webhook.{NAMESPACE}.svc" in names.get_values_for_type(x509.DNSName)
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        assert one(objs, kind)["webhooks"][0]["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    # The pod mounts exactly this secret as a directory (renewals propagate; subPath mounts would not).
    spec = pod_specs(objs)["webhook"]
    (tls,) = [v for v in spec["volumes"] if v["name"] == "tls"]
    assert tls["secret"]["secretName"] == secret["metadata"]["name"]
    mount = next(m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "tls")
    assert "subPath" not in mount


@pytest.mark.parametrize("variant", ["non-default", "auto-cert-manager"])
def test_cert_manager_issues_and_injects_the_certificate(render: Render, variant: str) -> None:
    objs = objects(render, variant)
    assert by_kind(objs, "Secret") == []
    certs = {c["metadata"]["name"]: c["spec"] for c in by_kind(objs, "Certificate")}
    issuers = {i["metadata"]["name"]: i["spec"] for i in by_kind(objs, "Issuer")}
    serving = certs["gp-gpupool-webhook"]
    assert serving["issuerRef"] == {"name": "gp-gpupool-webhook-ca", "kind": "Issuer"}
    assert issuers["gp-gpupool-webhook-ca"] == {"ca": {"secretName": certs["gp-gpupool-webhook-ca"]["secretName"]}}
    assert certs["gp-gpupool-webhook-ca"]["isCA"] is True
    assert certs["gp-gpupool-webhook-ca"]["issuerRef"]["name"] == "gp-gpupool-webhook-selfsigned"
    assert issuers["gp-gpupool-webhook-selfsigned"] == {"selfSigned": {}}
    assert f"gp-gpupool-webhook.{NAMESPACE}.svc" in serving["dnsNames"]
    spec = pod_specs(objs)["webhook"]
    (tls,) = [v for v in spec["volumes"] if v["name"] == "tls"]
    assert tls["secret"]["secretName"] == serving["secretName"]
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        config = one(objs, kind)
        assert config["metadata"]["annotations"] == {
            "cert-manager.io/inject-ca-from": f"{NAMESPACE}/gp-gpupool-webhook"
        }
        assert "caBundle" not in config["webhooks"][0]["clientConfig"]


def test_agent_mps_daemons_and_cdi_mode_reach_the_agent(render: Render) -> None:
    from gpupool.agent.config import load_config as agent_config

    default = agent_config(env=env_of(container(render(None), "agent", "agent")))
    assert (default.isolation, default.runs_mps_daemons, default.cdi) == ("hook", False, False)
    # A hook node that should also serve mps shares (the class mps.gpu.gpupool.io) runs the daemons; the
    # CDI mode the toolkit setting of docs/install.md needs is one switch, with the kind the node's spec uses.
    objs = render({"agent": {"mpsDaemons": True, "cdi": {"enabled": True, "kind": "example.com/gpu"}}})
    agent = agent_config(env=env_of(container(objs, "agent", "agent")))
    assert (agent.isolation, agent.runs_mps_daemons, agent.cdi, agent.cdi_kind) == (
        "hook", True, True, "example.com/gpu")
    off = agent_config(env=env_of(container(render({"isolation": "mps", "agent": {"mpsDaemons": False}}),
                                            "agent", "agent")))
    assert (off.isolation, off.runs_mps_daemons) == ("mps", False)
