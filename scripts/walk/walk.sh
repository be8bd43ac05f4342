#!/usr/bin/env bash
# The walk through the code that one Kubernetes-mode ADD takes (the
# measure of the plugin layer's shape): the debug binary runs one ADD of a
# pod on the test bed's API server (Kubernetes datastore, calico-ipam in
# process, policy k8s) under gdb, which records every call of one of our
# functions in order (scripts/walk/trace.py); scripts/walk/summary.py turns
# the calls into the walk a reader following the request takes: stays
# (each time the reading moves to another file), files, climbs back up (a
# call into a file of a higher tier: scripts/walk/summary.py), and how often
# each file is entered.
#
# Usage: bash scripts/walk/walk.sh   (as root; builds the debug binary, starts
# the test bed if needed). WALK_KEEP=1 keeps the trace in /tmp/walk.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
cargo build --quiet --bin calico
bash scripts/testbed.sh up >/dev/null
eval "$(bash scripts/testbed.sh env)"
work=$(mktemp -d /tmp/walk.XXXXXX)
tag=walk$$
ns=walk-$tag node=walk-node-$tag pool=walk-pool-$tag netns=walk-$tag
admin() {
  curl -sS --fail-with-body --cacert "$TESTBED_CA" --cert "$TESTBED_ADMIN_CERT" --key "$TESTBED_ADMIN_KEY" \
    -X "$1" -H 'Content-Type: application/json' "$TESTBED_API$2" ${3:+--data-binary "$3"} >/dev/null
}
cleanup() {
  ip netns del "$netns" 2>/dev/null || true
  admin DELETE "/api/v1/namespaces/$ns" || true
  admin DELETE "/api/v1/nodes/$node" || true
  admin DELETE "/apis/crd.projectcalico.org/v1/ippools/$pool" || true
  for plural in ipamhandles ipamblocks blockaffinities; do
    curl -sS --cacert "$TESTBED_CA" --cert "$TESTBED_ADMIN_CERT" --key "$TESTBED_ADMIN_KEY" \
      "$TESTBED_API/apis/crd.projectcalico.org/v1/$plural" |
      jq -r --arg n "$node" '.items[] | select((.spec.node // .spec.attributes[0].secondary.node // "") == $n or (.spec.cidr // "" | startswith("10.252.0."))) | .metadata.name' |
      while read -r name; do admin DELETE "/apis/crd.projectcalico.org/v1/$plural/$name" || true; done
  done
  [ "${WALK_KEEP:-}" = 1 ] || rm -rf "$work"
}
trap cleanup EXIT
admin POST /api/v1/namespaces "{\"metadata\":{\"name\":\"$ns\"}}"
admin POST /api/v1/nodes "{\"metadata\":{\"name\":\"$node\"}}"
admin POST /apis/crd.projectcalico.org/v1/ippools \
  "{\"apiVersion\":\"crd.projectcalico.org/v1\",\"kind\":\"IPPool\",\"metadata\":{\"name\":\"$pool\"},\"spec\":{\"cidr\":\"10.252.0.0/24\",\"blockSize\":28,\"nodeSelector\":\"all()\"}}"
admin POST "/api/v1/namespaces/$ns/pods" \
  "{\"metadata\":{\"name\":\"pod1\",\"labels\":{\"app\":\"walk\"}},\"spec\":{\"nodeName\":\"$node\",\"containers\":[{\"name\":\"c\",\"image\":\"i\"}]}}"
ip netns add "$netns"
mkdir -p "$work/bin"
ln -s "$root/target/x86_64-unknown-linux-musl/debug/calico" "$work/bin/calico"
ln -s "$root/target/x86_64-unknown-linux-musl/debug/calico" "$work/bin/calico-ipam"
jq -n --arg node "$node" --arg kc "$CALICO_CNI_KUBECONFIG" --arg dir "$work" '{
  cniVersion: "1.0.0", name: "k8s-pod-network", type: "calico", nodename: $node,
  datastore_type: "kubernetes", kubernetes: {kubeconfig: $kc}, policy: {type: "k8s"},
  log_file_path: ($dir + "/cni.log"), mtu_file: ($dir + "/mtu"), ipam_lock_file: ($dir + "/ipam.lock"),
  release_queue_dir: ($dir + "/queue"), ipam: {type: "calico-ipam"}}' >"$work/conf.json"
export WALK_OUT=$work/calls.jsonl WALK_STDIN=$work/conf.json WALK_SYMBOLS=$work/symbols
nm -C --defined-only "$root/target/x86_64-unknown-linux-musl/debug/calico" >"$WALK_SYMBOLS"
env -i PATH="$PATH" WALK_OUT="$WALK_OUT" WALK_STDIN="$WALK_STDIN" WALK_SYMBOLS="$WALK_SYMBOLS" \
  CNI_COMMAND=ADD CNI_CONTAINERID="0123456789$tag" CNI_NETNS="/var/run/netns/$netns" CNI_IFNAME=eth0 \
  CNI_PATH="$work/bin" CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=$ns;K8S_POD_NAME=pod1;K8S_POD_INFRA_CONTAINER_ID=0123456789$tag" \
  gdb -batch -nx -x "$root/scripts/walk/trace.py" "$work/bin/calico" >"$work/gdb.log" 2>&1 || true
grep -q '"ips"' "$work/gdb.log" || { cat "$work/gdb.log" >&2; echo "walk: the ADD failed" >&2; exit 1; }
python3 scripts/walk/summary.py "$WALK_OUT"
