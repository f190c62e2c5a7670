#!/usr/bin/env bash
# Builds a minimal, distroless-style OCI image of kcache, offline, with Debian's umoci
# (and skopeo for --docker-archive): one layer holding the stripped binary at
# /usr/local/bin/kcache, the shared libraries `ldd` says it needs (glibc, libgcc_s, the
# dynamic loader) at their host paths, the host's CA bundle, /etc/passwd and /etc/group
# with root and nonroot (65532), /etc/nsswitch.conf and an empty /tmp (1777). No shell,
# no package manager. The image runs as 65532:65532, `kcache serve` by default.
#
# Usage: deploy/image/build.sh [--binary PATH] [--out DIR] [--tag TAG] [--docker-archive FILE]
#   --binary PATH          use this kcache binary (not modified; a stripped copy goes in the
#                          image) instead of `cargo build --release -p kcache --bin kcache`
#   --out DIR              OCI image layout to write into (default: <repo>/target/image);
#                          an existing layout keeps its other tags
#   --tag TAG              image tag (default: workspace version + "-<short git rev>")
#   --docker-archive FILE  also write a docker-archive tarball (image kcache:TAG) for
#                          `docker load -i FILE` or `kind load image-archive FILE`
# Missing umoci/skopeo/binutils are installed with apt-get (through sudo when not root).
# SOURCE_DATE_EPOCH (default: the commit time of HEAD) sets every timestamp in the image.
# Progress goes to stderr; the last line on stdout is the image reference oci:<dir>:<tag>.
set -euo pipefail
umask 022

die() {
  echo "build.sh: error: $*" >&2
  exit 1
}
log() { echo "build.sh: $*" >&2; }

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

binary=""
out=""
tag=""
docker_archive=""
while (($#)); do
  case "$1" in
    --binary) binary=${2:?--binary needs a path}; shift 2 ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --tag) tag=${2:?--tag needs a value}; shift 2 ;;
    --docker-archive) docker_archive=${2:?--docker-archive needs a file}; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
done

# --- tools -----------------------------------------------------------------------------
apt_install() {
  command -v apt-get >/dev/null || return 1
  local sudo=()
  if [[ $(id -u) != 0 ]]; then
    command -v sudo >/dev/null || return 1
    sudo=(sudo)
  fi
  log "installing $* with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "$@" >&2 ||
    { "${sudo[@]}" apt-get update -qq >&2 &&
      "${sudo[@]}" apt-get install -y -qq --no-install-recommends "$@" >&2; }
}
# need TOOL PACKAGE: TOOL on PATH, else installed from Debian's PACKAGE, else an error.
need() {
  command -v "$1" >/dev/null && return 0
  apt_install "$2" || true
  command -v "$1" >/dev/null ||
    die "'$1' not found and could not be installed; run: apt-get install -y --no-install-recommends $2"
}
need umoci umoci
need strip binutils
need readelf binutils
need ldd libc-bin
[[ -z $docker_archive ]] || need skopeo skopeo
ca_bundle=/etc/ssl/certs/ca-certificates.crt
[[ -s $ca_bundle ]] || die "$ca_bundle missing; run: apt-get install -y ca-certificates"

# --- version, revision, tag ------------------------------------------------------------
version=$(awk '
  /^\[/ { in_pkg = ($0 ~ /^\[workspace\.package\][[:space:]]*$/) }
  in_pkg && /^version[[:space:]]*=/ { gsub(/.*=[[:space:]]*"|".*/, ""); print; exit }
' "$root/Cargo.toml")
[[ -n $version ]] || die "no [workspace.package] version in $root/Cargo.toml"
revision=""
if command -v git >/dev/null; then
  revision=$(git -C "$root" rev-parse HEAD 2>/dev/null || true)
fi
if [[ -z $tag ]]; then
  tag=$version${revision:+-${revision:0:7}}
fi
[[ $tag =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] || die "invalid tag: $tag"
if [[ -z ${SOURCE_DATE_EPOCH:-} && -n $revision ]]; then
  SOURCE_DATE_EPOCH=$(git -C "$root" log -1 --format=%ct 2>/dev/null || true)
fi
epoch=${SOURCE_DATE_EPOCH:-$(date +%s)}
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)

# --- binary ----------------------------------------------------------------------------
if [[ -z $binary ]]; then
  command -v cargo >/dev/null || die "cargo not found (or pass --binary PATH)"
  log "cargo build --release -p kcache --bin kcache"
  (cd "$root" && cargo build --release -p kcache --bin kcache) >&2 ||
    die "cargo build --release -p kcache --bin kcache failed (see above)"
  target_dir=$(cd "$root" && cargo metadata --format-version 1 --no-deps |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
  binary=${target_dir:-${CARGO_TARGET_DIR:-$root/target}}/release/kcache
fi
[[ -f $binary ]] || die "binary not found: $binary"
[[ -x $binary ]] || die "binary not executable: $binary"
machine=$(readelf -h "$binary" 2>/dev/null | sed -n 's/^ *Machine: *//p') ||
  die "not an ELF file: $binary"
case "$machine" in
  *X86-64*) arch=amd64 ;;
  *AArch64*) arch=arm64 ;;
  *) die "unsupported architecture of $binary: ${machine:-not an ELF file}" ;;
