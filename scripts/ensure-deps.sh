#!/usr/bin/env bash
# Installs what kcache's demo and tests need on a fresh Debian machine, when missing:
# Debian packages (kubectl, nats-server, openssl, curl, python3, promtool) and the kube-apiserver
# v1.20.2 + etcd build. Prints the kube-apiserver bin dir on its last line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
missing=()
command -v kubectl >/dev/null || missing+=(kubernetes-client)
command -v nats-server >/dev/null || [[ -x /usr/sbin/nats-server ]] || missing+=(nats-server)
command -v openssl >/dev/null || missing+=(openssl)
command -v curl >/dev/null || missing+=(curl)
command -v python3 >/dev/null || missing+=(python3)
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# promtool, for the alert rules' tests (deploy/observability); the package's server is
# not needed.
if ! command -v promtool >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
"$here/install-kube-apiserver.sh"
