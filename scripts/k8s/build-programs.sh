#!/usr/bin/env bash
# Builds kcache's Go judges at a Kubernetes version, from Go modules only, into the same
# PREFIX/VERSION/bin as scripts/k8s/build.sh:
#   kcache-e2e.test     Kubernetes' own e2e specs (test/e2e/apimachinery, test/e2e/common/...)
#                       through kcache's ginkgo entry point conformance/runner/
#   kcache-pb-informer  a client-go informer speaking protobuf only (conformance/informer/)
#   kcache-informer     an unchanged client-go SharedInformer with streaming lists and the
#                       watchlist consistency detector (conformance/informer-sync/)
#   kcache-kubelet      the kubelet's own watch-based Secret/ConfigMap managers
#                       (pkg/kubelet/secret, pkg/kubelet/configmap; conformance/kubelet-manager/)
#   kcache-kube-proxy   kube-proxy's Service and EndpointSlice informers with its label
#                       selector (conformance/kube-proxy/)
# Each program's source is the project's; the go.mod is a wrapper module made here for the
# version (scripts/k8s/lib.sh), so the same source builds against the reference and the
# second version.
#
# Usage: scripts/k8s/build-programs.sh [reference|second|vX.Y.Z] [PREFIX]
# Idempotent: the stamp PREFIX/VERSION/PROGRAMS-INFO records a hash of conformance/'s Go
# sources and these scripts; while it matches, only the e2e runner's path is printed (the
# last line). Log: PREFIX/VERSION/programs.log.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../../conformance" && pwd)
# shellcheck source=scripts/k8s/lib.sh
source "$here/lib.sh"
# shellcheck source=scripts/as-root.sh
source "$here/../as-root.sh"
k8s_resolve "${1:-reference}"
prefix=${2:-${K8S_TESTENV:-/opt/k8s-testenv}}
dest=$prefix/$version
bin=$dest/bin
stamp=$dest/PROGRAMS-INFO
programs=(runner informer informer-sync kubelet-manager kube-proxy)
# Go packages the programs share (not programs themselves).
libraries=(judgelib)
hash=$( (cd "$src" && find "${programs[@]}" "${libraries[@]}" -type f -print0 | LC_ALL=C sort -z | xargs -0 cat;
  cat "$here/build-programs.sh" "$here/lib.sh" "$here/versions.env") | sha256sum | cut -c1-16)
if [[ -x $bin/kcache-e2e.test && -x $bin/kcache-pb-informer && -x $bin/kcache-informer && -x $bin/kcache-kubelet && -x $bin/kcache-kube-proxy ]] && grep -qs "sha256 $hash" "$stamp"; then
  echo "$bin/kcache-e2e.test"
  exit 0
fi
k8s_build_start programs.log
cd "$work"
k8s_wrapper_gomod kcache.local/judges >go.mod
for p in "${programs[@]}" "${libraries[@]}"; do cp -r "$src/$p" "$work/$p"; done
ldflags=$(k8s_ldflags)
echo "build-programs.sh: building the e2e specs and client programs at $version (first time ~10 min on 2 cores), log: $log" >&2
go test -c -trimpath -ldflags "$ldflags" -o "$work/kcache-e2e.test" ./runner >>"$log" 2>&1 || k8s_build_fail kcache-e2e.test
go build -trimpath -ldflags "$ldflags" -o "$work/kcache-pb-informer" ./informer >>"$log" 2>&1 || k8s_build_fail kcache-pb-informer
go build -trimpath -ldflags "$ldflags" -o "$work/kcache-informer" ./informer-sync >>"$log" 2>&1 || k8s_build_fail kcache-informer
go build -trimpath -ldflags "$ldflags" -o "$work/kcache-kubelet" ./kubelet-manager >>"$log" 2>&1 || k8s_build_fail kcache-kubelet
go build -trimpath -ldflags "$ldflags" -o "$work/kcache-kube-proxy" ./kube-proxy >>"$log" 2>&1 || k8s_build_fail kcache-kube-proxy
install -m 0755 "$work/kcache-e2e.test" "$work/kcache-pb-informer" "$work/kcache-informer" "$work/kcache-kubelet" "$work/kcache-kube-proxy" "$bin/"
echo "kcache-e2e.test, kcache-pb-informer, kcache-informer, kcache-kubelet, kcache-kube-proxy at $version (Go modules), $(go env GOVERSION), sha256 $hash" >"$stamp"
echo "build-programs.sh: built in $((SECONDS - start)) s" >&2
echo "$bin/kcache-e2e.test"
