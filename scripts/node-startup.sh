#!/usr/bin/env bash
# Pod start-up on the whole Calico node (Felix and kube-proxy running),
# ours against Calico v3.32.1's binary in one run: for each, the binary
# (and its conflist: Calico's stock text at cniVersion 0.3.1 for Calico's,
# which answers no STATUS; the node's for ours) put in the node's
# /opt/cni/bin as an installer would, then 1 pod and 50 at once
# (scripts/node-startup.py: creation -> Running -> first connection,
# p50/p99), with every exec of the plugin timed (scripts/node-cni-cost.sh:
# CPU per pod, split by CNI command; API requests per pod). Ours is the
# release build (target/x86_64-unknown-linux-musl/release/calico; CALICO_BIN
# names another), as a node runs it. The node's own plugin is put back at
# the end.
#
# Usage: scripts/node-startup.sh [ROUNDS]    (default 1: 1 pod, then 50)
# Output: one JSON line per binary and batch on stdout, a table on stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
eval "$(bash scripts/testbed.sh env)"
[ -n "${TESTBED_NODE_DIR:-}" ] || { echo "node-startup: no node (scripts/testbed.sh up --node)" >&2; exit 1; }
rounds=${1:-1}
cni_bin=$TESTBED_NODE_DIR/host/opt/cni/bin
conflist=$TESTBED_NODE_DIR/host/etc/cni/net.d/10-calico.conflist
ours=${CALICO_BIN:-$root/target/x86_64-unknown-linux-musl/release/calico}
theirs=$PEERS_BIN/calico-v3.32.1/calico
[ -x "$ours" ] || { echo "node-startup: no binary at $ours (cargo build --release)" >&2; exit 1; }
[ -x "$theirs" ] || { echo "node-startup: no Calico binary at $theirs (scripts/peers.sh)" >&2; exit 1; }

work=$TESTBED_NODE_DIR/startup
mkdir -p "$work"
cp "$cni_bin/calico" "$work/calico.node"
cp "$conflist" "$work/conflist.node"
made_nodename=0
restore() {
  bash scripts/node-cni-cost.sh unwrap || true
  put "$work/calico.node" "$cni_bin/calico" 0755
  put "$work/conflist.node" "$conflist" 0644
  [ $made_nodename = 1 ] && rm -f /var/lib/calico/nodename
  return 0
}
trap restore EXIT
# put SRC DEST MODE: a new file renamed over the old, as an installer writes.
put() {
  cp "$1" "$2.startup"
  chmod "$3" "$2.startup"
  mv -f "$2.startup" "$2"
}
# Calico's binary insists on the node name calico-node writes.
if [ ! -f /var/lib/calico/nodename ]; then
  mkdir -p /var/lib/calico
  echo "$TESTBED_NODE" >/var/lib/calico/nodename
  made_nodename=1
fi
jq '.cniVersion = "0.3.1"' "$work/conflist.node" >"$work/conflist.calico"

for round in $(seq "$rounds"); do
  for which in ours calico; do
    if [ $which = ours ]; then
      put "$ours" "$cni_bin/calico" 0755
      put "$work/conflist.node" "$conflist" 0644
    else
      put "$theirs" "$cni_bin/calico" 0755
      put "$work/conflist.calico" "$conflist" 0644
    fi
    for n in 1 50; do
      bash scripts/node-cni-cost.sh wrap
      since=$(date +%s.%N)
      startup=$(python3 scripts/node-startup.py "$n")
      # (The DELs of the deleted pods included: node-startup.py waits them out.)
      cost=$(bash scripts/node-cni-cost.sh report "$since" 2>/dev/null)
      bash scripts/node-cni-cost.sh unwrap
      jq -cn --arg b "$which" --argjson r "$round" --argjson s "$startup" --argjson c "$cost" --argjson n "$n" '{
        binary: $b, round: $r, startup: $s,
        cpu_ms_per_pod: (([$c.calls | to_entries[] | select(.key != "STATUS") | .value.count * .value.cpu_ms_mean] | add // 0) / $n | . * 10 | round / 10),
        cpu_ms_by_command: ($c.calls | with_entries(.value = {count: .value.count, cpu_ms_mean: .value.cpu_ms_mean, api_requests: .value.api_requests})),
        api_requests_per_pod: (([$c.calls | to_entries[] | select(.key != "STATUS") | .value.api_requests] | add // 0) / $n | . * 10 | round / 10)}'
    done
  done
done | tee "$work/results.jsonl"
jq -r '"\(.binary)\t\(.startup.pods) pods\trunning p50 \(.startup.to_running_ms.p50) p99 \(.startup.to_running_ms.p99) ms\tconnected p50 \(.startup.to_first_connection_ms.p50) p99 \(.startup.to_first_connection_ms.p99) ms\tCNI CPU \(.cpu_ms_per_pod) ms/pod \(.cpu_ms_by_command)\tAPI \(.api_requests_per_pod)/pod"' \
  "$work/results.jsonl" >&2
