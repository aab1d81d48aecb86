"""Container images for the real-node testbed, built from local files and imported into containerd.

Nothing is pulled from a registry: each image is one uncompressed layer written here from files of this
machine, packed as an OCI image layout archive that `ctr images import` reads.

- `pause`   a static C program (compiled here with `cc -static`) that waits for SIGTERM/SIGINT and reaps
            children: the pod sandbox image of containerd's CRI plugin (`sandbox_image`).
- `busybox` /bin/busybox from Debian's `busybox-static` with a link per applet, plus gpupool's test
            programs under /gpupool (shell scripts that print what the container received).
- `cuda-probe` busybox, plus the interception library's fake CUDA driver (libcuda.so.1) and its test
            program (/usr/local/bin/probe, tests/native/fakes), compiled here, with the C library they and
            the interception library (mounted by the agent, preloaded via /etc/ld.so.preload) need.

Archives are cached in <cache>/images/ under a name that includes a digest of their inputs, so a second
run imports without rebuilding. Standard library only (runs without the project's virtualenv).
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import shutil
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

PAUSE_IMAGE = "gpupool.local/pause:1"
BUSYBOX_IMAGE = "gpupool.local/busybox:1"
PROBE_IMAGE = "gpupool.local/cuda-probe:1"
# The image the documentation's example pods name (README.md, docs/*.md), so that they run as written on the
# testbed's nodes, which reach no registry: there it is the busybox image under that name (its `sh`, `env`,
# `grep` and `sleep` run the examples' commands; `nvidia-smi` is missing, and the commands go on without it).
EXAMPLE_IMAGES = {"nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04": BUSYBOX_IMAGE}
REPO = Path(__file__).resolve().parents[2]
FAKES = REPO / "tests" / "native" / "fakes"  # the interception library's fake CUDA driver and test program
HOOK_LIBRARY = REPO / "src" / "gpupool" / "hook" / "libgpupool_hook.so"
PROBE_LIB_DIR = "usr/lib/gpupool-fake"
LAYOUT = b"2"

PAUSE_C = r"""
/* The pod sandbox's process: hold the namespaces until told to stop; reap zombies if it is PID 1. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t stop;
static void on_stop(int sig) { (void)sig; stop = 1; }
static void on_child(int sig) { (void)sig; while (waitpid(-1, 0, WNOHANG) > 0) {} }

int main(void) {
    struct sigaction a = {0}, c = {0};
    a.sa_handler = on_stop;
    sigaction(SIGINT, &a, 0);
    sigaction(SIGTERM, &a, 0);
    c.sa_handler = on_child;
    c.sa_flags = SA_NOCLDSTOP;
    sigaction(SIGCHLD, &c, 0);
    while (!stop) pause();
    return 0;
}
"""

# gpupool's test programs: what a container received, in a form a test parses without guessing.
GRANT_SCRIPT = """#!/bin/sh
# Print the container's gpupool grant: its GPU variables, then the mount points the runtime added for it
# (field 5 of mountinfo; the interception library, /etc/ld.so.preload, anything under /run/gpupool).
env | grep -E '^(NVIDIA_|GPUPOOL_|CUDA_MPS_)' | sort | sed 's/^/env /'
awk '$5 ~ "^/run/gpupool" || $5 ~ "^/usr/local/lib/gpupool" || $5 == "/etc/ld.so.preload" {print "mount " $5}' \\
  /proc/self/mountinfo | sort
"""


class ImageError(RuntimeError):
    """An image cannot be built or imported; the message says which tool failed and how."""


@dataclass(frozen=True)
class Layer:
    files: dict[str, tuple[bytes, int]]  # path in the image -> (content, mode)
    links: dict[str, str]  # symlink path -> target
    dirs: dict[str, int] = field(default_factory=dict)  # empty directories -> mode


def _arch() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def _layer_tar(layer: Layer) -> bytes:
    """A deterministic layer (fixed mtimes, owner root, sorted entries): same inputs, same digest."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = sorted({str(Path(p).parent) for p in [*layer.files, *layer.links]} - {"."})
        seen: set[str] = set()
        for d in dirs:
            parts = Path(d).parts
            for i in range(1, len(parts) + 1):
                sub = str(Path(*parts[:i]))
                if sub not in seen:
                    seen.add(sub)
                    info = tarfile.TarInfo(sub)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
        for path in sorted(set(layer.dirs) - seen):
            info = tarfile.TarInfo(path)
            info.type, info.mode = tarfile.DIRTYPE, layer.dirs[path]
            tar.addfile(info)
        for path in sorted(layer.files):
            data, mode = layer.files[path]
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
        for path in sorted(layer.links):
            info = tarfile.TarInfo(path)
            info.type, info.linkname = tarfile.SYMTYPE, layer.links[path]
            tar.addfile(info)
    return buf.getvalue()


def _blob(out: tarfile.TarFile, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo("blobs/sha256/" + digest.split(":", 1)[1])
    info.size = len(data)
    out.addfile(info, io.BytesIO(data))
    return digest


def write_archive(path: Path, name: str, layer: Layer, config: dict[str, object]) -> None:
    """An OCI image layout tar with one image `name` (registry/repo:tag) made of one layer."""
    layer_bytes = _layer_tar(layer)
    layer_digest = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    arch = _arch()
    image_config = {
        "architecture": arch,
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    }
    tmp = path.with_suffix(".tmp")
    with tarfile.open(tmp, mode="w") as out:
        _blob(out, layer_bytes)
        config_bytes = json.dumps(image_config, sort_keys=True).encode()
        config_digest = _blob(out, config_bytes)
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest,
                       "size": len(config_bytes)},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest,
                        "size": len(layer_bytes)}],
        }
        manifest_bytes = json.dumps(manifest, sort_keys=True).encode()
        manifest_digest = _blob(out, manifest_bytes)
        index = {
            "schemaVersion": 2,
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_digest,
                "size": len(manifest_bytes), "platform": {"architecture": arch, "os": "linux"},
                # containerd names the image after this annotation (the full reference).
                "annotations": {"io.containerd.image.name": name,
                                "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]},
            }],
        }
        for member, doc in (("oci-layout", {"imageLayoutVersion": "1.0.0"}), ("index.json", index)):
            data = json.dumps(doc).encode()
            info = tarfile.TarInfo(member)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
    tmp.replace(path)


def _run(argv: list[str], what: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ImageError(f"{what} failed (exit {done.returncode}): {' '.join(argv)}\n{done.stderr.strip()}")


def pause_layer(work: Path) -> Layer:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise ImageError("no C compiler (cc) to build the pause image: apt-get install gcc libc6-dev")
    src, binary = work / "pause.c", work / "pause"
    src.write_text(PAUSE_C)
    _run([cc, "-static", "-Os", "-s", "-o", str(binary), str(src)], "compiling the static pause program")
    return Layer({"pause": (binary.read_bytes(), 0o755)}, {})


def busybox_layer() -> Layer:
    busybox = Path("/bin/busybox")
    if not busybox.is_file():
        raise ImageError("/bin/busybox missing: apt-get install busybox-static")
    probe = subprocess.run([str(busybox), "--list"], capture_output=True, text=True, check=False)
    data = busybox.read_bytes()
    # A dynamically linked busybox would not run in an image without libc: its ELF interpreter path sits
    # in the first page (PT_INTERP); the static one has none.
    if probe.returncode != 0 or b"/ld-linux" in data[:4096]:
        raise ImageError(f"{busybox} is not Debian's busybox-static (apt-get install busybox-static)")
    links = {f"bin/{a}": "busybox" for a in probe.stdout.split() if a and a != "busybox"}
    files = {"bin/busybox": (data, 0o755), "gpupool/grant": (GRANT_SCRIPT.encode(), 0o755)}
    return Layer(files, links)


def _ldd(path: Path) -> list[Path]:
    """The shared objects `path` loads (resolved paths, the ELF interpreter included)."""
    done = subprocess.run(["ldd", str(path)], capture_output=True, text=True, check=False)
    out = []
    for line in done.stdout.splitlines():
        words = line.split()
        target = words[2] if len(words) > 2 and words[1] == "=>" else words[0] if words else ""
        if target.startswith("/"):
            out.append(Path(target))
    return out


def probe_layer(work: Path) -> Layer:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or not (FAKES / "probe.c").is_file():
        raise ImageError(f"cuda-probe image: needs cc and {FAKES}/probe.c, fake_cuda.c")
    lib = work / "libcuda.so.1"
    probe = work / "probe"
    # -Bsymbolic: the fake's internal calls must not come back through the interception library.
    _run([cc, "-std=c11", "-O2", "-fPIC", "-shared", "-Wl,-Bsymbolic", "-o", str(lib), str(FAKES / "fake_cuda.c"),
          "-lpthread"], "compiling the fake CUDA driver")
    _run([cc, "-std=c11", "-O2", "-o", str(probe), str(FAKES / "probe.c"), f"-L{work}", "-l:libcuda.so.1", "-ldl",
          "-lpthread", f"-Wl,-rpath,/{PROBE_LIB_DIR}"], "compiling the probe")
    base = busybox_layer()
    files = dict(base.files)
    files["usr/local/bin/probe"] = (probe.read_bytes(), 0o755)
    files[f"{PROBE_LIB_DIR}/libcuda.so.1"] = (lib.read_bytes(), 0o755)
    needed = _ldd(probe) + (_ldd(HOOK_LIBRARY) if HOOK_LIBRARY.is_file() else [])
    for so in needed:
        if so.name != "libcuda.so.1":
            files[str(so).lstrip("/")] = (so.read_bytes(), 0o755)
    # The fake driver keeps its device state in /tmp (FAKE_GPU_STATE's default).
    return Layer(files, base.links, {"tmp": 0o1777})


def build_images(cache: Path) -> dict[str, Path]:
    """Image name -> archive path, building what is not cached yet."""
    cache.mkdir(parents=True, exist_ok=True)
    work = cache / "work"
    work.mkdir(exist_ok=True)
    specs = [
        (PAUSE_IMAGE, lambda: pause_layer(work), {"Entrypoint": ["/pause"]}, PAUSE_C.encode()),
        (BUSYBOX_IMAGE, busybox_layer, {"Cmd": ["sh"], "Env": ["PATH=/bin"]},
         Path("/bin/busybox").read_bytes() + GRANT_SCRIPT.encode() if Path("/bin/busybox").is_file() else b""),
    ]
    probe_inputs = b"".join(p.read_bytes() for p in (FAKES / "probe.c", FAKES / "fake_cuda.c", HOOK_LIBRARY)
                            if p.is_file())
    specs.append((PROBE_IMAGE, lambda: probe_layer(work), {"Cmd": ["sh"], "Env": ["PATH=/bin:/usr/local/bin"]},
                  specs[1][3] + probe_inputs))
    out: dict[str, Path] = {}
    for name, make, config, inputs in specs:
        # LAYOUT: bump when this module changes what goes into an image, so cached archives are rebuilt.
        key = hashlib.sha256(LAYOUT + inputs + json.dumps(config).encode()).hexdigest()[:16]
        path = cache / f"{name.split('/')[-1].replace(':', '-')}-{key}.oci.tar"
        if not path.exists():
            write_archive(path, name, make(), config)
        out[name] = path
    return out


def import_images(archives: dict[str, Path], containerd_socket: Path, ctr: str = "ctr") -> None:
    """Import into containerd's `k8s.io` namespace (the one its CRI plugin, hence kubelet, sees), for this
    machine's platform (every archive here holds one image for it; `archive_platform` checks the project's).
    The image keeps the name its archive's index gives it (`io.containerd.image.name`, or a full reference
    in `org.opencontainers.image.ref.name`, as `buildah push ... oci-archive:FILE:NAME` writes)."""
    for name, path in archives.items():
        _run([ctr, "--address", str(containerd_socket), "-n", "k8s.io", "images", "import",
              "--platform", f"linux/{_arch()}", str(path)], f"importing {name}")


def tag_image(containerd_socket: Path, source: str, name: str, ctr: str = "ctr") -> None:
    """Give the imported image `source` a second name in containerd's `k8s.io` namespace (`ctr images tag`)."""
    _run([ctr, "--address", str(containerd_socket), "-n", "k8s.io", "images", "tag", "--force", source, name],
         f"tagging {source} as {name}")


def tag_example_images(containerd_socket: Path, ctr: str = "ctr") -> None:
    """EXAMPLE_IMAGES: each name given to its local image, which must be imported."""
    for name, source in EXAMPLE_IMAGES.items():
        tag_image(containerd_socket, source, name, ctr)


# --- the project's own images (scripts/image) --------------------------------------------------------------

PROJECT_MANIFEST = REPO / "build" / "image" / "images.json"  # written by scripts/image: name -> archive, facts


def archive_platform(path: Path) -> str:
    """os/architecture of the one image in an OCI archive (from its image config, which every manifest has,
    rather than the index entry, which buildah leaves without a platform)."""
    try:
        with tarfile.open(path) as tar:
            def blob(digest: str) -> dict[str, object]:
                member = tar.extractfile("blobs/sha256/" + digest.split(":", 1)[1])
                if member is None:
                    raise ImageError(f"{path}: blob {digest} missing")
                loaded: dict[str, object] = json.loads(member.read())
                return loaded
            index_file = tar.extractfile("index.json")
            if index_file is None:
                raise ImageError(f"{path}: no index.json (not an OCI archive)")
            manifests = json.loads(index_file.read()).get("manifests") or []
            if len(manifests) != 1:
                raise ImageError(f"{path}: {len(manifests)} manifests in its index, expected one")
            manifest = blob(manifests[0]["digest"])
            config_ref = manifest.get("config")
            if not isinstance(config_ref, dict):
                raise ImageError(f"{path}: its manifest has no config (an index of indexes?)")
            config = blob(str(config_ref["digest"]))
    except (OSError, tarfile.TarError, KeyError, ValueError) as e:
        raise ImageError(f"{path}: unreadable OCI archive ({e})") from None
    return f"{config.get('os')}/{config.get('architecture')}"


def project_archives(names: list[str] | None = None, manifest: Path = PROJECT_MANIFEST) -> dict[str, Path]:
    """Image name -> OCI archive for the images scripts/image built (the gpupool image of the Dockerfile,
    registry.k8s.io/kube-scheduler:<version>), all of them or `names`; each checked to exist and to be for
    this machine's platform. The error says which command builds what is missing."""
    if not manifest.is_file():
        raise ImageError(f"{manifest} missing: run scripts/image build (and scripts/image kube-scheduler)")
    known: dict[str, dict[str, object]] = json.loads(manifest.read_text())
    wanted = names if names is not None else sorted(known)
    out: dict[str, Path] = {}
    for name in wanted:
        facts = known.get(name)
        path = manifest.parent / str(facts["archive"]) if facts else None
        if path is None or not path.is_file():
            how = "scripts/image kube-scheduler" if "kube-scheduler" in name else "scripts/image build"
            raise ImageError(f"no archive of {name} in {manifest.parent}: run {how}")
        platform_ = archive_platform(path)
        if platform_ != f"linux/{_arch()}":
            raise ImageError(f"{path} holds a {platform_} image; this node runs linux/{_arch()}")
        out[name] = path
    return out


def import_project_images(containerd_sockets: list[Path], names: list[str] | None = None,
                          ctr: str = "ctr") -> dict[str, Path]:
    """The project's images (project_archives) into each node's containerd, so that pods with
    imagePullPolicy Never or IfNotPresent run them as a registry would have served them; returns them."""
    archives = project_archives(names)
    for socket in containerd_sockets:
        import_images(archives, socket, ctr)
    return archives
