#!/usr/bin/env bash
# The chaos soak: a kcache fleet under random faults, every client's event stream judged
# against the true history (loadtest/README.md, "Chaos soak").
#
#   loadtest/chaos.sh [--duration SECS] [--seed N] [other kcache-chaos flags]
#
# Starts a throw-away kube-apiserver v1.20.2 + etcd (scripts/start-test-cluster.sh),
# writes the configuration and run scripts of a 3-node NATS cluster with JetStream and of
# 3 release kcache replicas (token auth, a sealing key, lease_replicas = 3), and runs
# `kcache-chaos`, which starts them, injects seeded faults for --duration seconds
# (default 600) while clients on every replica watch and a writer writes, then judges.
# Result: loadtest/results/chaos-<date>.json (KCACHE_CHAOS_RESULTS: another directory).
# Exit status: kcache-chaos's (0 clean, 1 the judge found loss/duplicates/..., 2 the soak
# could not judge). Logs are kept (and their directory printed) when it fails, or always
# with KCACHE_CHAOS_KEEP_LOGS=1.
#
# Installs nothing beyond scripts/ensure-deps.sh; builds kcache and kcache-chaos in
# release (KCACHE_CHAOS_PROFILE=debug: the debug build, which CI's test build has mostly
# compiled already; KCACHE_CHAOS_NO_BUILD=1: use the binaries as they are;
# CARGO_TARGET_DIR is where they are built and taken from). `--duration 60` takes about
# 2.5 minutes once built.
set -euo pipefail
cd "$(dirname "$0")/.."

