#!/usr/bin/env bash
# Installs what kcache's demo and tests need on a fresh machine, when missing: Debian
# packages (nats-server, openssl, curl, python3, promtool, umoci, skopeo) and the reference
# Kubernetes version's kube-apiserver, kubectl and etcd, built from Go modules
# (scripts/k8s/build.sh). Prints that bin dir on its last line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/as-root.sh
source "$here/as-root.sh"
missing=()
command -v nats-server >/dev/null || [[ -x /usr/sbin/nats-server ]] || missing+=(nats-server)
command -v openssl >/dev/null || missing+=(openssl)
command -v curl >/dev/null || missing+=(curl)
command -v python3 >/dev/null || missing+=(python3)
# The image (deploy/image/build.sh) and its test.
command -v umoci >/dev/null || missing+=(umoci)
command -v skopeo >/dev/null || missing+=(skopeo)
command -v strip >/dev/null || missing+=(binutils)
# The restart benchmark pins processes; the tests read sockets with ss.
command -v ss >/dev/null || missing+=(iproute2)
# promtool, for the alert rules' tests (deploy/observability); the package's server is
# not needed.
command -v promtool >/dev/null || missing+=(prometheus)
if ((${#missing[@]})); then
  as_root apt-get update -qq >/dev/null
  as_root apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
"$here/k8s/build.sh" reference
