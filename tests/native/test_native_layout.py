"""The C programs in files of one concern each, in layers: a file may use only what files of lower layers
define, so no circle of files can form (issue 39: the library's gp_main.c once closed a circle of six).

What a file uses is read from the compiler, not guessed from the text: each file is compiled on its own and
`nm` lists the symbols it defines and the ones it needs; a needed symbol another of our files defines is an
edge. Includes are read from the sources (quoted includes only; system headers are not ours)."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import pytest

from tests.native.native_helpers import CC_FLAGS, ROOT, have_cc, native_build

NATIVE = ROOT / "native"
REMOTE = NATIVE / "remote"

# Lowest first; native/gp.h and native/remote/gpr_srv.h say what each file is for.
LIBRARY_LAYERS: list[list[str]] = [
    ["gp_sym.c"],
    ["gp_log.c"],
    ["gp_config.c", "gp_driver.c"],
    ["gp_device.c"],
    ["gp_shared.c"],
    ["gp_nvml.c"],
    ["gp_ident.c", "gp_mem.c", "gp_compute.c"],
    ["gp_lookup.c", "gp_fork.c"],
]
# The HIP library: the vendor-neutral files of native/ (gp_core.h) below native/hip/'s (gph.h lists them).
HIP = NATIVE / "hip"
SHARED_FILES = ["gp_sym.c", "gp_log.c", "gp_config.c", "gp_shared.c"]
HIP_LAYERS: list[list[str]] = [
    ["gp_sym.c"],
    ["gp_log.c"],
    ["gp_config.c"],
    ["gp_shared.c"],
    ["gph_runtime.c"],
    ["gph_mem.c", "gph_cu.c"],
    ["gph_lookup.c", "gph_fork.c"],
]
SERVER_LAYERS: list[list[str]] = [
    ["gpr_srv_io.c"],
    ["gpr_srv_driver.c"],
    ["gpr_srv_context.c"],
    ["gpr_srv_streams.c"],
    ["gpr_srv_memory.c", "gpr_srv_modules.c"],
    ["gpr_srv_state.c"],
    ["gpr_srv_dispatch.c"],
    ["gpr_srv_worker.c", "gpr_srv_listener.c"],
    ["gpr_server.c"],
]

Graph = dict[str, dict[str, set[str]]]  # file -> file it uses -> the symbols it uses there


def symbol_graph(sources: Iterable[Path], out: Path, flags: Sequence[str] = ()) -> Graph:
    """Which of `sources` uses which, by symbol: every file compiled alone, its undefined symbols matched
    with the global symbols the others define."""
    cc = os.environ.get("CC", "cc")
    defined: dict[str, str] = {}
    needed: dict[str, set[str]] = {}
    out.mkdir(parents=True, exist_ok=True)
    for src in sources:
        obj = out / (src.stem + ".o")
        subprocess.run([cc, *CC_FLAGS, "-O0", "-fPIC", *flags, "-c", str(src), "-o", str(obj)], check=True,
                       capture_output=True, text=True)
        listing = subprocess.run(["nm", "-P", str(obj)], check=True, capture_output=True, text=True).stdout
        needed[src.name] = set()
        for line in listing.splitlines():
            name, kind = line.split()[:2]
            if kind == "U":
                needed[src.name].add(name)
            elif kind.isupper():  # a global definition (lower case: local to the file)
                assert name not in defined, f"{name} is defined by both {defined[name]} and {src.name}"
                defined[name] = src.name
    graph: Graph = {name: {} for name in needed}
    for name, symbols in needed.items():
        for symbol in symbols:
            owner = defined.get(symbol)
            if owner is not None and owner != name:
                graph[name].setdefault(owner, set()).add(symbol)
    return graph


def include_graph(sources: Iterable[Path]) -> Graph:
    """Quoted includes, followed through our headers: file -> header (paths relative to native/)."""
    graph: Graph = {}
    todo = [Path(s) for s in sources]
    while todo:
        path = todo.pop()
        key = path.relative_to(NATIVE).as_posix() if path.is_relative_to(NATIVE) else path.name
        if key in graph:
            continue
        graph[key] = {}
        for target in re.findall(r'^\s*#\s*include\s+"([^"]+)"', path.read_text(), re.M):
            resolved = (path.parent / target).resolve()
            assert resolved.exists(), f"{key} includes {target}, which does not exist"
            assert resolved.suffix == ".h", f"{key} includes {target}: only headers are included"
            rkey = resolved.relative_to(NATIVE).as_posix() if resolved.is_relative_to(NATIVE) else resolved.name
            graph[key][rkey] = {target}
            todo.append(resolved)
    return graph


def find_cycle(graph: Mapping[str, Mapping[str, object]]) -> list[str] | None:
    """A circle of files (first file repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)) is not None:
            return found
    return None


