#!/usr/bin/env bash
# Build KEDA's operator and its metrics apiserver (keda-adapter) from KEDA's Go module, once per machine,
# for the autoscaling e2e test (tests/e2e/test_e2e_hpa.py) and benchmarks/hpa.py.
#
# Why this way: KEDA's go.mod has `replace` directives, which `go install module@version` refuses, so the
# module's source is downloaded (its hash checked against the pin below, as well as by the Go checksum
# database) and built inside itself with -mod=readonly: KEDA's own go.sum pins every dependency. The
# module's config/ (CRDs, RBAC) is copied beside the binaries; the testbed applies it from there at run
# time (nothing of KEDA is kept in this repository).
#
# Outputs: $GPUPOOL_KEDA_CACHE (default ~/.cache/gpupool-keda): bin/keda-operator, bin/keda-adapter,
# config/, and a stamp named after the pin and this script; a second run with the stamp in place does
# nothing. Go's module and build caches are its own (GOMODCACHE, GOCACHE), never the repository.
set -euo pipefail

KEDA_MODULE=github.com/kedacore/keda/v2
KEDA_VERSION=v2.21.0
# `go mod download -json` Sum of the module at KEDA_VERSION (the zip's dirhash).
KEDA_SUM='h1:R6z2HZvstK4RLUMxroNACzBj74xGxt3kG59b5Xc+Xps='

CACHE="${GPUPOOL_KEDA_CACHE:-$HOME/.cache/gpupool-keda}"
BIN="$CACHE/bin"
PIN=$(cat "$0" | sha256sum | cut -c1-16)
STAMP="$BIN/.built-$KEDA_VERSION-$PIN"

log() { printf '[keda build] %s\n' "$*" >&2; }

have_all() { [[ -f "$STAMP" && -x "$BIN/keda-operator" && -x "$BIN/keda-adapter" && -d "$CACHE/config/crd" ]]; }

if have_all; then
  log "KEDA $KEDA_VERSION present in $BIN"
  exit 0
fi
mkdir -p "$CACHE" "$BIN"
# One build at a time per cache (two test sessions, or CI and a developer): the second waits, or with
# GPUPOOL_KEDA_NOWAIT=1 gives up at once.
exec 9>"$CACHE/build.lock"
if ! flock ${GPUPOOL_KEDA_NOWAIT:+-n} 9; then
  log "another build is running (lock $CACHE/build.lock); try again when it is done"
  exit 75
fi
if have_all; then
  log "KEDA $KEDA_VERSION present in $BIN (built by the run that held the lock)"
  exit 0
fi
command -v go >/dev/null || { log "Go is needed (go1.26 or newer on PATH)"; exit 1; }

log "fetching $KEDA_MODULE@$KEDA_VERSION"
if ! go mod download -json "$KEDA_MODULE@$KEDA_VERSION" >"$CACHE/module.json" 2>"$CACHE/download.log"; then
  log "the Go module proxy (${GOPROXY:-default}) did not serve $KEDA_MODULE@$KEDA_VERSION:"
  cat "$CACHE/download.log" "$CACHE/module.json" >&2
  exit 1
fi
field() { sed -n "s/^[[:space:]]*\"$1\": \"\(.*\)\",\{0,1\}$/\1/p" "$CACHE/module.json" | head -1; }
SUM=$(field Sum)
DIR=$(field Dir)
if [[ "$SUM" != "$KEDA_SUM" ]]; then
  log "$KEDA_MODULE@$KEDA_VERSION has hash $SUM, the pin says $KEDA_SUM: refusing to build it"
  exit 1
fi

SRC="$CACHE/src"
rm -rf "$SRC" && cp -r "$DIR" "$SRC" && chmod -R u+w "$SRC"  # the module cache is read-only
log "fetching KEDA's dependencies (its go.sum)"
if ! (cd "$SRC" && go mod download -x >"$CACHE/deps.log" 2>&1); then
  log "could not fetch these modules from ${GOPROXY:-the Go module proxy}:"
  grep -E 'reading|verifying|404|403|410|not found|unrecognized' "$CACHE/deps.log" | sort -u | head -20 >&2
  exit 1
fi
log "building keda-operator and keda-adapter (cold: about 10-20 min on 2 cores; docs/autoscaling.md)"
V=github.com/kedacore/keda/v2/version
(cd "$SRC" && CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "-s -w -X $V.Version=$KEDA_VERSION" \
  -o "$BIN/keda-operator" ./cmd/operator)
(cd "$SRC" && CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "-s -w -X $V.Version=$KEDA_VERSION" \
  -o "$BIN/keda-adapter" ./cmd/adapter)
rm -rf "$CACHE/config" && cp -r "$SRC/config" "$CACHE/config"
rm -rf "$SRC"  # ~100 MB; the module cache keeps the source
rm -f "$BIN"/.built-*
touch "$STAMP"
log "done: KEDA $KEDA_VERSION in $BIN"
