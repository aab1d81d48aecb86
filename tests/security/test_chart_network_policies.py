"""The chart's NetworkPolicies (issue 26: the webhook's admitted any pod): the webhook's HTTPS port only from
the API server's addresses (or from outside the pod network), the agent's metrics port only from the
Prometheus pods the values select, nothing else; and the envFrom switch reaches the webhook's settings."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.webhook.config import load_config
from tests.deploy.conftest import NAMESPACE, Render, helm, render  # noqa: F401 (fixtures)


def policy(objs: list[dict[str, Any]], suffix: str) -> dict[str, Any]:
    [found] = [o for o in objs if o["kind"] == "NetworkPolicy" and o["metadata"]["name"].endswith(suffix)]
    return found


def test_the_webhook_admits_only_the_api_servers_addresses(render: Render) -> None:  # noqa: F811
    objs = render({"networkPolicy": {"apiServerCIDRs": ["10.0.0.0/28", "192.168.7.4/32"]}})
    [rule] = policy(objs, "-webhook")["spec"]["ingress"]
    assert rule["ports"] == [{"port": "https", "protocol": "TCP"}]
    assert rule["from"] == [{"ipBlock": {"cidr": "10.0.0.0/28"}}, {"ipBlock": {"cidr": "192.168.7.4/32"}}]


def test_without_the_api_servers_addresses_pods_are_kept_out_by_their_cidrs(render: Render) -> None:  # noqa: F811
    objs = render({"networkPolicy": {"podCIDRs": ["10.244.0.0/16", "fd00:10:244::/56"]}})
    [rule] = policy(objs, "-webhook")["spec"]["ingress"]
    assert rule["from"] == [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.244.0.0/16"]}},
                            {"ipBlock": {"cidr": "::/0", "except": ["fd00:10:244::/56"]}}]


def test_the_agent_admits_only_prometheus_on_its_metrics_port(render: Render) -> None:  # noqa: F811
    spec = policy(render(None), "-agent")["spec"]
    assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "agent"
    assert spec["policyTypes"] == ["Ingress"]
    [rule] = spec["ingress"]
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert rule["from"] == [{"namespaceSelector": {},
                             "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]
    chosen = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
              "podSelector": {"matchLabels": {"app": "prom"}}}
    # (Helm merges maps with the defaults: null drops the default label)
    given = {"namespaceSelector": chosen["namespaceSelector"],
             "podSelector": {"matchLabels": {"app": "prom", "app.kubernetes.io/name": None}}}
    [rule] = policy(render({"networkPolicy": {"prometheus": given}}), "-agent")["spec"]["ingress"]
    assert rule["from"] == [chosen]
    # Without a metrics port the agent takes no ingress at all.
    assert policy(render({"agent": {"metricsPort": 0}}), "-agent")["spec"]["ingress"] == []


@pytest.mark.parametrize("values", [{"allowEnvFrom": True}, {"policies": {"ml": {"allowEnvFrom": True}}}])
def test_allow_env_from_reaches_the_webhook(render: Render, values: dict[str, Any]) -> None:  # noqa: F811
    objs = render({"webhook": {"admission": values}})
    [deployment] = [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-webhook")]
    env = {e["name"]: e.get("value", "") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    settings = load_config(env=env).settings()
    if "policies" in values:
        assert settings.policy("ml").allow_env_from and not settings.policy().allow_env_from
    else:
        assert settings.policy().allow_env_from
