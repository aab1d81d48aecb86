"""Vendors as data: which runtime each vendor's cards run, and a catalogue of the card models gpupool knows
(vendor, memory, compute units, how the card partitions), so placement can route a pod to cards it can use.

A CUDA image runs only on NVIDIA cards, a ROCm image only on AMD Instinct, a CANN image only on Ascend
(vendors.md, "Routing by runtime"). Everything above the node agent knows a vendor only through these names
and this catalogue; the partition geometry itself lives in `gpupool.core.mig` (NVIDIA) and
`gpupool.core.partitions` (AMD, Ascend).

A model missing from the catalogue is not an error: `vendor_of_model` answers None and the caller decides.
Today every card gpupool meets without a vendor is NVIDIA (`GPU.vendor` defaults to "nvidia", the Alibaba
trace's undisclosed G2/G3 cards included), and callers keep that default.
"""

from __future__ import annotations

from dataclasses import dataclass

NVIDIA = "nvidia"
AMD = "amd"
ASCEND = "ascend"

CUDA = "cuda"
ROCM = "rocm"
CANN = "cann"
ANY_RUNTIME = "any"  # an image that carries several runtimes: any card will do

RUNTIME_OF_VENDOR: dict[str, str] = {NVIDIA: CUDA, AMD: ROCM, ASCEND: CANN}
VENDORS: tuple[str, ...] = (NVIDIA, AMD, ASCEND)

# How a model partitions (CardModel.partitioning).
PARTITION_NONE = "none"  # whole card (and soft shares) only
PARTITION_MIG = "mig"  # NVIDIA MIG: gpupool.core.mig
PARTITION_XCP = "xcp"  # AMD compute (SPX/DPX/QPX/CPX) x memory (NPS1/2/4) partition modes: core.partitions
PARTITION_VNPU = "vnpu"  # Ascend vNPU templates: core.partitions

# What a compute unit is called on each vendor's cards (CardModel.compute_units counts these).
UNIT_OF_VENDOR: dict[str, str] = {NVIDIA: "SM", AMD: "CU", ASCEND: "AI Core"}


@dataclass(frozen=True, slots=True)
class CardModel:
    """One card model: what placement needs to know of it besides its partition geometry."""

    name: str  # the name gpupool uses (inventories, the simulator, the MIG table)
    vendor: str  # NVIDIA / AMD / ASCEND
    memory_mib: int  # the card's memory as sold (GiB x 1024); a driver reports a little less
    compute_units: int  # SMs (NVIDIA), CUs (AMD), AI Cores (Ascend)
    partitioning: str = PARTITION_NONE
    # Hardware positions partitions sit on: MIG memory slices, AMD XCCs; 0 where partitions are carved
    # from capacity without a position (Ascend vNPUs) or the card does not partition.
    partition_slots: int = 0
    aliases: tuple[str, ...] = ()  # other names the same card goes by (vendor tools, older inventories)
    note: str = ""  # what about this row is inferred or simplified
    # How the compute units sit on the chip, for CU masks (gpupool.core.cu_masks): compute dies (AMD XCCs) and
    # shader engines per die; 0 shader engines where gpupool does not mask the card's units (not AMD) or does
    # not know its layout.
    xccs: int = 1
    shader_engines: int = 0

    @property
    def runtime(self) -> str:
        return RUNTIME_OF_VENDOR[self.vendor]

    @property
    def unit(self) -> str:
        return UNIT_OF_VENDOR[self.vendor]


def _gb(n: int) -> int:
    return n * 1024


# Bare family names ("A100", "V100") are not aliases: they name cards of different memory sizes.
# NVIDIA: the MIG table's models with the same names and card memory (core.mig.MODELS; a test keeps the two
# in step), then the models the simulator's trace, the demo scenarios and the fake inventories use. SM counts
# are those of the full card (the demo scenarios' sm_count where they give one).
_NVIDIA = (
    CardModel("A100-40GB", NVIDIA, 40960, 108, PARTITION_MIG, 8),
    CardModel("A100-80GB", NVIDIA, 81920, 108, PARTITION_MIG, 8),
    CardModel("H100-80GB", NVIDIA, 81920, 132, PARTITION_MIG, 8, (),
              "SXM5 SM count; the PCIe card (114 SMs) shares the name in the MIG table"),
    CardModel("H100-NVL", NVIDIA, 96256, 132, PARTITION_MIG, 8),
    CardModel("GH200-96GB", NVIDIA, 98304, 132, PARTITION_MIG, 8),
    CardModel("H200", NVIDIA, 144384, 132, PARTITION_MIG, 8),
    CardModel("GH200-144GB", NVIDIA, 147456, 132, PARTITION_MIG, 8),
    CardModel("B200", NVIDIA, 184320, 148, PARTITION_MIG, 8, (), "SM count not in the reference notes"),
    CardModel("A30-24GB", NVIDIA, _gb(24), 56, PARTITION_MIG, 4, ("A30",)),
    CardModel("A10", NVIDIA, _gb(24), 72, aliases=("A10-24GB",)),
    CardModel("L4", NVIDIA, _gb(24), 58, aliases=("L4-24GB",)),
    CardModel("L40S", NVIDIA, _gb(48), 142),
    CardModel("T4", NVIDIA, _gb(16), 40, aliases=("T4-16GB",)),
    CardModel("P100", NVIDIA, _gb(16), 56),
    CardModel("V100M16", NVIDIA, _gb(16), 80, aliases=("V100-16GB",)),
    CardModel("V100M32", NVIDIA, _gb(32), 80, aliases=("V100-32GB",)),
)

