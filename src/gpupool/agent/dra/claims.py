"""A DRA claim as the node prepares it: its reference, what prepare answered (the checkpoint's entry), a
started prepare or unprepare, and the grant of a MIG partition (gpupool.agent.dra.driver prepares them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from gpupool.agent.devices.discovery import DeviceInfo
from gpupool.agent.state.checkpoint import CheckpointError
from gpupool.api.allocation import GrantDoc, MigGrantDoc
from gpupool.core.mig import mig_model
from gpupool.core.mig_request import grant_share
from gpupool.core.model import MigSlot

CHECKPOINT_FILE = "dra-claims.json"
# The states of a claim's checkpoint entry (NVIDIA's DRA driver names them the same way).
PREPARE_STARTED, PREPARE_COMPLETED, UNPREPARE_STARTED = "PrepareStarted", "PrepareCompleted", "UnprepareStarted"
STATES = (PREPARE_STARTED, PREPARE_COMPLETED, UNPREPARE_STARTED)


@dataclass(frozen=True, slots=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str

    @property
    def label(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    request: str
    pool: str
    device: str
    share_id: str | None = None


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    """What prepare answered for one claim (the checkpoint's entry)."""

    uid: str
    namespace: str
    name: str
    isolation: str
    devices: tuple[PreparedDevice, ...]
    cdi_ids: tuple[str, ...]
    shares: tuple[tuple[str, int, float], ...] = ()  # (GPU UUID, memory MiB, cores %) granted: the watchdog's

    @property
    def label(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def ref(self) -> ClaimRef:
        return ClaimRef(self.namespace, self.name, self.uid)

    def to_json(self, state: str = PREPARE_COMPLETED) -> dict[str, Any]:
        return {**asdict(self), "state": state}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> PreparedClaim:
        return PreparedClaim(
            str(data["uid"]), str(data["namespace"]), str(data["name"]), str(data["isolation"]),
            tuple(PreparedDevice(str(d["request"]), str(d["pool"]), str(d["device"]), d.get("share_id"))
                  for d in data["devices"]),
            tuple(str(c) for c in data["cdi_ids"]),
            tuple((str(u), int(m), float(c)) for u, m, c in data.get("shares") or ()),
        )


@dataclass(frozen=True, slots=True)
class Pending:
    """A prepare or unprepare of a claim that started and has not completed (the checkpoint's record of it)."""

    ref: ClaimRef
    state: str  # PREPARE_STARTED or UNPREPARE_STARTED
    claim: PreparedClaim | None = None  # what an unprepare undoes

    def to_json(self) -> dict[str, Any]:
        if self.claim is not None:
            return self.claim.to_json(self.state)
        return {"uid": self.ref.uid, "namespace": self.ref.namespace, "name": self.ref.name, "state": self.state}


def claims_legacy(doc: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """dra-claims.json version 1: {"version": 1, "node", "claims": [PreparedClaim fields]}, no checksum; every
    claim in it was prepared (it had no other state)."""
    if "format" in doc or doc.get("version") != 1:
        return None
    claims = doc.get("claims")
    if not isinstance(claims, list) or not all(isinstance(c, dict) for c in claims):
        raise CheckpointError("claims is not a list of objects")
    return [{**c, "state": PREPARE_COMPLETED} for c in claims]


def decode_claims(entries: list[dict[str, Any]]) -> tuple[dict[str, PreparedClaim], dict[str, Pending]]:
    """The prepared claims and the started operations of a checkpoint's entries; CheckpointError for a bad one."""
    prepared: dict[str, PreparedClaim] = {}
    pending: dict[str, Pending] = {}
    for e in entries:
        try:
            state = e["state"]
            if state not in STATES:
                raise ValueError(f"unknown state {state!r}")
            ref = ClaimRef(str(e["namespace"]), str(e["name"]), str(e["uid"]))
            if ref.uid in prepared or ref.uid in pending:
                raise ValueError("a second entry of the claim")
            if state == PREPARE_COMPLETED:
                prepared[ref.uid] = PreparedClaim.from_json(e)
            elif state == UNPREPARE_STARTED and "isolation" in e:
                pending[ref.uid] = Pending(ref, state, PreparedClaim.from_json(e))
            else:
                pending[ref.uid] = Pending(ref, state)
        except (KeyError, TypeError, ValueError) as err:
            raise CheckpointError(f"bad entry {str(e)[:200]!r}: {err!r}") from None
    return prepared, pending


@dataclass(frozen=True, slots=True)
class Outcome:
    """One claim's answer: its devices, or why it could not be prepared (kubelet retries it)."""

    claim: PreparedClaim | None = None
    error: str = ""


def partition_grant(dev: DeviceInfo, slot: MigSlot) -> GrantDoc | str:
    """The grant of a MIG partition of `dev`, or why the GPU cannot serve it."""
    model = mig_model(dev.model)
    profile = model.profile(slot.profile) if model is not None else None
    if not dev.mig_enabled or model is None:
        return "the GPU is not in MIG mode"
    if profile is None or slot.start not in profile.starts:
        return f"{dev.model} has no MIG profile {slot.profile} at slice {slot.start}"
    milli, memory = grant_share(model, profile)
    return GrantDoc(uuid=dev.uuid, index=dev.index, memory_mib=memory, cores=milli / 10,
                    mig=MigGrantDoc(profile=slot.profile, start=slot.start))
