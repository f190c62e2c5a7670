#!/usr/bin/env bash
# The test command (README, CI): formatting, lints, then every unit and integration test.
# Integration tests start their own kube-apiserver + etcd on free ports.
set -euo pipefail
cd "$(dirname "$0")/.."
KCACHE_K8S_BIN=$(scripts/ensure-deps.sh | tail -1)
export KCACHE_K8S_BIN
cargo fmt --all --check
cargo clippy --all-targets --locked -- -D warnings
# Each integration test binary starts its own API server; two at a time fit a 2-core box.
cargo test --workspace --locked -- --test-threads=2
