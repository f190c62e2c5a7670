# shellcheck shell=bash
# Sourced, not run. Defines:
#
#   k8s_patched_source DIR
#
# Downloads Debian's `kubernetes` source package (v1.20.2, packaged as
# 1.20.5+really1.20.2) into DIR, extracts its tree there, swaps two vendored libraries for
# Debian's newer packaged sources (see below) and prints the tree's path (DIR/kubernetes-*)
# on stdout, nothing else. Needs root or sudo (apt-get, via as-root.sh, which the caller sources); Debian 12.
#
# Why the vendor swap: Kubernetes 1.20 vendors reflect2 1.0.1, which is broken under
# Go >= 1.18 — binaries built from the tree (the API server, the e2e test binary) crash
# with "fatal error: fault" the first time they encode an object carrying labels. We
# replace reflect2 and json-iterator with Debian's packaged reflect2 1.0.2 and
# json-iterator 1.1.12 before building.
#
# Used by scripts/install-kube-apiserver.sh and scripts/install-e2e-specs.sh.

# The body is a subshell with errexit on, so it never changes the caller's directory or
# options and stops at the first failing step whatever context it is called in.
k8s_patched_source() (
  set -euo pipefail
  dir=${1:?usage: k8s_patched_source DIR}
  export DEBIAN_FRONTEND=noninteractive
  sources=/etc/apt/sources.list.d/debian.sources
  needed=(dpkg-dev golang-github-modern-go-reflect2-dev golang-github-json-iterator-go-dev)
  refresh=
  # `apt-get source` needs deb-src entries; Debian 12 images ship deb822 sources without them.
  if [[ -f $sources ]] && ! grep -q 'deb-src' "$sources"; then
    as_root sed -i 's/^Types: deb$/Types: deb deb-src/' "$sources"
    refresh=1
  fi
  apt-cache showsrc kubernetes >/dev/null 2>&1 || refresh=1
  missing=()
  for pkg in "${needed[@]}"; do
    dpkg-query -W -f '${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' || missing+=("$pkg")
  done
  if [[ $refresh ]] || ((${#missing[@]})); then
    as_root apt-get update -qq >/dev/null
  fi
  if ((${#missing[@]})); then
    as_root apt-get install -y -qq "${missing[@]}" >/dev/null
  fi

  mkdir -p "$dir"
  cd "$dir"
  apt-get source -qq --download-only kubernetes >/dev/null
  tar xzf kubernetes_*.orig.tar.gz
  trees=(kubernetes-*/)
  ((${#trees[@]} == 1)) || { echo "k8s_patched_source: expected one kubernetes-*/ in $dir" >&2; exit 1; }
  tree=$(cd "${trees[0]}" && pwd)
  for pkg in github.com/modern-go/reflect2 github.com/json-iterator/go; do
    rm -rf "${tree:?}/vendor/$pkg"
    cp -r "/usr/share/gocode/src/$pkg" "$tree/vendor/$pkg"
  done
  echo "$tree"
)
