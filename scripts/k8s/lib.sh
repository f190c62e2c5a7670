# shellcheck shell=bash
# Sourced, not run, by scripts/k8s/build.sh and scripts/k8s/build-programs.sh. Defines:
#
#   k8s_resolve VERSION_ARG   sets version, major, minor_n, etcd_version from
#                             reference|second|vX.Y.Z and versions.env
#   k8s_wrapper_gomod MODULE  prints a go.mod for a wrapper module named MODULE that
#                             requires k8s.io/kubernetes $version (see below)
#   k8s_ldflags               prints -ldflags that set the version as hack/lib/version.sh does
#   k8s_build_start LOGNAME   once a build is needed: checks Go, creates $bin, empties
#                             $log ($dest/LOGNAME), makes $work (removed at exit), sets
#                             $start and exports Go's build settings
#   k8s_build_fail STEP       prints the log's tail and exits 1
#
# Why a wrapper module: k8s.io/kubernetes is not meant to be a dependency — its go.mod
# requires the staging modules (k8s.io/api, k8s.io/client-go, ...) at v0.0.0 with local
# replaces that dependents ignore. The wrapper replaces each with its published v0.Y.Z and
# copies Kubernetes' own `godebug` line (dependents ignore it; it pins x509 and other
# behaviour the API server relies on).
k8s_lib_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/k8s/versions.env
source "$k8s_lib_dir/versions.env"

k8s_resolve() {
  case ${1:-reference} in
    reference) version=$KCACHE_K8S_REFERENCE ;;
    second) version=$KCACHE_K8S_SECOND ;;
    v[0-9]*.[0-9]*.[0-9]*) version=$1 ;;
    *) echo "$(basename "$0"): version must be reference, second or vX.Y.Z, not '$1'" >&2; return 2 ;;
  esac
  local mm=${version#v}
  mm=${mm%.*}                # 1.37
  major=${mm%%.*}            # 1
  minor_n=${mm#*.}           # 37
  local etcd_var=KCACHE_ETCD_${major}_${minor_n}
  etcd_version=${!etcd_var:-}
  [[ -n $etcd_version ]] || { echo "$(basename "$0"): no $etcd_var in versions.env for $version" >&2; return 2; }
}

# The go.mod of a module, downloaded through the module proxy (cached in GOMODCACHE). Run
# outside any module: inside one (even the half-written wrapper) `go mod download` reads it.
k8s_gomod_of() {
  (cd / && go mod download -json "$1") | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p'
}

k8s_wrapper_gomod() {
  local module=$1 k8s_mod
  k8s_mod=$(k8s_gomod_of "k8s.io/kubernetes@$version")
  [[ -f $k8s_mod ]] || { echo "k8s_wrapper_gomod: could not download k8s.io/kubernetes@$version" >&2; return 1; }
  local staging_version="v0.${minor_n}.${version##*.}"
  echo "module $module"
  echo
  grep -m1 '^go ' "$k8s_mod"
  grep -m1 '^godebug ' "$k8s_mod" || true
  echo
  echo "require k8s.io/kubernetes $version"
  echo
  echo "replace ("
  # Every staging module k8s.io/kubernetes replaces locally, at its published version.
  sed -n 's#^\t\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$k8s_mod" | while read -r m; do
    echo "	$m => $m $staging_version"
  done
  echo ")"
}

k8s_ldflags() {
  local flags="-s -w" key
  for key in "gitVersion=$version" "gitMajor=$major" "gitMinor=$minor_n" gitTreeState=clean \
    "buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"; do
    flags+=" -X k8s.io/client-go/pkg/version.$key -X k8s.io/component-base/version.$key"
  done
  echo "$flags"
}

k8s_build_start() {
  command -v go >/dev/null || { echo "$(basename "$0"): needs Go (this machine kind has it at /usr/local/go)" >&2; exit 1; }
  ensure_dir "$bin"
  log=$dest/$1
  : >"$log"
  work=$(mktemp -d)
  # shellcheck disable=SC2064  # $work is fixed now, on purpose
  trap "rm -rf '$work'" EXIT
  start=$SECONDS
  export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local
}

k8s_build_fail() {
  tail -40 "$log" >&2
  echo "$(basename "$0"): $1 failed (log: $log)" >&2
  exit 1
}
