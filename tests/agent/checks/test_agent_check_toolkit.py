"""The toolkit validation step judges what the agent can see: it fails on evidence (a readable config that
lets pods pick GPUs, a readable version that is too old) and passes, saying what it could not check, when
the host's config or nvidia-ctk is not visible to the agent."""

from __future__ import annotations

from gpupool.agent.checks.toolkit import judge
from gpupool.agent.checks.toolkit_check import ToolkitCheck
from gpupool.agent.checks.toolkit_check import judge as read_config

PATH = "/etc/nvidia-container-runtime/config.toml"
SAFE = read_config("accept-nvidia-visible-devices-envvar-when-unprivileged = false\n", PATH, cdi=True)
UNSAFE = read_config("accept-nvidia-visible-devices-envvar-when-unprivileged = true\n", PATH, cdi=True)
UNSEEN = ToolkitCheck(PATH, False)
NEW, OLD = "NVIDIA Container Toolkit CLI version 1.17.8\ncommit: x\n", "NVIDIA Container Toolkit CLI version 1.17.3"


def test_safe_config_and_a_fixed_version_pass_without_a_note() -> None:
    assert (judge(SAFE, NEW).ok, judge(SAFE, NEW).reason) == (True, "")


def test_evidence_fails_the_step() -> None:
    unsafe = judge(UNSAFE, NEW)
    assert not unsafe.ok and "NVIDIA_VISIBLE_DEVICES=all" in unsafe.reason
    old = judge(SAFE, OLD)
    assert not old.ok and old.reason.startswith("toolkit 1.17.3 is older than 1.17.8")
    assert not judge(UNSEEN, OLD).ok  # a version too old fails even when the config is not visible
    garbled = judge(SAFE, "something else")
    assert not garbled.ok and "cannot read a version" in garbled.reason


def test_what_the_agent_cannot_see_passes_with_a_note() -> None:
    nothing = judge(UNSEEN, None)
    assert nothing.ok and nothing.reason == (f"config {PATH} not visible to the agent; nvidia-ctk not visible to "
                                             "the agent: not checked")
    no_ctk = judge(SAFE, None)
    assert no_ctk.ok and no_ctk.reason == "nvidia-ctk not visible to the agent: not checked"
    no_config = judge(UNSEEN, NEW)
    assert no_config.ok and no_config.reason == f"config {PATH} not visible to the agent: not checked"
