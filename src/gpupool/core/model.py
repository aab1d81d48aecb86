"""Domain objects: GPUs, nodes, what a pod asks for, and what it was given.

Compute shares are kept in *milli-GPU* (thousandths of one GPU's compute) so that both the Kubernetes
resource `gpupool.io/gpu-cores` (percent: 30 % = 300 milli) and the Alibaba trace unit `gpu_milli` map
onto it exactly. Memory is in MiB.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpupool.core.vendors import ANY_RUNTIME, RUNTIME_OF_VENDOR, SHARE_MODES

MILLI_PER_GPU = 1000
# What a pod may say it needs (GPURequest.runtime): a vendor's runtime, or "any" for an image that carries
# several. core.fit places a request only on cards whose vendor runs it.
RUNTIMES: tuple[str, ...] = (*RUNTIME_OF_VENDOR.values(), ANY_RUNTIME)


@dataclass(frozen=True, slots=True)
class GPU:
    uuid: str
    index: int
    model: str
    memory_mib: int
    sm_count: int = 0
    numa_node: int = 0
    nvlink_peers: tuple[int, ...] = ()  # indices of GPUs on the same node joined by NVLink
    vendor: str = "nvidia"
    healthy: bool = True


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: tuple[GPU, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict, hash=False, compare=False)


@dataclass(frozen=True, slots=True)
class GPURequest:
    """What a pod asks of GPUs: `count` GPUs, each with the same share.

    `milli` is the compute share per GPU (1000 = the whole GPU). `memory_mib` is the memory per GPU;
    None means "the same fraction of the card as the compute share" (so a whole-GPU request takes all
    of its memory, and a trace pod with gpu_milli=500 takes half of it).
    """

    count: int = 0
    milli: int = MILLI_PER_GPU
    memory_mib: int | None = None
    models: frozenset[str] = frozenset()  # allowed models; empty = any
    include_uuids: frozenset[str] = frozenset()  # if set, only these GPUs may be used
    exclude_uuids: frozenset[str] = frozenset()
    # The runtime the pod's image needs (cuda, rocm, cann) or "any"; None = not said, which placement reads
    # as "any" (api.pod decides what a pod that says nothing gets).
    runtime: str | None = None
    # The isolation mode its share is held in (hook, mps, remote, none, mig: gpupool.api.isolation); None = not
    # said, which placement reads as "no vendor rule" (the trace's and tests' requests). A share under a mode
    # that holds shares (core.vendors.SHARE_MODES) is placed only on cards whose vendor holds that mode.
    isolation: str | None = None

    @property
    def runs_anywhere(self) -> bool:
        """True when the request does not limit the cards' runtime."""
        return self.runtime is None or self.runtime == ANY_RUNTIME

    @property
    def share_mode(self) -> str | None:
        """The mode a share of this request must be held in on its card, None when any vendor's card will do:
        a whole-card request (nothing shares the card), no isolation said, or a mode that restricts no vendor
        (none: nothing enforced anywhere; mig: a partition, placed by the partition geometry)."""
        if self.whole or self.isolation not in SHARE_MODES:
            return None
        return self.isolation

    @property
    def cores_percent(self) -> float:
        return self.milli / 10

    @property
    def total_milli(self) -> int:
        """GPU compute the request takes over all its GPUs (0 when it asks for none)."""
        return self.count * self.milli

    @property
    def whole(self) -> bool:
        """True when each GPU is taken entirely (no sharing with other pods)."""
        return self.milli >= MILLI_PER_GPU and self.memory_mib is None

    def memory_on(self, gpu_memory_mib: int) -> int:
        """Memory this request needs on a card of the given size (rounded down: never overcommit)."""
        if self.memory_mib is not None:
            return self.memory_mib
        return gpu_memory_mib * self.milli // MILLI_PER_GPU

    def problems(self) -> list[str]:
        """Why this request can never be satisfied anywhere (empty list = well-formed)."""
        out: list[str] = []
        if self.count < 0:
            out.append(f"GPU count {self.count} is negative")
        if not 0 < self.milli <= MILLI_PER_GPU:
            out.append(f"compute share {self.milli / 10:g} percent is outside 0-100 percent of one GPU")
        if self.memory_mib is not None and self.memory_mib <= 0:
            out.append(f"GPU memory {self.memory_mib} MiB must be positive")
        if self.count > 1 and self.milli < MILLI_PER_GPU:
            out.append("a share of a GPU can only be asked for one GPU at a time (count must be 1)")
        if self.runtime is not None and self.runtime not in RUNTIMES:
            out.append(f"runtime {self.runtime!r} is unknown (use one of {', '.join(RUNTIMES)})")
        return out


@dataclass(frozen=True, slots=True)
class PodRequest:
    """A pod as placement sees it. `key` identifies it (namespace/name, or the trace name)."""

    key: str
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu: GPURequest = GPURequest()
    policy: str | None = None  # placement policy asked for by the pod, None = the configured default

    def problems(self) -> list[str]:
        out = self.gpu.problems() if self.gpu.count != 0 else []  # a pod without GPUs has no share to check
        if self.cpu_milli < 0:
            out.append(f"CPU request {self.cpu_milli}m is negative")
        if self.memory_mib < 0:
            out.append(f"memory request {self.memory_mib} MiB is negative")
        return out


@dataclass(frozen=True, slots=True, order=True)
class MigSlot:
    """The MIG instance a grant is served by: its profile and first memory slice on the GPU."""

    profile: str
    start: int


@dataclass(frozen=True, slots=True)
class GPUGrant:
    uuid: str
    index: int
    milli: int
    memory_mib: int
    mig: MigSlot | None = None  # isolation mig: the instance (milli and memory are then the profile's)


@dataclass(frozen=True, slots=True)
class Allocation:
    pod: str
    node: str
    grants: tuple[GPUGrant, ...]
    policy: str = ""
