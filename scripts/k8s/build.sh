#!/usr/bin/env bash
# Builds the real Kubernetes parts kcache is tested against, from Go modules only (the Go
# module proxy), once per machine and version:
#   kube-apiserver and kubectl   from k8s.io/kubernetes VERSION (through a wrapper module:
#                                scripts/k8s/lib.sh says why), /version reporting VERSION
#   etcd                         from go.etcd.io/etcd/server/v3, the release VERSION's kubeadm
#                                defaults to (scripts/k8s/versions.env)
#
# Usage: scripts/k8s/build.sh [reference|second|vX.Y.Z] [PREFIX]
#   default version: reference; default PREFIX: $K8S_TESTENV or /opt/k8s-testenv.
#   Installs into PREFIX/VERSION/bin; the last line printed is that dir.
#
# Idempotent: when the binaries and the stamp (PREFIX/VERSION/BUILD-INFO, which records a
# hash of these scripts) are present it only prints the bin dir. Log: PREFIX/VERSION/build.log.
# The Go module and build caches persist, so a rebuild after a script change is quick.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/k8s/lib.sh
source "$here/lib.sh"
# shellcheck source=scripts/as-root.sh
source "$here/../as-root.sh"
k8s_resolve "${1:-reference}"
prefix=${2:-${K8S_TESTENV:-/opt/k8s-testenv}}
dest=$prefix/$version
bin=$dest/bin
stamp=$dest/BUILD-INFO
script_hash=$(cat "$here/build.sh" "$here/lib.sh" "$here/versions.env" | sha256sum | cut -c1-16)
if [[ -x $bin/kube-apiserver && -x $bin/kubectl && -x $bin/etcd ]] && grep -qs "script-sha256 $script_hash" "$stamp"; then
  echo "$bin"
  exit 0
fi
k8s_build_start build.log

# --- kube-apiserver, kubectl ----------------------------------------------------------
mkdir -p "$work/k8s"
cd "$work/k8s"
k8s_wrapper_gomod kcache.local/k8s-build >go.mod
ldflags=$(k8s_ldflags)
echo "build.sh: building kube-apiserver and kubectl $version (first time ~10 min on 2 cores), log: $log" >&2
for cmd in kube-apiserver kubectl; do
  go build -trimpath -ldflags "$ldflags" -o "$work/$cmd" "k8s.io/kubernetes/cmd/$cmd" >>"$log" 2>&1 || k8s_build_fail "$cmd"
done

# --- etcd -----------------------------------------------------------------------------
mkdir -p "$work/etcd"
cd "$work/etcd"
etcd_mod=$(k8s_gomod_of "go.etcd.io/etcd/server/v3@$etcd_version")
[[ -f $etcd_mod ]] || { echo "build.sh: could not download go.etcd.io/etcd/server/v3@$etcd_version" >&2; exit 1; }
{
  echo "module kcache.local/etcd-build"
  echo
  grep -m1 '^go ' "$etcd_mod"
  echo
  echo "require go.etcd.io/etcd/server/v3 $etcd_version"
  echo
  echo "replace ("
  # server/v3's relative replaces (../api, ../client/v3, ...), at the same release.
  sed -n 's#^\t\(go.etcd.io/etcd/[a-z0-9/]*\) => \.\./.*#\1#p' "$etcd_mod" | while read -r m; do
    echo "	$m => $m $etcd_version"
  done
  echo ")"
} >go.mod
echo "build.sh: building etcd $etcd_version, log: $log" >&2
go build -trimpath -ldflags "-s -w" -o "$work/etcd-bin" go.etcd.io/etcd/server/v3 >>"$log" 2>&1 || k8s_build_fail etcd

install -m 0755 "$work/kube-apiserver" "$bin/kube-apiserver"
install -m 0755 "$work/kubectl" "$bin/kubectl"
install -m 0755 "$work/etcd-bin" "$bin/etcd"
echo "kube-apiserver and kubectl $version (k8s.io/kubernetes from the Go module proxy), etcd $etcd_version, $(go env GOVERSION), script-sha256 $script_hash" >"$stamp"
echo "build.sh: built in $((SECONDS - start)) s" >&2
echo "$bin"
