"""The isolation modes: how a GPU share is held to its grant on the node (docs/concepts.md, "Isolation modes").

One enum for every reader (webhook, scheduler, agent, simulator). Its values are the wire values, unchanged:
the `gpupool.io/isolation` annotation, the allocation's `isolation` field, a DRA class's `isolation`
parameter and the agent's setting. A member is a `str` and compares equal to its value, so an annotation
read as text compares with the member directly.
"""

from __future__ import annotations

from enum import StrEnum


class IsolationMode(StrEnum):
    NONE = "none"  # the GPUs and their limits as environment, nothing enforced (whole GPUs)
    HOOK = "hook"  # the interception library, limits from the agent's read-only file
    MPS = "mps"  # MPS client limits, one daemon per GPU
    MIG = "mig"  # a hardware partition: a MIG instance on NVIDIA, a compute partition on AMD, a vNPU on Ascend
    REMOTE = "remote"  # a share of a GPU on another node, through the forwarding library (DRA claims only)
