"""Which partition geometry a card follows: the one place that decides it, by the catalogue's `partitioning`
kind (gpupool.core.vendors): NVIDIA MIG (gpupool.core.mig, gpupool.core.mig_placement) or the AMD partition
modes and Ascend vNPU templates (gpupool.core.partitions).

The node agent's partition manager (gpupool.agent.devices.mig.MigManager) plans a carving through a
`Geometry`, whatever the vendor: which starts a profile may take, which existing partitions stand in the way
of a new one (and so must be idle, to be destroyed first), whether a layout is valid, and how fragmented a
card is. The ResourceSlice (gpupool.api.dra) and the scheduler's MIG plugin take the vendor geometry's
`PartitionModel` from `vendor_model` and the share a partition grants from `vendor_share`.

In the way, per kind:
- MIG: an instance whose memory slices overlap the new one's;
- AMD (xcp): every partition of another profile (a card is in one compute/memory mode at a time, and a
  mode change replaces all of its partitions) and one of the same profile at the same start (it is reused,
  never in the way, when idle);
- Ascend (vnpu): only a vNPU at the same index; other vNPUs hold their AI Cores until they are destroyed
  (idle ones by the agent's reaping), as gpupool.core.partitions plans them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpupool.core import partitions
from gpupool.core.mig import MigModel, PlacedInstance, mig_model
from gpupool.core.mig import layout_problems as mig_layout_problems
from gpupool.core.mig_placement import MigGPU, MigInstance
from gpupool.core.mig_placement import fragmentation as mig_fragmentation
from gpupool.core.model import MILLI_PER_GPU
from gpupool.core.partitions import PartitionModel, PartitionProfile, partition_model
from gpupool.core.vendors import PARTITION_MIG, PARTITION_VNPU, PARTITION_XCP, card_model

Demand = Mapping[str, float]


def vendor_model(name: str) -> PartitionModel | None:
    """The AMD or Ascend partition geometry of a card model (catalogue kind xcp or vnpu), None otherwise."""
    row = card_model(name)
    if row is None or row.partitioning not in (PARTITION_XCP, PARTITION_VNPU):
        return None
    return partition_model(row.name)


def vendor_share(model: PartitionModel, profile: PartitionProfile, card_memory_mib: int) -> tuple[int, int]:
    """(milli-GPU, MiB) a grant of one partition records on a card reporting `card_memory_mib`: its compute
    units as a fraction of the card's, and its memory as the same fraction of the card's memory *as reported*
    (AMD SMI reports a little less than the catalogue's total, so the partitions of a full layout never add
    up to more than the card the ledger knows), both rounded down."""
    milli = MILLI_PER_GPU * profile.compute_units // model.compute_units
    memory = card_memory_mib * profile.memory_mib // model.memory_mib
    return milli, memory


@dataclass(frozen=True, slots=True)
class Geometry:
    """One card model's partition geometry, as the agent's partition manager plans with it."""

    name: str  # the model's canonical name
    kind: str  # "mig", "xcp" or "vnpu"
    mig: MigModel | None = None
    vendor: PartitionModel | None = None

    @property
    def profiles(self) -> tuple[str, ...]:
        if self.mig is not None:
            return tuple(p.name for p in self.mig.profiles)
        assert self.vendor is not None
        return tuple(p.name for p in self.vendor.profiles)

    def has(self, profile: str) -> bool:
        return profile in self.profiles

    def starts(self, profile: str) -> tuple[int, ...]:
        """Where a partition of `profile` may start: MIG and AMD their allowed starts, Ascend any vNPU index."""
        if self.mig is not None:
            p = self.mig.profile(profile)
            return p.starts if p is not None else ()
        assert self.vendor is not None
        q = self.vendor.profile(profile)
        if q is None:
            return ()
        return q.starts if self.kind == PARTITION_XCP else tuple(range(self.vendor.max_partitions))

    def in_the_way(self, profile: str, start: int, other: str, other_start: int) -> bool:
        """Whether an existing `other`@`other_start` must go before `profile`@`start` can be carved."""
        if self.mig is not None:
            p = self.mig.profile(profile)
            assert p is not None
            q = self.mig.profile(other) or p  # an unknown profile: taken as wide as the new one
            return bool(q.slots(other_start) & p.slots(start))
        if self.kind == PARTITION_XCP:
            return other != profile or other_start == start
        return other_start == start

    def problems(self, layout: Sequence[PlacedInstance]) -> list[str]:
        if self.mig is not None:
            return mig_layout_problems(self.mig, list(layout))
        assert self.vendor is not None
        return partitions.layout_problems(self.vendor, layout)

    def fragmentation(self, instances: Sequence[MigInstance], demand: Demand) -> float:
        if self.mig is not None:
            return mig_fragmentation(MigGPU(self.mig.name, tuple(sorted(instances))), demand)
        assert self.vendor is not None
        return partitions.fragmentation(self.vendor, instances, demand)

    @property
    def one_mode(self) -> bool:
        """True where carving one partition makes the mode's others too (AMD: a mode change makes all of its
        partitions at once), so the agent adopts them as idle instead of finding them in its way."""
        return self.kind == PARTITION_XCP


def geometry(model: str) -> Geometry | None:
    """The partition geometry of a card model: by the catalogue's `partitioning` kind for AMD and Ascend
    cards, else NVIDIA's MIG tables (which also know NVML's long model names); None: the card has none."""
    found = vendor_model(model)
    if found is not None:
        return Geometry(found.name, found.kind, vendor=found)
    mig = mig_model(model)
    if mig is not None:
        return Geometry(mig.name, PARTITION_MIG, mig=mig)
    return None
