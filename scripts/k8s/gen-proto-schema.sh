#!/usr/bin/env bash
# Regenerates kcache's protobuf schema table (actors/src/core/proto/k8s.schema) from the
# reference Kubernetes version's staging modules in the Go module cache (k8s.io/api,
# k8s.io/apimachinery, k8s.io/kube-aggregator at v0.<minor>.<patch>), with
# scripts/gen-proto-schema.py. Run it when versions.env moves the reference forward.
#
# Usage: scripts/k8s/gen-proto-schema.sh [reference|second|vX.Y.Z]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/k8s/lib.sh
source "$here/lib.sh"
k8s_resolve "${1:-reference}"
staging_version="v0.${minor_n}.${version##*.}"
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
mkdir -p "$tree/staging/src/k8s.io"
for m in api apimachinery kube-aggregator; do
  dir=$(cd / && go mod download -json "k8s.io/$m@$staging_version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  [[ -d $dir ]] || { echo "gen-proto-schema.sh: could not download k8s.io/$m@$staging_version" >&2; exit 1; }
  ln -s "$dir" "$tree/staging/src/k8s.io/$m"
done
python3 "$here/../gen-proto-schema.py" "$tree" "$version" >"$here/../../actors/src/core/proto/k8s.schema"
echo "gen-proto-schema.sh: wrote actors/src/core/proto/k8s.schema from Kubernetes $version" >&2
