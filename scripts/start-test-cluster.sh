#!/usr/bin/env bash
# Starts a throw-away etcd + kube-apiserver (the reference version) on free loopback ports, in a fresh
# temp dir, and prints shell assignments to eval:
#   KUBE_URL  KUBE_TOKEN (admintoken)  KUBE_DIR  KUBECONFIG  KUBE_PIDS
#
#   eval "$(scripts/start-test-cluster.sh [BIN_DIR])"     # stop with: kill $KUBE_PIDS
#
# BIN_DIR holds kube-apiserver and etcd; default: what scripts/k8s/build.sh prints on its
# last line (it builds the reference version from Go modules on first use).
#
# The API server runs with --authorization-mode=Node,RBAC and these identities:
#   tokens ($KUBE_DIR/tokens.csv)
#     admintoken   -> admin, group system:masters
#     viewertoken  -> viewer (no RBAC bindings: forbidden until you bind it)
#     node1token   -> system:node:node1, group system:nodes (the Node authorizer applies)
#     with KUBE_NODE_TOKENS=N also bench-node-<n>-token -> system:node:bench-node-<n>, group
#     system:nodes, for n in 0..N-1 (load tests whose simulated kubelets each have their
#     own node identity: loadtest --node-identities)
#   client certificates (--client-ca-file $KUBE_DIR/pki/ca.crt)
#     $KUBE_DIR/pki/admin.crt + admin.key -> CN=admin, O=system:masters
# $KUBE_DIR/kubeconfig: current context uses admintoken; context "test-cert" uses the
# admin client certificate. Both skip server certificate verification.
# Logs: $KUBE_DIR/etcd.log, $KUBE_DIR/apiserver.log.
#
# $KUBE_DIR/restart-apiserver.sh kills the API server with SIGKILL and starts it again
# with the same command line (flags, port, etcd, certificates) on the same CPUs, etcd
# staying up; it prints the new pid and keeps the current one in $KUBE_DIR/apiserver.pid
# (after a restart, the API server's pid in KUBE_PIDS is stale: stop that one instead).
# For benchmarks of what clients do when the API server dies (loadtest --scenario restart).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:-$("$here/k8s/build.sh" | tail -1)}
for exe in etcd kube-apiserver; do
  [[ -x $bin/$exe ]] || { echo "start-test-cluster: no $bin/$exe" >&2; exit 1; }
