#!/usr/bin/env bash
# Kubernetes' own network tests against the test bed's node: a whole Calico
# node (a real kubelet and containerd, this plugin installed by `calico
# install`, Calico's Felix enforcing policy, kube-proxy, CoreDNS;
# scripts/testbed-node.sh), with the e2e suite of the node's Kubernetes
# release (k8s.io/kubernetes/test/e2e, built as e2e.test) run by its ginkgo
# CLI, E2E_PROCS tests at a time.
#
# Usage: scripts/node-e2e.sh [SET] [extra e2e.test flags]
#   --conformance  (the default) every `[sig-network] ... [Conformance]` test
#                  (47 in v1.36.3): pod networking, DNS, Services (ClusterIP,
#                  NodePort, session affinity), EndpointSlices, HostPort,
#                  Proxy, Ingress and ServiceCIDR APIs
#   --netpol       every `[sig-network] Netpol` test (NetworkPolicy, enforced
#                  by Felix); the SCTP ones skipped when this kernel has no
#                  SCTP (/proc/sys/net/sctp absent)
#   --netpol-ci    the fixed subset CI runs (below): default deny, ingress and
#                  egress allowed by pod and namespace selector, ports
#   --pods         the four pod-network conformance tests only
#   E2E_FOCUS      a ginkgo focus of your own (overrides SET)
#   E2E_PROCS      tests run at once (default 4)
#   E2E_REPORT     report directory (default target/node-e2e): the suite's log
#                  (e2e.log), its JUnit report (junit.xml) and a summary
#                  (summary.txt, one line per test)
# Builds e2e.test, agnhost, kubectl and ginkgo (scripts/peers.sh --e2e,
# cached; a cold build takes minutes), brings the test bed and its node up
# when they are not, and leaves them up. The node runs the debug build's
# plugin (CALICO_BIN: see scripts/testbed-node.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
[ "$(id -u)" = 0 ] || { echo "node-e2e: run as root" >&2; exit 1; }
set_name=${1:---conformance}
case $set_name in
  --conformance|--netpol|--netpol-ci|--pods) shift || true ;;
  -*) set_name=--conformance ;;
esac
skip='\[Disruptive\]'
sctp_skip=
[ -d /proc/sys/net/sctp ] || sctp_skip='SCTP'
case $set_name in
  --conformance) focus='\[sig-network\].*\[Conformance\]' ;;
  --netpol) focus='\[sig-network\] Netpol' ;;
  --netpol-ci)
    # Default deny (ingress; all), ingress allowed by pod selector and by
    # namespace selector, egress allowed to a pod in another namespace and
    # denied by pod selector, ports (TCP and UDP, named).
    focus='\[sig-network\] Netpol .*should (support a .default-deny-ingress. policy|support a .default-deny-all. policy|enforce policy to allow traffic from pods within server namespace based on PodSelector|enforce policy to allow traffic only from a different namespace, based on NamespaceSelector|enforce egress policy allowing traffic to a server in a different namespace based on PodSelector and NamespaceSelector|deny egress from pods based on PodSelector|enforce policy based on Ports|allow ingress access on one named port) ' ;;
  --pods) focus='\[sig-network\] Networking Granular Checks: Pods should function for (intra|node)-pod communication: (http|udp)' ;;
esac
[ -n "${E2E_FOCUS:-}" ] && { focus=$E2E_FOCUS; set_name="E2E_FOCUS=$E2E_FOCUS"; }
procs=${E2E_PROCS:-4}
report=${E2E_REPORT:-$root/target/node-e2e}

# The e2e images' tools are this machine's (curl, nc, dig, ...), Felix's
# image's too (ipset, conntrack, nft).
if ! command -v nc >/dev/null || ! command -v dig >/dev/null || ! command -v ipset >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    netcat-openbsd bind9-dnsutils ipset conntrack nftables >/dev/null
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
start=$SECONDS
"$bin/ginkgo" --procs="$procs" --no-color -v --focus="$focus" --skip="${sctp_skip:+$sctp_skip|}$skip" \
  --timeout=60m --output-dir="$report" --junit-report=junit.xml "$bin/e2e.test" -- \
  --kubeconfig="$KUBECONFIG" --provider=skeleton \
  --allowed-not-ready-nodes="$others" --minStartupPods=-1 --node-schedulable-timeout=2m \
  "$@" 2>&1 | tee "$report/e2e.log"
rc=${PIPESTATUS[0]}
set -e

# One line per test: its result and time.
if [ -f "$report/junit.xml" ]; then
  python3 - "$report/junit.xml" >"$report/summary.txt" <<'EOF'
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
  sort -k4 "$report/summary.txt"
  echo "node-e2e: $set_name: $(grep -c '^PASS' "$report/summary.txt") passed," \
    "$(grep -c '^FAIL' "$report/summary.txt") failed in $((SECONDS - start)) s" \
    "(${sctp_skip:+SCTP skipped: this kernel has none; }$procs at once)"
fi
echo "node-e2e: ginkgo exited $rc"
exit "$rc"
