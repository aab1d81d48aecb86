"""Cluster port: the one interface through which services read and write Kubernetes objects.

Objects cross it as plain dicts in Kubernetes JSON shape (`metadata`, `spec`, `status`), so the same
service code runs against a real API server (`kube` adapter, lightkube) and the embedded in-process
cluster (`memory` adapter) used by `gpupool demo` and the tests. Any kind is reached by a `Kind` (core
kinds, custom resources, `resource.k8s.io`); `gpupool.cluster.reflector` keeps a watched local copy.
"""

from gpupool.cluster.port import (
    CRDS,
    DEVICE_CLASSES,
    EVENTS,
    LEASES,
    NAMESPACES,
    NODES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    AlreadyExists,
    ApiError,
    ClusterPort,
    Conflict,
    Gone,
    Invalid,
    Kind,
    NotFound,
    Selector,
    WatchEvent,
)

__all__ = [
    "CRDS",
    "DEVICE_CLASSES",
    "EVENTS",
    "LEASES",
    "NAMESPACES",
    "NODES",
    "PODS",
    "RESOURCE_CLAIMS",
    "RESOURCE_SLICES",
    "AlreadyExists",
    "ApiError",
    "ClusterPort",
    "Conflict",
    "Gone",
    "Invalid",
    "Kind",
    "NotFound",
    "Selector",
    "WatchEvent",
]
