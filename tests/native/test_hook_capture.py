"""CUDA graphs made by stream capture (torch.cuda.graph, vLLM, TensorRT-LLM) under a compute cap.

The library measures a capped pod with CUDA events of its own, recorded on the pod's streams and queried
from its poller thread (native/gp_compute.c). Stream capture forbids both where they would land: an event
recorded on a capturing stream is captured, and querying it invalidates the capture; while a capture
begun in global mode (PyTorch's default) is under way, a potentially unsafe call from any thread not in
relaxed mode invalidates it (the fake follows NVIDIA's documentation, fake_cuda.c; which calls count as
unsafe is not listed by NVIDIA, so FAKE_CAPTURE_UNSAFE is swept). The probe captures a stream for 0.4 s while
it keeps another stream busy, ends the capture and launches the graph: capture must succeed under every
mode and every reading of the rules, capped or not, and the graph's device time is its captured kernels'.

Both tests fail with the library of issue 38 before it checked for capture (events recorded on the
capturing stream, queried from a poller thread in global mode)."""

from __future__ import annotations

import pytest

from tests.native.conftest import PodFactory
from tests.native.native_helpers import kernel_log

UNSAFE = ["query,sync", "sync", ""]  # FAKE_CAPTURE_UNSAFE: what counts as a potentially unsafe call
MODES = {"global": 0, "thread-local": 1, "relaxed": 2}
KERNEL_US = 500  # the probe's kernels: 500 blocks at the fake's 1 us per block


@pytest.mark.parametrize("unsafe", UNSAFE, ids=lambda u: u or "none")
@pytest.mark.parametrize("mode", list(MODES))
def test_a_capped_pod_captures_a_graph_and_launches_it(pods: PodFactory, mode: str, unsafe: str) -> None:
    probe = pods.start(pods.pod(cores="30", gpu={"FAKE_CAPTURE_UNSAFE": unsafe}))
    begin, end, graph_us, launched = probe.ask(f"capture {MODES[mode]} 0.4")
    probe.close()
    assert (begin, end, launched) == (0, 0, 0), f"capture {mode}: begin {begin}, end {end}, launch {launched}"
    # one captured kernel every ~2 ms (and one on the other stream beside it) for 0.4 s, however the cap
    # paced them: a whole number of the probe's kernels, at least one
    assert graph_us >= KERNEL_US and graph_us % KERNEL_US == 0, graph_us
    # the graph ran once, as one piece of device time of its captured length (the fake's graph launch)
    ran = [end_ns - start_ns for _, start_ns, end_ns in kernel_log(pods.device)]
    assert any(abs(length - graph_us * 1000) <= 1000 for length in ran), (graph_us, sorted(ran)[-3:])


def test_uncapped_capture_is_left_alone(pods: PodFactory) -> None:
    """The control: an uncapped pod records no events, so nothing of the library touches its capture."""
    probe = pods.start(pods.pod(cores="100"))
    begin, end, graph_us, launched = probe.ask("capture 0 0.2")
    probe.close()
    assert (begin, end, launched) == (0, 0, 0) and graph_us >= KERNEL_US
