"""limits.v1, one layout in two languages: the node agent writes it in Python (gpupool.agent.state.hookdir, its own
offsets), the libraries and the GPU server read it in C (struct gp_limits, native/gp_core.h). A field one side
moves and the other does not would give a pod its caps from the wrong bytes, silently.

The C side is what a compiler makes of native/gp.h (which includes gp_core.h), not a copy of its numbers: a
small program prints the offset and size of every field (the fields must tile the struct, so one added
without being listed here fails), and reads a file through the struct. The Python side is hookdir's own
offsets and the bytes its writer produces. Each is compared with the other, so either drifting fails;
gp_core.h's static assertions fail the build first when the struct moves without them. usage.v1 (struct
gp_shared, which the agent reads) is held the same way for the offsets the agent reads."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpupool.agent.state import hookdir
from tests.native.native_helpers import CC_FLAGS, ROOT, have_cc

NATIVE = ROOT / "native"

# Every field of struct gp_limits, in order: printed by the program below, checked to tile the struct.
LIMITS_FIELDS = ["magic", "version", "ndev", "limit", "cores_ppm", "mode", "squeeze_ppm", "uuid", "accounting_dir",
                 "oversub", "nvml_scale_ppm", "pad"]
# The fields hookdir names by offset (its _L_* constants), by C field; hookdir writes magic, version and ndev
# as one "<QII" at 0, and never the padding.
PYTHON_OFFSETS = {"_L_LIMIT": "limit", "_L_CORES": "cores_ppm", "_L_MODE": "mode", "_L_SQUEEZE": "squeeze_ppm",
                  "_L_UUID": "uuid", "_L_ACCOUNTING": "accounting_dir", "_L_OVERSUB": "oversub",
                  "_L_NVML_SCALE": "nvml_scale_ppm"}
U64_ARRAYS = ["limit", "cores_ppm", "squeeze_ppm", "oversub", "nvml_scale_ppm"]

PROGRAM = r"""
#include "gp.h"
#include <stdio.h>
#include <string.h>

#define FIELD(f) printf("field %s %zu %zu\n", #f, offsetof(struct gp_limits, f), sizeof(((struct gp_limits *)0)->f));
#define U64S(f) do { printf("value %s", #f); for (int i = 0; i < GP_MAX_DEV; i++) printf(" %llu", \
    (unsigned long long)l.f[i]); printf("\n"); } while (0)

