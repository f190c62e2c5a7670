#!/usr/bin/env bash
# Installs what kcache's demo and tests need on a fresh Debian machine, when missing:
# Debian packages (kubectl, nats-server, openssl, curl, python3, promtool) and the kube-apiserver
# v1.20.2 + etcd build. Prints the kube-apiserver bin dir on its last line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/as-root.sh
source "$here/as-root.sh"
missing=()
command -v kubectl >/dev/null || missing+=(kubernetes-client)
command -v nats-server >/dev/null || [[ -x /usr/sbin/nats-server ]] || missing+=(nats-server)
command -v openssl >/dev/null || missing+=(openssl)
command -v curl >/dev/null || missing+=(curl)
command -v python3 >/dev/null || missing+=(python3)
# The image (deploy/image/build.sh) and its test.
command -v umoci >/dev/null || missing+=(umoci)
command -v skopeo >/dev/null || missing+=(skopeo)
command -v strip >/dev/null || missing+=(binutils)
if ((${#missing[@]})); then
  as_root apt-get update -qq >/dev/null
  as_root apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# promtool, for the alert rules' tests (deploy/observability); the package's server is
# not needed.
if ! command -v promtool >/dev/null; then
  as_root apt-get update -qq >/dev/null
  as_root apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
"$here/install-kube-apiserver.sh"
