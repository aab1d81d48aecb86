"""Every Kubernetes example of README.md and docs/*.md runs as written on the trial's cluster: the chart
installed with its own pods on two real nodes, DRA on (as `scripts/k8s-testbed up --nodes 2 --gpupool` runs
it; the fixtures are test_e2e_chart_pods.py's).

Each fenced ```yaml block is read from the markdown. A block is applied with `kubectl apply` exactly as
written (document order, one block at a time) when every document in it is a Kubernetes object
(apiVersion and kind); a block that is not meant to be applied (helm values, a kube-scheduler
configuration file) must say so right before it, `<!-- not applied: REASON -->`, or the test fails: no
block is passed over silently, and the ones not applied are printed with their reasons. After a block is
applied, every object of it exists, and each of its pods runs, or shows the outcome its document gives
(OUTCOMES); then its objects are deleted (Namespaces at the end), so that examples that reuse a name
(`train` in `team-a`) each run on their own.

The examples' image, nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04, is on the testbed's nodes as the
busybox image under that name (no registry is reachable here; scripts/k8s/images.py EXAMPLE_IMAGES): the
examples' commands run there (`nvidia-smi` is missing, and they go on without it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import ROOT
from tests.e2e.real_node_fixtures import wait_for
from tests.e2e.test_e2e_chart_pods import Cluster, chart_cluster

pytestmark = pytest.mark.e2e
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_APPLIED = re.compile(r"^<!--\s*not applied:\s*(?P<why>.+?)\s*-->$")
# Pods whose document says they do not run on a cluster like this one, and what they show instead:
# (file, namespace/pod) -> (what the document says, a text the pod's Events must contain, in any case).
OUTCOMES = {
    ("docs/claims.md", "team-a/serve"): (
        "an MPS share waits, its reason on the pod, where no MPS daemon runs (none on the trial's nodes: the "
        "fake GPUs have no MPS control program)", "MPS"),
}
Obj = dict[str, Any]


@dataclass
class Example:
    file: str  # relative to the repository
    line: int  # of the opening fence
    text: str
    not_applied: str = ""  # the reason given in the markdown
    objects: list[Obj] = field(default_factory=list)

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


def examples() -> list[Example]:
    out = []
    for path in DOCS:
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            if lines[i].strip() != "```yaml":
                i += 1
                continue
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            marked = NOT_APPLIED.match(before)
            ex = Example(str(path.relative_to(ROOT)), i + 1, "\n".join(lines[i + 1:end]) + "\n",
                         marked.group("why") if marked else "")
            if not ex.not_applied:
                docs = [d for d in yaml.safe_load_all(ex.text) if d is not None]
                ex.objects = docs
            out.append(ex)
            i = end + 1
    return out


def test_every_yaml_block_is_objects_or_marked_not_applied() -> None:
    """No block is passed over silently: each is Kubernetes objects, or says why it is not applied."""
    found = examples()
    assert len(found) >= 10, [str(e) for e in found]
    unmarked = [f"{e}: {d if not isinstance(d, dict) else sorted(d)[:4]}" for e in found if not e.not_applied
                for d in e.objects if not (isinstance(d, dict) and d.get("apiVersion") and d.get("kind"))]
    assert not unmarked, ("yaml blocks that are not Kubernetes objects and not marked "
                          f"`<!-- not applied: REASON -->`: {unmarked}")
    for e in found:
        if e.not_applied:
            print(f"not applied: {e}: {e.not_applied}")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    # The trial's release: gp in gpupool-system (scripts/k8s-testbed up --gpupool).
    with chart_cluster("gp", "gpupool-system", install=True) as c:
        yield c


def _key(obj: Obj) -> str:
    return f"{obj['metadata'].get('namespace', 'default')}/{obj['metadata']['name']}"


def _pod_state(c: Cluster, pod: Obj) -> tuple[str, str]:
    ns, name = _key(pod).split("/")
    got = c.kubectl("-n", ns, "get", "pod", name, "-o", "json")
    status = json.loads(got.stdout).get("status", {}) if got.returncode == 0 else {}
    events = c.kubectl("-n", ns, "get", "events", "--field-selector", f"involvedObject.name={name}",
                       "-o", "custom-columns=REASON:.reason,MESSAGE:.message", "--no-headers").stdout
    return status.get("phase", "missing"), events


def _mib(quantity: str) -> int:
    for suffix, shift in (("Ki", -10), ("Mi", 0), ("Gi", 10), ("Ti", 20)):
        if str(quantity).endswith(suffix):
            value = int(str(quantity)[:-2])
            return value << shift if shift >= 0 else value >> -shift
    return int(quantity)  # gpupool.io/gpu-memory without a suffix is MiB


def documented_share(pod: Obj, block: list[Obj]) -> dict[str, str]:
    """The GPU memory (MiB) and compute (percent) the example gives its pod's container, where it names
    them: its gpupool.io limits, or the capacity its claim's template (in the same block) asks for."""
    (container, *_) = pod["spec"]["containers"]
    limits = (container.get("resources") or {}).get("limits") or {}
    asked = {"memory": limits.get("gpupool.io/gpu-memory"), "cores": limits.get("gpupool.io/gpu-cores")}
    for claim in pod["spec"].get("resourceClaims") or []:
        template = next((o for o in block if o["kind"] == "ResourceClaimTemplate"
                         and o["metadata"]["name"] == claim.get("resourceClaimTemplateName")), None)
        for request in ((template or {}).get("spec", {}).get("spec", {}).get("devices", {}).get("requests") or []):
            asked.update(((request.get("exactly") or {}).get("capacity") or {}).get("requests") or {})
    out = {}
    if asked.get("memory") is not None:
        out["GPUPOOL_MEMORY_LIMIT_MIB"] = str(_mib(str(asked["memory"])))
    if asked.get("cores") is not None:
        out["GPUPOOL_CORES_PERCENT"] = str(asked["cores"])
    return out


