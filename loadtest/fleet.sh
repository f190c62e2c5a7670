#!/usr/bin/env bash
# The fleet benchmark of the multi-replica issue: one kube-apiserver + etcd, then for 1, 2
# and 3 release kcache replicas (a fresh nats-server each time; one replica runs without
# NATS), `kcache-fleet-bench`: upstream watches vs client watches, same-replica vs
# cross-replica write→delivery latency, and (2+ replicas) failover time after kill -9 of
# a key's owner. Results: loadtest/results/fleet-<date>-<n>.json.
#   loadtest/fleet.sh [extra kcache-fleet-bench flags, e.g. --per-replica 10]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(scripts/ensure-deps.sh | tail -1)
cargo build --release -p kcache -p kcache-loadtest
eval "$(scripts/start-test-cluster.sh "$bin")"
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
pids=()
# shellcheck disable=SC2086
trap 'kill ${pids[*]:-} $KUBE_PIDS 2>/dev/null || true' EXIT
stamp=$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p loadtest/results
head -c 32 /dev/urandom | base64 >"$KUBE_DIR/nats-key"
echo -n fleetbench >"$KUBE_DIR/nats-token"
printf '[nats]\ntoken_file = "%s"\nencryption_active_key = "k1"\n\n[[nats.encryption_keys]]\nid = "k1"\nfile = "%s"\n' \
  "$KUBE_DIR/nats-token" "$KUBE_DIR/nats-key" >"$KUBE_DIR/fleet.toml"
for n in 1 2 3; do
  pids=()
  args=()
  if ((n > 1)); then
    nport=$(free_port)
    nats-server -a 127.0.0.1 -p "$nport" -js -sd "$KUBE_DIR/nats-$n" --auth fleetbench >"$KUBE_DIR/nats-$n.log" 2>&1 &
    pids+=($!)
    args=(--config "$KUBE_DIR/fleet.toml" --nats "nats://127.0.0.1:$nport")
  fi
  replicas=()
  for ((i = 0; i < n; i++)); do
    port=$(free_port)
    target/release/kcache serve --kubeconfig "$KUBECONFIG" --listen "127.0.0.1:$port" \
      --replica-id "r$i" "${args[@]}" >"$KUBE_DIR/kcache-$n-$i.log" 2>&1 &
    pid=$!
    pids+=("$pid")
    for _ in $(seq 100); do curl -skf "https://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.2; done
    replicas+=(--replica "https://127.0.0.1:$port=$pid")
  done
  failover=()
  ((n > 1)) && failover=(--failover)
  out=loadtest/results/fleet-$stamp-$n.json
  echo "==> $n replica(s)"
  target/release/kcache-fleet-bench --apiserver "$KUBE_URL" --namespace "fleet$n" \
    "${replicas[@]}" "${failover[@]}" --out "$out" "$@" >/dev/null
  echo "results: $out"
  kill "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
  sleep 2
done
