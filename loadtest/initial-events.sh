#!/usr/bin/env bash
# Initial events at scale: a namespace of N ConfigMaps (default 20,000 of ~2.2 KB JSON)
# streamed to one watch, read slowly and read at once, through kcache and straight from
# the API server, in one run on fresh processes. Samples each server's RSS every 100 ms
# while the watch streams; prints one JSON line per case and a summary table.
#
#   loadtest/initial-events.sh [N] [SLOW_BYTES_PER_SEC]
#
# Cases:
#   kcache  sendInitialEvents=true (streaming list, bookmark at the end), slow reader
#   kcache  watch=1 without resourceVersion (initial ADDED events), slow reader
#   kcache  watch=1 without resourceVersion, reader as fast as it can
#   apiserver sendInitialEvents=true, slow reader (the reference's own streaming list)
#   apiserver watch=1 without resourceVersion, slow reader
# A case ends when the reader has every ConfigMap (and, for the streaming list, the
# initial-events-end bookmark). "peak" is the largest RSS seen during the case, "base" the
# RSS just before it (kcache's key already synced by a list first, so the growth is the
# watch's own, not the cache's).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-20000}
slow=${2:-4000000}
cargo build --release -p kcache >/dev/null
eval "$(scripts/start-test-cluster.sh)"
kpid=
cleanup() {
  [[ $kpid ]] && kill "$kpid" 2>/dev/null
  # shellcheck disable=SC2086
  kill $KUBE_PIDS 2>/dev/null || true
}
trap cleanup EXIT
apid=${KUBE_PIDS%% *}  # "apiserver etcd"

port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
target/release/kcache serve --kubeconfig "$KUBECONFIG" --listen "127.0.0.1:$port" --admin-listen api \
  >"$KUBE_DIR/kcache.log" 2>&1 &
kpid=$!
for _ in $(seq 150); do
  curl -skf "https://127.0.0.1:$port/readyz" >/dev/null && break
  sleep 0.2
done
curl -skf "https://127.0.0.1:$port/readyz" >/dev/null || { tail -20 "$KUBE_DIR/kcache.log" >&2; exit 1; }

python3 - "$KUBE_URL" "https://127.0.0.1:$port" "$KUBE_TOKEN" "$n" "$slow" "$kpid" "$apid" <<'PY'
import http.client, json, ssl, sys, threading, time, urllib.parse
from concurrent.futures import ThreadPoolExecutor

api, kc, token, n, slow, kpid, apid = sys.argv[1:8]
n, slow = int(n), int(slow)
ctx = ssl._create_unverified_context()

def conn(base):
    u = urllib.parse.urlparse(base)
    return http.client.HTTPSConnection(u.hostname, u.port, context=ctx, timeout=600)

def request(base, method, path, body=None):
    c = conn(base)
    c.request(method, path, body=json.dumps(body) if body is not None else None,
              headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data

def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0

request(api, "POST", "/api/v1/namespaces", {"metadata": {"name": "big"}})
pad = "x" * 2000
def create(i):
    local = conn(api)
    for j in range(i, n, 16):
        body = {"metadata": {"name": f"cm{j}", "labels": {"app": "big"}}, "data": {"v": pad}}
        local.request("POST", "/api/v1/namespaces/big/configmaps", body=json.dumps(body),
                      headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
        r = local.getresponse(); r.read()
        if r.status not in (201, 409):
            raise SystemExit(f"create cm{j}: {r.status}")
t0 = time.time()
with ThreadPoolExecutor(16) as ex:
    list(ex.map(create, range(16)))
print(f"created {n} ConfigMaps in {time.time() - t0:.0f} s", file=sys.stderr)
# Sync kcache's key for the namespace first (a cached list), so a case measures the watch.
st, body = request(kc, "GET", "/api/v1/namespaces/big/configmaps?resourceVersion=0")
assert st == 200, st
listed = len(json.loads(body)["items"])
assert listed == n, listed
del body

def case(name, base, pid, query, rate, want_bookmark):
    c = conn(base)
    c.request("GET", "/api/v1/namespaces/big/configmaps?" + query,
              headers={"Authorization": "Bearer " + token})
    r = c.getresponse()
    assert r.status == 200, (name, r.status, r.read()[:300])
    base_rss, peak = rss(pid), 0
    stop = threading.Event()
    def sample():
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, rss(pid))
            time.sleep(0.1)
    th = threading.Thread(target=sample); th.start()
    seen, got_bookmark, nbytes, buf = 0, False, 0, b""
    t0 = time.time()
    while seen < n or (want_bookmark and not got_bookmark):
        chunk = r.read1(65536)
        if not chunk:
            break
        nbytes += len(chunk)
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if not line.strip():
                continue
            ev = json.loads(line)
            if ev["type"] == "ADDED":
                seen += 1
            elif ev["type"] == "BOOKMARK":
                ann = ev["object"]["metadata"].get("annotations") or {}
                got_bookmark |= ann.get("k8s.io/initial-events-end") == "true"
            elif ev["type"] == "ERROR":
                raise SystemExit(f"{name}: {ev}")
        if rate:
            # Read at `rate` bytes/s on average: a slow client.
            ahead = nbytes / rate - (time.time() - t0)
            if ahead > 0:
                time.sleep(ahead)
    secs = time.time() - t0
    stop.set(); th.join()
    c.close()
    out = {"case": name, "objects": seen, "bookmark": got_bookmark, "bytes": nbytes,
           "seconds": round(secs, 1), "base_rss_mb": round(base_rss / 2**20, 1),
           "peak_rss_mb": round(peak / 2**20, 1),
           "growth_mb": round((peak - base_rss) / 2**20, 1)}
    print(json.dumps(out))
    assert seen == n, out
    return out

stream = "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=600"
plain = "watch=1&timeoutSeconds=600"
rows = [
    case("kcache streaming list, slow reader", kc, kpid, stream, slow, True),
    case("kcache watch=1, slow reader", kc, kpid, plain, slow, False),
    case("kcache watch=1, fast reader", kc, kpid, plain, 0, False),
    case("apiserver streaming list, slow reader", api, apid, stream, slow, True),
    case("apiserver watch=1, slow reader", api, apid, plain, slow, False),
]
print(f"\n{n} ConfigMaps, slow reader at {slow / 1e6:.1f} MB/s")
print("| case | bytes | seconds | RSS before | peak RSS | growth |")
print("|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['case']} | {r['bytes'] / 2**20:.1f} MiB | {r['seconds']} | {r['base_rss_mb']} MiB | {r['peak_rss_mb']} MiB | {r['growth_mb']} MiB |")
PY
