#!/usr/bin/env bash
# The CNI image the DaemonSet change names (README: "Install on a node: the
# DaemonSet change"), built from a plugin binary as an OCI image layout tar
# (an OCI archive): /opt/cni/bin/calico, calico-ipam and install as links to
# it (install, the entrypoint, is `calico install`: Calico's install-cni),
# and any other CNI plugin given with --add. Run as root 0:0, as Calico's.
#
#   scripts/image.sh [--binary FILE] [--out FILE] [--name NAME] [--add FILE]...
#
#   --binary FILE  the plugin (default: the release build,
#                  ${CARGO_TARGET_DIR:-target}/x86_64-unknown-linux-musl/release/calico;
#                  `cargo build --release` first)
#   --out FILE     the archive (default: ${CARGO_TARGET_DIR:-target}/calico-cni-image.tar)
#   --name NAME    the image's name (default: calico-cni-rs:<version>, the
#                  version the binary's -v gives)
#   --add FILE     another binary for /opt/cni/bin (repeatable: portmap, ...)
#
# It prints where the archive is, its name and what it holds. Load it with
# `ctr -n k8s.io images import FILE`, or push it with
# `skopeo copy oci-archive:FILE docker://REGISTRY/NAME`.
# Sourced (scripts/testbed.sh does), it only defines oci_layout.
set -euo pipefail

# oci_layout OUT NAME ROOTFS ENTRYPOINT-JSON CMD-JSON USER: an OCI image
# layout tar of the directory ROOTFS as its one layer, named NAME.
oci_layout() {
  local out=$1 name=$2 rootfs=$3 entrypoint=$4 cmd=$5 user=$6
  local w
  w=$(mktemp -d)
  mkdir -p "$w/oci/blobs/sha256"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$rootfs" -cf "$w/layer.tar" .
  local diff_id layer layer_size config config_size manifest manifest_size
  diff_id=$(sha256sum "$w/layer.tar" | cut -d' ' -f1)
  gzip -n -9 <"$w/layer.tar" >"$w/layer.tar.gz"
  layer=$(sha256sum "$w/layer.tar.gz" | cut -d' ' -f1)
  layer_size=$(stat -c %s "$w/layer.tar.gz")
  mv "$w/layer.tar.gz" "$w/oci/blobs/sha256/$layer"
  jq -cn --arg d "sha256:$diff_id" --argjson e "$entrypoint" --argjson c "$cmd" --arg u "$user" '{
    architecture: "amd64", os: "linux",
    config: ({Entrypoint: $e, User: $u} + (if $c == null then {} else {Cmd: $c} end)),
    rootfs: {type: "layers", diff_ids: [$d]}
  }' >"$w/config.json"
  config=$(sha256sum "$w/config.json" | cut -d' ' -f1)
  config_size=$(stat -c %s "$w/config.json")
  mv "$w/config.json" "$w/oci/blobs/sha256/$config"
  jq -cn --arg c "sha256:$config" --argjson cs "$config_size" --arg l "sha256:$layer" --argjson ls "$layer_size" '{
    schemaVersion: 2, mediaType: "application/vnd.oci.image.manifest.v1+json",
    config: {mediaType: "application/vnd.oci.image.config.v1+json", digest: $c, size: $cs},
    layers: [{mediaType: "application/vnd.oci.image.layer.v1.tar+gzip", digest: $l, size: $ls}]
  }' >"$w/manifest.json"
  manifest=$(sha256sum "$w/manifest.json" | cut -d' ' -f1)
  manifest_size=$(stat -c %s "$w/manifest.json")
  mv "$w/manifest.json" "$w/oci/blobs/sha256/$manifest"
  echo '{"imageLayoutVersion":"1.0.0"}' >"$w/oci/oci-layout"
  jq -cn --arg m "sha256:$manifest" --argjson ms "$manifest_size" --arg name "$name" '{
    schemaVersion: 2, mediaType: "application/vnd.oci.image.index.v1+json",
    manifests: [{mediaType: "application/vnd.oci.image.manifest.v1+json", digest: $m, size: $ms,
      platform: {architecture: "amd64", os: "linux"},
      annotations: {"io.containerd.image.name": $name, "org.opencontainers.image.ref.name": ($name | split(":") | last)}}]
  }' >"$w/oci/index.json"
  tar --sort=name --owner=0 --group=0 --numeric-owner -C "$w/oci" -cf "$out.new" oci-layout index.json blobs
  mv -f "$out.new" "$out"
  rm -rf "$w"
}

# Sourced: the function only.
if [ "${BASH_SOURCE[0]}" != "$0" ]; then
  return 0
fi

die() { echo "image: $*" >&2; exit 1; }

target=${CARGO_TARGET_DIR:-$(cd "$(dirname "$0")/.." && pwd)/target}
binary=$target/x86_64-unknown-linux-musl/release/calico
out=$target/calico-cni-image.tar
name=
extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --binary) binary=${2:?--binary needs a file}; shift 2 ;;
    --out) out=${2:?--out needs a file}; shift 2 ;;
    --name) name=${2:?--name needs a name}; shift 2 ;;
    --add) extra+=("${2:?--add needs a file}"); shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) die "unknown argument $1 (scripts/image.sh --help)" ;;
  esac
done
[ -x "$binary" ] || die "no plugin binary at $binary (cargo build --release, or --binary FILE)"
# -v: Calico's release, then "calico-cni VERSION (commit ...), ...".
version=$("$binary" -v) || die "$binary -v failed"
ours=$(sed -n 2p <<<"$version" | awk '{print $2}')
[ -n "$name" ] || name=calico-cni-rs:${ours:-unknown}

rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT
bin=$rootfs/opt/cni/bin
mkdir -p "$bin"
install -m 0755 "$binary" "$bin/calico"
ln -s calico "$bin/calico-ipam"
ln -s calico "$bin/install"
for f in "${extra[@]}"; do
  [ -f "$f" ] || die "no file $f (--add)"
  install -m 0755 "$f" "$bin/"
done
mkdir -p "$(dirname "$out")"
oci_layout "$out" "$name" "$rootfs" '["/opt/cni/bin/install"]' null 0:0

echo "image $name: $out ($(stat -c %s "$out") bytes, an OCI image layout tar)"
echo "entrypoint: /opt/cni/bin/install (calico install: Calico's install-cni), user 0:0"
for f in "$bin"/*; do
  if [ -L "$f" ]; then
    echo "  /opt/cni/bin/$(basename "$f") -> $(readlink "$f")"
  else
    echo "  /opt/cni/bin/$(basename "$f") ($(stat -c %s "$f") bytes)"
  fi
done
echo "calico -v: $(tr '\n' ' ' <<<"$version" | sed 's/ $//')"
