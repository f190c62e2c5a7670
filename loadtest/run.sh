#!/usr/bin/env bash
# The 1,000-watch benchmark of the single-replica issue: starts a fresh kube-apiserver +
# etcd and a release kcache, runs `kcache-bench` against both (same client, same run),
# and writes loadtest/results/bench-<date>.json. Pins the API server and etcd to core 0,
# kcache to core 1, and the generator to core 1 as well when only two cores exist (said
# in the output).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(scripts/ensure-deps.sh | tail -1)
cargo build --release -p kcache -p kcache-loadtest
eval "$(scripts/start-test-cluster.sh "$bin")"
port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
target/release/kcache serve --kubeconfig "$KUBECONFIG" --listen "127.0.0.1:$port" >"$KUBE_DIR/kcache.log" 2>&1 &
kpid=$!
# shellcheck disable=SC2086
trap 'kill $kpid $KUBE_PIDS 2>/dev/null || true' EXIT
for _ in $(seq 100); do curl -skf "https://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.2; done
apid=${KUBE_PIDS%% *}
epid=${KUBE_PIDS##* }
cores=$(nproc)
if [[ -z ${KCACHE_BENCH_NO_PIN:-} ]] && command -v taskset >/dev/null && ((cores >= 2)); then
  taskset -pc 0 "$apid" >/dev/null; taskset -pc 0 "$epid" >/dev/null; taskset -pc 1 "$kpid" >/dev/null
  echo "pinned: kube-apiserver+etcd on core 0, kcache on core 1, generator on core $((cores - 1))"
  pin=(taskset -c $((cores - 1)))
else
  pin=()
fi
mkdir -p loadtest/results
out=loadtest/results/bench-$(date -u +%Y%m%dT%H%M%SZ).json
"${pin[@]}" target/release/kcache-bench --apiserver "$KUBE_URL" --apiserver-pid "$apid" \
  --kcache "https://127.0.0.1:$port" --kcache-pid "$kpid" --out "$out" "$@"
echo "results: $out"
