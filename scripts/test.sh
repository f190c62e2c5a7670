#!/usr/bin/env bash
# The test command (README, CI): formatting, lints, then every unit and integration test.
# Fails at the first step that fails.
#
# Integration tests (services/tests/) start their own etcd + kube-apiserver of the reference
# Kubernetes version (scripts/k8s/versions.env) on free loopback ports; KCACHE_K8S_BIN tells
# them where the binaries are. Set KCACHE_KEEP_TEST_DIRS=1 to keep each test cluster's
# directory (logs) after the run.
set -euo pipefail
cd "$(dirname "$0")/.."
# Missing apt packages and the reference version's kube-apiserver, kubectl and etcd, built
# from Go modules (scripts/k8s/build.sh, a no-op once built); the last line is the bin dir.
KCACHE_K8S_BIN=$(scripts/ensure-deps.sh | tail -1)
export KCACHE_K8S_BIN
for exe in kube-apiserver kubectl etcd; do
  [[ -x $KCACHE_K8S_BIN/$exe ]] || { echo "test.sh: no $exe in '$KCACHE_K8S_BIN'" >&2; exit 1; }
done
# Kubernetes' own e2e specs and kcache's client-go judges at the same version
# (services/tests/conformance.rs runs the specs directly and through kcache).
KCACHE_E2E_TEST=$(scripts/k8s/build-programs.sh reference | tail -1)
export KCACHE_E2E_TEST
# A client-go informer over NATS on the project's Go package (services/tests/nats_informer.rs),
# beside the other judges.
scripts/k8s/build-nats-informer.sh reference >/dev/null
# helm, built from its Go module, for the chart's lint and render (services/tests/deploy.rs).
KCACHE_HELM_BIN=$(scripts/k8s/build-helm.sh | tail -1)
export KCACHE_HELM_BIN
# Go's build cache (several GB after a Kubernetes build) is not needed once the binaries are
# in place (each build is kept by its hash); on a fresh machine the disk is better spent on
# the Rust build. KCACHE_KEEP_GO_CACHE=1 keeps it.
trim_go_cache() {
  [[ -n ${KCACHE_KEEP_GO_CACHE:-} ]] || go clean -cache 2>/dev/null || true
}
trim_go_cache
# Tests and scripts that run kubectl get the reference version's.
export PATH="$KCACHE_K8S_BIN:$PATH"
# rustfmt and clippy are rustup components; a toolchain without them cannot check format
# or lints. Say so loudly and go on with the tests rather than fail on a missing tool.
missing_tools=()
cargo fmt --version >/dev/null 2>&1 || missing_tools+=(rustfmt)
cargo clippy --version >/dev/null 2>&1 || missing_tools+=(clippy)
set -x
if ((${#missing_tools[@]} == 0)); then
  cargo fmt --all --check
  cargo clippy --workspace --all-targets --locked -- -D warnings
else
  { set +x; } 2>/dev/null
  printf '\n!!! test.sh: %s missing on this machine: format and lint checks NOT RUN !!!\n\n' "${missing_tools[*]}" >&2
  set -x
fi
# Each integration test starts its own API server; two at a time suit a 2-core machine.
cargo test --workspace --locked -- --test-threads=2
# The Go subscriber package against the subject contract's shared cases
# (clients/contract/), the same ones the Rust library's contract test replays.
(cd clients/go && go vet ./... && go test ./...)
# The second supported version (the oldest minor still supported upstream,
# scripts/k8s/versions.env): the differential, consistency and real-client tests again,
# against its own API server, kubectl and client-go, and its own e2e specs
# (conformance/specs-second.txt) directly, through one kcache and through a fleet.
{ set +x; } 2>/dev/null
second_bin=$(scripts/k8s/build.sh second | tail -1)
second_e2e=$(scripts/k8s/build-programs.sh second | tail -1)
trim_go_cache
set -x
KCACHE_K8S_BIN=$second_bin KCACHE_E2E_TEST=$second_e2e \
  KCACHE_E2E_SPECS="$PWD/conformance/specs-second.txt" \
  cargo test -p kcache --locked --test api_semantics --test authorization --test differential \
  --test consistent_reads --test client_go --test kubelet --test kube_proxy --test kubectl \
  --test protobuf --test conformance \
  -- --test-threads=2
# The fleet's chaos soak, 60 s with a fixed seed (replayable): a real API server, a 3-node
# NATS cluster and 3 replicas under kill -9s, pauses, compactions and an API server
# restart; fails on any lost, duplicated or going-back event (loadtest/README.md). The
# debug build: its dependencies are the tests' own, already compiled.
KCACHE_CHAOS_PROFILE=debug loadtest/chaos.sh --duration 60 --seed "${KCACHE_CHAOS_SEED:-7}"
# Adaptive coalescing under the same faults, 45 s: reflectors on one replica only, and
# single-object watches that start one by one during the faults, so the fleet's watched
# names cross coalesce_min_names (30 of the 40 objects) mid-chaos and name keys' live
# watchers move onto the namespace key; fails as well if none moved.
KCACHE_CHAOS_PROFILE=debug KCACHE_CHAOS_NO_BUILD=1 KCACHE_CHAOS_CACHE='coalesce_min_names = 30' \
  loadtest/chaos.sh --duration 45 --seed "${KCACHE_CHAOS_COALESCE_SEED:-11}" \
  --reflector-replicas 1 --watches-per-replica 0 --late-watches-per-replica 40 --require-coalescing
