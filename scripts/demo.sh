#!/usr/bin/env bash
# shellcheck disable=SC2317  # running/stop/cleanup are called from the EXIT trap
# Runs kcache for real on this machine:
#   1. installs what is missing (apt packages; kube-apiserver, kubectl and etcd of the
#      reference Kubernetes version, built once from Go modules: scripts/k8s/build.sh),
#   2. starts a throw-away etcd + kube-apiserver (scripts/start-test-cluster.sh),
#   3. builds kcache and starts a fleet of ${KCACHE_REPLICAS:-3} replicas in front of it on
#      https://127.0.0.1:8443, :8444, :8445 … sharing one nats-server (JetStream, token
#      auth, Secrets sealed with a generated key): the API server sees one watch per key
#      for the whole fleet. KCACHE_REPLICAS=1 runs a single replica without NATS.
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
echo "==> checking prerequisites (first run builds kube-apiserver, kubectl and etcd, ~12 min)"
bin=$(scripts/ensure-deps.sh | tail -1)
# The reference version's kubectl, not whatever else the machine has.
export PATH="$bin:$PATH"

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

replicas=${KCACHE_REPLICAS:-3}
fleet_args=()
if ((replicas > 1)); then
  nats_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  echo "==> starting nats-server (JetStream) on 127.0.0.1:$nats_port"
  head -c 24 /dev/urandom | base64 | tr -d '/+=' >"$KUBE_DIR/nats-token"
  head -c 32 /dev/urandom | base64 >"$KUBE_DIR/nats-key-k1"
  # The fleet's signing key: mirrors act only on what a replica signed.
  head -c 32 /dev/urandom | base64 >"$KUBE_DIR/nats-signing-key"
  nats-server -a 127.0.0.1 -p "$nats_port" -js -sd "$KUBE_DIR/nats" \
    --auth "$(cat "$KUBE_DIR/nats-token")" >"$KUBE_DIR/nats.log" 2>&1 &
  pids+=($!)
  printf '[nats]\ntoken_file = "%s"\nsigning_key_file = "%s"\nencryption_active_key = "k1"\n\n[[nats.encryption_keys]]\nid = "k1"\nfile = "%s"\n' \
    "$KUBE_DIR/nats-token" "$KUBE_DIR/nats-signing-key" "$KUBE_DIR/nats-key-k1" >"$KUBE_DIR/kcache.toml"
  fleet_args=(--config "$KUBE_DIR/kcache.toml" --nats "nats://127.0.0.1:$nats_port")
fi

ids=(a b c d e f g h i j)
urls=()
for ((i = 0; i < replicas; i++)); do
  p=$((port + i))
  id=${ids[i]:-r$i}
  echo "==> starting kcache replica $id on https://127.0.0.1:$p"
  # Several replicas share this machine: each keeps its admin endpoints (/metrics,
  # /debug/keys) on its API port (--admin-listen api) rather than all on 127.0.0.1:8081.
  target/release/kcache serve --kubeconfig "$KUBE_DIR/kubeconfig" --listen "127.0.0.1:$p" --admin-listen api \
    --replica-id "$id" "${fleet_args[@]}" </dev/null >"$KUBE_DIR/kcache-$id.log" 2>&1 &
  kcache_pid=$!
  pids+=("$kcache_pid")
  urls+=("https://127.0.0.1:$p")
  until curl -skf "https://127.0.0.1:$p/readyz" >/dev/null; do
    if ! kill -0 "$kcache_pid" 2>/dev/null; then
      echo "demo: kcache replica $id exited:" >&2
      tail -20 "$KUBE_DIR/kcache-$id.log" >&2
      exit 1
    fi
    sleep 0.2
  done
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

last=${urls[-1]}
cat <<EOF

kcache is serving ${urls[*]} in front of the API server at $KUBE_URL.
Tokens: admintoken (cluster-admin), viewertoken (no permissions), node1token (a node).

Watch demo/ticker change every 2 s, served from kcache's cache (any replica):
  $bin/kubectl --server $last --insecure-skip-tls-verify --token admintoken get configmaps -n demo -w

More:
  $bin/kubectl --server $kcache_url --insecure-skip-tls-verify --token admintoken get secrets -n demo
  curl -sk -H 'Authorization: Bearer admintoken' $last/debug/keys   # role, owner, epoch, seq per key
  curl -sk -H 'Authorization: Bearer admintoken' $kcache_url/metrics | grep -E '^kcache_(fleet|nats|upstream)'
  logs: $KUBE_DIR/kcache-*.log   (KCACHE_KEEP_DEMO_DIR=1 keeps them after exit)

With several replicas: kill -9 one and another takes its keys over; watches on the others
stay open. Ctrl-C stops everything.
EOF
wait "$kcache_pid"
echo "demo: kcache replica $id exited; last log lines:" >&2
tail -20 "$KUBE_DIR/kcache-$id.log" >&2
exit 1
