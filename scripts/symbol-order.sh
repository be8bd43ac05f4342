#!/usr/bin/env bash
# Regenerates link/symbol-order.txt: the functions that plain-CNI ADD, CHECK,
# DEL (netns present and gone), STATUS, VERSION and an error answer execute,
# at the default and the debug log level, with host-local and with
# calico-ipam in process (on a pool in the embedded store); and, when the
# test bed is up (`eval "$(bash scripts/testbed.sh env)"`), the Kubernetes
# and etcd paths too: the bench's datastore rows for our binary, small.
# build.rs hands the file to lld (--symbol-ordering-file), which places
# those functions together at the start of .text.
#
# Why: the kernel maps 64 KiB around every page fault in a file mapping, so
# when the ~1.2 MB of code an invocation runs is scattered over 5 MB of text,
# nearly all of the text becomes resident and peak RSS follows binary size.
#
# How: callgrind lists every function the workloads execute (under valgrind's
# CPU model); then, on the real CPU, the workloads run under perf's
# page-fault tracepoint and every instruction fetch that faults outside the
# packed functions names a function valgrind did not see (AVX-512 variants
# of glibc's string functions, the store's WAL checkpoint, timing-dependent
# paths); those are added and the binary relinked until no such fault is
# left (a fault maps 64 KiB, hiding its neighbours until the next pass).
#
# Names carry a hash per crate version, toolchain and profile, and LTO gives
# some local functions numbered names, so regenerate after changing
# Cargo.lock, the toolchain or much of the code: stale names are skipped by
# the linker and the benefit fades (scripts/check-symbol-order.sh fails past
# 3% missing names; the smoke bench, when peak RSS passes ptp's). Needs
# root (network namespaces), valgrind, jq, Debian's containernetworking-plugins
# and, for the fault passes, perf (linux-perf). Takes about 13 minutes, 17
# with the test bed.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR=target/symbol-order
bin=$CARGO_TARGET_DIR/x86_64-unknown-linux-musl/release/calico
order=link/symbol-order.txt

# One invocation, run by WRAPPER... (valgrind, or nothing); stdout to $work/out.
# ($work/bin/calico-ipam is a link to $bin: calico-ipam runs in process.)
# (The test bed's environment names its datastores: not for these calls.)
cni() { # verb netns stdin wrapper...
  (
    unset DATASTORE_TYPE ETCD_ENDPOINTS KUBECONFIG
    CNI_COMMAND=$1 CNI_CONTAINERID=symorder CNI_NETNS=$2 CNI_IFNAME=eth0 \
      CNI_PATH=$work/bin:/usr/lib/cni "${@:4}" "$bin" <<<"$3" >"$work/out" 2>/dev/null || true
  )
}

# Each round: every invocation at the default and at the debug log level,
# with host-local and with calico-ipam.
workloads() { # rounds wrapper...
  local rounds=$1 result conf level ipam
  shift
  for _ in $(seq "$rounds"); do
    for level in info debug; do
     for ipam in '{"type":"host-local","subnet":"10.250.0.0/24","dataDir":"'$work'/ipam"}' \
       '{"type":"calico-ipam"}'; do
      conf='{"cniVersion":"1.0.0","name":"symorder","type":"calico","nodename":"n1",
       "log_level":"'$level'","log_file_path":"'$work'/cni.log",
       "local_datastore_path":"'$work'/store.db","mtu_file":"'$work'/mtu",
       "ipam_lock_file":"'$work'/ipam.lock","ipam":'$ipam'}'
      ip netns add "$ns"
      cni VERSION "" "$conf" "$@"
      cni ADD "/var/run/netns/$ns" "$conf" "$@"
      result=$(cat "$work/out")
      jq -en --argjson r "$result" '$r.ips[0]' >/dev/null 2>&1 || { echo "profiled ADD failed: $result" >&2; exit 1; }
      cni CHECK "/var/run/netns/$ns" "$(jq --argjson r "$result" '. + {prevResult: $r}' <<<"$conf")" "$@"
      cni STATUS "" "$(jq '.cniVersion = "1.1.0"' <<<"$conf")" "$@"
      cni DEL "/var/run/netns/$ns" "$conf" "$@"
      ip netns del "$ns"
      cni DEL "/var/run/netns/$ns" "$conf" "$@"
      cni ADD "/var/run/netns/$ns" '{"cniVersion": "1.0.0", "name":' "$@"
     done
    done
  done
}

# The Kubernetes and etcd paths, with the test bed up: the bench's datastore
# rows for our binary (CALICO_BIN: $bin, or $1/calico, a wrapper), 2 pods a
# row and a burst of 2. The bench's plain rows run too (on $bin), briefly.
remote() { # [wrapper-dir]
  [ -n "${TESTBED_API:-}" ] || return 0
  CALICO_BIN=$(realpath "${1:-$(dirname "$bin")}")/calico "$CARGO_TARGET_DIR/x86_64-unknown-linux-musl/release/examples/bench" \
    --n 2 --conc 1 --datastores 2,2 --only ours >"$work/bench.out" 2>&1 ||
    { echo "the bench's datastore rows failed:" >&2; tail -20 "$work/bench.out" >&2; exit 1; }
}

