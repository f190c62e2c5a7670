#!/usr/bin/env bash
# The standard benchmark and the scale benchmark, each scenario on fresh processes
# (loadtest/run.sh: new kube-apiserver + etcd and kcache, pinned with taskset).
#
#   loadtest/standard.sh           scenarios 1-3, under 10 minutes on a 2-core machine:
#                                    kubelet   100 nodes x (99 single-object + 1 pod watch)
#                                              = 10,000 watches, 100 writes/s for 20 s
#                                    informer  50 list+watch clients over 5 namespaces,
#                                              60 create/update/delete per s for 20 s
#                                    slow      900 normal + 100 slow-consumer watches,
#                                              100 writes/s, 15 s without + 15 s with
#   loadtest/standard.sh scale     scenario 4: 50,000 watches on one kcache replica (the
#                                  API server directly: 10,000, said in the output);
#                                  extra kcache-bench flags may follow, e.g.
#                                  --apiserver-max-watches 50000
#   loadtest/standard.sh --smoke [scale]   the same scripts at a few hundred watches
#
# Results: loadtest/results/<standard|scale>-<date>/<scenario>-<date>.json and PNGs.
set -euo pipefail
cd "$(dirname "$0")/.."

smoke=
if [[ ${1:-} == --smoke ]]; then
  smoke=1
  shift
fi
what=standard
if [[ ${1:-} == scale ]]; then
  what=scale
  shift
fi

cargo build --release -p kcache-loadtest -p kcache
export KCACHE_BENCH_NO_BUILD=1
dir=loadtest/results/$what-$(date -u +%Y%m%dT%H%M%SZ)
[[ $smoke ]] && dir=$dir-smoke
export KCACHE_BENCH_RESULTS=$dir
start=$SECONDS

if [[ $what == scale ]]; then
  if [[ $smoke ]]; then
    loadtest/run.sh --scenario scale --watches 1000 --objects 100 --apiserver-max-watches 500 \
      --source-addrs 2 --seconds 5 "$@"
  else
    loadtest/run.sh --scenario scale "$@"
  fi
else
  if [[ $smoke ]]; then
    small=(--seconds 5 --steps 3)
    loadtest/run.sh --scenario kubelet --nodes 4 --watches-per-node 49 --secrets 50 --configmaps 50 \
      --cached-objects 100 "${small[@]}"
    loadtest/run.sh --scenario informer --clients 10 --namespaces 2 --objects-per-namespace 20 "${small[@]}"
    loadtest/run.sh --scenario slow --watches 200 --objects 20 "${small[@]}"
  else
    loadtest/run.sh --scenario kubelet
    loadtest/run.sh --scenario informer
    loadtest/run.sh --scenario slow
  fi
fi
echo "$what benchmark done in $((SECONDS - start)) s; results in $dir:"
ls -1 "$dir"
