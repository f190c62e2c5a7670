#!/usr/bin/env bash
# Starts a throw-away etcd + kube-apiserver v1.20.2 on free loopback ports and prints
# shell assignments to eval:
#   KUBE_URL  KUBE_DIR  KUBECONFIG (admin token, insecure TLS)  KUBE_PIDS
# Tokens (in $KUBE_DIR/tokens.csv):
#   admintoken  -> admin, system:masters
#   viewertoken -> viewer (no RBAC bindings)
#   node1token  -> system:node:node1, system:nodes (the Node authorizer applies)
#
# Usage:  eval "$(scripts/start-test-cluster.sh [BIN_DIR])";  stop with: kill $KUBE_PIDS
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:-$("$here/install-kube-apiserver.sh" | tail -1)}
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
dir=$(mktemp -d /tmp/kcache-k8s.XXXXXX)
etcd_port=$(free_port); peer_port=$(free_port); api_port=$(free_port)
"$bin/etcd" --data-dir "$dir/etcd" --listen-client-urls "http://127.0.0.1:$etcd_port" \
  --advertise-client-urls "http://127.0.0.1:$etcd_port" --listen-peer-urls "http://127.0.0.1:$peer_port" \
  >"$dir/etcd.log" 2>&1 &
etcd_pid=$!
openssl genrsa -out "$dir/sa.key" 2048 2>/dev/null
openssl rsa -in "$dir/sa.key" -pubout -out "$dir/sa.pub" 2>/dev/null
cat >"$dir/tokens.csv" <<T
admintoken,admin,admin-uid,"system:masters"
viewertoken,viewer,viewer-uid
node1token,system:node:node1,node1-uid,"system:nodes"
T
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$etcd_port/health" >/dev/null && break; sleep 0.2; done
"$bin/kube-apiserver" --etcd-servers="http://127.0.0.1:$etcd_port" --bind-address=127.0.0.1 \
  --secure-port="$api_port" --cert-dir="$dir/certs" --token-auth-file="$dir/tokens.csv" \
  --service-account-issuer=https://kubernetes.default.svc --service-account-key-file="$dir/sa.pub" \
  --service-account-signing-key-file="$dir/sa.key" --authorization-mode=Node,RBAC \
  --service-cluster-ip-range=10.0.0.0/24 --advertise-address=127.0.0.1 \
  >"$dir/apiserver.log" 2>&1 &
api_pid=$!
for _ in $(seq 300); do
  curl -skf -H 'Authorization: Bearer admintoken' "https://127.0.0.1:$api_port/readyz" >/dev/null && break
  kill -0 $api_pid 2>/dev/null || { tail -20 "$dir/apiserver.log" >&2; exit 1; }
  sleep 0.2
done
cat >"$dir/kubeconfig" <<K
apiVersion: v1
kind: Config
clusters: [{name: test, cluster: {server: "https://127.0.0.1:$api_port", insecure-skip-tls-verify: true}}]
users: [{name: admin, user: {token: admintoken}}]
contexts: [{name: test, context: {cluster: test, user: admin}}]
current-context: test
K
echo "KUBE_URL=https://127.0.0.1:$api_port KUBE_DIR=$dir KUBECONFIG=$dir/kubeconfig KUBE_PIDS='$api_pid $etcd_pid'"