# AMD Instinct (vendors.md; AMD SMI partition guide): MI300X and MI325X are 8 XCDs (one XCC each) of 38 CUs;
# MI210 is CDNA2 and does not partition. Shader engines: 4 per XCC on GC 9.4.3 (MI300X, MI325X: rocminfo shows
# 32 for the SPX card, and KFD programs only se0-se3 of each XCC's queue on these chips), so 38 CUs sit 10/10/9/9;
# 8 on the MI210 (KFD programs se0-se7 on its GFX9 generation), 13 CUs each.
_AMD = (
    CardModel("MI300X", AMD, _gb(192), 304, PARTITION_XCP, 8, ("AMD Instinct MI300X", "MI300X OAM"),
              xccs=8, shader_engines=4),
    CardModel("MI325X", AMD, _gb(256), 304, PARTITION_XCP, 8, ("AMD Instinct MI325X",), xccs=8, shader_engines=4),
    CardModel("MI210", AMD, _gb(64), 104, aliases=("AMD Instinct MI210",), shader_engines=8,
              note="shader engines: 8, from KFD's per-SE queue registers on GFX9 and 104 = 8 x 13"),
)

# Ascend. The AI-core counts and memories are named so the partition tables and the docs can say where they
# come from.
ASCEND_910B_AI_CORES = 30
"""vendors.md gives 30 or 32 AI Cores for the training card, depending on the SKU; planning with 30 keeps every
layout valid on both (vir16 + vir08 + vir04 + vir02 = 30 fills the smaller one exactly)."""
ASCEND_310P_MEMORY_MIB = _gb(24)
"""Atlas 300I Pro / 300V Pro (one 310P chip each): 24 GB LPDDR4X per chip in Huawei's product pages; the
dual-chip 300I Duo reports each chip separately."""

_ASCEND = (
    CardModel("Ascend910B", ASCEND, _gb(64), ASCEND_910B_AI_CORES, PARTITION_VNPU, 0, ("910B", "Ascend 910B"),
              "AI cores: the smaller of vendors.md's 30 or 32"),
    CardModel("Ascend310P", ASCEND, ASCEND_310P_MEMORY_MIB, 8, PARTITION_VNPU, 0,
              ("310P", "310P3", "Ascend 310P", "Ascend310P3")),
)

MODELS: dict[str, CardModel] = {m.name: m for m in (*_NVIDIA, *_AMD, *_ASCEND)}


def _key(name: str) -> str:
    """Lower case, single spaces, vendor words dropped ("NVIDIA A10" and "AMD Instinct MI300X" find their
    rows by the plain name too)."""
    words = name.strip().lower().split()
    while words and words[0] in ("nvidia", "amd", "instinct", "huawei"):
        words = words[1:]
    return " ".join(words)


# Every name and alias is unique after _key (tests/core/test_vendors.py checks it).
_BY_KEY: dict[str, CardModel] = {_key(n): m for m in MODELS.values() for n in (m.name, *m.aliases)}


def card_model(name: str) -> CardModel | None:
    """The catalogue row of a model, by its name or an alias (any case, vendor prefix optional)."""
    return _BY_KEY.get(_key(name))


def known_models(vendor: str | None = None) -> list[str]:
    """Catalogue names, sorted; only one vendor's with `vendor`."""
    return sorted(m.name for m in MODELS.values() if vendor is None or m.vendor == vendor)


def vendor_of_model(model: str) -> str | None:
    """NVIDIA / AMD / ASCEND for a catalogued model, None for one gpupool does not know (callers decide; the
    inventory's default for such a card is NVIDIA)."""
    row = card_model(model)
    return row.vendor if row is not None else None


def runtime_of(vendor: str) -> str | None:
    """The runtime a vendor's cards run (cuda / rocm / cann), None for a vendor gpupool does not know."""
    return RUNTIME_OF_VENDOR.get(vendor.strip().lower())


def runtime_of_model(model: str) -> str | None:
    """The runtime of a catalogued model's cards, None for an unknown model."""
    vendor = vendor_of_model(model)
    return runtime_of(vendor) if vendor is not None else None


def runs_on(runtime: str, vendor: str) -> bool:
    """Whether an image built for `runtime` (or "any") can use a card of `vendor`."""
    wanted = runtime.strip().lower()
    return wanted == ANY_RUNTIME or runtime_of(vendor) == wanted
