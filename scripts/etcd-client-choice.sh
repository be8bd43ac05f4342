#!/usr/bin/env bash
# Measures release `calico` binaries against the test bed's Calico etcd
# cluster, for the etcd client's choice (BENCHMARKS.md, "etcd client: gRPC
# gateway vs etcd-client"). For each binary:
#   - its size on disk (build.rs strips it at link time);
#   - peak RSS (/usr/bin/time -v, largest of 5 calls) of `calico -t` and of
#     a calico-ipam ADD and DEL on etcd;
#   - latency (fork+exec+wait, median and p99) of N `calico -t` calls and of
#     N calico-ipam ADD/DEL pairs, and the median CPU time of those calls.
# calico-ipam alone is the IPAM-on-etcd part of an ADD: no netns work, so
# no root is needed for anything but the test bed itself.
#
#   bash scripts/etcd-client-choice.sh BINARY [BINARY...]
#
# With several binaries their calls alternate one by one (A, B, A, B, ...),
# so that load from elsewhere on the machine falls on each alike.
#   ETCD_CHOICE_N          calls of each kind per binary (default 200)
#   ETCD_CHOICE_ENDPOINTS  comma-separated, instead of the test bed's three
#                          (e.g. to pin one member)
#
# The test bed must be up (scripts/testbed.sh). An IPPool bench-pool
# (10.247.0.0/16) is put for the run and removed at the end (`calico ipam
# pool remove`). It is written with etcdctl in assignmentMode Manual, which
# `calico ipam pool add` cannot set, and the ADDs ask for it by name
# (ipv4_pools): other users of the shared cluster (tests running meanwhile)
# never allocate from it, and their pools' node selectors are never
# consulted for bench-node.
set -euo pipefail

[ $# -ge 1 ] || { echo "usage: $0 BINARY [BINARY...]" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
eval "$(bash "$here/testbed.sh" env)"
: "${TESTBED_CALICO_ETCD_ENDPOINTS:?the test bed is not up}"
endpoints=${ETCD_CHOICE_ENDPOINTS:-$TESTBED_CALICO_ETCD_ENDPOINTS}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# One directory per binary: the personality is the name it is run by.
dirs=()
for bin in "$@"; do
    d="$work/bin${#dirs[@]}"
    mkdir "$d"
    ln -s "$(realpath "$bin")" "$d/calico"
    ln -s "$(realpath "$bin")" "$d/calico-ipam"
    dirs+=("$d")
done

etcd=$(printf '"datastore_type":"etcdv3","etcd_endpoints":"%s","etcd_ca_cert_file":"%s","etcd_cert_file":"%s","etcd_key_file":"%s"' \
    "$endpoints" "$TESTBED_CALICO_ETCD_CA" \
    "$TESTBED_CALICO_ETCD_CERT" "$TESTBED_CALICO_ETCD_KEY")
printf '{"cniVersion":"1.0.0","name":"n","type":"calico",%s}\n' "$etcd" >"$work/test.conf"
printf '{"cniVersion":"1.0.0","name":"bench","plugins":[{"type":"calico",%s,"nodename":"bench-node","ipam":{"type":"calico-ipam"}}]}\n' \
    "$etcd" >"$work/pool.conflist"
printf '{"cniVersion":"1.0.0","name":"bench","type":"calico",%s,"nodename":"bench-node","ipam_lock_file":"%s/ipam.lock","ipam":{"type":"calico-ipam","ipv4_pools":["bench-pool"]}}\n' \
    "$etcd" "$work" >"$work/ipam.conf"

# ClusterInformation default, ready, as calico-node would have written it
# (and as tests/common/ipam.rs puts it), unless it is there.
etcdctl=("$PEERS_BIN/etcdctl" --endpoints="$TESTBED_CALICO_ETCD_ENDPOINTS"
    --cacert="$TESTBED_CALICO_ETCD_CA" --cert="$TESTBED_CALICO_ETCD_CERT"
    --key="$TESTBED_CALICO_ETCD_KEY")
ci=/calico/resources/v3/projectcalico.org/clusterinformations/default
if [ -z "$("${etcdctl[@]}" get "$ci" --keys-only)" ]; then
    "${etcdctl[@]}" put "$ci" '{"kind":"ClusterInformation","apiVersion":"projectcalico.org/v3","metadata":{"name":"default","uid":"6e1e1a3c-0000-4000-8000-000000000001","creationTimestamp":"2026-12-01T00:00:00Z"},"spec":{"clusterGUID":"0123456789abcdef0123456789abcdef","clusterType":"k8s,bgp","datastoreReady":true}}' >/dev/null
fi
for d in "${dirs[@]}"; do
    "$d/calico" -t <"$work/test.conf" || {
        echo "$(realpath "$d/calico") -t failed against $endpoints" >&2
        exit 1
    }
done
pool=/calico/resources/v3/projectcalico.org/ippools/bench-pool
if [ -n "$("${etcdctl[@]}" get "$pool" --keys-only)" ]; then
    echo "IPPool bench-pool exists already (a run in progress, or left over)" >&2
    exit 1
fi
"${etcdctl[@]}" put "$pool" '{"kind":"IPPool","apiVersion":"projectcalico.org/v3","metadata":{"name":"bench-pool","uid":"5d0c1b7e-0000-4000-8000-000000000247","creationTimestamp":"2026-12-01T00:00:00Z"},"spec":{"cidr":"10.247.0.0/16","vxlanMode":"Never","ipipMode":"Never","blockSize":26,"nodeSelector":"all()","allowedUses":["Workload","Tunnel"],"assignmentMode":"Manual"}}' >/dev/null
cleanup() {
    "${dirs[0]}/calico" ipam pool remove bench-pool --config "$work/pool.conflist" >/dev/null ||
        echo "could not remove IPPool bench-pool" >&2
    rm -rf "$work"
}
trap cleanup EXIT

echo "# $(date -u +%FT%TZ) endpoints $endpoints; loadavg $(cut -d' ' -f1-3 /proc/loadavg)"
WORK="$work" N="${ETCD_CHOICE_N:-200}" python3 - "${dirs[@]}" <<'EOF'
import os, statistics, subprocess, sys, time

work, n, dirs = os.environ["WORK"], int(os.environ["N"]), sys.argv[1:]
test_conf = open(f"{work}/test.conf", "rb").read()
ipam_conf = open(f"{work}/ipam.conf", "rb").read()
env = {"PATH": os.environ["PATH"]}
pid = os.getpid()

def cni(command, cid):
    return env | {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": "/x",
                  "CNI_IFNAME": "eth0", "CNI_PATH": cni.dir}

def run(argv, stdin, e, expect=b""):
    """Wall-clock ms (fork+exec+wait) and CPU ms (user+sys) of one call."""
    t = time.perf_counter()
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=e)
    p.stdin.write(stdin)
    p.stdin.close()
    out, err = p.stdout.read(), p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    ms = (time.perf_counter() - t) * 1000
    p.returncode = os.waitstatus_to_exitcode(status)
    p.stdout.close()
    p.stderr.close()
    if p.returncode != 0 or expect not in out:
        sys.exit(f"{argv} {e.get('CNI_COMMAND', '')} failed ({p.returncode}): "
                 f"{out.decode()} {err.decode()}")
    return ms, (ru.ru_utime + ru.ru_stime) * 1000