esac

# --- output layout ---------------------------------------------------------------------
out=${out:-$root/target/image}
mkdir -p "$(dirname "$out")"
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
[[ $out != *:* ]] || die "the output directory must not contain ':': $out"
if [[ -d $out && -z $(ls -A "$out") ]]; then
  rmdir "$out"
fi
if [[ ! -e $out ]]; then
  umoci init --layout "$out"
elif [[ -f $out/oci-layout ]]; then
  if umoci ls --layout "$out" | grep -qxF -- "$tag"; then
    log "replacing tag $tag in $out"
    umoci rm --image "$out:$tag"
  fi
else
  die "$out exists and is not an OCI image layout"
fi

# --- rootfs ----------------------------------------------------------------------------
work=$(mktemp -d "${TMPDIR:-/tmp}/kcache-image.XXXXXX")
trap 'chmod -R u+rwX "$work" 2>/dev/null; rm -rf "$work"' EXIT
rootfs=$work/rootfs
mkdir -p "$rootfs"/{usr/local/bin,etc/ssl/certs,tmp}
chmod 1777 "$rootfs/tmp"

strip --strip-all -o "$rootfs/usr/local/bin/kcache" "$binary"
chmod 0755 "$rootfs/usr/local/bin/kcache"

# The libraries (and the loader, printed without "=>") at their absolute paths; the
# vDSO has no path.
set +e
ldd_out=$(LC_ALL=C ldd "$binary" 2>&1)
ldd_rc=$?
set -e
if ((ldd_rc != 0)); then
  [[ $ldd_out == *"not a dynamic executable"* || $ldd_out == *"statically linked"* ]] ||
    die "ldd $binary failed: $ldd_out"
  ldd_out=""
fi
libs=$(awk '
  $2 == "=>" && $3 ~ /^\// { print $3; next }
  $2 == "=>" && $3 == "not" { print "MISSING " $1; next }
  $1 ~ /^\// { print $1 }
' <<<"$ldd_out")
if grep -q '^MISSING' <<<"$libs"; then
  die "libraries not found by ldd: $(grep '^MISSING' <<<"$libs" | cut -d' ' -f2 | tr '\n' ' ')"
fi
for lib in $libs; do
  mkdir -p "$rootfs$(dirname "$lib")"
  cp -L "$lib" "$rootfs$lib"
  log "library $lib"
done

cp -L "$ca_bundle" "$rootfs/etc/ssl/certs/ca-certificates.crt"
chmod 0644 "$rootfs/etc/ssl/certs/ca-certificates.crt"
cat >"$rootfs/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/usr/sbin/nologin
nonroot:x:65532:65532:nonroot:/nonexistent:/usr/sbin/nologin
EOF
cat >"$rootfs/etc/group" <<'EOF'
root:x:0:
nonroot:x:65532:
EOF
cat >"$rootfs/etc/nsswitch.conf" <<'EOF'
passwd: files
group: files
hosts: files dns
EOF

# --- image -----------------------------------------------------------------------------
# --rootless even as root: files are unpacked and repacked as the invoking user, mapped
# to uid/gid 0 in the layer, whoever runs this.
image=$out:$tag
bundle=$work/bundle
umoci new --image "$image"
umoci unpack --rootless --image "$image" "$bundle"
cp -a "$rootfs/." "$bundle/rootfs/"
find "$bundle/rootfs" -exec touch -h -d "@$epoch" {} +
umoci repack --image "$image" \
  --history.created "$created" \
  --history.created_by "deploy/image/build.sh" \
  "$bundle"

labels=(
  --config.label "org.opencontainers.image.title=kcache"
  --config.label "org.opencontainers.image.version=$version"
  --config.label "org.opencontainers.image.licenses=Apache-2.0"
)
[[ -z $revision ]] || labels+=(--config.label "org.opencontainers.image.revision=$revision")
umoci config --image "$image" \
  --created "$created" \
  --history.created "$created" \
  --history.created_by "deploy/image/build.sh: umoci config" \
  --architecture "$arch" --os linux \
  --config.user 65532:65532 \
  --config.entrypoint /usr/local/bin/kcache \
  --config.cmd serve \
  --config.workingdir / \
  --config.env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
  --config.exposedports 8443/tcp \
  --config.exposedports 8081/tcp \
  "${labels[@]}"
umoci gc --layout "$out"

if [[ -n $docker_archive ]]; then
  mkdir -p "$(dirname "$docker_archive")"
  rm -f "$docker_archive"
  log "writing docker-archive $docker_archive (kcache:$tag)"
  skopeo --insecure-policy copy "oci:$image" "docker-archive:$docker_archive:kcache:$tag" >&2
fi

echo "oci:$image"
