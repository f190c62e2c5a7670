#!/usr/bin/env bash
# Builds kcache-nats-informer at a Kubernetes version, from Go modules only, into the same
# PREFIX/VERSION/bin as scripts/k8s/build.sh: an unchanged client-go SharedInformer of that
# version running over NATS on the project's Go package clients/go/natsinformer
# (conformance/nats-informer/). Apart from build-programs.sh so that a change of the
# subscriber package rebuilds this program only, not the e2e specs.
#
# Usage: scripts/k8s/build-nats-informer.sh [reference|second|vX.Y.Z] [PREFIX]
# Idempotent: the stamp PREFIX/VERSION/NATS-INFORMER-INFO records a hash of the program,
# judgelib, clients/go and these scripts; while it matches, only the path is printed (the
# last line). Log: PREFIX/VERSION/nats-informer.log.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../../conformance" && pwd)
clients=$(cd "$here/../../clients/go" && pwd)
# shellcheck source=scripts/k8s/lib.sh
source "$here/lib.sh"
# shellcheck source=scripts/as-root.sh
source "$here/../as-root.sh"
k8s_resolve "${1:-reference}"
prefix=${2:-${K8S_TESTENV:-/opt/k8s-testenv}}
dest=$prefix/$version
bin=$dest/bin
stamp=$dest/NATS-INFORMER-INFO
hash=$( (cd "$src" && find nats-informer judgelib -type f -print0 | LC_ALL=C sort -z | xargs -0 cat;
  cd "$clients" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 cat;
  cat "$here/build-nats-informer.sh" "$here/lib.sh" "$here/versions.env") | sha256sum | cut -c1-16)
if [[ -x $bin/kcache-nats-informer ]] && grep -qs "sha256 $hash" "$stamp"; then
  echo "$bin/kcache-nats-informer"
  exit 0
fi
k8s_build_start nats-informer.log
cd "$work"
k8s_wrapper_gomod kcache.local/judges >go.mod
# The subscriber module from the tree; its Kubernetes modules are pinned by the replaces.
printf '\nrequire kcache.local/subscriber v0.0.0\n\nreplace kcache.local/subscriber => %s\n' "$clients" >>go.mod
cp -r "$src/nats-informer" "$src/judgelib" "$work/"
echo "build-nats-informer.sh: building kcache-nats-informer at $version, log: $log" >&2
go build -trimpath -ldflags "$(k8s_ldflags)" -o "$work/kcache-nats-informer" ./nats-informer >>"$log" 2>&1 ||
  k8s_build_fail kcache-nats-informer
install -m 0755 "$work/kcache-nats-informer" "$bin/"
echo "kcache-nats-informer at $version (Go modules), $(go env GOVERSION), sha256 $hash" >"$stamp"
echo "build-nats-informer.sh: built in $((SECONDS - start)) s" >&2
echo "$bin/kcache-nats-informer"