def rss(argv, stdin, e):
    """Peak RSS in KiB of one call, from /usr/bin/time -v."""
    p = subprocess.run(["/usr/bin/time", "-v", *argv], input=stdin, env=e,
                       capture_output=True)
    if p.returncode != 0:
        sys.exit(f"{argv} failed under time -v: {p.stderr.decode()}")
    for line in p.stderr.decode().splitlines():
        if "Maximum resident set size" in line:
            return int(line.split(":")[1])
    sys.exit("no RSS in time -v output")

def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]

res = {d: {"rss": {}, "ms": {}, "cpu": {}} for d in dirs}
def note(d, kind, ms_cpu):
    res[d]["ms"].setdefault(kind, []).append(ms_cpu[0])
    res[d]["cpu"].setdefault(kind, []).append(ms_cpu[1])
    return ms_cpu[0]

# Each binary's pages out of the page cache, to be read back by exec as on
# a node: a file just written (cp, the linker) sits in the cache in large
# folios, which fault-around maps whole (~+0.5 MiB of RSS here).
for d in dirs:
    fd = os.open(os.path.realpath(f"{d}/calico"), os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)

# Warm-up: the first ADD claims a block for bench-node; page cache.
for i in range(5):
    for d in dirs:
        cni.dir = d
        run([f"{d}/calico", "-t"], test_conf, env)
        cid = f"bench-warm-{pid}-{i}"
        run([f"{d}/calico-ipam"], ipam_conf, cni("ADD", cid), expect=b'"10.247.')
        run([f"{d}/calico-ipam"], ipam_conf, cni("DEL", cid))

for i in range(5):
    for d in dirs:
        cni.dir = d
        r = res[d]["rss"]
        r["-t"] = max(r.get("-t", 0), rss([f"{d}/calico", "-t"], test_conf, env))
        cid = f"bench-rss-{pid}-{i}"
        r["ADD"] = max(r.get("ADD", 0), rss([f"{d}/calico-ipam"], ipam_conf, cni("ADD", cid)))
        r["DEL"] = max(r.get("DEL", 0), rss([f"{d}/calico-ipam"], ipam_conf, cni("DEL", cid)))

for i in range(n):
    for d in dirs:
        note(d, "calico -t", run([f"{d}/calico", "-t"], test_conf, env))
for i in range(n):
    for d in dirs:
        cni.dir = d
        cid = f"bench-{pid}-{i}"
        a = note(d, "ipam ADD", run([f"{d}/calico-ipam"], ipam_conf, cni("ADD", cid)))
        b = note(d, "ipam DEL", run([f"{d}/calico-ipam"], ipam_conf, cni("DEL", cid)))
        res[d]["ms"].setdefault("ipam ADD+DEL", []).append(a + b)

for d in dirs:
    path = os.path.realpath(f"{d}/calico")
    size = os.stat(path).st_size
    r = res[d]["rss"]
    print(f"binary          {path}")
    print(f"size            {size} bytes ({size / 2**20:.2f} MiB)")
    print(f"peak RSS        calico -t {r['-t']} KiB; ipam ADD {r['ADD']} KiB, DEL {r['DEL']} KiB (max of 5)")
    for kind, xs in res[d]["ms"].items():
        print(f"latency         {kind:<13} n={len(xs)} median {statistics.median(xs):.2f} ms"
              f"  p99 {pct(xs, 0.99):.2f} ms")
    for kind, xs in res[d]["cpu"].items():
        print(f"CPU user+sys    {kind:<13} median {statistics.median(xs):.2f} ms")
    print()
EOF