done

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/kcache-k8s.XXXXXX")
etcd_port=$(free_port)
peer_port=$(free_port)
api_port=$(free_port)
pids=()
# On any failure, stop what was started; on success the servers outlive this script.
fail() {
  echo "start-test-cluster: $1 (logs in $dir)" >&2
  [[ -f $dir/${2:-} ]] && tail -30 "$dir/$2" >&2
  ((${#pids[@]})) && kill "${pids[@]}" 2>/dev/null
  exit 1
}
trap 'fail "failed at line $LINENO"' ERR

# --- etcd ---------------------------------------------------------------------------
"$bin/etcd" --data-dir "$dir/etcd" \
  --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
  --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
  --initial-cluster "default=http://127.0.0.1:$peer_port" \
  </dev/null >"$dir/etcd.log" 2>&1 &
pids+=($!)

# --- credentials --------------------------------------------------------------------
cat >"$dir/tokens.csv" <<EOF
admintoken,admin,admin-uid,"system:masters"
viewertoken,viewer,viewer-uid
node1token,system:node:node1,node1-uid,"system:nodes"
EOF
if ((${KUBE_NODE_TOKENS:-0} > 0)); then
  awk -v n="$KUBE_NODE_TOKENS" 'BEGIN { for (i = 0; i < n; i++)
    printf "bench-node-%d-token,system:node:bench-node-%d,bench-node-%d-uid,\"system:nodes\"\n", i, i, i }' \
    >>"$dir/tokens.csv"
fi
# Service-account signing key (RSA: the API server signs tokens with RS256).
openssl genrsa -out "$dir/sa.key" 2048 2>/dev/null
openssl rsa -in "$dir/sa.key" -pubout -out "$dir/sa.pub" 2>/dev/null
# Client CA and an admin client certificate (v3, clientAuth).
pki=$dir/pki
mkdir -p "$pki"
ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
openssl req -x509 "${ec[@]}" -keyout "$pki/ca.key" -out "$pki/ca.crt" -days 30 \
  -subj "/CN=kcache-test-client-ca" 2>/dev/null
openssl req "${ec[@]}" -keyout "$pki/admin.key" -out "$pki/admin.csr" \
  -subj "/O=system:masters/CN=admin" 2>/dev/null
printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n' >"$pki/client.ext"
openssl x509 -req -in "$pki/admin.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
  -days 30 -extfile "$pki/client.ext" -out "$pki/admin.crt" 2>/dev/null

ready=
for _ in $(seq 150); do
  curl -sf "http://127.0.0.1:$etcd_port/health" >/dev/null && { ready=1; break; }
  kill -0 "${pids[0]}" 2>/dev/null || break
  sleep 0.2
done
[[ $ready ]] || fail "etcd did not become healthy" etcd.log

# --- kube-apiserver -----------------------------------------------------------------
# An array, so restart-apiserver.sh below can start the very same command line again.
api_cmd=(
  "$bin/kube-apiserver"
  --etcd-servers="http://127.0.0.1:$etcd_port"
  --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$api_port"
  --cert-dir="$dir/certs"
  --token-auth-file="$dir/tokens.csv"
  --client-ca-file="$pki/ca.crt"
  --authorization-mode=Node,RBAC
  --service-account-issuer=https://kubernetes.default.svc
  --service-account-key-file="$dir/sa.pub"
  --service-account-signing-key-file="$dir/sa.key"
  --service-cluster-ip-range=10.0.0.0/24
  # Since 1.2x the endpoint reconciler refuses a loopback advertise address; the rig has no
  # other, and nothing here reaches the API server through the kubernetes Service.
  --endpoint-reconciler-type=none
)
"${api_cmd[@]}" </dev/null >"$dir/apiserver.log" 2>&1 &
pids+=($!)
echo "${pids[1]}" >"$dir/apiserver.pid"

ready=
deadline=$((SECONDS + 90))
while ((SECONDS < deadline)); do
  curl -skf -H 'Authorization: Bearer admintoken' "https://127.0.0.1:$api_port/readyz" >/dev/null && { ready=1; break; }
  kill -0 "${pids[1]}" 2>/dev/null || fail "kube-apiserver exited" apiserver.log
  sleep 0.2
done
[[ $ready ]] || fail "kube-apiserver not ready in 90 s" apiserver.log

cat >"$dir/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: "https://127.0.0.1:$api_port", insecure-skip-tls-verify: true}
users:
- name: admin
  user: {token: admintoken}
- name: admin-cert
  user: {client-certificate: "$pki/admin.crt", client-key: "$pki/admin.key"}
contexts:
- name: test
  context: {cluster: test, user: admin}
- name: test-cert
  context: {cluster: test, user: admin-cert}
current-context: test
EOF

# --- restart script (see the header) ---------------------------------------------------
{
  echo '#!/usr/bin/env bash'
  echo '# Written by scripts/start-test-cluster.sh: kill -9 this kube-apiserver and start it again'
  echo '# with the same command line on the same CPUs (etcd stays up); prints the new pid, which'
  echo '# apiserver.pid holds from then on. Does not wait for readiness.'
  echo 'set -euo pipefail'
  printf 'dir=%q\n' "$dir"
  printf 'port=%q\n' "$api_port"
  printf 'cmd=(%s)\n' "$(printf '%q ' "${api_cmd[@]}")"
  cat <<'EOF'
old=$(<"$dir/apiserver.pid")
# The restarted server gets the CPUs the old one had (a benchmark pins it with taskset).
cpus=$(taskset -pc "$old" 2>/dev/null | sed 's/.*: //' || true)
kill -9 "$old" 2>/dev/null || true
# Running: neither gone nor a zombie (whose port is free too).
alive() { [[ -e /proc/$1 ]] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null; }
for _ in $(seq 200); do # at most 10 s
  alive "$old" || break
  sleep 0.05
done
pin=()
[[ -n $cpus ]] && command -v taskset >/dev/null && pin=(taskset -c "$cpus")
echo "--- restart-apiserver.sh: pid $old killed (-9) at $(date -u +%FT%T.%NZ); starting again ---" >>"$dir/apiserver.log"
# The new server can find its port taken and exit at once ("bind: address already in
# use"): by a killed connection whose client has not closed its end yet (the server's
# end then waits in FIN-WAIT-2, which SO_REUSEADDR does not pass), or, the port being in
# the ephemeral range, by a client's outgoing connection. Neither lasts: start again
# until it listens (the sockets on the port go to apiserver.log), at most 60 times.
for _ in $(seq 60); do
  "${pin[@]}" "${cmd[@]}" </dev/null >>"$dir/apiserver.log" 2>&1 &
  new=$!
  echo "$new" >"$dir/apiserver.pid"
  for i in $(seq 50); do # 5 s to bind
    alive "$new" || break
    if command -v ss >/dev/null; then
      [[ $(ss -ltnpH "sport = :$port" 2>/dev/null) == *"pid=$new,"* ]] && { echo "$new"; exit 0; }
    elif ((i >= 15)); then # no ss: up 1.5 s, so past its bind
      echo "$new"
      exit 0
    fi
    sleep 0.1
  done
  alive "$new" && { echo "$new"; exit 0; } # no listener after 5 s, but running: its business
  {
    echo "--- restart-apiserver.sh: pid $new exited at start (port $port taken?); sockets on it: ---"
    ss -tanp "( sport = :$port )" 2>/dev/null || true
    echo "--- starting again ---"
  } >>"$dir/apiserver.log"
  echo "restart-apiserver.sh: pid $new exited at start (port $port taken?); starting again" >&2
  sleep 1
done
echo "restart-apiserver.sh: kube-apiserver did not stay up (see $dir/apiserver.log)" >&2
exit 1
EOF
} >"$dir/restart-apiserver.sh"
chmod +x "$dir/restart-apiserver.sh"
trap - ERR
echo "KUBE_URL=https://127.0.0.1:$api_port KUBE_TOKEN=admintoken KUBE_DIR=$dir KUBECONFIG=$dir/kubeconfig KUBE_PIDS='${pids[1]} ${pids[0]}'"
