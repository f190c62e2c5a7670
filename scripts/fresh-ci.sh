#!/usr/bin/env bash
# Measures CI as a fresh machine would run it, on this one: a clean clone of HEAD with
# ../shared beside it, and every cache the run fills pointed at an empty directory — the
# Kubernetes builds (K8S_TESTENV), Go's module and build caches, Cargo's registry and the
# Rust target dir. What it cannot empty: the Debian packages and the Rust toolchain
# (installed on this machine kind; ensure-deps.sh installs the packages in a minute or two).
#   scripts/fresh-ci.sh [WORKDIR]     (default: a new directory under /tmp)
# Prints the wall time and .ci/run's exit code; the log is WORKDIR/ci.log. Leaves WORKDIR
# in place (several GB): remove it when done.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$(mktemp -d /tmp/kcache-fresh-ci.XXXXXX)}
mkdir -p "$work"
git clone -q "$repo" "$work/main"
ln -sfn "$(cd "$repo/../shared" && pwd)" "$work/shared"
start=$(date +%s)
set +e
(
  cd "$work/main"
  env K8S_TESTENV="$work/testenv" \
    GOMODCACHE="$work/go/mod" GOCACHE="$work/go/cache" GOPATH="$work/go/path" \
    CARGO_HOME="$work/cargo" CARGO_TARGET_DIR="$work/target" \
    PATH="$HOME/.cargo/bin:$PATH" \
    .ci/run
) >"$work/ci.log" 2>&1
rc=$?
set -e
secs=$(($(date +%s) - start))
echo "fresh CI: rc=$rc in $((secs / 60)) min $((secs % 60)) s (log: $work/ci.log)"
exit "$rc"
