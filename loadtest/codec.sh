#!/usr/bin/env bash
# The protobuf design's measurement (loadtest/src/bin/kcache-codec-bench.rs): per-event
# costs and sizes of JSON-first vs protobuf-first on the objects of a fresh
# kube-apiserver v1.20.2 (started here, stopped at the end).
#
#   loadtest/codec.sh [--objects N] [--passes N]
#
# Writes loadtest/results/codec-<date>.json (KCACHE_BENCH_RESULTS overrides the folder).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(scripts/ensure-deps.sh | tail -1)
release=${CARGO_TARGET_DIR:-target}/release
cargo build --release -p kcache-loadtest --bin kcache-codec-bench
eval "$(scripts/start-test-cluster.sh "$bin")"
# shellcheck disable=SC2064
trap "kill $KUBE_PIDS 2>/dev/null; rm -rf '$KUBE_DIR'" EXIT
results=${KCACHE_BENCH_RESULTS:-loadtest/results}
mkdir -p "$results"
"$release/kcache-codec-bench" --apiserver "$KUBE_URL" --token "$KUBE_TOKEN" \
  --out "$results/codec-$(date -u +%Y%m%dT%H%M%SZ).json" "$@"
