#!/usr/bin/env bash
# The kubelet's own Secret/ConfigMap managers of the reference version (v1.37.2), first
# reads and update propagation, straight from the kube-apiserver and through a fresh
# kcache, alternating, in one run on one fresh cluster. What it measures: how long
# kcache's freshness proof for consistent streaming lists (every reflector's first sync
# is a streaming list with the resourceVersion omitted; kcache serves it from its cache
# only once a probe proves the key as new as the API server) holds back the kubelet's
# first reads, beside the same kubelet talking to the API server.
#
#   loadtest/kubelet-managers.sh [RUNS]        # default 3 runs each way
#
# Setup (as services/tests/kubelet.rs): namespaces kl0..kl3, a `default` ServiceAccount
# in each, 25 pods per namespace bound to node1, each with 5 Secret and 5 ConfigMap
# volumes of its own (p{p}-s{j}, p{p}-c{j}; data v) = 100 pods, 1,000 objects, created by
# server-side apply (kubectl).
#
# Each run, alternating:
#   direct  kcache-kubelet --server <kube-apiserver> --token node1token
#   kcache  a fresh kcache process (started, /readyz), kcache-kubelet through it with
#           node1token; kcache's consistent-read and freshness-probe metrics saved after
#           it; kcache stopped.
# kcache-kubelet (conformance/kubelet-manager/main.go) runs the kubelet's watch-based
# managers (pkg/kubelet/secret, pkg/kubelet/configmap, unchanged) for the node's pods and
# prints `synced pods=N objects=M` once every pod's objects were all read once; right
# then this script sets every object's data.v to a new value (server-side apply, 16 at a
# time over one HTTP/2 connection, as the test does), the value the kubelet was told to
# --await-value; the kubelet prints one JSON line when every pod's manager sees it.
# firstRead* is the time from the managers' start until each pod's objects were all
# readable; awaitedMs is from `synced` (so it includes issuing the 1,000 writes) until the
# last object reached the new value.
#
# Pinning (taskset, as loadtest/run.sh): kube-apiserver + etcd on core 0, kcache and
# kcache-kubelet on core 1 (with 2 cores the kubelet shares kcache's core; in the direct
# runs it has core 1 to itself). KCACHE_BENCH_NO_PIN=1 pins nothing.
#
# Results: loadtest/results/kubelet-managers-<UTC date>/ (run<i>-direct.json,
# run<i>-kcache.json, run<i>-kcache-metrics.txt (consistent reads, freshness probes, 410
# Expired watches, coalescing moves; -full.txt: all of kcache's /metrics), the API server's
# priority-and-fairness counters before and after each run (run<i>-<mode>-apf-*.txt), the
# kubelet's stderr per run, meta.txt, summary.md).
# Environment: K8S_BIN (default /opt/k8s-testenv/v1.37.2/bin), KCACHE_BENCH_NO_BUILD=1
# (use $CARGO_TARGET_DIR/release/kcache as it is; CARGO_TARGET_DIR defaults to target;
# the run in docs/benchmarks.md used a clean build of one commit there), KCACHE_BENCH_REV (what that binary was built from, for meta.txt;
# default: this tree's HEAD, and whether actors/ or services/ have uncommitted changes),
# KCACHE_BENCH_RESULTS (default loadtest/results), KCACHE_BENCH_KEEP_LOGS=1 (keep the
# cluster's directory: apiserver.log, each kcache's log).
set -euo pipefail
cd "$(dirname "$0")/.."

runs=${1:-3}
bin=${K8S_BIN:-/opt/k8s-testenv/v1.37.2/bin}
release=${CARGO_TARGET_DIR:-target}/release
for exe in kube-apiserver etcd kubectl kcache-kubelet; do
  [[ -x $bin/$exe ]] || { echo "kubelet-managers: no $bin/$exe" >&2; exit 1; }
done
if [[ -z ${KCACHE_BENCH_NO_BUILD:-} ]]; then
  # A benchmark measures the code in this tree: no stale binary if the build fails.
  nice cargo build --release -p kcache
