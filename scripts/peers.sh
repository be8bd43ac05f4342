#!/usr/bin/env bash
# Builds the real peers the tests and the benchmark run against, from pinned
# Go modules (peers/*/go.mod and go.sum, our own wrapper modules), into a
# cache that later runs reuse:
#
#   kube-apiserver, kube-controller-manager,  k8s.io/kubernetes  (peers/kubernetes)
#   kube-scheduler, kubelet, kube-proxy
#   etcd, etcdctl                             go.etcd.io/etcd    (peers/etcd)
#   crictl                                    sigs.k8s.io/cri-tools (peers/cri-tools)
#   cnitool, host-local, ptp, portmap,        containernetworking/cni and
#   bandwidth, loopback                       /plugins           (peers/cni)
#   containerd, ctr, containerd-shim-runc-v2  containerd/containerd/v2 (peers/containerd)
#   pause                                     peers/pause/pause.c (static, for the sandbox image)
#   echo                                      peers/echo/echo.c (static, the node tests' workload image)
#   with --e2e (scripts/node-e2e.sh), also:
#   e2e.test, agnhost, kubectl, ginkgo        k8s.io/kubernetes/test/e2e,
#                                             test/images/agnhost, cmd/kubectl and the
#                                             suite's ginkgo CLI (peers/kubernetes-e2e)
#   coredns                                   github.com/coredns/coredns (peers/coredns),
#                                             the node's cluster DNS
#   calico, calico-ipam, calicoctl,           Calico v3.32.1, prebuilt (not buildable from the
#   calico-felix                              module proxy): unpacked into $PEERS_CACHE/bin/calico-v3.32.1
#
# Every Go peer is stamped with its module's real version (and release date)
# through the ldflags its own project's release build sets, so `/version`,
# `--version` and the like answer v1.36.3, 3.6.16, ... instead of the
# placeholders of a plain `go build`.
#
# Usage: scripts/peers.sh [--print-bin | --e2e]
#   PEERS_CACHE (default /var/cache/calico-cni-peers): binaries in $PEERS_CACHE/bin.
#   CALICO_RELEASE_DIR (default ../shared/calico/v3.32.1 beside the checkout):
#     a directory holding Calico v3.32.1's `calico`, `calicoctl` and
#     `calico-felix`, plain or xz-compressed (calico.xz, calicoctl.xz,
#     calico-felix.xz); when it holds SHA256SUMS the
#     unpacked files must match it. Outside this workplace, build them from
#     Calico's tag (see that directory's README) and point this at them.
#     Missing: the tests that need Calico's binaries skip, or fail under CI=true.
# A module is rebuilt only when its go.mod, go.sum, the tool list or the Go
# version changed (a stamp per module), so a warm run costs seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
cache=${PEERS_CACHE:-/var/cache/calico-cni-peers}
bin=$cache/bin
mkdir -p "$bin" "$cache/stamps"
[ "${1:-}" = --print-bin ] && { echo "$bin"; exit 0; }
e2e=0
[ "${1:-}" = --e2e ] && e2e=1

export GOFLAGS=-mod=readonly GOTOOLCHAIN=local
gover=$(go env GOVERSION)

# modver MODULE PATH [FIELD]: the version (or, with FIELD=date, the release
# date) of module PATH in the build list of our wrapper module MODULE.
modver() {
  local fmt='{{.Version}}'
  [ "${3:-}" = date ] && fmt='{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}'
  (cd "$root/peers/$1" && go list -m -f "$fmt" "$2")
}

