#!/usr/bin/env bash
# The test command (README, CI): formatting, lints, then every unit and integration test.
# Fails at the first step that fails.
#
# Integration tests (services/tests/) start their own etcd + kube-apiserver v1.20.2 on free
# loopback ports; KCACHE_K8S_BIN tells them where the binaries are. Set
# KCACHE_KEEP_TEST_DIRS=1 to keep each test cluster's directory (logs) after the run.
set -euo pipefail
cd "$(dirname "$0")/.."
# Missing apt packages (kubectl, openssl, curl, ...) and the kube-apiserver build; the last
# line is the bin dir (scripts/install-kube-apiserver.sh).
KCACHE_K8S_BIN=$(scripts/ensure-deps.sh | tail -1)
export KCACHE_K8S_BIN
[[ -x $KCACHE_K8S_BIN/kube-apiserver && -x $KCACHE_K8S_BIN/etcd ]] || {
  echo "test.sh: no kube-apiserver/etcd in '$KCACHE_K8S_BIN'" >&2
  exit 1
}
# Kubernetes' own api-machinery e2e specs, built once from the same source tree
# (services/tests/conformance.rs runs them directly and through kcache).
KCACHE_E2E_TEST=$(scripts/install-e2e-specs.sh | tail -1)
export KCACHE_E2E_TEST
set -x
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# Each integration test starts its own API server; two at a time suit a 2-core machine.
cargo test --workspace --locked -- --test-threads=2
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