fi
[[ -x $release/kcache ]] || { echo "kubelet-managers: no $release/kcache" >&2; exit 1; }

NAMESPACES=4
PODS=25 # per namespace
SECRETS=5
CONFIGMAPS=5
objects=$((NAMESPACES * PODS * (SECRETS + CONFIGMAPS)))

stamp=$(date -u +%Y%m%dT%H%M%SZ)
out=${KCACHE_BENCH_RESULTS:-loadtest/results}/kubelet-managers-$stamp
mkdir -p "$out"

eval "$(scripts/start-test-cluster.sh "$bin")"
apid=${KUBE_PIDS%% *}
epid=${KUBE_PIDS##* }
kpid=
stop_kcache() {
  [[ -n $kpid ]] || return 0
  kill "$kpid" 2>/dev/null || true
  for _ in $(seq 100); do
    kill -0 "$kpid" 2>/dev/null || break
    sleep 0.1
  done
  kill -9 "$kpid" 2>/dev/null || true
  wait "$kpid" 2>/dev/null || true
  kpid=
}
cleanup() {
  local status=$?
  # The kubelet of a failed run, if still running.
  [[ -n ${klpid:-} ]] && { kill "$klpid" 2>/dev/null || true; }
  stop_kcache
  # shellcheck disable=SC2086
  kill $KUBE_PIDS 2>/dev/null || true
  for _ in $(seq 60); do
    # shellcheck disable=SC2086
    kill -0 $KUBE_PIDS 2>/dev/null || break
    sleep 0.5
  done
  for p in $KUBE_PIDS; do
    kill -0 "$p" 2>/dev/null && { kill -9 "$p" 2>/dev/null || true; }
  done
  if ((status == 0)) && [[ -z ${KCACHE_BENCH_KEEP_LOGS:-} ]]; then
    rm -rf "$KUBE_DIR"
  elif ((status == 0)); then
    echo "kubelet-managers: logs (apiserver.log, kcache-*.log) kept in $KUBE_DIR" >&2
  else
    echo "kubelet-managers: failed; logs (apiserver.log, etcd.log, kcache-*.log) kept in $KUBE_DIR" >&2
  fi
}
trap cleanup EXIT

pin_servers=()
pin_client=()
pinning="not pinned"
if [[ -z ${KCACHE_BENCH_NO_PIN:-} ]] && command -v taskset >/dev/null && (($(nproc) >= 2)); then
  taskset -a -pc 0 "$apid" >/dev/null
  taskset -a -pc 0 "$epid" >/dev/null
  pin_servers=(taskset -c 1)
  pin_client=(taskset -c 1)
  pinning="kube-apiserver+etcd on core 0, kcache on core 1, kcache-kubelet on core 1 (with kcache in the kcache runs)"
fi
echo "pinned: $pinning"

{
  echo "command: loadtest/kubelet-managers.sh $runs"
  echo "date: $stamp"
  echo "kcache: $release/kcache, built from ${KCACHE_BENCH_REV:-$(git rev-parse HEAD)$(git diff --quiet HEAD -- actors services 2>/dev/null || echo ' + uncommitted changes')}"
  echo "kube-apiserver: $("$bin/kube-apiserver" --version)"
  echo "kcache-kubelet: $bin/kcache-kubelet (conformance/kubelet-manager, v1.37.2)"
  echo "machine: $(nproc) cores ($(lscpu | sed -n 's/^Model name: *//p')), $(free -g | awk '/^Mem:/ {print $2}') GiB; load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "pinning: $pinning"
  echo "objects: $NAMESPACES namespaces x $PODS pods x ($SECRETS Secrets + $CONFIGMAPS ConfigMaps) = $objects"
} >"$out/meta.txt"
cat "$out/meta.txt"

# --- objects ------------------------------------------------------------------------
secret_b64() { printf %s "$1" | base64; }
manifests=$KUBE_DIR/objects.yaml
{
  for ((n = 0; n < NAMESPACES; n++)); do
    printf -- '---\napiVersion: v1\nkind: Namespace\nmetadata: {name: kl%d}\n' "$n"
    # No controller-manager here: pods need the namespace's default ServiceAccount.
    printf -- '---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {name: default, namespace: kl%d}\n' "$n"
  done
  for ((n = 0; n < NAMESPACES; n++)); do
    for ((p = 0; p < PODS; p++)); do
      for ((j = 0; j < SECRETS; j++)); do
        printf -- '---\napiVersion: v1\nkind: Secret\nmetadata: {name: p%d-s%d, namespace: kl%d}\ndata: {v: %s}\n' "$p" "$j" "$n" "$(secret_b64 1)"
      done
      for ((j = 0; j < CONFIGMAPS; j++)); do
        printf -- '---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: p%d-c%d, namespace: kl%d}\ndata: {v: "1"}\n' "$p" "$j" "$n"
      done
      printf -- '---\napiVersion: v1\nkind: Pod\nmetadata: {name: p%d, namespace: kl%d}\nspec:\n  nodeName: node1\n  automountServiceAccountToken: false\n  containers: [{name: c, image: busybox}]\n  volumes:\n' "$p" "$n"
      for ((j = 0; j < SECRETS; j++)); do
        printf '  - {name: s%d, secret: {secretName: p%d-s%d}}\n' "$j" "$p" "$j"
      done
      for ((j = 0; j < CONFIGMAPS; j++)); do
        printf '  - {name: c%d, configMap: {name: p%d-c%d}}\n' "$j" "$p" "$j"
      done
    done
  done
} >"$manifests"
t0=$SECONDS
"$bin/kubectl" --kubeconfig "$KUBECONFIG" apply --server-side --field-manager=bench -f "$manifests" >/dev/null
echo "created $NAMESPACES namespaces, $((NAMESPACES * PODS)) pods, $objects objects in $((SECONDS - t0)) s"

# Every Secret and ConfigMap to data.v=$1: server-side apply, 16 at a time (curl
# --parallel, HTTP/2 to the API server). Fails unless every write succeeded.
put_all() {
  local v=$1 cfg=$KUBE_DIR/put-$1.curl codes
  local b64
  b64=$(secret_b64 "$v")
  {
    for ((n = 0; n < NAMESPACES; n++)); do
      for ((p = 0; p < PODS; p++)); do
        for ((j = 0; j < SECRETS; j++)); do
          printf 'next\n'
          printf 'url = "%s/api/v1/namespaces/kl%d/secrets/p%d-s%d?fieldManager=bench&force=true"\n' "$KUBE_URL" "$n" "$p" "$j"
          printf 'data = "{\\"apiVersion\\":\\"v1\\",\\"kind\\":\\"Secret\\",\\"metadata\\":{\\"name\\":\\"p%d-s%d\\"},\\"data\\":{\\"v\\":\\"%s\\"}}"\n' "$p" "$j" "$b64"
          printf 'request = PATCH\nheader = "Authorization: Bearer admintoken"\nheader = "Content-Type: application/apply-patch+yaml"\ninsecure\nsilent\noutput = /dev/null\nwrite-out = "%%{http_code}\\n"\n'
        done
        for ((j = 0; j < CONFIGMAPS; j++)); do
          printf 'next\n'
          printf 'url = "%s/api/v1/namespaces/kl%d/configmaps/p%d-c%d?fieldManager=bench&force=true"\n' "$KUBE_URL" "$n" "$p" "$j"
          printf 'data = "{\\"apiVersion\\":\\"v1\\",\\"kind\\":\\"ConfigMap\\",\\"metadata\\":{\\"name\\":\\"p%d-c%d\\"},\\"data\\":{\\"v\\":\\"%s\\"}}"\n' "$p" "$j" "$v"
          printf 'request = PATCH\nheader = "Authorization: Bearer admintoken"\nheader = "Content-Type: application/apply-patch+yaml"\ninsecure\nsilent\noutput = /dev/null\nwrite-out = "%%{http_code}\\n"\n'
        done
      done
    done
  } | tail -n +2 >"$cfg" # no `next` before the first
  codes=$(curl --no-progress-meter --parallel --parallel-max 16 -K "$cfg")
  local ok
  ok=$(grep -c '^200$' <<<"$codes" || true)
  ((ok == objects)) || { echo "put_all $v: $ok of $objects writes returned 200: $(sort <<<"$codes" | uniq -c | tr '\n' ' ')" >&2; return 1; }
}

# The API server's priority-and-fairness counters (cumulative): requests dispatched and
# rejected (429), by flow schema and priority level.
apf_metrics() {
  curl -skf -H 'Authorization: Bearer admintoken' "$KUBE_URL/metrics" |
    grep -E '^apiserver_flowcontrol_(rejected|dispatched)_requests_total' || true
}

# One kcache-kubelet run against $2; every object goes to value $3 once it has synced.
# Writes $out/run<i>-<mode>.json and .stderr; prints how long the updates took.
kubelet_run() {
  local mode=$1 server=$2 v=$3 i=$4 line t_upd
  local fifo=$KUBE_DIR/kubelet-$mode-$i.fifo
  mkfifo "$fifo"
  apf_metrics >"$out/run$i-$mode-apf-before.txt"
  "${pin_client[@]}" "$bin/kcache-kubelet" --server "$server" --token node1token --node node1 \
    --await-value "$v" --timeout 300s >"$fifo" 2>"$out/run$i-$mode.stderr" &
  klpid=$!
  exec 3<"$fifo"
  if ! read -r -t 300 line <&3; then
    echo "run $i $mode: no synced line (stderr: $out/run$i-$mode.stderr)" >&2
    tail -5 "$out/run$i-$mode.stderr" >&2
    return 1
  fi
  [[ $line == "synced pods=$((NAMESPACES * PODS)) objects=$objects" ]] || { echo "run $i $mode: unexpected '$line'" >&2; return 1; }
  t_upd=$(date +%s.%N)
  put_all "$v"
  t_upd=$(python3 -c "import sys,time; print(round((time.time() - float(sys.argv[1])) * 1000))" "$t_upd")
  if ! read -r -t 300 line <&3; then
    echo "run $i $mode: no summary (stderr: $out/run$i-$mode.stderr)" >&2
    tail -5 "$out/run$i-$mode.stderr" >&2
    return 1
  fi
  exec 3<&-
  apf_metrics >"$out/run$i-$mode-apf-after.txt"
  wait "$klpid" || { echo "run $i $mode: kcache-kubelet exited $?" >&2; return 1; }
  klpid=
  rm -f "$fifo"
  # The kubelet's line plus this script's own measure of issuing the updates.
  jq -c --arg mode "$mode" --argjson run "$i" --argjson value "$v" --argjson updatesMs "$t_upd" \
    '. + {mode: $mode, run: $run, value: $value, updatesIssuedMs: $updatesMs}' <<<"$line" >"$out/run$i-$mode.json"
  cat "$out/run$i-$mode.json"
}

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }


