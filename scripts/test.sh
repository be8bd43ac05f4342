#!/usr/bin/env bash
# The whole test suite, as root on a fresh Debian 12 machine: installs what
# the tests need, then lint, unit, integration (real netns) and smoke runs.
set -euo pipefail
cd "$(dirname "$0")/.."

[ "$(id -u)" = 0 ] || { echo "run as root: the tests create network namespaces" >&2; exit 1; }
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
  iproute2 iputils-ping containernetworking-plugins time sqlite3 >/dev/null
bash scripts/install-cnitool.sh

cargo fmt --all -- --check
cargo clippy --locked --all-targets --features fault-injection -- -D warnings
cargo test --locked --features fault-injection
# The benchmark harness in a small configuration: fails on any failure or leak.
cargo build --locked --release --bins --examples
cargo run --locked --release --example bench -- --smoke
