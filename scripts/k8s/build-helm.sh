#!/usr/bin/env bash
# Builds helm from its Go module (helm.sh/helm/v4, the version pinned in
# scripts/k8s/versions.env), once per machine, so the chart in deploy/helm is linted and
# rendered by the real thing: nothing prebuilt is downloaded.
#
# Usage: scripts/k8s/build-helm.sh [PREFIX]
#   default PREFIX: $K8S_TESTENV or /opt/k8s-testenv. Installs PREFIX/helm-VERSION/bin/helm;
#   the last line printed is that dir. Idempotent (a stamp records a hash of this script).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/k8s/lib.sh
source "$here/lib.sh"
# shellcheck source=scripts/as-root.sh
source "$here/../as-root.sh"
version=$KCACHE_HELM
prefix=${1:-${K8S_TESTENV:-/opt/k8s-testenv}}
dest=$prefix/helm-$version
bin=$dest/bin
stamp=$dest/BUILD-INFO
script_hash=$(cat "$here/build-helm.sh" "$here/versions.env" | sha256sum | cut -c1-16)
if [[ -x $bin/helm ]] && grep -qs "script-sha256 $script_hash" "$stamp"; then
  echo "$bin"
  exit 0
fi
k8s_build_start build.log
echo "build-helm.sh: building helm $version (first time ~3 min on 2 cores), log: $log" >&2
# `go install module@version` builds the module as released (its own go.mod, no replaces);
# the version flag is what helm's Makefile sets.
GOBIN=$work go install -trimpath \
  -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$version" \
  "helm.sh/helm/v4/cmd/helm@$version" >>"$log" 2>&1 || k8s_build_fail helm
install -m 0755 "$work/helm" "$bin/helm"
echo "helm $version (helm.sh/helm/v4 from the Go module proxy), $(go env GOVERSION), script-sha256 $script_hash" >"$stamp"
echo "build-helm.sh: built in $((SECONDS - start)) s" >&2
echo "$bin"