value=1
for ((i = 1; i <= runs; i++)); do
  value=$((value + 1))
  echo "--- run $i: direct (await v=$value)"
  kubelet_run direct "$KUBE_URL" "$value" "$i"

  value=$((value + 1))
  port=$(free_port)
  "${pin_servers[@]}" "$release/kcache" serve --kubeconfig "$KUBECONFIG" --listen "127.0.0.1:$port" --admin-listen api \
    >"$KUBE_DIR/kcache-$i.log" 2>&1 &
  kpid=$!
  ready=
  for _ in $(seq 150); do
    curl -skf "https://127.0.0.1:$port/readyz" >/dev/null && { ready=1; break; }
    kill -0 "$kpid" 2>/dev/null || break
    sleep 0.2
  done
  [[ $ready ]] || { echo "kcache not ready" >&2; tail -20 "$KUBE_DIR/kcache-$i.log" >&2; exit 1; }
  echo "--- run $i: through kcache (await v=$value)"
  kubelet_run kcache "https://127.0.0.1:$port" "$value" "$i"
  curl -skf -H 'Authorization: Bearer admintoken' "https://127.0.0.1:$port/metrics" >"$out/run$i-kcache-metrics-full.txt"
  grep -E '^kcache_(consistent_reads_total|freshness_probes_total|watch_expired_total|coalesce_moved_watchers_total|covered_requests_total)' \
    "$out/run$i-kcache-metrics-full.txt" >"$out/run$i-kcache-metrics.txt"
  cat "$out/run$i-kcache-metrics.txt"
  stop_kcache
