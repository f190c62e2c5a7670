#!/usr/bin/env bash
# Runs kcache for real on this machine: a kube-apiserver v1.20.2 + etcd, kcache in front
# of it on https://127.0.0.1:${KCACHE_PORT:-8443}, and a writer that updates a ConfigMap
# every 2 s so a watch through kcache shows events. Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
port=${KCACHE_PORT:-8443}
bin=$(scripts/ensure-deps.sh | tail -1)
command -v cargo >/dev/null || { echo "cargo (Rust) is required" >&2; exit 1; }
cargo build --release -p kcache
eval "$(scripts/start-test-cluster.sh "$bin")"
pids=()
cleanup() {
  kill "${pids[@]}" 2>/dev/null || true
  # shellcheck disable=SC2086
  kill $KUBE_PIDS 2>/dev/null || true
  wait 2>/dev/null || true
  echo "stopped (logs were in $KUBE_DIR)"
}
trap cleanup EXIT INT TERM
target/release/kcache serve --kubeconfig "$KUBECONFIG" --listen "127.0.0.1:$port" \
  >"$KUBE_DIR/kcache.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do curl -skf "https://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.2; done
k() { KUBECONFIG=/dev/null kubectl --server "https://127.0.0.1:$port" --insecure-skip-tls-verify --token admintoken "$@"; }
k create namespace demo >/dev/null
k -n demo create secret generic hello --from-literal=greeting=hi >/dev/null
k -n demo create configmap ticker --from-literal=tick=0 >/dev/null
(
  i=0
  while sleep 2; do
    i=$((i + 1))
    k -n demo patch configmap ticker --type merge -p "{\"data\":{\"tick\":\"$i\"}}" >/dev/null || true
  done
) &
pids+=($!)
cat <<MSG

kcache is serving https://127.0.0.1:$port in front of $KUBE_URL
(self-signed certificate; tokens: admintoken, viewertoken, node1token).

Watch a ConfigMap change every 2 s, served from kcache's cache:
  kubectl --server https://127.0.0.1:$port --insecure-skip-tls-verify --token admintoken -n demo get configmaps -w
Inspect it:
  curl -sk https://127.0.0.1:$port/debug/keys
  curl -sk https://127.0.0.1:$port/metrics | grep ^kcache_
Logs: $KUBE_DIR/kcache.log    Ctrl-C to stop.
MSG
wait "${pids[0]}"