def layer_violations(graph: Graph, layers: Sequence[Sequence[str]]) -> list[str]:
    """Every use that does not go to a strictly lower layer, and every file without a layer."""
    level = {name: i for i, layer in enumerate(layers) for name in layer}
    problems = [f"{name} has no layer" for name in sorted(graph) if name not in level]
    for name, uses in sorted(graph.items()):
        for used, symbols in sorted(uses.items()):
            if name in level and used in level and level[used] >= level[name]:
                problems.append(f"{name} (layer {level[name]}) uses {used} (layer {level[used]}): "
                                f"{', '.join(sorted(symbols))}")
    return problems


@pytest.fixture(scope="module")
def cc() -> None:
    assert have_cc(), "no C compiler: the native tests need one (set CC)"


def test_every_file_of_the_library_and_the_server_has_a_layer_and_is_built() -> None:
    build = native_build()
    library = sorted(p.name for p in NATIVE.glob("*.c"))
    assert library == sorted(n for layer in LIBRARY_LAYERS for n in layer)
    assert sorted(p.name for p in build.sources()) == library
    server = sorted(p.name for p in REMOTE.glob("*.c") if p.name != "gpr_client.c")
    assert server == sorted(n for layer in SERVER_LAYERS for n in layer)
    assert sorted(p.name for p in build.server_sources()) == server
    assert [p.name for p in build.client_sources()] == ["gpr_client.c"]
    hip = sorted(p.name for p in HIP.glob("*.c"))
    assert hip == sorted(n for layer in HIP_LAYERS for n in layer if n not in SHARED_FILES)
    assert sorted(p.name for p in build.hip_sources()) == sorted([*SHARED_FILES, *hip])


@pytest.mark.usefixtures("cc")
def test_the_hip_librarys_files_use_only_lower_layers_and_nothing_of_cudas(tmp_path: Path) -> None:
    """The HIP library is built from the shared files and its own: none of them may need a symbol that only
    a CUDA file of native/ defines (it would not link, or would drag the CUDA modules in)."""
    sources = [NATIVE / n for n in SHARED_FILES] + sorted(HIP.glob("*.c"))
    graph = symbol_graph(sources, tmp_path / "hip", ["-DGP_LIB_FEATURES=0"])
    assert find_cycle(graph) is None, find_cycle(graph)
    assert layer_violations(graph, HIP_LAYERS) == []
    assert all(graph[name] for layer in HIP_LAYERS[2:] for name in layer)
    cuda_only = symbol_graph(sorted(NATIVE.glob("gp_*.c")), tmp_path / "all")
    for name in SHARED_FILES:  # the shared files use only each other, in the CUDA library too
        assert set(cuda_only[name]) <= set(SHARED_FILES), (name, cuda_only[name])


@pytest.mark.usefixtures("cc")
def test_the_librarys_files_use_only_lower_layers(tmp_path: Path) -> None:
    graph = symbol_graph(sorted(NATIVE.glob("gp_*.c")), tmp_path)
    assert find_cycle(graph) is None, find_cycle(graph)
    assert layer_violations(graph, LIBRARY_LAYERS) == []
    # the layers are real: each file above the first uses something below it
    assert all(graph[name] for layer in LIBRARY_LAYERS[2:] for name in layer)


