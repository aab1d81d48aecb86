"""Partition geometry of AMD Instinct and Huawei Ascend cards: the MIG analog for the other vendors.

AMD (MI300X, MI325X): a card is 8 XCCs (compute dies, 38 CUs each). Its compute partition mode (SPX, DPX,
QPX, CPX: 1, 2, 4, 8 partitions) and memory partition mode (NPS1, NPS2, NPS4) are set for the whole card, so
every partition on it has the same profile "<COMPUTE>/<MEMORY>" (e.g. "CPX/NPS4"). Partition k of an
N-partition mode holds XCCs k*8/N .. (k+1)*8/N - 1, and `start` is its first XCC. Each gets total/N CUs and
total/N memory: what AMD's DRA driver advertises per partition ("total GPU VRAM divided by partition
count"). Under NPS1 the memory is one pool the partitions share, not a hardware split: total/N is what
gpupool plans and grants, the HIP memory cap keeps each to it. AMD SMI reports a little less than total/N
(a DPX MI300X partition shows 98,296 MiB, not 98,304), as nvidia-smi does for MIG.

Which compute modes pair with which memory modes is amdgpu's rule for these chips on bare metal
(aqua_vanjaram.c, `__aqua_vanjaram_get_px_mode_info`): SPX with NPS1; DPX with at most 2 memory partitions;
QPX and CPX with NPS1 or NPS4; and the memory modes these chips (GC 9.4.3/9.4.4) offer on bare metal are
NPS1 and NPS4 only (`gmc_v9_0_init_nps_details`), so DPX pairs with NPS1 alone. DPX/NPS2 is a GC 9.5
(MI350-class) pair, and CPX/NPS2 one of SR-IOV virtual functions: neither is modelled. A mode is changed only when the
card is idle, so an AMD card's *idle* partitions never block a new mode: its mode is free while no partition
is in use, and fixed by those in use otherwise.

Ascend (vNPU templates, MindCluster "AVI" rules): a vNPU takes AI Cores and memory from the card's capacity
and has no hardware position; `start` is its vNPU index on the card (0, 1, ...), one per vNPU. Training cards
(the 910 class: vir02/vir04/vir08/vir16, the number being AI Cores) may carve until the AI Cores are used up,
at most one vNPU per two AI Cores (15 on a 30-core card). The 310P (vir01/vir02/vir04 and the fewer-AI-CPU
variants vir02_1c, vir04_3c) has 8 AI Cores, 7 AI CPUs, at most 4 vGroups (each at least 2 AI Cores: one or
two vir01 share a 2-core vGroup by time slicing) and at most 7 vNPUs. The real 910B variants (910B2, 910B3,
910B4: gpupool.core.vendors.ASCEND_910B_VARIANTS) have their own templates, each naming its AI Cores, AI CPUs and
memory (vir10_3c_32g), carved from the chip's three capacities with no vGroup rule.

Layouts are tuples of `gpupool.core.mig.PlacedInstance` as for MIG, and `fragmentation` scores a card the
way `gpupool.core.mig_placement.fragmentation` scores a MIG GPU (idle units the expected demand could not
use), so the scheduler and agent can prefer the carving that keeps larger partitions possible. Its unit is
the XCC on AMD and the AI Core on Ascend.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache

from gpupool.core.mig import PlacedInstance
from gpupool.core.mig_placement import MigChoice, MigInstance, MigOption, MigRefusal
from gpupool.core.vendors import (
    AMD,
    ASCEND,
    ASCEND_910B_VARIANTS,
    PARTITION_VNPU,
    PARTITION_XCP,
    AscendVariant,
    CardModel,
    card_model,
)

Layout = Sequence[PlacedInstance]
Demand = Mapping[str, float]  # profile name -> share of the expected partition pods (sums to 1)

COMPUTE_MODES: dict[str, int] = {"SPX": 1, "DPX": 2, "QPX": 4, "CPX": 8}  # mode -> partitions on 8 XCCs
MEMORY_MODES: dict[str, int] = {"NPS1": 1, "NPS2": 2, "NPS4": 4}  # mode -> memory partitions
# amdgpu's compatible memory modes per compute mode on MI300X/MI325X, bare metal (see the module text).
AMD_COMPATIBLE_MEMORY: dict[str, tuple[str, ...]] = {
    "SPX": ("NPS1",), "DPX": ("NPS1",), "QPX": ("NPS1", "NPS4"), "CPX": ("NPS1", "NPS4"),
}


@dataclass(frozen=True, slots=True)
class PartitionProfile:
    """One partition profile (AMD compute/memory mode pair) or vNPU template (Ascend) of one card model."""

    name: str  # "CPX/NPS4", "vir04"
    compute_units: int  # CUs (AMD) or AI Cores (Ascend) the partition gets
    memory_mib: int
    max_count: int  # most partitions of this profile on one card
    slots: int = 0  # AMD: XCCs one partition spans; Ascend: 0 (no position)
    starts: tuple[int, ...] = ()  # AMD: allowed first XCCs; Ascend: () (any free vNPU index)
    ai_cpus: int = 0  # Ascend 310P and 910B variants: AI CPUs the template takes (0 where not limited)
    note: str = ""  # what about this row is inferred

    def mask(self, start: int) -> int:
        """Bit mask of the XCCs a partition starting at `start` spans (0 for a vNPU)."""
        return ((1 << self.slots) - 1) << start


@dataclass(frozen=True, slots=True)
class PartitionModel:
    """A partitionable AMD or Ascend card model and its profiles (smallest first)."""

    name: str  # the catalogue name (gpupool.core.vendors.MODELS)
    vendor: str
    kind: str  # PARTITION_XCP or PARTITION_VNPU
    compute_units: int
    memory_mib: int
    profiles: tuple[PartitionProfile, ...]
    max_partitions: int  # most partitions of any mix on one card
    slots: int = 0  # AMD: XCCs; Ascend: 0
    ai_cpus: int = 0  # Ascend 310P and 910B variants: AI CPUs vNPUs draw from (0: not a limit)
    vgroups: int = 0  # Ascend 310P: most vGroups (0: not a limit)
    note: str = ""

    @property
    def full_mask(self) -> int:
        return (1 << self.slots) - 1

    def profile(self, name: str) -> PartitionProfile | None:
        for p in self.profiles:
            if p.name == name:
                return p
        return None


@dataclass(frozen=True, slots=True)
class Usage:
    """What a layout takes of a card."""

    compute_units: int  # on the 310P counted per vGroup: a lone vir01 holds its vGroup's 2 AI Cores
    memory_mib: int
    ai_cpus: int
    vgroups: int
    partitions: int
    xcc_mask: int  # AMD: XCCs covered; 0 on Ascend


def _row(name: str, kind: str) -> CardModel:
    """The catalogue row this table builds on; a mismatch is a programming error caught at import."""
    row = card_model(name)
    if row is None or row.partitioning != kind:
        raise ValueError(f"{name}: not a {kind} card in gpupool.core.vendors.MODELS")
    return row


def _amd(name: str, note: str = "") -> PartitionModel:
    row = _row(name, PARTITION_XCP)
    profiles = []
    for compute, n in sorted(COMPUTE_MODES.items(), key=lambda kv: -kv[1]):  # smallest partitions first
        width = row.partition_slots // n
        for memory in AMD_COMPATIBLE_MEMORY[compute]:
            profiles.append(PartitionProfile(
                f"{compute}/{memory}", row.compute_units // n, row.memory_mib // n, n, width,
                tuple(range(0, row.partition_slots, width))))
    return PartitionModel(row.name, AMD, PARTITION_XCP, row.compute_units, row.memory_mib, tuple(profiles),
                          max(COMPUTE_MODES.values()), row.partition_slots, note=note)


# The 910-class training card's templates: vir<N> is N AI Cores. Memory per template is the card's memory
# in proportion to its AI Cores, rounded down (MindCluster gives templates by AI Cores only; HAMi's table for
# the 32 GB, 30-core 910 does the same: 2,184 MiB for vir02).
TRAINING_TEMPLATES = (2, 4, 8, 16)
TRAINING_CORES_PER_VNPU = 2  # at most one vNPU per two AI Cores: 15 on a 30-core card, 16 on a 32-core one

# 310P (HAMi's 310P3 table for memory and AI CPUs; the Atlas 300V vNPU guide for the vGroup rule and the
# variants; MindX DL's "virtual instance combinations" for the 7-vNPU limit).
ASCEND_310P_AI_CPUS = 7
ASCEND_310P_VGROUPS = 4
ASCEND_310P_MAX_VNPUS = 7
ASCEND_310P_VGROUP_MIN_CORES = 2  # a vGroup holds at least 2 AI Cores; one or two vir01 share one


def _training(name: str) -> PartitionModel:
    row = _row(name, PARTITION_VNPU)
    cores, memory = row.compute_units, row.memory_mib
    profiles = tuple(
        PartitionProfile(f"vir{c:02d}", c, memory * c // cores, cores // c,
                         note="memory in proportion to AI Cores")
        for c in TRAINING_TEMPLATES)
    return PartitionModel(row.name, ASCEND, PARTITION_VNPU, cores, memory, profiles,
                          cores // TRAINING_CORES_PER_VNPU,
                          note="910-class templates (vir02-vir16) on the catalogue's 30-core, 64 GB card")


def _inference_310p(name: str) -> PartitionModel:
    row = _row(name, PARTITION_VNPU)
    per_core = row.memory_mib // row.compute_units  # 3,072 MiB: HAMi's vir01 on a 24,576 MiB 310P3
    n = ASCEND_310P_MAX_VNPUS
    profiles = (
        PartitionProfile("vir01", 1, per_core, n, ai_cpus=1),
        PartitionProfile("vir02", 2, 2 * per_core, ASCEND_310P_VGROUPS, ai_cpus=2),
        PartitionProfile("vir02_1c", 2, 2 * per_core, ASCEND_310P_VGROUPS, ai_cpus=1,
                         note="memory taken equal to vir02's"),
        PartitionProfile("vir04", 4, 4 * per_core, 2, ai_cpus=4),
        PartitionProfile("vir04_3c", 4, 4 * per_core, 2, ai_cpus=3, note="memory taken equal to vir04's"),
    )
    return PartitionModel(row.name, ASCEND, PARTITION_VNPU, row.compute_units, row.memory_mib, profiles, n,
                          ai_cpus=ASCEND_310P_AI_CPUS, vgroups=ASCEND_310P_VGROUPS,
                          note="the DVPP variants (vir04_3c_ndvpp, vir04_4c_dvpp) are not modelled")


# A real 910B variant's vNPU ids span 16 per chip (npu-smi create-vnpu: phy_id*16+100 onwards), the most vNPUs
# one chip can hold whatever its templates; its AI Cores, AI CPUs and memory bind long before.
VARIANT_MAX_VNPUS = 16


def _variant(variant: AscendVariant) -> PartitionModel:
    """A 910B variant (gpupool.core.vendors.ASCEND_910B_VARIANTS): its own templates, each naming its AI Cores,
    AI CPUs and memory, carved from the chip's three capacities like the 310P's, without vGroups."""
    row = _row(variant.model, PARTITION_VNPU)
    cores, memory, cpus = row.compute_units, row.memory_mib, variant.ai_cpus
    profiles = tuple(
        PartitionProfile(t.name, t.ai_cores, t.memory_mib,
                         min(cores // t.ai_cores, cpus // t.ai_cpus, memory // t.memory_mib), ai_cpus=t.ai_cpus)
        for t in variant.templates)
    most = min(VARIANT_MAX_VNPUS, max(p.max_count for p in profiles))
    return PartitionModel(row.name, ASCEND, PARTITION_VNPU, cores, memory, profiles, most, ai_cpus=cpus,
                          note=f"{variant.chip_name} templates as HAMi's Ascend table gives them")


MODELS: dict[str, PartitionModel] = {
    m.name: m for m in (
        _amd("MI300X"),
        _amd("MI325X", "compute/memory pairs taken equal to MI300X's (same amdgpu rule for both chips)"),
        _training("Ascend910B"),
        *(_variant(v) for v in ASCEND_910B_VARIANTS),
        _inference_310p("Ascend310P"),
    )
}


def partition_model(name: str) -> PartitionModel | None:
    """The partition geometry of a card model (catalogue name or alias), None when it does not partition
    this way (MI210, NVIDIA cards: see gpupool.core.mig) or is unknown."""
    row = card_model(name)
    return MODELS.get(row.name) if row is not None else None


def known_models() -> list[str]:
    return sorted(MODELS)


def _resolve(model: PartitionModel | str) -> PartitionModel:
    if isinstance(model, PartitionModel):
        return model
    found = partition_model(model)
    if found is None:
        raise KeyError(f"card model {model!r} has no AMD or Ascend partition geometry "
                       f"(known: {', '.join(known_models())})")
    return found


def usage(model: PartitionModel, layout: Layout) -> Usage:
    """Resources a layout takes (instances of unknown profiles are left out; layout_problems names them)."""
    cores = memory = cpus = groups = mask = count = 0
    vir01 = 0
    for inst in layout:
        p = model.profile(inst.profile)
        if p is None:
            continue
        count += 1
        memory += p.memory_mib
        cpus += p.ai_cpus
        mask |= p.mask(inst.start) if model.kind == PARTITION_XCP else 0
        if model.vgroups and p.compute_units < ASCEND_310P_VGROUP_MIN_CORES:
            vir01 += 1
        else:
            cores += p.compute_units
            groups += 1 if model.vgroups else 0
    if vir01:
        shared = -(-vir01 // 2)  # two vir01 per vGroup
        groups += shared
        cores += shared * ASCEND_310P_VGROUP_MIN_CORES
    return Usage(cores, memory, cpus, groups, count, mask)


def layout_problems(model: PartitionModel | str, layout: Layout) -> list[str]:
    """Why a layout is impossible on `model` (empty list = valid)."""
    m = _resolve(model)
    out: list[str] = []
    counts: Counter[str] = Counter()
    seen_starts: set[int] = set()
    used = 0
    modes: list[str] = []
    for inst in layout:
        p = m.profile(inst.profile)
        if p is None:
            out.append(f"{inst.profile}: not a profile of {m.name} "
                       f"(profiles: {', '.join(q.name for q in m.profiles)})")
            continue
        if m.kind == PARTITION_XCP:
            if inst.start not in p.starts:
                out.append(f"{p.name} cannot start at XCC {inst.start} (allowed: {', '.join(map(str, p.starts))})")
                continue
            if used & p.mask(inst.start):
                out.append(f"{p.name} at XCC {inst.start} overlaps another partition")
            used |= p.mask(inst.start)
            if p.name not in modes:
                modes.append(p.name)
        else:
            if not 0 <= inst.start < m.max_partitions:
                out.append(f"{p.name}: vNPU index {inst.start} is outside 0-{m.max_partitions - 1}")
                continue
            if inst.start in seen_starts:
                out.append(f"{p.name}: vNPU index {inst.start} is taken by another vNPU")
            seen_starts.add(inst.start)
        counts[p.name] += 1
        if counts[p.name] == p.max_count + 1:
            out.append(f"more than {p.max_count} partition(s) of {p.name} on {m.name}")
    if len(modes) > 1:
        out.append(f"{m.name} is in one partition mode at a time; the layout mixes {', '.join(modes)}")
    if m.kind == PARTITION_VNPU:
        u = usage(m, layout)
        if u.partitions > m.max_partitions:
            out.append(f"{u.partitions} vNPUs, {m.name} allows at most {m.max_partitions}")
        if u.compute_units > m.compute_units:
            shared = " (one or two vir01 hold a 2-core vGroup)" if m.vgroups else ""
            out.append(f"{u.compute_units} AI Cores asked{shared}, {m.name} has {m.compute_units}")
        if u.memory_mib > m.memory_mib:
            out.append(f"{u.memory_mib} MiB asked, {m.name} has {m.memory_mib} MiB")
        if m.ai_cpus and u.ai_cpus > m.ai_cpus:
            out.append(f"{u.ai_cpus} AI CPUs asked, {m.name} has {m.ai_cpus}")
        if m.vgroups and u.vgroups > m.vgroups:
            out.append(f"{u.vgroups} vGroups needed, {m.name} has at most {m.vgroups}")
    return out


def can_add(model: PartitionModel | str, layout: Layout, profile: PartitionProfile | str, start: int) -> bool:
    """Whether a partition of `profile` at `start` may join an already valid `layout`."""
    name = profile if isinstance(profile, str) else profile.name
    return not layout_problems(model, (*layout, PlacedInstance(name, start)))


def free_starts(model: PartitionModel | str, layout: Layout, profile: PartitionProfile | str) -> list[int]:
    """Where a new partition of `profile` fits beside `layout`: the free allowed first XCCs on AMD; on
    Ascend the lowest free vNPU index if the template fits (vNPU indices are interchangeable), else none."""
    m = _resolve(model)
    p = m.profile(profile if isinstance(profile, str) else profile.name)
    if p is None:
        return []
    if m.kind == PARTITION_XCP:
        return [s for s in p.starts if can_add(m, layout, p, s)]
    taken = {i.start for i in layout}
    index = next(k for k in range(len(layout) + 1) if k not in taken)
    return [index] if can_add(m, layout, p, index) else []


def _canonical(m: PartitionModel, layout: Layout) -> tuple[PlacedInstance, ...]:
    """AMD: sorted by start. Ascend: largest template first (then name), vNPU indices renumbered 0, 1, ...,
    so two layouts holding the same templates compare equal."""
    if m.kind == PARTITION_XCP:
        return tuple(sorted(layout, key=lambda i: (i.start, i.profile)))
    size = {p.name: p.compute_units for p in m.profiles}
    names = sorted((i.profile for i in layout), key=lambda n: (-size.get(n, 0), n))
    return tuple(PlacedInstance(n, k) for k, n in enumerate(names))


def _grow(m: PartitionModel, layout: tuple[PlacedInstance, ...], floor: int) -> Iterator[tuple[PlacedInstance, ...]]:
    """Every valid layout extending `layout`, each once: AMD adds (profile, start) pairs in increasing
    order of their index in the list of all pairs; Ascend adds templates in non-decreasing profile order."""
    yield layout
    if m.kind == PARTITION_XCP:
        pairs = [(p, s) for p in m.profiles for s in p.starts]
        for k in range(floor, len(pairs)):
            p, s = pairs[k]
            if can_add(m, layout, p, s):
                yield from _grow(m, (*layout, PlacedInstance(p.name, s)), k + 1)
    else:
        for k in range(floor, len(m.profiles)):
            p = m.profiles[k]
            if can_add(m, layout, p, len(layout)):
                yield from _grow(m, (*layout, PlacedInstance(p.name, len(layout))), k)


@cache
def valid_layouts(model_name: str) -> tuple[tuple[PlacedInstance, ...], ...]:
    """Every valid layout of a model (the empty one included), canonical (see `_canonical`), sorted."""
    m = _resolve(model_name)
    found = {_canonical(m, lay) for lay in _grow(m, (), 0)}
    return tuple(sorted(found, key=lambda lay: [(i.start, i.profile) for i in lay]))


@cache
def maximal_layouts(model_name: str) -> tuple[tuple[PlacedInstance, ...], ...]:
    """Every valid layout to which no further partition can be added, in `valid_layouts` order."""
    m = _resolve(model_name)
    return tuple(lay for lay in valid_layouts(model_name)
                 if not any(free_starts(m, lay, p) for p in m.profiles))


# --- placement: the fragmentation of a card and the carving that grows it least ---------------------------

def _blocking(m: PartitionModel, instances: Sequence[MigInstance]) -> tuple[PlacedInstance, ...]:
    """The instances a new partition must fit beside: on AMD only those in use (an idle card changes mode
    freely, and idle partitions of the card's mode are there for the taking); on Ascend every existing
    vNPU holds its share of the card until it is destroyed, as an idle MIG instance does."""
    keep = [i for i in instances if i.used or m.kind == PARTITION_VNPU]
    return tuple(PlacedInstance(i.profile, i.start) for i in keep)


def _idle_units(m: PartitionModel, instances: Sequence[MigInstance]) -> int:
    busy = usage(m, [PlacedInstance(i.profile, i.start) for i in instances if i.used])
    if m.kind == PARTITION_XCP:
        return (m.full_mask & ~busy.xcc_mask).bit_count()
    return m.compute_units - busy.compute_units


def _usable_units(m: PartitionModel, instances: Sequence[MigInstance], p: PartitionProfile) -> int:
    """Idle units a stream of `p` partitions could still take: new ones where they fit, idle ones of `p`."""
    idle_own = [i for i in instances if i.profile == p.name and not i.used]
    layout = _blocking(m, instances)
    if m.kind == PARTITION_XCP:
        mask = 0
        for i in idle_own:
            mask |= p.mask(i.start)
        for s in p.starts:
            if can_add(m, layout, p, s):
                mask |= p.mask(s)
        return mask.bit_count()
    units = len(idle_own) * p.compute_units
    grown = list(layout)
    while True:
        starts = free_starts(m, grown, p)
        if not starts:
            return units
        grown.append(PlacedInstance(p.name, starts[0]))
        units += p.compute_units


def fragmentation(model: PartitionModel | str, instances: Sequence[MigInstance], demand: Demand) -> float:
    """Demand-weighted idle units (XCCs on AMD, AI Cores on Ascend) the demand could not use on this card:
    for each profile of the demand, the card's idle units minus those its partitions could still take."""
    return _fragment(_resolve(model).name, tuple(sorted(instances)), tuple(sorted(demand.items())))


@lru_cache(maxsize=65536)  # choose() scores every option of every card: the same states recur (as for MIG)
def _fragment(model_name: str, instances: tuple[MigInstance, ...], demand: tuple[tuple[str, float], ...]) -> float:
    m = MODELS[model_name]
    idle = _idle_units(m, instances)
    total = 0.0
    for name, weight in demand:
        p = m.profile(name)
        if p is None or weight <= 0:
            continue
        total += weight * max(0, idle - _usable_units(m, instances, p))
    return total


@dataclass(frozen=True, slots=True)
class PartitionCard:
    """A partitionable card as placement sees it: its model and the partitions on it."""

    model: str
    instances: tuple[MigInstance, ...] = ()

    def with_partition(self, profile: str, start: int) -> PartitionCard:
        """The card once a pod holds `profile`@`start` (an idle partition there is taken, or one is made).
        On AMD a partition of another mode than the card's idle ones means a mode change, which replaces
        them; the agent's next report shows the new mode's partitions."""
        amd = _resolve(self.model).kind == PARTITION_XCP
        rest = tuple(i for i in self.instances if (i.start != start or i.profile != profile)
                     and (i.used or i.profile == profile or not amd))
        return PartitionCard(self.model, tuple(sorted((*rest, MigInstance(profile, start, True)))))


def options(card: PartitionCard, profile: str) -> list[MigOption]:
    """Every way to serve a pod of `profile` on `card`: its idle partitions of that profile, then new ones."""
    m = _resolve(card.model)
    p = m.profile(profile)
    if p is None:
        return []
    out = [MigOption(profile, i.start, True) for i in card.instances if i.profile == profile and not i.used]
    reused = {o.start for o in out}
    out.extend(MigOption(profile, s, False) for s in free_starts(m, _blocking(m, card.instances), p)
               if s not in reused)
    return out


def choose(cards: Sequence[PartitionCard], profile: str, demand: Demand) -> MigChoice | MigRefusal:
    """The card and partition for a pod of `profile`: where the card's fragmentation grows least; ties
    prefer an existing idle partition, then the fuller card, then the lower index and start (the MIG
    plugin's order, gpupool.core.mig_placement.choose)."""
    best: tuple[tuple[float, int, int, int, int], MigChoice] | None = None
    for k, card in enumerate(cards):
        found = options(card, profile)
        if not found:
            continue
        m = _resolve(card.model)
        before = fragmentation(m, card.instances, demand)
        idle = _idle_units(m, card.instances)
        for opt in found:
            delta = fragmentation(m, card.with_partition(opt.profile, opt.start).instances, demand) - before
            key = (round(delta, 9), 0 if opt.reuse else 1, idle, k, opt.start)
            if best is None or key < best[0]:
                best = (key, MigChoice(k, opt, delta))
    if best is not None:
        return best[1]
    if not any(_resolve(c.model).profile(profile) is not None for c in cards):
        return MigRefusal(f"profile {profile} exists on none of the {len(cards)} card(s) given")
    return MigRefusal(f"no card has an idle {profile} partition or room for a new one")
