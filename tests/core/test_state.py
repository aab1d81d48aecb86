from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.model import Allocation, GPUGrant, GPURequest, PodRequest
from gpupool.core.placement import Placement, place
from gpupool.core.policies import get_policy, policy_names
from gpupool.core.policy import PolicyContext
from gpupool.core.state import ClusterState

from .helpers import node


def test_allocate_refuses_over_capacity_and_changes_nothing() -> None:
    state = ClusterState([node("a", gpus=1)])
    pod = PodRequest("p", 0, 0, GPURequest(1, 700))
    ok = Allocation("p", "a", (GPUGrant("a-g0", 0, 700, 100),))
    assert state.allocate(pod, ok) is None
    second = PodRequest("q", 0, 0, GPURequest(1, 400))
    before = state.gpu_milli_free.copy()
    assert "too little free" in (state.allocate(second, Allocation("q", "a", (GPUGrant("a-g0", 0, 400, 1),))) or "")
    assert (state.gpu_milli_free == before).all()
    assert "already holds" in (state.allocate(pod, ok) or "")
    assert state.release("p") == ok
    assert state.gpu_milli_free[0, 0] == 1000 and state.release("p") is None


def test_wrong_uuid_is_refused() -> None:
    state = ClusterState([node("a", gpus=1)])
    pod = PodRequest("p", 0, 0, GPURequest(1, 100))
    assert "does not match" in (state.allocate(pod, Allocation("p", "a", (GPUGrant("zzz", 0, 100, 0),))) or "")


requests = st.one_of(
    st.builds(lambda m, mem: GPURequest(1, m, memory_mib=mem), st.integers(1, 1000),
              st.one_of(st.none(), st.integers(1, 50_000))),
    st.builds(lambda k: GPURequest(k), st.integers(1, 3)),
    st.just(GPURequest(0)),
)


@settings(max_examples=60, deadline=None)
@given(
    stream=st.lists(st.tuples(requests, st.integers(0, 20_000), st.booleans()), min_size=1, max_size=60),
    policy=st.sampled_from(policy_names()),
)
def test_no_gpu_ever_exceeds_capacity(stream: list[tuple[GPURequest, int, bool]], policy: str) -> None:
    """Random arrivals and departures under every policy: free capacity stays within [0, total] in both
    dimensions, and releasing everything restores the empty cluster."""
    state = ClusterState([node("a", gpus=2, cpu=32_000), node("b", gpus=3, cpu=16_000, gpu_mem=16_384)])
    ctx = PolicyContext()
    live: list[str] = []
    for k, (gpu, cpu, depart) in enumerate(stream):
        pod = PodRequest(f"p{k}", cpu, 100, gpu)
        decision = place(state, pod, get_policy(policy), ctx)
        if isinstance(decision, Placement):
            assert state.allocate(pod, decision.allocation) is None
            live.append(pod.key)
        if depart and live:
            state.release(live.pop(0))
        assert (state.gpu_milli_free >= 0).all() and (state.gpu_mem_free >= 0).all()
        assert (state.gpu_milli_free <= 1000).all()
        assert (state.gpu_mem_free <= state.gpu_mem_total).all()
        assert (state.cpu_free >= 0).all() and (state.mem_free >= 0).all()
    for key in live:
        state.release(key)
    assert (state.gpu_milli_free[state.gpu_present] == 1000).all()
    assert (state.gpu_mem_free == state.gpu_mem_total).all()
    assert (state.cpu_free == state.cpu_total).all()