@pytest.mark.usefixtures("cc")
def test_the_servers_files_use_only_lower_layers(tmp_path: Path) -> None:
    graph = symbol_graph([REMOTE / n for layer in SERVER_LAYERS for n in layer], tmp_path)
    assert find_cycle(graph) is None, find_cycle(graph)
    assert layer_violations(graph, SERVER_LAYERS) == []
    assert all(graph[name] for layer in SERVER_LAYERS[1:] for name in layer)


def test_includes_form_no_circle_and_name_only_headers() -> None:
    graph = include_graph([*NATIVE.glob("*.c"), *REMOTE.glob("*.c"), *HIP.glob("*.c")])
    assert find_cycle(graph) is None, find_cycle(graph)
    assert set(graph["gp_core.h"]) == set()  # the vendor-neutral interface includes no vendor's types
    assert set(graph["hip/gph.h"]) == {"gp_core.h"}
    # the library's files share one interface; the server's files theirs (and the limits file's layout)
    for name, uses in graph.items():
        if name in SHARED_FILES:  # the files both libraries are built from know no vendor's header
            assert set(uses) == {"gp_core.h"}, (name, uses)
        elif name.startswith("gp_") and name.endswith(".c"):
            assert set(uses) == {"gp.h"}, (name, uses)
        if name.startswith("hip/gph_"):
            assert set(uses) == {"hip/gph.h"}, (name, uses)
        if name.startswith("remote/gpr_srv_") or name == "remote/gpr_server.c":
            assert set(uses) <= {"remote/gpr_srv.h", "gp.h"}, (name, uses)


def test_no_server_handler_switch_is_left() -> None:
    """The requests are dispatched by a table (gpr_srv_dispatch.c), one handler per op family file."""
    for path in [*REMOTE.glob("gpr_srv_*.c"), REMOTE / "gpr_server.c"]:
        assert "case GPR_OP_" not in path.read_text(), path.name
    table = (REMOTE / "gpr_srv_dispatch.c").read_text()
    ops = re.findall(r"^\s*(GPR_OP_\w+)", (REMOTE / "gpr.h").read_text().split("enum gpr_op {")[1].split("};")[0],
                     re.M)
    served = {op for op in ops if op not in ("GPR_OP_HELLO", "GPR_OP_COUNT")}
    assert served == set(re.findall(r"^\s*\[(GPR_OP_\w+)\]\s*=", table, re.M))  # the hello is the listener's


@pytest.mark.usefixtures("cc")
def test_a_circle_of_files_fails_the_check(tmp_path: Path) -> None:
    """The check itself: two files that call each other are a circle, and break any layer order."""
    (tmp_path / "a.c").write_text("int b(void);\nint a(void) { return b(); }\n")
    (tmp_path / "b.c").write_text("int a(void);\nint c(void) { return 1; }\nint b(void) { return a() + c(); }\n")
    (tmp_path / "c.c").write_text("int c2(void) { return 2; }\n")
    graph = symbol_graph(sorted(tmp_path.glob("*.c")), tmp_path / "obj")
    assert graph == {"a.c": {"b.c": {"b"}}, "b.c": {"a.c": {"a"}}, "c.c": {}}
    assert find_cycle(graph) == ["a.c", "b.c", "a.c"]
    assert layer_violations(graph, [["a.c"], ["b.c"], ["c.c"]]) == [
        "a.c (layer 0) uses b.c (layer 1): b"]
    assert layer_violations(graph, [["b.c", "a.c"], ["c.c"]]) == [
        "a.c (layer 0) uses b.c (layer 0): b", "b.c (layer 0) uses a.c (layer 0): a"]
    assert layer_violations(graph, [["a.c"]]) == ["b.c has no layer", "c.c has no layer"]
    # an include circle too
    (tmp_path / "x.h").write_text('#include "y.h"\n')
    (tmp_path / "y.h").write_text('#include "x.h"\n')
    (tmp_path / "x.c").write_text('#include "x.h"\n')
    assert find_cycle(include_graph([tmp_path / "x.c"])) == ["x.h", "y.h", "x.h"]
