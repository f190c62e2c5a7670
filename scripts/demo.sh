#!/usr/bin/env bash
# shellcheck disable=SC2317  # running/stop/cleanup are called from the EXIT trap
# Runs kcache for real on this machine:
#   1. installs what is missing (apt packages; kube-apiserver v1.20.2 + etcd, built once),
#   2. starts a throw-away etcd + kube-apiserver (scripts/start-test-cluster.sh),
#   3. builds and starts kcache in front of it on https://127.0.0.1:${KCACHE_PORT:-8443},
#   4. creates namespace `demo` with a Secret, and a writer that updates ConfigMap
#      demo/ticker every 2 s through kcache,
# then prints how to watch it. Ctrl-C stops and removes everything.
#
# kcache serves HTTPS (self-signed certificate) because kubectl sends no bearer token
# over plain HTTP.
set -euo pipefail
cd "$(dirname "$0")/.."
port=${KCACHE_PORT:-8443}
kcache_url=https://127.0.0.1:$port

command -v cargo >/dev/null || { echo "demo: cargo (a Rust toolchain) is required" >&2; exit 1; }
echo "==> checking prerequisites (first run builds kube-apiserver, ~4 min)"
bin=$(scripts/ensure-deps.sh | tail -1)

echo "==> building kcache"
cargo build --release -p kcache

echo "==> starting etcd + kube-apiserver"
cluster=$(scripts/start-test-cluster.sh "$bin") # KUBE_URL= KUBE_DIR= KUBE_PIDS= ...
eval "$cluster"

pids=()
# Whether $1 is a live process (a child that exited but is not yet reaped does not count).
running() { [[ -e /proc/$1 ]] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null; }
# SIGTERM to each pid given, then SIGKILL to whatever still runs 5 s later.
stop() {
  kill "$@" 2>/dev/null
  for _ in $(seq 25); do
    local alive=
    for pid in "$@"; do running "$pid" && alive=1; done
    [[ $alive ]] || return 0
    sleep 0.2
  done
  kill -9 "$@" 2>/dev/null
}
cleanup() {
  set +e
  trap - EXIT INT TERM
  echo
  echo "==> stopping"
  # shellcheck disable=SC2086  # KUBE_PIDS is a list
  stop "${pids[@]}" $KUBE_PIDS
  wait 2>/dev/null
  if [[ -n ${KCACHE_KEEP_DEMO_DIR:-} ]]; then
    echo "logs kept in $KUBE_DIR"
  else
    rm -rf "$KUBE_DIR"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "==> starting kcache on $kcache_url"
target/release/kcache serve --kubeconfig "$KUBE_DIR/kubeconfig" --listen "127.0.0.1:$port" \
  </dev/null >"$KUBE_DIR/kcache.log" 2>&1 &
kcache_pid=$!
pids+=("$kcache_pid")
until curl -skf "$kcache_url/readyz" >/dev/null; do
  if ! kill -0 "$kcache_pid" 2>/dev/null; then
    echo "demo: kcache exited:" >&2
    tail -20 "$KUBE_DIR/kcache.log" >&2
    exit 1
  fi
  sleep 0.2
done

# kubectl through kcache as the cluster admin, ignoring any kubeconfig on this machine.
kc() {
  KUBECONFIG=/dev/null kubectl --server "$kcache_url" --insecure-skip-tls-verify --token admintoken "$@"
}
kc create namespace demo >/dev/null
kc -n demo create secret generic hello --from-literal=greeting=hi >/dev/null
kc -n demo create configmap ticker --from-literal=tick=0 >/dev/null

# The writer: one ConfigMap update every 2 s, through kcache (writes are proxied upstream).
(
  tick=0
  while sleep 2; do
    tick=$((tick + 1))
    kc -n demo patch configmap ticker --type merge \
      -p "{\"data\":{\"tick\":\"$tick\",\"at\":\"$(date +%T)\"}}" >/dev/null || true
  done
) &
pids+=($!)

cat <<EOF

kcache is serving $kcache_url in front of the API server at $KUBE_URL.
Tokens: admintoken (cluster-admin), viewertoken (no permissions), node1token (a node).

Watch demo/ticker change every 2 s, served from kcache's cache:
  kubectl --server $kcache_url --insecure-skip-tls-verify --token admintoken get configmaps -n demo -w

More:
  kubectl --server $kcache_url --insecure-skip-tls-verify --token admintoken get secrets -n demo
  curl -sk -H 'Authorization: Bearer admintoken' $kcache_url/debug/keys
  curl -sk -H 'Authorization: Bearer admintoken' $kcache_url/metrics | grep '^kcache_'
  kcache log: $KUBE_DIR/kcache.log   (KCACHE_KEEP_DEMO_DIR=1 keeps it after exit)

Ctrl-C to stop.
EOF
wait "$kcache_pid"
echo "demo: kcache exited; last log lines:" >&2
tail -20 "$KUBE_DIR/kcache.log" >&2
exit 1
