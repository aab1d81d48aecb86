"""Does this node's NVIDIA Container Toolkit let any pod take every GPU? Checked at agent start.

With the toolkit's default `accept-nvidia-visible-devices-envvar-when-unprivileged = true`, a container
that sets `NVIDIA_VISIBLE_DEVICES=all` itself (no gpupool resource, no device plugin) is handed every GPU
of the node by the NVIDIA runtime. The admission webhook refuses that variable, but its entry for
non-GPU pods fails open while the webhook is down, and namespaces it never sees (kube-system, excluded
ones) are not checked at all; only the toolkit setting closes it on the node.

The same setting makes the runtime ignore the NVIDIA_VISIBLE_DEVICES that gpupool's agent itself hands a
container (the runtime cannot tell who set it), so with it the agent must hand GPUs over as CDI devices
(`--cdi`). NVIDIA's own device plugin can use volume mounts instead
(`accept-nvidia-visible-devices-as-volume-mounts = true`); gpupool's agent does not implement that yet.

The check reads the toolkit's config.toml (when the agent can see it: mount the host's
/etc/nvidia-container-runtime read-only into the agent) and logs loudly; it changes nothing.
"""

from __future__ import annotations

import logging
import tomllib
from dataclasses import dataclass
from pathlib import Path

DEFAULT_CONFIG = Path("/etc/nvidia-container-runtime/config.toml")
ENVVAR_KEY = "accept-nvidia-visible-devices-envvar-when-unprivileged"
VOLUME_KEY = "accept-nvidia-visible-devices-as-volume-mounts"

log = logging.getLogger("gpupool.agent.toolkit")


@dataclass(frozen=True, slots=True)
class ToolkitCheck:
    path: str
    found: bool
    envvar_when_unprivileged: bool | None = None  # None: not set, the toolkit's default (true) applies
    volume_mounts: bool | None = None  # None: not set (default false)
    problems: tuple[str, ...] = ()

    @property
    def safe(self) -> bool:
        return self.found and not self.problems


def judge(text: str, path: str, cdi: bool = False) -> ToolkitCheck:
    """Read the toolkit's config.toml text; `problems` says what lets pods bypass the pool, or what keeps
    gpupool's own grant from reaching containers (`cdi`: whether the agent hands GPUs over as CDI devices)."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        return ToolkitCheck(path, True, problems=(f"{path}: not valid TOML ({e}); cannot tell whether pods may "
                                                   "choose their GPUs with NVIDIA_VISIBLE_DEVICES",))
    envvar, volume = doc.get(ENVVAR_KEY), doc.get(VOLUME_KEY)
    envvar = envvar if isinstance(envvar, bool) else None
    volume = volume if isinstance(volume, bool) else None
    problems: list[str] = []
    if envvar is not False:
        state = "true" if envvar else "not set (the toolkit's default is true)"
        problems.append(
            f"{path}: {ENVVAR_KEY} is {state}: any unprivileged pod on this node that sets "
            f"NVIDIA_VISIBLE_DEVICES=all gets every GPU, outside gpupool's shares; set it to false "
            "(see docs/install.md)"
        )
    elif not cdi:
        problems.append(
            f"{path}: {ENVVAR_KEY} is false, so the runtime also ignores the NVIDIA_VISIBLE_DEVICES the agent "
            "hands containers: GPU pods would start without their GPUs; run the agent with --cdi "
            "(GPUPOOL_AGENT_CDI=true)"
        )
    return ToolkitCheck(path, True, envvar, volume, tuple(problems))


def check_toolkit(path: Path = DEFAULT_CONFIG, cdi: bool = False) -> ToolkitCheck:
    """Check the toolkit config at `path`; a missing file is reported, not an error (the agent may not
    see the host's /etc, or the node may use CDI only)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return ToolkitCheck(str(path), False)
    except OSError as e:
        return ToolkitCheck(str(path), False, problems=(f"{path}: cannot read ({e.strerror})",))
    return judge(text, str(path), cdi)


def warn_if_unsafe(path: Path = DEFAULT_CONFIG, cdi: bool = False) -> ToolkitCheck:
    """Check and log: a WARNING per problem, an INFO line when the file is not visible."""
    result = check_toolkit(path, cdi)
    for problem in result.problems:
        log.warning("NVIDIA toolkit: %s", problem)
    if not result.found and not result.problems:
        log.info("NVIDIA toolkit config %s not visible to the agent; cannot check %s (docs/install.md)", path,
                 ENVVAR_KEY)
    return result
