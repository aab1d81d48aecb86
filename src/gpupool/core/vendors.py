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

# Isolation modes (the wire values of gpupool.api.isolation.IsolationMode, spelled here because core imports no
# api module; tests/core/test_vendors.py keeps the two in step).
ISOLATION_NONE = "none"
ISOLATION_HOOK = "hook"
ISOLATION_MPS = "mps"
ISOLATION_MIG = "mig"
ISOLATION_REMOTE = "remote"

# The isolation modes each vendor's cards are served in: the one table the scheduler's filter (core.fit), the
# webhook and the node agent (gpupool.agent.isolation.vendors.served_modes) read, so they cannot disagree.
# - NVIDIA: every mode (the CUDA library's hook, MPS, MIG on the models that have it, remote shares through
#   the forwarding library, which speaks CUDA).
# - AMD: whole cards, hook (the HIP library: a memory cap and the share's own CUs) and compute partitions (mig,
#   for DRA claims; MI300X/MI325X). No MPS, no remote forwarding (its library is a CUDA one).
# - Ascend: whole cards and vNPUs (mig, for DRA claims). gpupool has no memory or compute limiter for CANN
#   programs, so no hook or mps share: a share placed there would hold nothing.
ISOLATION_OF_VENDOR: dict[str, frozenset[str]] = {
    NVIDIA: frozenset({ISOLATION_NONE, ISOLATION_HOOK, ISOLATION_MPS, ISOLATION_MIG, ISOLATION_REMOTE}),
    AMD: frozenset({ISOLATION_NONE, ISOLATION_HOOK, ISOLATION_MIG}),
    ASCEND: frozenset({ISOLATION_NONE, ISOLATION_MIG}),
}
# The modes that hold a *share* (less than a whole card) to its size. A share asked under one of them may only
# go to a card whose vendor holds that mode. Not in it: `none` (nothing is enforced on any vendor, the pod
# said so) and `mig` (a hardware partition, placed by the vendor's partition geometry, not as a share).
SHARE_MODES: tuple[str, ...] = (ISOLATION_HOOK, ISOLATION_MPS, ISOLATION_REMOTE)


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



@dataclass(frozen=True, slots=True)
class VnpuTemplate:
    """One vNPU template of an Ascend chip whose templates name all three resources (`vir10_3c_32g`: 10 AI Cores,
    3 AI CPUs, 32 GB)."""

    name: str
    ai_cores: int
    ai_cpus: int
    memory_mib: int


@dataclass(frozen=True, slots=True)
class AscendVariant:
    """A real 910B variant (Atlas A2 training series) and its vNPU templates: what the chip reports as its name
    through DCMI ("910B3"), its AI CPUs and the templates npu-smi create-vnpu accepts on it."""

    model: str  # the catalogue name (MODELS)
    chip_name: str  # DCMI's dcmi_get_device_chip_info chip_name, npu-smi's "Name"
    ai_cpus: int
    templates: tuple[VnpuTemplate, ...]  # smallest first


# The 910B variants (Atlas 800T A2 class). Source: HAMi's Ascend device configuration (Project-HAMi/
# ascend-device-plugin, ascend-device-configmap.yaml: per chip name its AI Cores, AI CPUs, HBM and templates with
# their AI Cores, AI CPUs and memory), checked for the 910B3 against npu-smi's own output in Huawei's forum
# (`npu-smi info -t info-vnpu` on 910B3 chips carved into two vir10_3c_32g: AI Cores 0/20 free, memory 0/64 GB,
# AI CPUs 1/7, vNPU ids 164 and 165 on physical chip 4). The template names carry the AI Cores (vir<N>), AI CPUs
# (<N>c) and memory (<N>g) themselves. Not modelled: the 910B1 (no template table found) and HAMi's "910B4-1"
# (a 64 GB 910B4 whose DCMI chip name was not found in a public source).
ASCEND_910B_VARIANTS: tuple[AscendVariant, ...] = (
    AscendVariant("Ascend910B2", "910B2", 6, (
        VnpuTemplate("vir03_1c_8g", 3, 1, _gb(8)),
        VnpuTemplate("vir06_1c_16g", 6, 1, _gb(16)),
        VnpuTemplate("vir12_3c_32g", 12, 3, _gb(32)),
    )),
    AscendVariant("Ascend910B3", "910B3", 7, (
        VnpuTemplate("vir05_1c_16g", 5, 1, _gb(16)),
        VnpuTemplate("vir10_3c_32g", 10, 3, _gb(32)),
    )),
    AscendVariant("Ascend910B4", "910B4", 7, (
        VnpuTemplate("vir05_1c_8g", 5, 1, _gb(8)),
        VnpuTemplate("vir10_3c_16g", 10, 3, _gb(16)),
    )),
)

_ASCEND = (
    # The first catalogue row: the Atlas training series' generic 910 templates (vir02-vir16 on 30 or 32 AI Cores)
    # on a 64 GB card. No real chip is exactly this (the 32 GB 910 has these templates, the 64 GB 910B variants
    # have the rows below); kept so that existing inventories, traces and tests that name "Ascend910B" still run.
    CardModel("Ascend910B", ASCEND, _gb(64), ASCEND_910B_AI_CORES, PARTITION_VNPU, 0, ("910B", "Ascend 910B"),
              "AI cores: the smaller of vendors.md's 30 or 32; generic 910-class templates, not a real variant"),
    CardModel("Ascend910B2", ASCEND, _gb(64), 24, PARTITION_VNPU, 0, ("910B2", "Ascend 910B2"),
              "HAMi's Ascend table: 24 AI Cores, 6 AI CPUs, 64 GB"),
    CardModel("Ascend910B3", ASCEND, _gb(64), 20, PARTITION_VNPU, 0, ("910B3", "Ascend 910B3"),
              "HAMi's Ascend table and npu-smi output: 20 AI Cores, 7 AI CPUs, 64 GB"),
    CardModel("Ascend910B4", ASCEND, _gb(32), 20, PARTITION_VNPU, 0, ("910B4", "Ascend 910B4"),
              "HAMi's Ascend table: 20 AI Cores, 7 AI CPUs, 32 GB"),
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


def ascend_variant(model: str) -> AscendVariant | None:
    """The 910B variant (its templates) of a catalogued model, None for any other card."""
    row = card_model(model)
    return next((v for v in ASCEND_910B_VARIANTS if row is not None and v.model == row.name), None)


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


def holds(vendor: str, isolation: str) -> bool:
    """Whether `vendor`'s cards are served in `isolation` (False for a vendor gpupool does not know)."""
    return isolation in ISOLATION_OF_VENDOR.get(vendor.strip().lower(), frozenset())


def share_holders(isolation: str) -> tuple[str, ...] | None:
    """The vendors whose cards hold a share asked under `isolation`, in VENDORS order; None when the mode
    restricts no vendor (not a share mode: `none`, `mig`, or a mode gpupool does not know)."""
    if isolation not in SHARE_MODES:
        return None
    return tuple(v for v in VENDORS if isolation in ISOLATION_OF_VENDOR[v])


def runs_on(runtime: str, vendor: str) -> bool:
    """Whether an image built for `runtime` (or "any") can use a card of `vendor`."""
    wanted = runtime.strip().lower()
    return wanted == ANY_RUNTIME or runtime_of(vendor) == wanted
