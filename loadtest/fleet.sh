#!/usr/bin/env bash
# The fleet benchmark of the multi-replica issue: one kube-apiserver + etcd, then for 1, 2
# and 3 release kcache replicas (a fresh nats-server each time; one replica runs without
# NATS), `kcache-fleet-bench`: upstream watches vs client watches, same-replica vs
# cross-replica write→delivery latency, and (2+ replicas) failover: `--kills` (20) times,
# kill -9 of the owner of a continuously written key, time until a write made after the
# kill reaches a watch on a surviving replica, restart of the killed replica (same port
# and flags, by $KUBE_DIR/start-<n>-<i>.sh), settle; plus takeovers while the owner was
# alive. Results: loadtest/results/fleet-<date>-<n>.json.
#   loadtest/fleet.sh [--sizes "1 2 3"] [extra kcache-fleet-bench flags, e.g. --kills 5]
#   loadtest/fleet.sh --sizes 3            # the 3-replica run only (latency + 20 kills)
# CARGO_TARGET_DIR, if set, is where cargo builds and where the binaries are taken from.
set -euo pipefail
cd "$(dirname "$0")/.."
sizes="1 2 3"
bench_args=()
while (($#)); do
  case $1 in
    --sizes) sizes=$2; shift 2 ;;
    --sizes=*) sizes=${1#--sizes=}; shift ;;
    *) bench_args+=("$1"); shift ;;
  esac
done
release=${CARGO_TARGET_DIR:-target}/release
bin=$(scripts/ensure-deps.sh | tail -1)
cargo build --release -p kcache -p kcache-loadtest
eval "$(scripts/start-test-cluster.sh "$bin")"
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
nats_pid=
# The replicas' current pids: in $KUBE_DIR/kcache-<n>-<i>.pid (a restart writes the new one).
replica_pids() { cat "$KUBE_DIR"/kcache-*.pid 2>/dev/null || true; }
stop_replicas() {
  local p
  p=$(replica_pids)
  # shellcheck disable=SC2086
  [[ -n $p ]] && { kill $p 2>/dev/null || true; }
  for _ in $(seq 50); do
    # shellcheck disable=SC2086
    [[ -n $p ]] && kill -0 $p 2>/dev/null || break
    sleep 0.2
  done
  rm -f "$KUBE_DIR"/kcache-*.pid
}
# shellcheck disable=SC2086
trap 'stop_replicas; kill $nats_pid $KUBE_PIDS 2>/dev/null || true' EXIT
stamp=$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p loadtest/results
head -c 32 /dev/urandom | base64 >"$KUBE_DIR/nats-key"
head -c 32 /dev/urandom | base64 >"$KUBE_DIR/nats-signing-key"
echo -n fleetbench >"$KUBE_DIR/nats-token"
# Every simulated client uses the one bench token: its fair queue for cache seats is lifted
# (in a cluster each kubelet and controller waits in a queue of its own; run.sh says more).
printf '[server]\ncache_queue_per_user = 1000000\ncache_queue_total = 0\n\n[nats]\ntoken_file = "%s"\nsigning_key_file = "%s"\nencryption_active_key = "k1"\n\n[[nats.encryption_keys]]\nid = "k1"\nfile = "%s"\n' \
  "$KUBE_DIR/nats-token" "$KUBE_DIR/nats-signing-key" "$KUBE_DIR/nats-key" >"$KUBE_DIR/fleet.toml"

# Writes $KUBE_DIR/start-<n>-<i>.sh: starts that replica (in the background, its log
# appended to, its pid in kcache-<n>-<i>.pid and printed), again until it listens: a
# restarted replica can find its port still held for a moment.
write_start_script() {
  local n=$1 i=$2 port=$3
  shift 3
  local script=$KUBE_DIR/start-$n-$i.sh
  {
    echo '#!/usr/bin/env bash'
    echo "# Written by loadtest/fleet.sh: starts replica r$i of the $n-replica fleet; prints its pid."
    echo 'set -euo pipefail'
    printf 'log=%q\npidfile=%q\nport=%q\n' "$KUBE_DIR/kcache-$n-$i.log" "$KUBE_DIR/kcache-$n-$i.pid" "$port"
    printf 'cmd=(%s)\n' "$(printf '%q ' "$@")"
    cat <<'EOS'
alive() { [[ -e /proc/$1 ]] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null; }
echo "--- start at $(date -u +%FT%T.%NZ) ---" >>"$log"
for _ in $(seq 30); do
  "${cmd[@]}" </dev/null >>"$log" 2>&1 &
  new=$!
  echo "$new" >"$pidfile"
  for i in $(seq 100); do # 10 s to bind
    alive "$new" || break
    if command -v ss >/dev/null; then
      [[ $(ss -ltnpH "sport = :$port" 2>/dev/null) == *"pid=$new,"* ]] && { echo "$new"; exit 0; }
    elif ((i >= 15)); then
      echo "$new"
      exit 0
    fi
    sleep 0.1
  done
  alive "$new" && { echo "$new"; exit 0; }
  echo "--- pid $new exited at start (port $port taken?); starting again ---" >>"$log"
  sleep 1
done
echo "start script: kcache did not stay up (see $log)" >&2
exit 1
EOS
  } >"$script"
  chmod +x "$script"
}

for n in $sizes; do
  nats_pid=
  args=()
  if ((n > 1)); then
    nport=$(free_port)
    nats-server -a 127.0.0.1 -p "$nport" -js -sd "$KUBE_DIR/nats-$n" --auth fleetbench >"$KUBE_DIR/nats-$n.log" 2>&1 &
    nats_pid=$!
    args=(--config "$KUBE_DIR/fleet.toml" --nats "nats://127.0.0.1:$nport")
  fi
  replicas=()
  for ((i = 0; i < n; i++)); do
    port=$(free_port)
    write_start_script "$n" "$i" "$port" "$release/kcache" serve --kubeconfig "$KUBECONFIG" \
      --listen "127.0.0.1:$port" --admin-listen api --replica-id "r$i" "${args[@]}"
    pid=$("$KUBE_DIR/start-$n-$i.sh")
    for _ in $(seq 100); do curl -skf "https://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.2; done
    replicas+=(--replica "https://127.0.0.1:$port=$pid")
  done
  failover=()
  ((n > 1)) && failover=(--failover --restart-cmd "$KUBE_DIR/start-$n-{i}.sh")
  out=loadtest/results/fleet-$stamp-$n.json
  echo "==> $n replica(s)"
  "$release/kcache-fleet-bench" --apiserver "$KUBE_URL" --namespace "fleet$n" \
    "${replicas[@]}" "${failover[@]}" --out "$out" "${bench_args[@]}" >/dev/null
  echo "results: $out (replica logs: $KUBE_DIR/kcache-$n-*.log)"
  stop_replicas
  [[ -n $nats_pid ]] && { kill "$nats_pid" 2>/dev/null || true; wait "$nats_pid" 2>/dev/null || true; }
  sleep 2
done