def test_every_example_runs_as_written(cluster: Cluster) -> None:
    c = cluster
    applied, namespaces = [], set()
    for ex in examples():
        if ex.not_applied:
            continue
        done = c.kubectl("apply", "-f", "-", stdin=ex.text)
        assert done.returncode == 0, f"{ex}: kubectl apply failed:\n{done.stderr}\n{ex.text}"
        got = c.kubectl("get", "-f", "-", "-o", "name", stdin=ex.text)
        assert got.returncode == 0 and len(got.stdout.split()) == len(ex.objects), (str(ex), got.stdout, got.stderr)
        for obj in ex.objects:
            if obj["kind"] == "Namespace":
                namespaces.add(obj["metadata"]["name"])
            if obj["kind"] != "Pod":
                continue
            pod = obj
            outcome = OUTCOMES.get((ex.file, _key(pod)))
            describe = lambda pod=pod: f"{_pod_state(c, pod)}\n{c.release.describe_pods()}"  # noqa: E731
            if outcome is None:
                wait_for(lambda pod=pod: _pod_state(c, pod)[0] == "Running", 240,  # type: ignore[misc]
                         f"{ex}: pod {_key(pod)} Running", describe)
                # ... and its container holds the share the example asks for.
                ns, name = _key(pod).split("/")
                seen = c.kubectl("-n", ns, "exec", name, "--", "env").stdout
                env = dict(line.split("=", 1) for line in seen.splitlines() if line.startswith("GPUPOOL_"))
                want = documented_share(pod, ex.objects)
                assert {k: env.get(k) for k in want} == want, (str(ex), _key(pod), env)
                print(f"{ex}: pod {_key(pod)} runs, {want or 'no share named'}")
            else:
                said, shown = outcome

                def waits(pod: Obj = pod, shown: str = shown) -> tuple[str, str] | None:
                    state = _pod_state(c, pod)
                    return state if state[0] == "Pending" and shown.lower() in state[1].lower() else None

                state = wait_for(waits, 240, f"{ex}: pod {_key(pod)} waits with {shown!r}", describe)
                print(f"{ex}: pod {_key(pod)} waits as documented ({said}):\n{state[1].strip()}")
        applied.append(str(ex))
        # The block's objects go (not its Namespaces: a later example may name them), pods without waiting
        # out their grace period.
        rest = yaml.safe_dump_all([o for o in ex.objects if o["kind"] != "Namespace"])
        gone = c.kubectl("delete", "-f", "-", "--grace-period=1", "--wait=true", "--timeout=180s",
                         "--ignore-not-found", stdin=rest)
        assert gone.returncode == 0, f"{ex}: delete failed: {gone.stderr}"
    print("applied: " + ", ".join(applied))
    assert len(applied) >= 10, applied
    for ns in sorted(namespaces):
        assert c.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=180s").returncode == 0, ns