# build MODULE CGO TAGS LDFLAGS NAME=PACKAGE...
build() {
  local module=$1 cgo=$2 tags=$3 ldflags=$4
  shift 4
  local dir=$root/peers/$module
  local stamp
  stamp=$( (cat "$dir/go.mod" "$dir/go.sum"; echo "$gover $cgo $tags $ldflags $*") | sha256sum | cut -c1-16)
  local missing=0 spec
  for spec in "$@"; do [ -x "$bin/${spec%%=*}" ] || missing=1; done
  if [ $missing = 0 ] && [ "$(cat "$cache/stamps/$module" 2>/dev/null)" = "$stamp" ]; then
    echo "peers: $module up to date"
    return
  fi
  local start=$SECONDS
  for spec in "$@"; do
    local name=${spec%%=*} pkg=${spec#*=} verb=build
    # (test:PACKAGE: the package's test binary, `go test -c`.)
    [ "${pkg#test:}" != "$pkg" ] && { verb="test -c"; pkg=${pkg#test:}; }
    # shellcheck disable=SC2086
    (cd "$dir" && CGO_ENABLED=$cgo go $verb -trimpath -tags "$tags" -ldflags="-s -w $ldflags" \
      -o "$bin/$name.new" "$pkg")
    mv -f "$bin/$name.new" "$bin/$name"
  done
  echo "$stamp" >"$cache/stamps/$module"
  echo "peers: built $module in $((SECONDS - start)) s"
}

# What each project's own release build stamps (-X), from the pinned versions.
cni_ver=$(modver cni github.com/containernetworking/plugins)
build cni 0 "" "-X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$cni_ver" \
  cnitool=github.com/containernetworking/cni/cnitool \
  host-local=github.com/containernetworking/plugins/plugins/ipam/host-local \
  ptp=github.com/containernetworking/plugins/plugins/main/ptp \
  portmap=github.com/containernetworking/plugins/plugins/meta/portmap \
  bandwidth=github.com/containernetworking/plugins/plugins/meta/bandwidth \
  loopback=github.com/containernetworking/plugins/plugins/main/loopback
build cri-tools 0 "" "-X sigs.k8s.io/cri-tools/pkg/version.Version=$(modver cri-tools sigs.k8s.io/cri-tools)" \
  crictl=sigs.k8s.io/cri-tools/cmd/crictl
# etcd's Version is a constant of its api module; its build adds the commit only.
build etcd 0 "" "-X go.etcd.io/etcd/api/v3/version.GitSHA=$(modver etcd go.etcd.io/etcd/server/v3)" \
  etcd=go.etcd.io/etcd/server/v3 etcdctl=go.etcd.io/etcd/etcdctl/v3
containerd_ver=$(modver containerd github.com/containerd/containerd/v2)
build containerd 0 "no_btrfs no_devmapper no_zfs" \
  "-X github.com/containerd/containerd/v2/version.Version=$containerd_ver -X github.com/containerd/containerd/v2/version.Package=github.com/containerd/containerd/v2" \
  containerd=github.com/containerd/containerd/v2/cmd/containerd \
  ctr=github.com/containerd/containerd/v2/cmd/ctr \
  containerd-shim-runc-v2=github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2
# Kubernetes' hack/lib/version.sh sets these in both version packages; the
# module proxy gives no commit, so gitCommit stays empty and the build date is
# the release's (reproducible builds, a stable stamp).
kube_ver=$(modver kubernetes k8s.io/kubernetes)
kube_date=$(modver kubernetes k8s.io/kubernetes date)
kube_major=${kube_ver#v}; kube_major=${kube_major%%.*}
kube_minor=${kube_ver#v*.}; kube_minor=${kube_minor%%.*}
kube_ldflags=
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kube_ldflags+=" -X $pkg.gitVersion=$kube_ver -X $pkg.gitMajor=$kube_major -X $pkg.gitMinor=$kube_minor"
  kube_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.gitCommit= -X $pkg.buildDate=$kube_date"
done
build kubernetes 0 "" "$kube_ldflags" \
  kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver \
  kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager \
  kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler \
  kubelet=k8s.io/kubernetes/cmd/kubelet \
  kube-proxy=k8s.io/kubernetes/cmd/kube-proxy
# Kubernetes' e2e suite and its agnhost test image's program, same release
# and stamps (their own wrapper module: the suite's dependencies stay out of
# the control plane's).
# kubectl (the e2e tests exec it) and ginkgo (the suite's CLI, for parallel
# runs) from the same module.
if [ $e2e = 1 ]; then
  build kubernetes-e2e 0 "" "$kube_ldflags" \
    agnhost=k8s.io/kubernetes/test/images/agnhost \
    e2e.test=test:k8s.io/kubernetes/test/e2e \
    kubectl=k8s.io/kubernetes/cmd/kubectl \
    ginkgo=github.com/onsi/ginkgo/v2/ginkgo
fi
# The node's cluster DNS; its Makefile stamps the commit (the version is a
# constant of coremain): the module proxy has none, so the version's tag.
build coredns 0 "" "-X github.com/coredns/coredns/coremain.GitCommit=$(modver coredns github.com/coredns/coredns)" \
  coredns=github.com/coredns/coredns

# The sandbox image's process: sleeps until a signal, reaps children.
pause_stamp=$(sha256sum peers/pause/pause.c | cut -c1-16)
if [ ! -x "$bin/pause" ] || [ "$(cat "$cache/stamps/pause" 2>/dev/null)" != "$pause_stamp" ]; then
  cc -static -Os -o "$bin/pause" peers/pause/pause.c
  echo "$pause_stamp" >"$cache/stamps/pause"
  echo "peers: built pause"
fi
# The test workload image's program (tests/node.rs): HTTP/UDP echo and probe.
echo_stamp=$(sha256sum peers/echo/echo.c | cut -c1-16)
if [ ! -x "$bin/echo" ] || [ "$(cat "$cache/stamps/echo" 2>/dev/null)" != "$echo_stamp" ]; then
  cc -static -Os -o "$bin/echo" peers/echo/echo.c
  echo "$echo_stamp" >"$cache/stamps/echo"
  echo "peers: built echo"
fi
# Calico's own binaries (prebuilt; see CALICO_RELEASE_DIR above).
calico_src=${CALICO_RELEASE_DIR:-$root/../shared/calico/v3.32.1}
calico_dir=$bin/calico-v3.32.1
calico_missing() {
  if [ "${CI:-}" = true ]; then
    echo "peers: $1 (CI=true: Calico's binaries are required)" >&2
    exit 1
  fi
  echo "peers: $1; the tests that need Calico's binaries will skip" >&2
}
if [ -d "$calico_src" ]; then
  mkdir -p "$calico_dir"
  ok=1
  for name in calico calicoctl calico-felix; do
    if [ -f "$calico_src/$name.xz" ]; then
      xz -dc "$calico_src/$name.xz" >"$calico_dir/$name.new"
    elif [ -f "$calico_src/$name" ]; then
      cp "$calico_src/$name" "$calico_dir/$name.new"
    else
      calico_missing "$calico_src has no $name or $name.xz"; ok=0; continue
    fi
    if [ -f "$calico_src/SHA256SUMS" ]; then
      want=$(awk -v n="$name" '$2 == n || $2 == "*" n { print $1 }' "$calico_src/SHA256SUMS")
      got=$(sha256sum "$calico_dir/$name.new" | cut -d' ' -f1)
      if [ "$want" != "$got" ]; then
        rm -f "$calico_dir/$name.new"
        calico_missing "$name from $calico_src does not match SHA256SUMS (want ${want:-nothing}, got $got)"
        ok=0; continue
      fi
    fi
    chmod 0755 "$calico_dir/$name.new"
    mv -f "$calico_dir/$name.new" "$calico_dir/$name"
  done
  ln -sf calico "$calico_dir/calico-ipam"
  [ $ok = 1 ] && echo "peers: Calico $("$calico_dir/calico" -v 2>/dev/null) in $calico_dir"
else
  calico_missing "no Calico binaries at $calico_src (set CALICO_RELEASE_DIR)"
fi
echo "peers: all in $bin"