done

# --- summary ------------------------------------------------------------------------
python3 - "$out" "$runs" <<'PY' | tee "$out/summary.md"
import json, re, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
def metric(i, name, label):
    total = 0.0
    for line in open(f"{out}/run{i}-kcache-metrics.txt"):
        m = re.match(rf'{name}\{{(.*)\}} (\S+)', line)
        if m and label in m.group(1):
            total += float(m.group(2))
    return int(total)
def apf(i, mode, kind):
    """Requests the API server dispatched or rejected (429) during the run, by priority level."""
    def read(when):
        d = {}
        for line in open(f"{out}/run{i}-{mode}-apf-{when}.txt"):
            m = re.match(rf'apiserver_flowcontrol_{kind}_requests_total\{{(.*)\}} (\S+)', line)
            if m:
                pl = re.search(r'priority_level="([^"]*)"', m.group(1)).group(1)
                d[pl] = d.get(pl, 0) + float(m.group(2))
        return d
    before, after = read("before"), read("after")
    delta = {k: int(v - before.get(k, 0)) for k, v in after.items() if v - before.get(k, 0) > 0}
    return ", ".join(f"{k} {v}" for k, v in sorted(delta.items())) or "0"
rows = []
for i in range(1, runs + 1):
    for mode in ("direct", "kcache"):
        r = json.load(open(f"{out}/run{i}-{mode}.json"))
        if mode == "kcache":
            r["reads"] = "%d / %d / %d" % tuple(metric(i, "kcache_consistent_reads_total", f'outcome="{o}"') for o in ("fresh", "waited", "forwarded"))
            r["probes"] = "%d / %d" % tuple(metric(i, "kcache_freshness_probes_total", f'result="{o}"') for o in ("ok", "error"))
        else:
            r["reads"] = r["probes"] = "—"
        r["rejected"] = apf(i, mode, "rejected")
        r["dispatched"] = apf(i, mode, "dispatched")
        r["expired"] = metric(i, "kcache_watch_expired_total", "") if mode == "kcache" else "—"
        rows.append(r)
