#!/usr/bin/env bash
# Build kube-apiserver, kube-scheduler and kubelet 1.20 from Debian's source package, once per machine.
#
# The binaries land in $GPUPOOL_K8S_CACHE/bin (default ~/.cache/gpupool-k8s/bin) together with a stamp;
# a second run with the stamp in place does nothing. etcd comes from Debian's etcd-server package.
# Debian build dependencies are installed with apt-get only when missing (root or sudo required then).
set -euo pipefail

CACHE="${GPUPOOL_K8S_CACHE:-$HOME/.cache/gpupool-k8s}"
BIN="$CACHE/bin"
STAMP="$BIN/.built-1.20.2-kubelet"
WHAT="cmd/kube-apiserver cmd/kube-scheduler cmd/kubelet"
TARGETS=(kube-apiserver kube-scheduler kubelet)
# The exact Debian source version: with newer suites enabled, a bare `apt-get source kubernetes` picks the
# newest source of that name (1.36.4+ds is kubectl only) and the build fails. GPUPOOL_K8S_DEB_VERSION
# overrides it (e.g. after a Debian point release replaces this revision on the mirror).
DEB_VERSION="${GPUPOOL_K8S_DEB_VERSION:-1.20.5+really1.20.2-1.1+deb12u1}"

log() { printf '[k8s-testbed build] %s\n' "$*" >&2; }

have_all() {
  [[ -f "$STAMP" ]] || return 1
  local t
  for t in "${TARGETS[@]}"; do [[ -x "$BIN/$t" ]] || return 1; done
  command -v etcd >/dev/null
}

if have_all; then
  log "binaries present in $BIN"
  exit 0
fi

mkdir -p "$CACHE"
# One build at a time per cache (two pytest sessions, or CI and a developer): the second waits, or with
# GPUPOOL_K8S_NOWAIT=1 gives up at once.
exec 9>"$CACHE/build.lock"
if ! flock ${GPUPOOL_K8S_NOWAIT:+-n} 9; then
  log "another build is running (lock $CACHE/build.lock); try again when it is done"
  exit 75
fi
if have_all; then
  log "binaries present in $BIN (built by the run that held the lock)"
  exit 0
fi

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { log "need root or sudo to install Debian packages"; exit 1; }
  SUDO=(sudo)
fi
apt_install() {
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2
}

# deb-src for the Debian mirror this machine already uses (deb822 or one-line format).
ensure_deb_src() {
  if apt-get source --print-uris "kubernetes=$DEB_VERSION" >/dev/null 2>&1; then return 0; fi
  local uri
  uri=$(grep -hoE 'https?://[^ ]*debian\.org/debian/?' /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null \
        | grep -v security | head -n1 || true)
  uri="${uri:-http://deb.debian.org/debian}"
  log "adding deb-src entry for $uri"
  printf 'Types: deb-src\nURIs: %s\nSuites: bookworm\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    "$uri" | "${SUDO[@]}" tee /etc/apt/sources.list.d/gpupool-k8s-src.sources >/dev/null
  "${SUDO[@]}" apt-get update -qq >&2
}

need=()
command -v go >/dev/null || need+=(golang-go)
command -v etcd >/dev/null || need+=(etcd-server)
command -v dpkg-source >/dev/null || need+=(dpkg-dev)
command -v make >/dev/null || need+=(make)
command -v rsync >/dev/null || need+=(rsync)
command -v openssl >/dev/null || need+=(openssl)  # the testbed's service-account key pair
[[ -d /usr/share/gocode/src/github.com/modern-go/reflect2 ]] || need+=(golang-github-modern-go-reflect2-dev)
if ((${#need[@]})); then
  log "installing ${need[*]}"
  "${SUDO[@]}" apt-get update -qq >&2
  apt_install "${need[@]}"
fi
# etcd-server starts a system service on install; the testbed runs its own etcd on a free port.
if command -v systemctl >/dev/null && systemctl is-active --quiet etcd 2>/dev/null; then
  "${SUDO[@]}" systemctl disable --now etcd >/dev/null 2>&1 || true
fi

mkdir -p "$CACHE/src" "$BIN"
# The tree dpkg-source unpacks is named after the upstream part of the version (before the last '-').
SRC="$CACHE/src/kubernetes-${DEB_VERSION%-*}"
if [[ ! -f "$SRC/.unpacked" ]]; then
  ensure_deb_src
  rm -rf "$CACHE/src" && mkdir -p "$CACHE/src"
  log "fetching Debian source package kubernetes=$DEB_VERSION"
  (cd "$CACHE/src" && apt-get source -qq "kubernetes=$DEB_VERSION" >&2)
  [[ -d "$SRC" ]] || { log "apt-get source kubernetes=$DEB_VERSION produced no $SRC"; exit 1; }
  # reflect2 1.0.1 (vendored) faults in map iteration under Go >= 1.18; Debian's 1.0.2 does not.
  rm -rf "$SRC/vendor/github.com/modern-go/reflect2"
  cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 "$SRC/vendor/github.com/modern-go/reflect2"
  touch "$SRC/.unpacked"
fi

log "building $WHAT in $SRC (cold: ~10 min on 2 cores)"
(cd "$SRC" && make WHAT="$WHAT" >&2)
for b in "${TARGETS[@]}"; do
  out=$(find "$SRC/_output" -type f -name "$b" -perm -u+x | head -n1)
  [[ -n "$out" ]] || { log "build produced no $b"; exit 1; }
  install -m 0755 "$out" "$BIN/$b"
done
touch "$STAMP"
log "done: ${TARGETS[*]} in $BIN, etcd at $(command -v etcd)"
