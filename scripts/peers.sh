#!/usr/bin/env bash
# Builds the real peers the tests and the benchmark run against, from pinned
# Go modules (peers/*/go.mod and go.sum, our own wrapper modules), into a
# cache that later runs reuse:
#
#   kube-apiserver, kube-controller-manager   k8s.io/kubernetes  (peers/kubernetes)
#   etcd, etcdctl                             go.etcd.io/etcd    (peers/etcd)
#   crictl                                    sigs.k8s.io/cri-tools (peers/cri-tools)
#   cnitool, host-local, ptp, portmap,        containernetworking/cni and
#   bandwidth, loopback                       /plugins           (peers/cni)
#   containerd, ctr, containerd-shim-runc-v2  containerd/containerd/v2 (peers/containerd)
#   pause                                     peers/pause/pause.c (static, for the sandbox image)
#
# Usage: scripts/peers.sh [--print-bin]
#   PEERS_CACHE (default /var/cache/calico-cni-peers): binaries in $PEERS_CACHE/bin.
# A module is rebuilt only when its go.mod, go.sum, the tool list or the Go
# version changed (a stamp per module), so a warm run costs seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
cache=${PEERS_CACHE:-/var/cache/calico-cni-peers}
bin=$cache/bin
mkdir -p "$bin" "$cache/stamps"
[ "${1:-}" = --print-bin ] && { echo "$bin"; exit 0; }

export GOFLAGS=-mod=readonly GOTOOLCHAIN=local
gover=$(go env GOVERSION)

# build MODULE CGO TAGS NAME=PACKAGE...
build() {
  local module=$1 cgo=$2 tags=$3
  shift 3
  local dir=$root/peers/$module
  local stamp
  stamp=$( (cat "$dir/go.mod" "$dir/go.sum"; echo "$gover $cgo $tags $*") | sha256sum | cut -c1-16)
  local missing=0 spec
  for spec in "$@"; do [ -x "$bin/${spec%%=*}" ] || missing=1; done
  if [ $missing = 0 ] && [ "$(cat "$cache/stamps/$module" 2>/dev/null)" = "$stamp" ]; then
    echo "peers: $module up to date"
    return
  fi
  local start=$SECONDS
  for spec in "$@"; do
    local name=${spec%%=*} pkg=${spec#*=}
    (cd "$dir" && CGO_ENABLED=$cgo go build -trimpath -tags "$tags" -ldflags='-s -w' \
      -o "$bin/$name.new" "$pkg")
    mv -f "$bin/$name.new" "$bin/$name"
  done
  echo "$stamp" >"$cache/stamps/$module"
  echo "peers: built $module in $((SECONDS - start)) s"
}

build cni 0 "" \
  cnitool=github.com/containernetworking/cni/cnitool \
  host-local=github.com/containernetworking/plugins/plugins/ipam/host-local \
  ptp=github.com/containernetworking/plugins/plugins/main/ptp \
  portmap=github.com/containernetworking/plugins/plugins/meta/portmap \
  bandwidth=github.com/containernetworking/plugins/plugins/meta/bandwidth \
  loopback=github.com/containernetworking/plugins/plugins/main/loopback
build cri-tools 0 "" crictl=sigs.k8s.io/cri-tools/cmd/crictl
build etcd 0 "" etcd=go.etcd.io/etcd/server/v3 etcdctl=go.etcd.io/etcd/etcdctl/v3
build containerd 0 "no_btrfs no_devmapper no_zfs" \
  containerd=github.com/containerd/containerd/v2/cmd/containerd \
  ctr=github.com/containerd/containerd/v2/cmd/ctr \
  containerd-shim-runc-v2=github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2
build kubernetes 0 "" \
  kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver \
  kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager

# The sandbox image's process: sleeps until a signal, reaps children.
pause_stamp=$(sha256sum peers/pause/pause.c | cut -c1-16)
if [ ! -x "$bin/pause" ] || [ "$(cat "$cache/stamps/pause" 2>/dev/null)" != "$pause_stamp" ]; then
  cc -static -Os -o "$bin/pause" peers/pause/pause.c
  echo "$pause_stamp" >"$cache/stamps/pause"
  echo "peers: built pause"
fi
echo "peers: all in $bin"