duration=600
seed=
args=()
while (($#)); do
  case $1 in
    --duration) duration=$2; shift 2 ;;
    --duration=*) duration=${1#*=}; shift ;;
    --seed) seed=$2; shift 2 ;;
    --seed=*) seed=${1#*=}; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
# A seed of the clock's when none is given; printed, so the run can be replayed.
[[ -n $seed ]] || seed=$(date +%s)

bin=$(scripts/ensure-deps.sh | tail -1)
target=${CARGO_TARGET_DIR:-target}
[[ $target == /* ]] || target=$PWD/$target
profile=${KCACHE_CHAOS_PROFILE:-release}
case $profile in
  release) release=$target/release; build=(--release -p kcache -p kcache-loadtest) ;;
  # The whole workspace with its tests, as `cargo test --workspace` selects it: the same
  # features, so the dependencies it compiled are reused, not built a second time (that
  # second copy once filled CI's disk).
  debug) release=$target/debug; build=(--workspace --tests) ;;
  *) echo "chaos.sh: KCACHE_CHAOS_PROFILE must be release or debug" >&2; exit 2 ;;
esac
if [[ -z ${KCACHE_CHAOS_NO_BUILD:-} ]]; then
  cargo build "${build[@]}" --locked --bin kcache --bin kcache-chaos
fi
nats_server=$(command -v nats-server || echo /usr/sbin/nats-server)

eval "$(scripts/start-test-cluster.sh "$bin")"
dir=$KUBE_DIR
cleanup() {
  local status=$?
  # kcache-chaos stops what it started; these are left only if it died. SIGCONT first:
  # a stopped process does not act on SIGTERM.
  for f in "$dir"/r*.pid "$dir"/n*.pid; do
    [[ -s $f ]] || continue
    p=$(<"$f")
    kill -CONT "$p" 2>/dev/null || true
    kill -9 "$p" 2>/dev/null || true
  done
  # The API server may have been restarted (restart-apiserver.sh): stop the current one.
  local pids="$(<"$dir/apiserver.pid") ${KUBE_PIDS##* }"
  # shellcheck disable=SC2086
  kill $pids 2>/dev/null || true
  for _ in $(seq 20); do
    # shellcheck disable=SC2086
    kill -0 $pids 2>/dev/null || break
    sleep 0.5
  done
  # shellcheck disable=SC2086
  kill -9 $pids 2>/dev/null || true
  if ((status == 0)) && [[ -z ${KCACHE_CHAOS_KEEP_LOGS:-} ]]; then
    rm -rf "$dir"
  else
    echo "chaos.sh: logs (apiserver.log, etcd.log, r*.log, n*.log) kept in $dir" >&2
  fi
}
trap cleanup EXIT

free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
etcd_url=$(grep -o 'etcd-servers=http://127\.0\.0\.1:[0-9]*' "$dir/restart-apiserver.sh" | head -1 | cut -d= -f2)
[[ -n $etcd_url ]] || { echo "chaos.sh: no etcd URL in $dir/restart-apiserver.sh" >&2; exit 2; }

# --- NATS: three nodes with JetStream, one cluster, on loopback ------------------------
token=chaos-nats-token
printf '%s' "$token" >"$dir/nats-token"
nodes=(n0 n1 n2)
declare -A client_port cluster_port
for n in "${nodes[@]}"; do
  client_port[$n]=$(free_port)
  cluster_port[$n]=$(free_port)
done
routes=$(for n in "${nodes[@]}"; do printf 'nats-route://127.0.0.1:%s, ' "${cluster_port[$n]}"; done)
nats_urls=$(for n in "${nodes[@]}"; do printf 'nats://127.0.0.1:%s,' "${client_port[$n]}"; done)
nats_urls=${nats_urls%,}
nats_args=()
for n in "${nodes[@]}"; do
  mkdir -p "$dir/$n"
  cat >"$dir/$n.conf" <<EOF
server_name: $n
listen: 127.0.0.1:${client_port[$n]}
authorization { token: "$token" }
jetstream { store_dir: "$dir/$n" }
cluster {
  name: kcache-chaos
  listen: 127.0.0.1:${cluster_port[$n]}
  routes: [${routes%, }]
}
EOF
  # Run by kcache-chaos, again after each kill -9: same ports, same store.
  cat >"$dir/$n.run" <<EOF
#!/usr/bin/env bash
echo "--- \$(date -u +%FT%T.%NZ) start ---" >>"$dir/$n.log"
exec "$nats_server" -c "$dir/$n.conf" >>"$dir/$n.log" 2>&1
EOF
  nats_args+=(--nats "$n=${client_port[$n]}")
done

# --- kcache: three release replicas -----------------------------------------------------
head -c 32 /dev/urandom | base64 >"$dir/nats-key"
head -c 32 /dev/urandom | base64 >"$dir/nats-signing-key"
cat >"$dir/kcache.toml" <<EOF
[nats]
token_file = "$dir/nats-token"
# Mirrors act only on messages a replica signed.
signing_key_file = "$dir/nats-signing-key"
encryption_active_key = "k1"
# The lease stream has a copy on every node: a NATS node's death loses no lease.
lease_replicas = 3

[[nats.encryption_keys]]
id = "k1"
file = "$dir/nats-key"
EOF
# More settings of the `[cache]` table for every replica (TOML lines), e.g.
# KCACHE_CHAOS_CACHE='coalesce_min_names = 8' for adaptive coalescing's thresholds.
if [[ -n ${KCACHE_CHAOS_CACHE:-} ]]; then
  printf '\n[cache]\n%s\n' "$KCACHE_CHAOS_CACHE" >>"$dir/kcache.toml"
fi
# Which NATS URLs each replica gets. `list` (default): all three, comma-separated, as the
# fleet overlay sets KCACHE_NATS_URL. `one`: replica rN gets node nN's URL alone and learns
# the other nodes from the cluster (NATS servers advertise their peers to clients).
url_mode=${KCACHE_CHAOS_NATS_URLS:-list}
replica_args=()
i=0
for r in r0 r1 r2; do
  port=$(free_port)
  urls=$nats_urls
  [[ $url_mode == list ]] || urls=nats://127.0.0.1:${client_port[${nodes[i]}]}
  i=$((i + 1))
  cat >"$dir/$r.run" <<EOF
#!/usr/bin/env bash
echo "--- \$(date -u +%FT%T.%NZ) start ---" >>"$dir/$r.log"
export KCACHE_LOG=\${KCACHE_LOG:-info}
exec "$release/kcache" serve --kubeconfig "$KUBECONFIG" --listen 127.0.0.1:$port --admin-listen api \\
  --config "$dir/kcache.toml" --nats "$urls" --replica-id $r >>"$dir/$r.log" 2>&1
EOF
  replica_args+=(--replica "$r=https://127.0.0.1:$port")
done

results=${KCACHE_CHAOS_RESULTS:-loadtest/results}
mkdir -p "$results"
out=$results/chaos-$(date -u +%Y%m%dT%H%M%SZ).json
echo "chaos.sh: seed $seed, $duration s; API server $KUBE_URL, etcd $etcd_url, NATS $nats_urls (replicas get: $url_mode); logs in $dir"
status=0
"$release/kcache-chaos" --apiserver "$KUBE_URL" --etcd "$etcd_url" \
  --restart-apiserver "$dir/restart-apiserver.sh" --dir "$dir" \
  "${replica_args[@]}" "${nats_args[@]}" \
  --duration "$duration" --seed "$seed" --out "$out" "${args[@]}" || status=$?
exit "$status"
