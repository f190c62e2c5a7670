#!/usr/bin/env bash
# One kcache-bench scenario on fresh processes: starts a new kube-apiserver of the reference version + etcd
# (scripts/start-test-cluster.sh) and a release kcache, pins them, runs
# `kcache-bench --scenario ...` against both (same client, same run), writes
# <results>/<scenario>-<date>.json plus <scenario>-<date>-latency-cdf.png and -rss.png,
# and stops everything it started.
#
#   loadtest/run.sh [--scenario kubelet|informer|slow|flood|scale|objects|kubeproxy|restart|coalesce|relist] [other kcache-bench flags]
#   loadtest/run.sh --scenario kubelet --nodes 10 --watches-per-node 49   # a small run
#   loadtest/run.sh --scenario relist    # controllers' consistent paged relists + a Table list, direct and through kcache
#
# The standard benchmark (scenarios 1-3) and scenario 4: loadtest/standard.sh. The
# coalescing benchmark (three runs of --scenario coalesce, one per target): loadtest/coalesce.sh.
# `target/release/kcache-bench --help` lists every flag and its default.
#
# Pinning (taskset, all threads): kube-apiserver + etcd on core 0, kcache on core 1, the
# generator on cores 2.. when there are 3 or more; with 2 cores the generator shares core
# 1 with kcache (a handicap for kcache, not for the API server). What was pinned is
# printed and recorded in the JSON. KCACHE_BENCH_NO_PIN=1 pins nothing.
#
# Environment: KCACHE_BENCH_RESULTS (default loadtest/results), KCACHE_BENCH_NO_BUILD=1
# (use the binaries in target/release as they are), KCACHE_BENCH_NOFILE (open-file limit
# to ask for, default 200000), KCACHE_BENCH_LOG_DIR (copy kcache*.log, apiserver.log and nats.log
# there at the end, whatever the outcome), KCACHE_BENCH_SERVER_TOML and
# KCACHE_BENCH_CACHE_TOML (an experiment's extra [server] and [cache] lines of kcache's
# configuration, recorded with the rest). CARGO_TARGET_DIR, if set, is where cargo
# builds and where the binaries are taken from (default: target). KCACHE_BENCH_FLEET=N
# (relist and coalesce): kcache is a fleet of N replicas over a nats-server of its own,
# all on kcache's core; relist sends each page to the next replica in turn, coalesce each
# node's connection to replica node % N, as behind a Service.
set -euo pipefail
cd "$(dirname "$0")/.."