print("| run | target | first read p50 / p99 / max (ms) | awaitedMs (updates issued in) | readRetries | streaming lists / lists / watches / errors | consistent reads fresh / waited / forwarded | probes ok / error | 410 Expired (kcache) | API server 429s | API server requests (priority level; exempt includes the 1,000 updates) |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['run']} | {r['mode']} | {r['firstReadP50ms']:.0f} / {r['firstReadP99ms']:.0f} / {r['firstReadMaxms']:.0f} | {r['awaitedMs']:.0f} ({r['updatesIssuedMs']}) | {r['readRetries']} | {r['streamingLists']} / {r['lists']} / {r['watches']} / {r['errors']} | {r['reads']} | {r['probes']} | {r['expired']} | {r['rejected']} | {r['dispatched']} |")
print()
for mode in ("direct", "kcache"):
    rs = [r for r in rows if r["mode"] == mode]
    med = lambda k: statistics.median(r[k] for r in rs)
    print(f"median of {len(rs)} {mode}: first read p50 {med('firstReadP50ms'):.0f} ms, p99 {med('firstReadP99ms'):.0f} ms, max {med('firstReadMaxms'):.0f} ms, awaitedMs {med('awaitedMs'):.0f}, readRetries {med('readRetries'):.0f}")
PY
echo "results: $out"
