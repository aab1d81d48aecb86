"""Cluster port: the one interface through which services read and write Kubernetes objects.

Objects cross it as plain dicts in Kubernetes JSON shape (`metadata`, `spec`, `status`), so the same
service code runs against a real API server (`kube` adapter, lightkube) and the embedded in-process
cluster (`memory` adapter) used by `gpupool demo` and the tests.
"""

from gpupool.cluster.port import (
    AlreadyExists,
    ApiError,
    ClusterPort,
    Conflict,
    Gone,
    Invalid,
    NotFound,
    WatchEvent,
)

__all__ = [
    "AlreadyExists",
    "ApiError",
    "ClusterPort",
    "Conflict",
    "Gone",
    "Invalid",
    "NotFound",
    "WatchEvent",
]