scenario=kubelet
own_out=
# Off unless --kcache-coalesce-min-names says otherwise (kcache's own default is 8): the
# scenarios measure name keys as docs/benchmarks.md records them; `coalesce` sets it.
coalesce_min_names=0
node_identities=
nodes=100
prev=
for a in "$@"; do
  [[ $prev == --scenario ]] && scenario=$a
  [[ $a == --scenario=* ]] && scenario=${a#--scenario=}
  [[ $prev == --kcache-coalesce-min-names ]] && coalesce_min_names=$a
  [[ $a == --kcache-coalesce-min-names=* ]] && coalesce_min_names=${a#--kcache-coalesce-min-names=}
  [[ $a == --out || $a == --out=* ]] && own_out=1
  # Each simulated node its own identity: the API server must know their tokens.
  [[ $a == --node-identities ]] && node_identities=1
  [[ $prev == --nodes ]] && nodes=$a
  [[ $a == --nodes=* ]] && nodes=${a#--nodes=}
  prev=$a
done

# Every watch is a stream and, with --http1, a socket: raise the open-file limit for the
# servers started below and the generator.
want=${KCACHE_BENCH_NOFILE:-200000}
ulimit -Hn "$want" 2>/dev/null || true
ulimit -n "$want" 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
echo "open-file limit: $(ulimit -n)"

bin=$(scripts/ensure-deps.sh | tail -1)
release=${CARGO_TARGET_DIR:-target}/release
if [[ -z ${KCACHE_BENCH_NO_BUILD:-} ]]; then
  # A benchmark measures the code in this tree: no stale binary if the build fails.
  cargo build --release -p kcache-loadtest -p kcache
fi

[[ $node_identities ]] && export KUBE_NODE_TOKENS=$nodes
eval "$(scripts/start-test-cluster.sh "$bin")"
kpid=
# KCACHE_BENCH_FLEET: the replicas after the first, and their nats-server.
more_pids=
nats_pid=
cleanup() {
  local status=$?
  # The restart scenario kills the API server and starts another (restart-apiserver.sh,
  # written by start-test-cluster.sh): stop the one running now, not the first one.
  if [[ -s $KUBE_DIR/apiserver.pid ]]; then
    KUBE_PIDS="$(<"$KUBE_DIR/apiserver.pid") ${KUBE_PIDS##* }"
  fi
  # A KCACHE_BENCH_WRAP wrapper's child is kcache itself.
  [[ -n $kpid ]] && { pkill -TERM -P "$kpid" 2>/dev/null || true; }
  # shellcheck disable=SC2086
  kill $kpid $more_pids $nats_pid $KUBE_PIDS 2>/dev/null || true
  # The API server takes ~10 s to shut down; the next run must not share core 0 with it.
  for _ in $(seq 60); do
    # shellcheck disable=SC2086
    kill -0 $kpid $more_pids $nats_pid $KUBE_PIDS 2>/dev/null || break
    sleep 0.5
  done
  for p in $kpid $more_pids $nats_pid $KUBE_PIDS; do
    kill -0 "$p" 2>/dev/null && { kill -9 "$p" 2>/dev/null || true; }
  done
  wait 2>/dev/null || true
  if [[ -n ${KCACHE_BENCH_LOG_DIR:-} ]]; then
    mkdir -p "$KCACHE_BENCH_LOG_DIR"
    # A fleet's other replicas (kcache-r<i>.log) and its nats-server too.
    cp "$KUBE_DIR"/kcache*.log "$KUBE_DIR"/apiserver.log "$KUBE_DIR"/nats.log "$KCACHE_BENCH_LOG_DIR"/ 2>/dev/null || true
  fi
  if ((status == 0)) && [[ -z ${KCACHE_BENCH_KEEP_LOGS:-} ]]; then
    rm -rf "$KUBE_DIR"
  elif ((status != 0)); then
    echo "run.sh: failed; logs (apiserver.log, etcd.log, kcache.log) kept in $KUBE_DIR" >&2
  fi
}
trap cleanup EXIT
apid=${KUBE_PIDS%% *}
epid=${KUBE_PIDS##* }

kcache_args=()
bench_args=()
if [[ $scenario == restart ]]; then
  # Kills -9 and restarts the API server (same flags, port, etcd, CPUs); prints the new pid.
  bench_args=(--apiserver-restart-cmd "$KUBE_DIR/restart-apiserver.sh")
fi
# Coalescing as --kcache-coalesce-min-names says (0, off, unless given; kcache-bench
# records it) in every scenario: kcache's own default (8) would fold the kubelet
# scenario's name keys into namespace keys mid-run, which the scenarios other than
# `coalesce` do not measure. Before 2026-11-25 only `coalesce` wrote it, so the other
# scenarios ran with kcache's default.
# Every simulated client uses the one bench token, so kcache sees one user where a cluster
# has thousands (each kubelet, each controller): its fair queue for cache seats, 1,000 per
# user, would refuse the simultaneous starts of thousands of clients that in a cluster
# each wait in a queue of their own. Lifted in every scenario.
caps='[server]\ncache_queue_per_user = 1000000\ncache_queue_total = 0\n'
# An experiment's extra [server] lines (e.g. 'cache_seats = 2'), recorded with the rest.
[[ -n ${KCACHE_BENCH_SERVER_TOML:-} ]] && caps+="${KCACHE_BENCH_SERVER_TOML}\n"
if [[ $scenario == scale || $scenario == coalesce ]]; then
  # 50,000+ watches of one user (the bench token) exceed kcache's default per-user caps
  # (watches, and keys: 10,000 per user, which 200,000 watches over 20,000 Secrets pass).
  caps+='max_watches = 0\nmax_watches_per_user = 0\n'
fi
# An experiment's extra [cache] lines (e.g. 'upstream_streaming_lists = false').
cache_extra=${KCACHE_BENCH_CACHE_TOML:-}
printf "${caps}[cache]\ncoalesce_min_names = %d\n%s\n%b" "$coalesce_min_names" \
  "$([[ $scenario == scale || $scenario == coalesce ]] && echo 'max_keys_per_user = 0')" \
  "$cache_extra" >"$KUBE_DIR/kcache-bench.toml"
kcache_args=(--config "$KUBE_DIR/kcache-bench.toml")
fleet=${KCACHE_BENCH_FLEET:-1}
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
if ((fleet > 1)); then
  [[ $scenario == relist || $scenario == coalesce ]] ||
    { echo "run.sh: KCACHE_BENCH_FLEET is for --scenario relist or coalesce" >&2; exit 2; }
  # As loadtest/fleet.sh: one nats-server, messages signed and sealed.
  nport=$(free_port)
  nats-server -a 127.0.0.1 -p "$nport" -js -sd "$KUBE_DIR/nats" --auth fleetbench >"$KUBE_DIR/nats.log" 2>&1 &
  nats_pid=$!
  head -c 32 /dev/urandom | base64 >"$KUBE_DIR/nats-key"
  head -c 32 /dev/urandom | base64 >"$KUBE_DIR/nats-signing-key"
  echo -n fleetbench >"$KUBE_DIR/nats-token"
  printf '\n[nats]\ntoken_file = "%s"\nsigning_key_file = "%s"\nencryption_active_key = "k1"\n\n[[nats.encryption_keys]]\nid = "k1"\nfile = "%s"\n' \
    "$KUBE_DIR/nats-token" "$KUBE_DIR/nats-signing-key" "$KUBE_DIR/nats-key" >>"$KUBE_DIR/kcache-bench.toml"
  kcache_args+=(--nats "nats://127.0.0.1:$nport")
  echo "kcache: a fleet of $fleet replicas over nats://127.0.0.1:$nport"
fi
echo "kcache: cache.coalesce_min_names = $coalesce_min_names, $(tr '\n' ' ' <"$KUBE_DIR/kcache-bench.toml") ($KUBE_DIR/kcache-bench.toml)"

cores=$(nproc)
pin_kcache=()
pin_gen=()
pinning="not pinned"
if [[ -z ${KCACHE_BENCH_NO_PIN:-} ]] && command -v taskset >/dev/null && ((cores >= 2)); then
  taskset -a -pc 0 "$apid" >/dev/null
  taskset -a -pc 0 "$epid" >/dev/null
  pin_kcache=(taskset -c 1)
  if ((cores >= 3)); then
    pin_gen=(taskset -c "2-$((cores - 1))")
    pinning="kube-apiserver+etcd on core 0, kcache on core 1, generator on cores 2-$((cores - 1))"
  else
    pin_gen=(taskset -c 1)
    pinning="kube-apiserver+etcd on core 0, kcache on core 1, generator on core 1 too (2 cores: it shares kcache's core)"
  fi
fi
if [[ -n ${KCACHE_BENCH_GEN_CPUS:-} && -n $pinning && ${#pin_kcache[@]} -gt 0 ]]; then
  # An experiment's override: the generator's cores (e.g. 0, beside the API server).
  pin_gen=(taskset -c "$KCACHE_BENCH_GEN_CPUS")
  pinning="kube-apiserver+etcd on core 0, kcache on core 1, generator on core(s) $KCACHE_BENCH_GEN_CPUS (KCACHE_BENCH_GEN_CPUS)"
fi
echo "pinned: $pinning"

port=$(free_port)
# KCACHE_BENCH_WRAP runs kcache under a profiler, e.g. "heaptrack -o /tmp/kcache-heap";
# RSS and CPU figures are then the wrapper's and mean nothing. KCACHE_BENCH_BIN: another
# kcache build (e.g. one with debug line tables for the profiler).
read -r -a wrap <<<"${KCACHE_BENCH_WRAP:-}"
replica_args=()
((fleet > 1)) && replica_args=(--replica-id r0)
"${pin_kcache[@]}" "${wrap[@]}" "${KCACHE_BENCH_BIN:-$release/kcache}" serve --kubeconfig "$KUBECONFIG" --listen "127.0.0.1:$port" --admin-listen api \
  "${kcache_args[@]}" "${replica_args[@]}" >"$KUBE_DIR/kcache.log" 2>&1 &
kpid=$!
# Waits for the kcache at $1 (pid $2, log $3) to be ready.
await_ready() {
  local ready=
  for _ in $(seq 150); do
    curl -skf "https://127.0.0.1:$1/readyz" >/dev/null && { ready=1; break; }
    kill -0 "$2" 2>/dev/null || break
    sleep 0.2
  done
  [[ $ready ]] || { echo "run.sh: kcache not ready" >&2; tail -20 "$3" >&2; exit 1; }
}
await_ready "$port" "$kpid" "$KUBE_DIR/kcache.log"
for ((i = 1; i < fleet; i++)); do
  rport=$(free_port)
  "${pin_kcache[@]}" "$release/kcache" serve --kubeconfig "$KUBECONFIG" --listen "127.0.0.1:$rport" --admin-listen api \
    "${kcache_args[@]}" --replica-id "r$i" >"$KUBE_DIR/kcache-r$i.log" 2>&1 &
  rpid=$!
  more_pids+=" $rpid"
  await_ready "$rport" "$rpid" "$KUBE_DIR/kcache-r$i.log"
  bench_args+=(--kcache-replica "https://127.0.0.1:$rport=$rpid")
done

results=${KCACHE_BENCH_RESULTS:-loadtest/results}
mkdir -p "$results"
out=()
[[ $own_out ]] || out=(--out "$results/$scenario-$(date -u +%Y%m%dT%H%M%SZ).json")
"${pin_gen[@]}" "$release/kcache-bench" --apiserver "$KUBE_URL" --apiserver-pid "$apid" \
  --kcache "https://127.0.0.1:$port" --kcache-pid "$kpid" --etcd-pid "$epid" --pinning "$pinning" "${out[@]}" \
  "${bench_args[@]}" "$@"
