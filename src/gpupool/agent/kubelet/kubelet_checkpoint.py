"""Reading kubelet's own device-manager checkpoint (`kubelet_internal_checkpoint` in the device-plugin
directory), only to tell two calls apart that look the same.

While a pod has served and unserved GPU containers, a call is either kubelet asking again for the last
served container I (it restarted before it checkpointed I's answer, maybe picking other devices) or the
first call for the next container (which may even come with I's device IDs: kubelet hands a plain init
container's devices to the containers after it). Kubelet writes its checkpoint after each container's
Allocate and before it asks for the next container, so whether the checkpoint records I decides it:
recorded → the next container; not recorded → I again.

The file is JSON: {"Data": {"PodDeviceEntries": [{"PodUID", "ContainerName", "ResourceName", "DeviceIDs",
"AllocResp"}, ...], "RegisteredDevices": {...}}, "Checksum": n}. Only the first three fields of an entry
are read: `DeviceIDs` changed shape between kubelet releases (a list, then a map by NUMA node).
"""

from __future__ import annotations

import json
from pathlib import Path

FILE_NAME = "kubelet_internal_checkpoint"


def recorded_containers(directory: Path, pod_uid: str, resource: str) -> set[str] | str:
    """The containers of pod `pod_uid` for which kubelet's checkpoint records an allocation of `resource`;
    a string says why the checkpoint could not be read."""
    path = directory / FILE_NAME
    try:
        doc = json.loads(path.read_bytes())
        entries = doc["Data"]["PodDeviceEntries"] or []
        return {
            str(e["ContainerName"])
            for e in entries
            if e.get("PodUID") == pod_uid and e.get("ResourceName") == resource
        }
    except FileNotFoundError:  # a running kubelet always has one: this is not kubelet's directory
        return f"{path} does not exist"
    except OSError as e:
        return f"cannot read {path}: {e.strerror or e}"
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return f"{path} is not a kubelet device-manager checkpoint as expected ({e!r})"
