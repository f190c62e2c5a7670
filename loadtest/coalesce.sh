#!/usr/bin/env bash
# The coalescing benchmark (issue 16): the kubelet's single-object Secret/ConfigMap
# watches at scale (`kcache-bench --scenario coalesce`, src/scenario/coalesce.rs), against
# three targets, each on fresh processes (loadtest/run.sh: new etcd + kube-apiserver and
# kcache, pinned):
#   direct   the API server directly
#   off      through kcache, coalescing off (cache.coalesce_min_names = 0)
#   on       through kcache, cache.coalesce_min_names = 4 (KCACHE_COALESCE_MIN_NAMES),
#            other cache.coalesce_* at their defaults
# then `kcache-coalesce-report` puts them side by side, judges the issue's targets (API
# server RSS growth direct ≥ 100× that through kcache with coalescing; ≤ 2 upstream
# watches per namespace; every write delivered to every watch of its object, no more) and
# counts WARN/ERROR lines in each run's logs.
#
#   loadtest/coalesce.sh [--smoke] [kcache-bench flags, e.g. --nodes 2000]
#
# Default size: --nodes 1000 × 33 watches (30 Secrets/ConfigMaps + 3 kube-root-ca.crt) over
# --namespaces 100 of 20 Secrets + 21 ConfigMaps. --smoke: 20 nodes over 10 namespaces.
# Results: loadtest/results/coalesce-<date>.json (the three runs' own JSON and logs stay
# in ${TMPDIR:-/tmp}/kcache-coalesce-<date>/, printed). KCACHE_BENCH_NO_BUILD=1 and
# CARGO_TARGET_DIR as for run.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

command="loadtest/coalesce.sh${*:+ $*}"
defaults=(--nodes 1000)
smoke=
if [[ ${1:-} == --smoke ]]; then
  smoke=1
  defaults=(--nodes 20 --namespaces 10 --steps 3 --seconds 10 --settle-secs 40)
  shift
fi
# The size flags above, but those given on the command line (kcache-bench takes each once).
size=()
for ((i = 0; i < ${#defaults[@]}; i += 2)); do
  [[ " $* " == *" ${defaults[i]} "* || " $* " == *" ${defaults[i]}="* ]] ||
    size+=("${defaults[i]}" "${defaults[i + 1]}")
done
min_names=${KCACHE_COALESCE_MIN_NAMES:-4}
release=${CARGO_TARGET_DIR:-target}/release
if [[ -z ${KCACHE_BENCH_NO_BUILD:-} ]]; then
  cargo build --release -p kcache-loadtest -p kcache
fi
export KCACHE_BENCH_NO_BUILD=1
stamp=$(date -u +%Y%m%dT%H%M%SZ)
results=${KCACHE_BENCH_RESULTS:-loadtest/results}
parts=${TMPDIR:-/tmp}/kcache-coalesce-$stamp
mkdir -p "$parts" "$results"
start=$SECONDS
for part in direct off on; do
  case $part in
    direct) target=(--targets apiserver) ;;
    off) target=(--targets kcache --kcache-coalesce-min-names 0) ;;
    on) target=(--targets kcache --kcache-coalesce-min-names "$min_names") ;;
  esac
  echo "=== coalesce: $part ($((SECONDS - start)) s in) ==="
  # One failed part does not stop the others: the report says which is missing.
  KCACHE_BENCH_LOG_DIR=$parts/$part loadtest/run.sh --scenario coalesce "${target[@]}" \
    --no-plots --out "$parts/$part.json" ${size[@]+"${size[@]}"} "$@" ||
    echo "coalesce: the $part run failed (logs in $parts/$part)" >&2
done
out=$results/coalesce-$stamp.json
[[ $smoke ]] && out=$results/coalesce-$stamp-smoke.json
"$release/kcache-coalesce-report" --out "$out" --logs "$parts" \
  --command "$command" --wall-seconds $((SECONDS - start)) \
  "$parts/direct.json" "$parts/off.json" "$parts/on.json"
echo "coalesce benchmark done in $((SECONDS - start)) s; parts and logs in $parts"