# The fault passes run the workloads in a child under one perf session.
if [ "${1:-}" = --workloads ]; then
  workloads "$2"
  remote
  exit
fi

[ "$(id -u)" = 0 ] || { echo "run as root: it creates network namespaces" >&2; exit 1; }
for pkg in valgrind jq linux-perf; do
  dpkg -s "$pkg" >/dev/null 2>&1 || apt-get install -y -qq "$pkg" >/dev/null
done
build() { CALICO_LINK_KEEP_SYMBOLS=1 cargo build --locked --release --bin calico; }
if [ -n "${TESTBED_API:-}" ]; then
  CALICO_LINK_KEEP_SYMBOLS=1 cargo build --locked --release --example bench
else
  echo "no test bed: the Kubernetes and etcd paths are left out" >&2
fi

export work ns=symorder$$
work=$(mktemp -d)
cleanup() { ip netns del "$ns" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
mkdir -p link

build
# calico-ipam's pool, in the store every workload uses.
mkdir -p "$work/bin"
ln -s "$(realpath "$bin")" "$work/bin/calico-ipam"
echo '{"name":"symorder","cniVersion":"1.0.0","plugins":[{"type":"calico",
  "local_datastore_path":"'$work'/store.db"}]}' >"$work/pool.conflist"
(unset DATASTORE_TYPE ETCD_ENDPOINTS KUBECONFIG
  "$bin" ipam pool add symorder 10.251.0.0/16 --config "$work/pool.conflist" >/dev/null)
# SYMBOL_ORDER_FAULT_PASSES_ONLY=1: keep the callgrind list the order file
# already has and run the fault passes only.
if [ -z "${SYMBOL_ORDER_FAULT_PASSES_ONLY:-}" ]; then
  # (%p: each call runs in a subshell of its own.)
  grind() { valgrind -q --tool=callgrind --demangle=no --callgrind-out-file="$work/cg.%p" "$@"; }
  workloads 1 grind
  # The remote paths under callgrind: a wrapper named calico runs the binary
  # under the name it was called by (the bench links calico-ipam to it), so
  # calico-ipam runs as its own process here, in process in the fault passes.
  mkdir -p "$work/grind" "$work/real"
  ln -s "$(realpath "$bin")" "$work/real/calico"
  ln -s "$(realpath "$bin")" "$work/real/calico-ipam"
  printf '#!/bin/sh\nexec valgrind -q --tool=callgrind --demangle=no --callgrind-out-file=%s/cg.remote.%%p %s/real/"$(basename "$0")" "$@"\n' \
    "$work" "$work" >"$work/grind/calico"
  chmod +x "$work/grind/calico"
  remote "$work/grind"
  # callgrind names a function once per file as "fn=(id) name" (or cfn= when
  # first seen as a callee); "'N" marks recursion depth.
  cat "$work"/cg.* | grep -oE '^c?fn=\([0-9]+\) .*' | sed -E "s/^c?fn=\([0-9]+\) //; s/'[0-9]+\$//" |
    awk '!seen[$0]++ && $0 !~ /^[(]|^0x/' >"$order"
  echo "callgrind: $(wc -l <"$order") functions"
fi

if [ "$(perf list 2>/dev/null | grep -c 'exceptions:page_fault_user')" = 0 ]; then
  echo "perf's page-fault tracepoint is not available: fault passes skipped" >&2
  exit 0
fi
for pass in $(seq 8); do
  build
  # Enough rounds for the store's WAL checkpoint to run too.
  perf record -q -e exceptions:page_fault_user -o "$work/faults" -- bash "$0" --workloads 5
  nm -S --defined-only "$bin" >"$work/symbols"
  perf script -i "$work/faults" -F pid,comm,trace 2>/dev/null >"$work/faults.txt"
  python3 - "$work/symbols" "$work/faults.txt" "$order" >"$work/new" <<'EOF'
import bisect, re, sys
symbols, faults, order = sys.argv[1:]
funcs = []
for line in open(symbols):
    f = line.split()
    if len(f) == 4 and f[2] in "tTW":
        funcs.append((int(f[0], 16), int(f[1], 16), f[3]))
funcs.sort()
starts = [f[0] for f in funcs]
listed = set(l.strip() for l in open(order))
events = [l.split(None, 2) for l in open(faults)]
# The plugin's processes (threads share the pid; only the main thread is
# named calico), not host-local's, ip's or the shell's.
ours = {pid for comm, pid, _ in events if comm == "calico"}
new = []
for _, pid, trace in events:
    m = re.search(r"address=(0x[0-9a-f]+) ip=\S+ error_code=(0x[0-9a-f]+)", trace)
    # Instruction fetches: error code bit 4.
    if pid not in ours or not m or not int(m[2], 16) & 0x10:
        continue
    addr = int(m[1], 16)
    i = bisect.bisect_right(starts, addr) - 1
    if i >= 0 and addr < funcs[i][0] + funcs[i][1] and funcs[i][2] not in listed:
        listed.add(funcs[i][2])
        new.append(funcs[i][2])
print("\n".join(new))
EOF
  added=$(grep -c . "$work/new" || true)
  echo "fault pass $pass: $added functions outside the packed ones"
  [ "$added" = 0 ] && break
  cat "$work/new" >>"$order"
done
echo "$order: $(wc -l <"$order") functions"
