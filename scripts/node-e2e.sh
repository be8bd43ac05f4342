#!/usr/bin/env bash
# Kubernetes' own pod-network conformance tests against the test bed's node
# (a real kubelet and containerd, this plugin installed by `calico install`):
# the e2e suite of the node's Kubernetes release (k8s.io/kubernetes/test/e2e,
# built as e2e.test) focused on `[sig-network] Networking Granular Checks:
# Pods`, whose four conformance tests are
#   should function for intra-pod communication: http
#   should function for intra-pod communication: udp
#   should function for node-pod communication: http [LinuxOnly]
#   should function for node-pod communication: udp [LinuxOnly]
# (the two sctp tests are not conformance tests, [Feature:SCTPConnectivity],
# and are left out). Each creates agnhost `netexec` pods, one per ready node
# (one here), a test pod and, for node-pod, a host-network pod, then execs
# curl and nc in them through the API server and kubelet.
#
# Usage: scripts/node-e2e.sh [extra e2e.test flags]
#   E2E_FOCUS   the ginkgo focus (default: the four tests above)
#   E2E_REPORT  report directory (default target/node-e2e): the suite's log
#               (e2e.log), its JUnit report (junit_01.xml) and a summary
#               (summary.txt, one line per test)
# Builds e2e.test and agnhost (scripts/peers.sh --e2e, cached; a cold build
# takes minutes), brings the test bed and its node up when they are not, and
# leaves them up. The node runs the debug build's plugin (CALICO_BIN: see
# scripts/testbed-node.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
[ "$(id -u)" = 0 ] || { echo "node-e2e: run as root" >&2; exit 1; }
focus=${E2E_FOCUS:-'\[sig-network\] Networking Granular Checks: Pods should function for (intra|node)-pod communication: (http|udp)'}
report=${E2E_REPORT:-$root/target/node-e2e}

# The agnhost image's tools: this machine's curl, nc and grep.
if ! command -v nc >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends netcat-openbsd >/dev/null
fi
bash scripts/peers.sh --e2e
bin=$(bash scripts/peers.sh --print-bin)

eval "$(bash scripts/testbed.sh env)"
if [ -z "${TESTBED_NODE:-}" ]; then
  [ -x target/x86_64-unknown-linux-musl/debug/calico ] || [ -n "${CALICO_BIN:-}" ] ||
    cargo build --features fault-injection
  bash scripts/testbed.sh up --node
  eval "$(bash scripts/testbed.sh env)"
fi
bash scripts/testbed.sh node-import-e2e-images

# The test bed's other Nodes (objects the datastore tests make, with no
# kubelet) are never Ready: the suite is told how many to expect, and runs
# on the ready one. No system pods run here (the control plane is
# processes), so the suite does not wait for any.
nodes=$(curl -sS --fail --max-time 30 --cacert "$TESTBED_CA" --cert "$TESTBED_ADMIN_CERT" \
  --key "$TESTBED_ADMIN_KEY" "$TESTBED_API/api/v1/nodes")
others=$(jq --arg n "$TESTBED_NODE" '[.items[] | select(.metadata.name != $n)] | length' <<<"$nodes")

rm -rf "$report"
mkdir -p "$report"
set +e
"$bin/e2e.test" --kubeconfig="$KUBECONFIG" --provider=skeleton \
  --ginkgo.focus="$focus" --ginkgo.v --ginkgo.no-color --ginkgo.timeout=30m \
  --allowed-not-ready-nodes="$others" --minStartupPods=-1 --node-schedulable-timeout=2m \
  --report-dir="$report" "$@" 2>&1 | tee "$report/e2e.log"
rc=${PIPESTATUS[0]}
set -e

# One line per test: its result and time.
if [ -f "$report/junit_01.xml" ]; then
  python3 - "$report/junit_01.xml" >"$report/summary.txt" <<'EOF'
import sys
import xml.etree.ElementTree as ET
for case in ET.parse(sys.argv[1]).getroot().iter("testcase"):
    if case.find("skipped") is not None:
        continue
    failed = case.find("failure") is not None or case.find("error") is not None
    # (The suite's own set-up and reports, unless they failed.)
    if not failed and not case.get("name", "").startswith("[It]"):
        continue
    print(f"{'FAIL' if failed else 'PASS'} {float(case.get('time', 0)):6.1f} s  {case.get('name')}")
EOF
  echo "node-e2e: results ($report/summary.txt):"
  cat "$report/summary.txt"
fi
echo "node-e2e: e2e.test exited $rc"
exit "$rc"
