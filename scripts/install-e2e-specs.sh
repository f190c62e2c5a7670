#!/usr/bin/env bash
# Builds kcache's e2e spec runner: Kubernetes v1.20.2's own api-machinery e2e specs
# (test/e2e/apimachinery) plus test/e2e/common (ConfigMap, Secret, ... specs), compiled
# with our ginkgo entry point conformance/runner/ into one `go test -c` binary; and,
# beside it, kcache-pb-informer (conformance/informer/): a client-go informer speaking
# protobuf only, which services/tests/protobuf.rs runs.
#
# Source: the same patched Debian source tree scripts/install-kube-apiserver.sh builds
# from (scripts/k8s-source.sh: Debian's `kubernetes` source package with reflect2 and
# json-iterator swapped for Debian's newer packaged versions; without the swap binaries
# built with Go >= 1.18 crash with "fatal error: fault").
#
# Idempotent: when PREFIX/bin/kcache-e2e.test, PREFIX/bin/kcache-pb-informer and the stamp
# (PREFIX/bin/kcache-e2e.test.stamp, which records a hash of conformance/runner/* and
# conformance/informer/*) are present and the hash matches, it only prints the runner's
# path. Editing either folder makes the next call rebuild.
# Build log: PREFIX/kcache-e2e.build.log (its tail is printed on failure).
#
# Usage: scripts/install-e2e-specs.sh [PREFIX]   (default $K8S_TESTENV or /opt/k8s-testenv)
# Last line of output: PREFIX/bin/kcache-e2e.test
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
runner=$here/../conformance/runner
informer=$here/../conformance/informer
prefix=${1:-${K8S_TESTENV:-/opt/k8s-testenv}}
bin=$prefix/bin
out=$bin/kcache-e2e.test
stamp=$out.stamp
log=$prefix/kcache-e2e.build.log

runner_hash=$(cd "$runner/.." && find runner informer -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
if [[ -x $out && -x $bin/kcache-pb-informer ]] && grep -qs "runner-sha256 $runner_hash" "$stamp"; then
  echo "$out"
  exit 0
fi

export DEBIAN_FRONTEND=noninteractive
# shellcheck source=scripts/as-root.sh
source "$here/as-root.sh"
command -v go >/dev/null || {
  as_root apt-get update -qq >/dev/null
  as_root apt-get install -y -qq golang-go >/dev/null
}
# shellcheck source=scripts/k8s-source.sh
source "$here/k8s-source.sh"

ensure_dir "$bin"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tree=$(k8s_patched_source "$tmp")
mkdir -p "$tree/test/e2e/kcache" "$tmp/home" "$tmp/gopath/src/k8s.io"
cp "$runner"/* "$tree/test/e2e/kcache/"
mkdir -p "$tree/test/kcache-pb-informer"
cp "$informer"/* "$tree/test/kcache-pb-informer/"
# GOPATH mode, as Kubernetes 1.20's own build does (hack/lib/init.sh: GO111MODULE=off):
# in module mode Go >= 1.19 rejects this tree's go.mod ("updates to go.mod needed,
# disabled by -mod=vendor"). vendor/ (staging repos are symlinks in it) supplies all deps.
ln -s "$tree" "$tmp/gopath/src/k8s.io/kubernetes"
cd "$tmp/gopath/src/k8s.io/kubernetes"
echo "install-e2e-specs: building $out (about 3-4 min on 2 cores), log: $log" >&2
start=$SECONDS
if ! env HOME="$tmp/home" GOPATH="$tmp/gopath" GO111MODULE=off GOFLAGS= CGO_ENABLED=0 \
  go test -c -ldflags '-s -w' -o "$tmp/kcache-e2e.test" ./test/e2e/kcache >"$log" 2>&1; then
  tail -40 "$log" >&2
  exit 1
fi
if ! env HOME="$tmp/home" GOPATH="$tmp/gopath" GO111MODULE=off GOFLAGS= CGO_ENABLED=0 \
  go build -ldflags '-s -w' -o "$tmp/kcache-pb-informer" ./test/kcache-pb-informer >>"$log" 2>&1; then
  tail -40 "$log" >&2
  exit 1
fi
install -m 0755 "$tmp/kcache-e2e.test" "$out"
install -m 0755 "$tmp/kcache-pb-informer" "$bin/kcache-pb-informer"
echo "kcache-e2e.test: Kubernetes v1.20.2 test/e2e/{apimachinery,common} (Debian source), $(go env GOVERSION), reflect2 1.0.2, json-iterator 1.1.12, runner-sha256 $runner_hash" >"$stamp"
echo "install-e2e-specs: built in $((SECONDS - start)) s" >&2
echo "$out"