int main(int argc, char **argv) {
    FIELDS
    printf("size %zu\n", sizeof(struct gp_limits));
    printf("const magic %llu\n", (unsigned long long)GP_LIMITS_MAGIC);
    printf("const version %d\n", GP_LIMITS_VERSION);
    printf("const max_dev %d\n", GP_MAX_DEV);
    printf("const uuid_len %zu\n", sizeof(((struct gp_limits *)0)->uuid[0]));
    printf("usage dev %zu\n", offsetof(struct gp_shared, dev));
    printf("usage devstate %zu\n", sizeof(struct gp_devstate));
    printf("usage busy_ns %zu\n", offsetof(struct gp_devstate, busy_ns));
    printf("usage features %zu\n", offsetof(struct gp_shared, features));
    printf("usage squeeze_ppm %zu\n", offsetof(struct gp_shared, squeeze_ppm));
    printf("usage scale_ppm %zu\n", offsetof(struct gp_shared, scale_ppm));
    printf("usage slots %zu\n", offsetof(struct gp_shared, slots));
    printf("usage slot %zu\n", sizeof(struct gp_slot));
    printf("usage slot_used %zu\n", offsetof(struct gp_slot, used));
    printf("usage slot_ctx %zu\n", offsetof(struct gp_slot, ctx));
    printf("usage ident %zu\n", offsetof(struct gp_shared, ident));
    printf("usage magic %llu\n", (unsigned long long)GP_MAGIC);
    printf("usage max_slots %d\n", GP_MAX_SLOTS);
    if (argc < 2) return 0;
    struct gp_limits l;
    FILE *f = fopen(argv[1], "rb");
    if (f == NULL || fread(&l, sizeof l, 1, f) != 1) return 2;
    fclose(f);
    printf("value magic %llu\n", (unsigned long long)l.magic);
    printf("value version %u\n", l.version);
    printf("value ndev %u\n", l.ndev);
    printf("value mode %llu\n", (unsigned long long)l.mode);
    U64S(limit); U64S(cores_ppm); U64S(squeeze_ppm); U64S(oversub); U64S(nvml_scale_ppm);
    for (int i = 0; i < GP_MAX_DEV; i++) printf("uuid %d %.63s\n", i, l.uuid[i]);
    printf("accounting_dir %.255s\n", l.accounting_dir);
    int zero = 1;
    for (size_t i = 0; i < sizeof l.pad; i++) zero &= l.pad[i] == 0;
    printf("value pad_zero %d\n", zero);
    return 0;
}
"""


@dataclass
class CReader:
    fields: dict[str, tuple[int, int]]  # field -> (offset, size)
    size: int
    const: dict[str, int]
    usage: dict[str, int]
    binary: Path

    def read(self, path: Path) -> dict[str, object]:
        out = subprocess.run([str(self.binary), str(path)], check=True, capture_output=True, text=True).stdout
        values: dict[str, object] = {"uuid": {}}
        for line in out.splitlines():
            kind, rest = line.split(" ", 1)
            if kind == "value":
                name, *numbers = rest.split()
                values[name] = [int(n) for n in numbers] if len(numbers) > 1 else int(numbers[0])
            elif kind == "uuid":
                index, _, text = rest.partition(" ")
                values["uuid"][int(index)] = text  # type: ignore[index]
            elif kind == "accounting_dir":
                values["accounting_dir"] = rest
        return values


def compile_reader(out: Path, include: Path = NATIVE) -> CReader:
    assert have_cc(), "no C compiler: the native tests need one (set CC)"
    src = out / "limits_layout.c"
    src.write_text(PROGRAM.replace("FIELDS", " ".join(f"FIELD({f})" for f in LIMITS_FIELDS)))
    binary = out / "limits_layout"
    subprocess.run([os.environ.get("CC", "cc"), *CC_FLAGS, f"-I{include}", "-o", str(binary), str(src)],
                   check=True, capture_output=True, text=True)
    out_text = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout
    reader = CReader({}, 0, {}, {}, binary)
    for line in out_text.splitlines():
        kind, name, *rest = line.split()
        if kind == "field":
            reader.fields[name] = (int(rest[0]), int(rest[1]))
        elif kind == "size":
            reader.size = int(name)
        elif kind == "const":
            reader.const[name] = int(rest[0])
        elif kind == "usage":
            reader.usage[name] = int(rest[0])
    return reader


def python_layout(module: object = hookdir) -> dict[str, int]:
    """hookdir's own numbers for both files (private names: they are the writer's definition)."""
    return {name: value for name, value in vars(module).items()
            if name.startswith("_") and name[1:].isupper() and type(value) is int}


def differences(c: CReader, py: Mapping[str, int]) -> list[str]:
    """Where the C reader and the Python writer disagree on limits.v1 (and on what the agent reads of
    usage.v1); [] when they agree."""
    out: list[str] = []
    # the C fields tile the struct: every field is listed, none overlaps, nothing is unaccounted for
    at = 0
    for name in LIMITS_FIELDS:
        offset, size = c.fields[name]
        if offset != at:
            out.append(f"C field {name} at {offset}, after the previous field's end {at}: a field is not listed")
        at = offset + size
    if at != c.size:
        out.append(f"C fields end at {at}, struct gp_limits is {c.size} bytes")
    unmapped = sorted(n for n in py if n.startswith("_L_") and n not in PYTHON_OFFSETS)
    if unmapped:
        out.append(f"hookdir offsets with no C field here: {unmapped}")
    for const, field in PYTHON_OFFSETS.items():
        if py.get(const) != c.fields[field][0]:
            out.append(f"{field}: C offset {c.fields[field][0]}, hookdir {const} = {py.get(const)}")
    n = py.get("_MAX_DEV", 0)
    expected_sizes = {**{f: 8 * n for f in U64_ARRAYS}, "mode": 8, "uuid": py.get("_UUID_LEN", 0) * n,
                      "accounting_dir": py.get("_ACCOUNTING_LEN", 0)}
    for field, size in expected_sizes.items():
        if c.fields[field][1] != size:
            out.append(f"{field}: C size {c.fields[field][1]}, hookdir writes {size}")
    if c.fields["magic"] != (0, 8) or c.fields["version"] != (8, 4) or c.fields["ndev"] != (12, 4):
        out.append(f"header: C magic/version/ndev at {c.fields['magic']}, {c.fields['version']}, "
                   f"{c.fields['ndev']}; hookdir packs '<QII' at 0")
    for name, want in [("_LIMITS_SIZE", c.size), ("_LIMITS_MAGIC", c.const["magic"]),
                       ("_MAX_DEV", c.const["max_dev"]), ("_UUID_LEN", c.const["uuid_len"])]:
        if py.get(name) != want:
            out.append(f"{name}: hookdir {py.get(name)}, C {want}")
    # usage.v1: what the agent reads
    u = c.usage
    for name, want in [("_MAGIC", u["magic"]), ("_DEV_OFFSET", u["dev"]), ("_SLOT_OFFSET", u["slots"]),
                       ("_SLOT_SIZE", u["slot"]), ("_FEATURES_OFFSET", u["features"]),
                       ("_SQUEEZE_OFFSET", u["squeeze_ppm"]), ("_LEARNT_SCALE_OFFSET", u["scale_ppm"]),
                       ("_SLOTS", u["max_slots"]),
                       ("_FILE_SIZE", u["ident"])]:
        if py.get(name) != want:
            out.append(f"usage.v1 {name}: hookdir {py.get(name)}, C {want}")
    # read_usage's literal offsets (busy_ns at 40 in a 64-byte devstate; used and ctx after the slot's pid)
    if (u["devstate"], u["busy_ns"], u["slot_used"], u["slot_ctx"]) != (64, 40, 8, 136):
        out.append(f"usage.v1 devstate/slot: C {u['devstate']}, {u['busy_ns']}, {u['slot_used']}, "
                   f"{u['slot_ctx']}; hookdir.read_usage reads 64, 40, 8, 8 + 128")
    return out


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> CReader:
    return compile_reader(tmp_path_factory.mktemp("limits-layout"))


def test_the_agents_offsets_are_the_c_readers(reader: CReader) -> None:
    assert differences(reader, python_layout()) == []


def test_what_the_agent_writes_is_what_the_library_reads(reader: CReader, tmp_path: Path) -> None:
    limits = hookdir.HookLimits(memory_mib=(1024, 0, 3), cores=(12.5, 100, 99.99), mode="elastic",
                                gpus=("GPU-1111", "GPU-2222", "MIG-3333"), accounting_dir="/run/gpupool/hook",
                                oversub_mib=(512, 0, 7), nvml_scale_ppm=(1_600_000, 0, 1_000_000))
    path = hookdir.write_limits(tmp_path / "limits", limits)
    assert hookdir.write_squeeze(tmp_path, {0: 40, 2: 0.5}) is not None  # rewritten in place, as on a reclaim
    got = reader.read(path)
    zeros = [0] * 16
    assert got["magic"] == reader.const["magic"] and got["version"] == reader.const["version"] == 1
    assert got["ndev"] == 3 and got["mode"] == 1
    assert got["limit"] == [1024 << 20, 0, 3 << 20, *zeros[3:]]
    assert got["cores_ppm"] == [125_000, 0, 999_900, *zeros[3:]]
    assert got["oversub"] == [512 << 20, 0, 7 << 20, *zeros[3:]]
    assert got["squeeze_ppm"] == [400_000, 0, 5_000, *zeros[3:]]
    assert got["uuid"] == {0: "GPU-1111", 1: "GPU-2222", 2: "MIG-3333", **{i: "" for i in range(3, 16)}}
    assert got["accounting_dir"] == "/run/gpupool/hook"
    assert got["nvml_scale_ppm"] == [1_600_000, 0, 1_000_000, *zeros[3:]] and got["pad_zero"] == 1
    # and hookdir's own reader agrees with the C reader on the same bytes
    back = hookdir.read_limits(tmp_path / "limits")
    assert back is not None
    assert (back["limit"], back["cores"], back["mode"], back["squeeze"], back["oversub"], back["nvml_scale"],
            back["ndev"]) == (got["limit"], got["cores_ppm"], got["mode"], got["squeeze_ppm"], got["oversub"],
                              got["nvml_scale_ppm"], got["ndev"])


def test_a_drift_on_either_side_is_found(reader: CReader) -> None:
    py = python_layout()
    assert differences(reader, {**py, "_L_OVERSUB": py["_L_OVERSUB"] + 8}) == [
        "oversub: C offset 1688, hookdir _L_OVERSUB = 1696"]
    assert differences(reader, {**py, "_L_NEW": 1944}) == ["hookdir offsets with no C field here: ['_L_NEW']"]
    assert differences(reader, {**py, "_SQUEEZE_OFFSET": 1344}) == ["usage.v1 _SQUEEZE_OFFSET: hookdir 1344, C 1336"]
    moved = CReader({**reader.fields, "mode": (280, 8)}, reader.size, reader.const, reader.usage, reader.binary)
    assert "mode: C offset 280, hookdir _L_MODE = 272" in differences(moved, py)
    # a field added to the struct (taking from the padding) but not listed here
    grown = dict(reader.fields)
    grown["pad"] = (grown["pad"][0] + 8, grown["pad"][1] - 8)
    assert differences(CReader(grown, reader.size, reader.const, reader.usage, reader.binary), py) == [
        "C field pad at 1952, after the previous field's end 1944: a field is not listed"]


def test_a_struct_moved_without_its_assertions_does_not_compile(tmp_path: Path) -> None:
    """gp_core.h's static assertions: the libraries and the server are not built with a layout the agent does
    not write, whatever this test's list says."""
    for name in ("gp.h", "gp_core.h", "gpupool_cuda.h"):
        shutil.copy(NATIVE / name, tmp_path / name)
    header = tmp_path / "gp_core.h"
    text = header.read_text()
    anchor = "    uint64_t mode;                        /* 272: enum gp_mode */\n"
    assert anchor in text
    header.write_text(text.replace(anchor, "    uint64_t mode;\n    uint64_t added;\n", 1))
    with pytest.raises(subprocess.CalledProcessError) as failed:
        compile_reader(tmp_path, include=tmp_path)
    assert "limits.v1 is written by the agent at these offsets" in failed.value.stderr
