# Sourced by the install scripts: `as_root CMD…` runs CMD as root — directly when the
# script runs as root, else through sudo (a non-root user with sudo rights) — and
# `ensure_dir DIR` creates DIR owned by the invoking user (e.g. /opt/k8s-testenv).
as_root() {
  if [[ $(id -u) -eq 0 ]]; then
    env DEBIAN_FRONTEND=noninteractive "$@"
  elif command -v sudo >/dev/null; then
    sudo env DEBIAN_FRONTEND=noninteractive "$@"
  else
    echo "$(basename "$0"): needs root for: $* (run as root, or as a user with sudo)" >&2
    exit 1
  fi
}
ensure_dir() {
  mkdir -p "$1" 2>/dev/null || as_root install -d -o "$(id -u)" -g "$(id -g)" "$1"
  [[ -w $1 ]] || as_root chown "$(id -u):$(id -g)" "$1"
}
