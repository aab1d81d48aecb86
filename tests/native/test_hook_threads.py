"""16 threads allocating and freeing at once never pass the cap (hypothesis picks the cap and the sizes)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.native.native_helpers import MIB, Built, Pod


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    cap_mib=st.integers(min_value=1, max_value=512),
    sizes=st.lists(st.integers(min_value=1, max_value=128 * MIB), min_size=1, max_size=6),
    seed=st.integers(min_value=0, max_value=2**31),
)
def test_sixteen_threads_never_pass_the_cap(built: Built, cap_mib: int, sizes: list[int], seed: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "hook").mkdir()
        probe = Pod(built, root / "gpu", root / "hook", memory_mib=str(cap_mib)).start()
        try:
            rc, max_live, successes, failures, others = probe.ask(
                f"threads 16 60 {seed} {' '.join(map(str, sizes))}"
            )
            cap = cap_mib * MIB
            assert rc == 0 and others == 0  # only success or CUDA_ERROR_OUT_OF_MEMORY, never another code
            assert max_live <= cap
            assert successes + failures > 0
            if min(sizes) <= cap:
                assert successes > 0
            # everything was freed: the whole share is available again, and not a byte more
            assert probe.alloc("mem", cap)[0] == 0
            assert probe.alloc("mem", 1)[0] == 2
        finally:
            probe.close()
