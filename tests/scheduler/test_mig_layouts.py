"""The MIG layouts (the mig_placement plugin's MigState, a view of the ledger): the agent's report with the
ledger's own MIG grants laid over it. Whatever
sequence of reservations and releases, what placement sees is a valid layout in which no two pods hold
overlapping slices, and it follows the inventory when the agent reports."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.api.inventory import encode_inventory
from gpupool.api.names import ANN_INVENTORY
from gpupool.core.mig import layout_problems, mig_model
from gpupool.core.mig_placement import MigChoice, MigInstance, choose
from gpupool.core.mig_request import grant_share
from gpupool.core.model import GPU, Allocation, GPUGrant, MigSlot, PodRequest
from gpupool.scheduler.ledger import Ledger
from gpupool.scheduler.mig_layouts import MigState

MODEL = mig_model("A100-40GB")
PROFILES = ["1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]


def node(instances: list[dict[str, object]]) -> dict[str, object]:
    gpus = [GPU("GPU-0", 0, "A100-40GB", 40960), GPU("GPU-1", 1, "A100-40GB", 40960)]
    text = encode_inventory("n0", gpus, 10, extra={0: {"mig": True, "mig_instances": instances}})
    return {"metadata": {"name": "n0", "annotations": {ANN_INVENTORY: text}},
            "status": {"allocatable": {"cpu": "64", "memory": "256Gi"}}}


def attached(obj: dict[str, object]) -> tuple[Ledger, MigState]:
    ledger, mig = Ledger([obj]), MigState()
    ledger.attach(mig)
    return ledger, mig


def reserve(ledger: Ledger, mig: MigState, uid: str, profile: str) -> bool:
    """What Filter + Reserve do for a MIG pod on n0's GPU 0; False when it fits nowhere."""
    assert MODEL is not None
    gpu = mig.layouts.gpus("n0")["GPU-0"]
    c = choose([gpu], profile, {profile: 1.0})
    if not isinstance(c, MigChoice):
        return False
    p = MODEL.profile(profile)
    assert p is not None
    milli, memory = grant_share(MODEL, p)
    grant = GPUGrant("GPU-0", 0, milli, memory, MigSlot(profile, c.option.start))
    assert ledger.assume(uid, f"default/{uid}", PodRequest(key=uid), Allocation(uid, "n0", (grant,)), 1e9) is None
    return True


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.sampled_from(PROFILES)), min_size=1, max_size=25))
def test_reservations_never_overlap(steps: list[tuple[bool, str]]) -> None:
    assert MODEL is not None
    ledger, mig = attached(node([{"profile": "1g.5gb", "start": 6, "used": False}]))  # one idle instance
    held: list[str] = []
    for n, (add, profile) in enumerate(steps):
        if add or not held:
            if reserve(ledger, mig, f"u{n}", profile):
                held.append(f"u{n}")
        else:
            ledger.forget(held.pop(0))
        gpu = mig.layouts.gpus("n0")["GPU-0"]
        assert layout_problems(MODEL, list(gpu.layout)) == []
        used = [i for i in gpu.instances if i.used]
        assert len(used) == len(held)  # each held pod has its own instance


def test_claims_follow_the_report_and_the_ledger() -> None:
    ledger, mig = attached(node([{"profile": "3g.20gb", "start": 0, "used": True}]))
    assert mig.gpu.tolist() == [[True, False]]
    assert reserve(ledger, mig, "a", "2g.10gb")  # 2g starts at 0, 2 or 4; 0-3 are taken: 4
    assert MigInstance("2g.10gb", 4, True) in mig.layouts.gpus("n0")["GPU-0"].instances
    assert mig.layouts.asked == {"2g.10gb": 1}
    # the agent reports the instance it carved: the claim and the report agree, nothing doubles
    ledger.apply_node("MODIFIED", node([{"profile": "3g.20gb", "start": 0, "used": True},
                                        {"profile": "2g.10gb", "start": 4, "used": True}]))
    assert mig.layouts.gpus("n0")["GPU-0"].instances == (MigInstance("2g.10gb", 4, True),
                                                        MigInstance("3g.20gb", 0, True))
    ledger.forget("a")
    assert mig.layouts.asked == {} and mig.layouts.gpus("n0")["GPU-0"].instances[0].used  # the report still says used
