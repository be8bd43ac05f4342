#!/usr/bin/env bash
# Builds the real `cnitool` (libcni 1.1.2, spec 1.0.0: add/check/del) offline,
# from Debian 12's own packages: Go 1.19 and golang-github-appc-cni-dev (libcni
# under /usr/share/gocode), plus cnitool.go from that package's Debian source
# tarball. Installs /usr/local/bin/cnitool. Needs root and apt.
set -euo pipefail

OUT=${OUT:-/usr/local/bin/cnitool}
[ -x "$OUT" ] && { echo "cnitool already at $OUT"; exit 0; }
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq --no-install-recommends golang-go golang-github-appc-cni-dev xz-utils >/dev/null

work=$(mktemp -d)
src_list=/etc/apt/sources.list.d/calico-cni-deb-src.sources
cleanup() { rm -rf "$work" "$src_list"; }
trap cleanup EXIT

if ! grep -rqsE '^(deb-src|Types:.*deb-src)' /etc/apt/sources.list /etc/apt/sources.list.d/; then
  # Reuse the first stanza of the machine's own Debian sources as deb-src.
  awk 'BEGIN{RS="";ORS="\n\n"} NR==1' /etc/apt/sources.list.d/debian.sources \
    | sed -e 's/^Types: deb$/Types: deb-src/' >"$src_list"
  apt-get update -qq
fi
cd "$work"
apt-get source --download-only golang-github-appc-cni=1.1.2-1 >/dev/null 2>&1
tar -xJf golang-github-appc-cni_1.1.2.orig.tar.xz --strip-components=1 \
  golang-github-appc-cni-1.1.2/cnitool/cnitool.go
env GO111MODULE=off GOPATH=/usr/share/gocode GOFLAGS= GOPROXY=off CGO_ENABLED=0 \
  GOCACHE="$work/gocache" go build -trimpath -o "$OUT" ./cnitool/cnitool.go
echo "built $OUT"
