"""The one registry of placement policies: a new policy is one module plus one line here."""

from __future__ import annotations

from collections.abc import Callable

from gpupool.core.policies.clustering import Clustering
from gpupool.core.policies.dra_default import DraDefault
from gpupool.core.policies.fgd import FGD
from gpupool.core.policies.gpupool import GpupoolPolicy
from gpupool.core.policies.packing import BestFit, DotProd, Packing
from gpupool.core.policies.simple import FirstFit, RandomFit
from gpupool.core.policy import Policy

REGISTRY: dict[str, Callable[[], Policy]] = {
    "random": RandomFit,
    "firstfit": FirstFit,
    "bestfit": BestFit,
    "dotprod": DotProd,
    "packing": Packing,
    "clustering": Clustering,
    "fgd": FGD,
    "gpupool": GpupoolPolicy,
    "dra-default": DraDefault,  # baseline: what a stock kube-scheduler does with DRA claims
}

DEFAULT_POLICY = "gpupool"


class UnknownPolicy(ValueError):
    pass


def get_policy(name: str) -> Policy:
    try:
        return REGISTRY[name]()
    except KeyError:
        raise UnknownPolicy(f"unknown policy {name!r}; valid policies: {', '.join(REGISTRY)}") from None


def policy_names() -> list[str]:
    return list(REGISTRY)
