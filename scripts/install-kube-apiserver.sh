#!/usr/bin/env bash
# Builds and installs the real control plane kcache's tests and demo run against:
#   etcd 3.4 (Debian package `etcd-server`) and kube-apiserver v1.20.2, compiled from
#   Debian's `kubernetes` source package with Debian's Go.
#
# Why the vendor swap: Kubernetes 1.20 vendors reflect2 1.0.1, which is broken under
# Go >= 1.18 — the API server crashes with "fatal error: fault" the first time it encodes
# an object carrying labels. We replace reflect2 and json-iterator with Debian's newer
# packaged sources before building.
#
# Idempotent: when the binaries and the stamp are present it only prints the bin dir.
# Usage: scripts/install-kube-apiserver.sh [PREFIX]   (default $K8S_TESTENV or /opt/k8s-testenv)
# Last line of output: PREFIX/bin (holds kube-apiserver and etcd).
set -euo pipefail
prefix=${1:-${K8S_TESTENV:-/opt/k8s-testenv}}
bin=$prefix/bin
stamp=$prefix/BUILD-INFO
if [[ -x $bin/kube-apiserver && -x $bin/etcd ]] && grep -qs 'reflect2 1.0.2' "$stamp"; then
  echo "$bin"
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/k8s-source.sh
source "$here/k8s-source.sh"
# shellcheck source=scripts/as-root.sh
source "$here/as-root.sh"
as_root apt-get update -qq >/dev/null
as_root apt-get install -y -qq etcd-server golang-go rsync jq dpkg-dev openssl \
  golang-github-modern-go-reflect2-dev golang-github-json-iterator-go-dev >/dev/null
ensure_dir "$bin"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Download, extract, swap reflect2 + json-iterator (k8s-source.sh).
tree=$(k8s_patched_source "$tmp")
cd "$tree"
mkdir -p "$tmp/home"
if ! env HOME="$tmp/home" CGO_ENABLED=0 make WHAT=cmd/kube-apiserver >"$tmp/build.log" 2>&1; then
  tail -40 "$tmp/build.log" >&2
  exit 1
fi
install -m 0755 _output/bin/kube-apiserver "$bin/kube-apiserver"
ln -sf "$(command -v etcd)" "$bin/etcd"
echo "kube-apiserver v1.20.2 (Debian source), $(go env GOVERSION), reflect2 1.0.2, json-iterator 1.1.12" >"$stamp"
echo "$bin"
