#!/usr/bin/env bash
# Build the testbed's Kubernetes 1.37, etcd, containerd 2, the CNI plugins and helm 4 from their Go modules,
# once per machine.
#
#   scripts/k8s/build.sh          everything (what `scripts/k8s-testbed build` runs)
#   scripts/k8s/build.sh helm     helm only (all the chart tests need; tests/deploy/helm_tool.py runs it)
#
# The pins are the `require` lines of scripts/k8s/modules/*/go.mod, with go.sum beside them: the same pins
# always give the same versions, and a module the proxy cannot serve fails the build naming it. Outputs go to
# $GPUPOOL_K8S_CACHE/bin (default ~/.cache/gpupool-k8s/bin) with a stamp named after a hash of the module
# files; a second run with that stamp in place does nothing. helm has its own stamp (a hash of modules/helm
# and this script) and its own lock: pinning another helm never rebuilds Kubernetes, and helm alone builds
# while a Kubernetes build runs. Go's module and build caches are its own (~/go/pkg/mod, ~/.cache/go-build),
# never the repository.
#
# runc (and util-linux, openssl, busybox, a C compiler) come from Debian's packages, installed when missing.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
MODULES="$HERE/modules"
CACHE="${GPUPOOL_K8S_CACHE:-$HOME/.cache/gpupool-k8s}"
BIN="$CACHE/bin"
K8S_MODULES=(kubernetes etcd containerd cni)
# A hash of the files of some module directories (go.mod, go.sum, tools.go) and of this script.
pins() {
  local d
  for d in "$@"; do cat "$MODULES/$d"/go.mod "$MODULES/$d"/go.sum "$MODULES/$d"/*.go; done | cat - "$0" \
    | sha256sum | cut -c1-16
}
STAMP="$BIN/.built-$(pins "${K8S_MODULES[@]}")"
HELM_STAMP="$BIN/.helm-$(pins helm)"
TARGETS=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet kubectl etcd containerd
         containerd-shim-runc-v2 ctr cni/bridge cni/host-local cni/loopback)

log() { printf '[k8s-testbed build] %s\n' "$*" >&2; }

case "${1:-all}" in
  all) WANT_K8S=1 ;;
  helm) WANT_K8S= ;;
  *) log "usage: $0 [all|helm]"; exit 2 ;;
esac

have_k8s() {
  [[ -z "$WANT_K8S" ]] && return 0
  [[ -f "$STAMP" ]] || return 1
  local t
  for t in "${TARGETS[@]}"; do [[ -x "$BIN/$t" ]] || return 1; done
}
have_helm() { [[ -f "$HELM_STAMP" && -x "$BIN/helm" ]]; }
have_all() { have_k8s && have_helm; }

# The version a module file pins for `module` (its require line).
pin() { awk -v m="$2" '$1 == m && $2 ~ /^v/ {print $2; exit} $1 == "require" && $2 == m {print $3; exit}' "$1"; }

if have_all; then
  log "binaries present in $BIN"
  exit 0
fi

mkdir -p "$CACHE" "$BIN"
command -v go >/dev/null || { log "Go is needed (go1.26 or newer on PATH)"; exit 1; }
# One build at a time per cache and part (two pytest sessions, or CI and a developer): the second waits, or
# with GPUPOOL_K8S_NOWAIT=1 gives up at once. Kubernetes and the rest hold build.lock; helm, helm.lock.
lock() {
  local fd="$1" file="$CACHE/$2"
  eval "exec $fd>\"\$file\""
  if ! flock ${GPUPOOL_K8S_NOWAIT:+-n} "$fd"; then
    log "another build is running (lock $file); try again when it is done"
    exit 75
  fi
}

# Build one module directory: fetch its pinned modules (a clear error naming what the proxy refused), then
# `go build` the packages given, into $OUT (default $BIN). -mod=readonly: go.mod and go.sum are the whole truth.
build() {
  local name="$1" ldflags="$2" tags="$3"; shift 3
  local src="$CACHE/src/$name"
  rm -rf "$src" && mkdir -p "$src" && cp "$MODULES/$name"/* "$src/"
  log "$name: fetching modules"
  if ! (cd "$src" && go mod download -x >"$CACHE/$name-download.log" 2>&1); then
    log "$name: could not fetch these modules from ${GOPROXY:-the Go module proxy}:"
    grep -E 'reading|verifying|404|403|410|not found|unrecognized' "$CACHE/$name-download.log" | sort -u | head -20 >&2
    exit 1
  fi
  log "$name: building $*"
  mkdir -p "${OUT:-$BIN}"
  (cd "$src" && CGO_ENABLED=0 go build -mod=readonly -trimpath -tags "$tags" -ldflags "-s -w $ldflags" -o "${OUT:-$BIN}/" "$@")
}

# helm 4 (helm.sh/helm/v4 at the pin in modules/helm; its client-go is Kubernetes' own v0.37.2, so the
# module cache is shared): the chart tests' and the testbed's helm. Version strings as helm's Makefile sets
# them for a release, without the git commit (a module zip has none); the Kubernetes version `helm template`
# assumes follows that client-go (v1.37).
if ! have_helm; then
  lock 8 helm.lock
  if ! have_helm; then
    HELM=$(pin "$MODULES/helm/go.mod" helm.sh/helm/v4)
    HV=helm.sh/helm/v4/internal/version
    OUT="$CACHE/helm-out" build helm "-X $HV.version=$HELM -X $HV.metadata= -X $HV.gitTreeState=clean" "" \
      helm.sh/helm/v4/cmd/helm
    mv -f "$CACHE/helm-out/helm" "$BIN/helm"
    rm -f "$BIN"/.helm-*
    touch "$HELM_STAMP"
    log "done: helm $HELM in $BIN/helm"
  fi
  exec 8>&-
  if have_all; then
    exit 0
  fi
fi

lock 9 build.lock
if have_all; then
  log "binaries present in $BIN (built by the run that held the lock)"
  exit 0
fi

need=()
command -v runc >/dev/null || need+=(runc)
command -v openssl >/dev/null || need+=(openssl)  # the testbed's certificates and service-account keys
command -v unshare >/dev/null || need+=(util-linux)
if ((${#need[@]})); then
  SUDO=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { log "need root or sudo to install ${need[*]}"; exit 1; }
    SUDO=(sudo)
  fi
  log "installing ${need[*]} from Debian"
  "${SUDO[@]}" apt-get update -qq >&2
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
fi

K8S=$(pin "$MODULES/kubernetes/go.mod" k8s.io/kubernetes)
MINOR=$(echo "$K8S" | cut -d. -f2)
V=k8s.io/component-base/version
build kubernetes "-X $V.gitVersion=$K8S -X $V.gitMajor=1 -X $V.gitMinor=$MINOR -X $V.gitTreeState=clean" "" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/cmd/kubelet \
  k8s.io/kubernetes/cmd/kubectl
ETCD=$(pin "$MODULES/etcd/go.mod" go.etcd.io/etcd/server/v3)
build etcd "" "" .
CTD=$(pin "$MODULES/containerd/go.mod" github.com/containerd/containerd/v2)
# No btrfs/devmapper/zfs snapshotters (cgo headers; the nodes use overlayfs).
build containerd "-X github.com/containerd/containerd/v2/version.Version=$CTD" "no_btrfs no_devmapper no_zfs" \
  github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
  github.com/containerd/containerd/v2/cmd/ctr
P=github.com/containernetworking/plugins/plugins
OUT="$BIN/cni" build cni "" "" $P/main/bridge $P/ipam/host-local $P/main/loopback
rm -f "$BIN"/.built-*
touch "$STAMP"
log "done: Kubernetes $K8S, etcd $ETCD, containerd $CTD, CNI plugins $(pin "$MODULES/cni/go.mod" github.com/containernetworking/plugins), helm $(pin "$MODULES/helm/go.mod" helm.sh/helm/v4) in $BIN (runc: $(command -v runc))"
