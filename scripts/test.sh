#!/usr/bin/env bash
# The whole test suite, as root on a fresh Debian 12 machine: installs what
# the tests need, builds the real peers (scripts/peers.sh, cached), starts
# the test bed (scripts/testbed.sh: etcd, kube-apiserver,
# kube-controller-manager on loopback), then lint, unit, integration (real
# netns, real API server, containerd) and smoke runs; the test bed is
# stopped at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

[ "$(id -u)" = 0 ] || { echo "run as root: the tests create network namespaces" >&2; exit 1; }
t0=$SECONDS
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
  iproute2 iputils-ping containernetworking-plugins time sqlite3 \
  openssl curl jq runc iptables strace netcat-openbsd musl-tools \
  ipset conntrack nftables bind9-dnsutils >/dev/null
# The toolchain and the musl target rust-toolchain.toml names (rustup would
# fetch them at the first cargo call, unless RUSTUP_AUTO_INSTALL=0).
rustup toolchain install
bash scripts/install-cnitool.sh

bash scripts/peers.sh --e2e
echo "test.sh: peers ready at $((SECONDS - t0)) s"
trap 'bash scripts/testbed.sh down' EXIT
bash scripts/testbed.sh up
eval "$(bash scripts/testbed.sh env)"
echo "test.sh: test bed up at $((SECONDS - t0)) s"

cargo fmt --all -- --check
cargo clippy --locked --all-targets --features fault-injection -- -D warnings
cargo test --locked --features fault-injection
# The Kubernetes datastore's IPAM suites again on Calico v3.32's native v3
# CRDs (`calico_api_group: projectcalico.org/v3`; tests/common/ipam.rs).
CALICO_TEST_API_GROUP=projectcalico.org/v3 \
  cargo test --locked --features fault-injection --test calico_ipam --test ipam_cooldown -- kdd
echo "test.sh: tests done at $((SECONDS - t0)) s"
# The node stage: a real kubelet, kube-scheduler and containerd on the test
# bed with Calico's Felix, kube-proxy and CoreDNS, this build installed by
# `calico install` (scripts/testbed-node.sh),
# after the other tests so that the node's plugin calls never meet theirs.
# (The node's tests are #[ignore]d in the run above; the plugin installed is
# the debug build that run made.)
bash scripts/testbed.sh up --node
eval "$(bash scripts/testbed.sh env)"
cargo test --locked --features fault-injection --test node -- --ignored --test-threads=1
# Kubernetes' own tests on that node, a whole Calico node (Calico's Felix
# enforcing policy, kube-proxy, CoreDNS): every [sig-network] conformance
# test, then the fixed NetworkPolicy subset (scripts/node-e2e.sh).
E2E_REPORT=target/node-e2e/conformance bash scripts/node-e2e.sh --conformance
E2E_REPORT=target/node-e2e/netpol-ci bash scripts/node-e2e.sh --netpol-ci
# (Down before the benchmark, which the node's own work would disturb.)
bash scripts/testbed.sh node-down
echo "test.sh: node stage done at $((SECONDS - t0)) s"
# The benchmark harness in a small configuration: fails on any failure or leak.
cargo build --locked --release --bins --examples
# The release link: fails when link/symbol-order.txt has gone stale.
bash scripts/check-symbol-order.sh
cargo run --locked --release --example bench -- --smoke
# A cluster simulated on the test bed's API server (examples/cluster_scale.rs):
# 20 nodes' pod churn through calico-ipam, ours and Calico v3.32.1's, with
# kube-apiserver restarted halfway and 1 call in 50 SIGKILLed; fails on a
# duplicate address, a misallocation or a leak.
cargo run --locked --release --example cluster_scale -- \
  --backend kdd --nodes 20 --ops 1000 --fault apiserver --kill-every 50
# And ours alone with one node's traffic black-holed for 20 s, then the node
# lost and its IPAM released as kube-controllers releases it.
cargo run --locked --release --example cluster_scale -- \
  --backend kdd --nodes 20 --ops 600 --fault blackhole --hole-seconds 20 --kill-every 50 --binary ours
echo "test.sh: cluster simulation done at $((SECONDS - t0)) s"
# The README's run command on a machine with nothing but Rust: a rustup home
# with the host target only, no musl-gcc on PATH (copies; a cold release build).
bash scripts/first-command.sh
echo "test.sh: all done in $((SECONDS - t0)) s"
