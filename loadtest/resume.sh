#!/usr/bin/env bash
# The resume benchmark of issue 30.2: one kube-apiserver + etcd, a nats-server with
# JetStream, one release kcache replica retaining events ([nats] retain) and declaring a
# namespace's ConfigMaps ([[publish]]), then `kcache-resume-bench`: a NATS subscriber
# follows the key, goes away for --away seconds (30) while the ConfigMap is written
# --writes-per-sec (20), comes back from its position, and every write is checked seen
# exactly once; the API server's own watch from the same resourceVersion is the
# reference. Results: loadtest/results/resume-<date>.json.
#   loadtest/resume.sh [extra kcache-resume-bench flags, e.g. --away 60]
# CARGO_TARGET_DIR, if set, is where cargo builds and where the binaries are taken from.
set -euo pipefail
cd "$(dirname "$0")/.."
release=${CARGO_TARGET_DIR:-target}/release
bin=$(scripts/ensure-deps.sh | tail -1)
cargo build --release -p kcache -p kcache-loadtest
eval "$(scripts/start-test-cluster.sh "$bin")"
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
nats_pid= kcache_pid=
# shellcheck disable=SC2086
trap 'kill $kcache_pid $nats_pid $KUBE_PIDS 2>/dev/null || true' EXIT
ns=resume-bench
head -c 32 /dev/urandom | base64 >"$KUBE_DIR/nats-key"
head -c 32 /dev/urandom | base64 >"$KUBE_DIR/nats-signing-key"
echo -n resumebench >"$KUBE_DIR/nats-token"
nport=$(free_port)
nats-server -a 127.0.0.1 -p "$nport" -js -sd "$KUBE_DIR/nats-resume" --auth resumebench >"$KUBE_DIR/nats-resume.log" 2>&1 &
nats_pid=$!
cat >"$KUBE_DIR/resume.toml" <<TOML
[nats]
token_file = "$KUBE_DIR/nats-token"
signing_key_file = "$KUBE_DIR/nats-signing-key"
encryption_active_key = "k1"
retain = true

[[nats.encryption_keys]]
id = "k1"
file = "$KUBE_DIR/nats-key"

[[publish]]
version = "v1"
resource = "configmaps"
namespace = "$ns"
TOML
port=$(free_port)
"$release/kcache" serve --kubeconfig "$KUBECONFIG" --listen "127.0.0.1:$port" --admin-listen api \
  --replica-id r0 --config "$KUBE_DIR/resume.toml" --nats "nats://127.0.0.1:$nport" >"$KUBE_DIR/kcache-resume.log" 2>&1 &
kcache_pid=$!
for _ in $(seq 100); do curl -skf "https://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.2; done
stamp=$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p loadtest/results
out=loadtest/results/resume-$stamp.json
"$release/kcache-resume-bench" --apiserver "$KUBE_URL" --namespace "$ns" \
  --nats "nats://127.0.0.1:$nport" --nats-token-file "$KUBE_DIR/nats-token" --out "$out" "$@"
echo "results: $out (kcache log: $KUBE_DIR/kcache-resume.log)"
