#!/usr/bin/env bash
# What the node's CNI plugin costs while kubelet and containerd drive it, on
# the test bed's node (scripts/testbed.sh up --node):
#
#   scripts/node-cni-cost.sh idle [SECONDS]   an idle node (default 180 s): how
#                 often the plugin is exec'd (STATUS, with cniVersion 1.1.0),
#                 and per call and per minute: API requests, CPU ms, bytes
#                 (COST_BYTES=0: no bytes, the kubeconfig left as it is)
#   scripts/node-cni-cost.sh wrap             every exec of the node's CNI
#                 binaries (calico, calico-ipam, portmap, loopback...) timed
#                 from now on (/usr/bin/time: wall, user, sys, peak RSS,
#                 the CNI command), its API traffic relayed through a counting
#                 proxy (scripts/count-proxy.py)
#   scripts/node-cni-cost.sh report SINCE [UNTIL]   the calls and requests
#                 between two epoch times (UNTIL: now), as JSON on stdout and
#                 a table on stderr
#   scripts/node-cni-cost.sh unwrap           the plugin and its kubeconfig
#                 as they were
#
# API requests are counted from the API server's audit log (the test bed
# logs every request of the plugin's identity, calico-cni-plugin, and of
# calico-node's, of which those with our user agent are the datastore watch
# `calico install --watch` keeps for STATUS: testbed/audit-policy.yaml),
# bytes by the proxy (TLS included; the plugin's only).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
eval "$(bash scripts/testbed.sh env)"
[ -n "${TESTBED_NODE_DIR:-}" ] || { echo "node-cni-cost: no node (scripts/testbed.sh up --node)" >&2; exit 1; }
cni_bin=$TESTBED_NODE_DIR/host/opt/cni/bin
cni_conf=$TESTBED_NODE_DIR/host/etc/cni/net.d
measured=$TESTBED_NODE_DIR/cni-cost
calls=$measured/calls.log
proxy_port=${TESTBED_COST_PROXY_PORT:-26458}
audit=$TESTBED_DIR/logs/audit.log

wrap() {
  [ -d "$measured/real" ] && return 0
  mkdir -p "$measured/real"
  : >"$calls"
  # Every CNI binary of the node (calico and the plugins it chains, portmap;
  # containerd's loopback): each exec timed, then the real binary run under
  # its own name.
  local f name
  for f in "$cni_bin"/*; do
    name=$(basename "$f")
    [ -f "$f" ] && [ -x "$f" ] && [ ! -L "$f" ] || continue
    case $name in *.wrap | *.unwrap) continue ;; esac
    cp "$f" "$measured/real/$name"
    cat >"$f.wrap" <<WRAPPER
#!/bin/sh
# scripts/node-cni-cost.sh: each call timed, then the real binary run under its own name.
exec /usr/bin/time -a -o "$calls" -f "%e %U %S %M \${CNI_COMMAND:-cli} \$(date +%s.%N) \$(basename "\$0")" \\
  "$measured/real/\$(basename "\$0")" "\$@"
WRAPPER
    chmod 0755 "$f.wrap"
    mv -f "$f.wrap" "$f"
  done
  # A symlink to a wrapped binary (calico-ipam -> calico) now points at the
  # real one: the plugin finds calico-ipam to be its own executable and runs
  # IPAM in process as on a real node; a plugin that execs it (Calico's) has
  # that exec's CPU counted in its own call's (time counts waited children).
  : >"$measured/links"
  for f in "$cni_bin"/*; do
    [ -L "$f" ] || continue
    local target
    target=$(readlink "$f")
    [ -f "$measured/real/$(basename "$target")" ] || continue
    echo "$(basename "$f") $target" >>"$measured/links"
    ln -sfn "$measured/real/$(basename "$target")" "$f"
  done
  # The plugin's API traffic through the counting relay (COST_BYTES=0: not,
  # and no bytes counted: the kubeconfig then names the server the
  # datastore watch of `calico install --watch` reports on, so its report
  # stands for STATUS's probe as on a node without the relay).
  cp "$cni_conf/calico-kubeconfig" "$measured/calico-kubeconfig.orig"
  echo '{"connections": 0, "bytes_up": 0, "bytes_down": 0}' >"$measured/bytes.json"
  [ "${COST_BYTES:-1}" = 0 ] && { : >"$measured/proxy.pid"; return 0; }
  local server
  server=$(grep -o 'server: https://[^ ]*' "$cni_conf/calico-kubeconfig" | head -1 | cut -d/ -f3)
  setsid python3 "$root/scripts/count-proxy.py" "$proxy_port" "$server" "$measured/bytes.json" \
    </dev/null >"$measured/proxy.log" 2>&1 &
  echo $! >"$measured/proxy.pid"
  sleep 0.5
  sed -e "s#server: https://$server#server: https://127.0.0.1:$proxy_port#" \
    "$measured/calico-kubeconfig.orig" >"$cni_conf/calico-kubeconfig.tmp"
  mv -f "$cni_conf/calico-kubeconfig.tmp" "$cni_conf/calico-kubeconfig"
  echo '{"connections": 0, "bytes_up": 0, "bytes_down": 0}' >"$measured/bytes.json"
}

unwrap() {
  [ -d "$measured/real" ] || return 0
  local f
  for f in "$measured/real"/*; do
    [ -L "$f" ] && continue
    cp "$f" "$cni_bin/$(basename "$f").unwrap"
    mv -f "$cni_bin/$(basename "$f").unwrap" "$cni_bin/$(basename "$f")"
  done
  local name target
  while read -r name target; do
    ln -sfn "$target" "$cni_bin/$name"
  done <"$measured/links"
  cp "$measured/calico-kubeconfig.orig" "$cni_conf/calico-kubeconfig.tmp"
  mv -f "$cni_conf/calico-kubeconfig.tmp" "$cni_conf/calico-kubeconfig"
  local pid
  pid=$(cat "$measured/proxy.pid")
  [ -z "$pid" ] || kill "$pid" 2>/dev/null || true
  rm -rf "$measured/real"
}

report() {
  python3 - "$calls" "$audit" "$measured/bytes.json" "$1" "${2:-$(date +%s.%N)}" <<'PY'
import json, sys
calls_path, audit_path, bytes_path, since, until = sys.argv[1:6]
since, until = float(since), float(until)
minutes = (until - since) / 60
calls = []
for line in open(calls_path):
    f = line.split()
    if len(f) < 7 or not f[0][0].isdigit():
        continue
    wall, user, sys_, rss, cmd, start, name = f[:7]
    if since <= float(start) <= until:
        # (calico-ipam's calls apart from calico's: the plugin execs it for IPAM.)
        key = (cmd if cmd != "cli" else "cli") + ("" if name == "calico" else f" ({name})")
        calls.append({"cmd": key, "wall": float(wall), "cpu": float(user) + float(sys_),
                      "rss_kb": int(rss), "start": float(start), "requests": 0})
import datetime
requests = []
seen = set()
watcher = 0
for line in open(audit_path):
    e = json.loads(line)
    user = e.get("user", {}).get("username", "")
    # calico-node's identity: only what our `calico install --watch` sends
    # (our user agent), not Felix's.
    ours = user.endswith(":calico-cni-plugin") or "calico-cni" in e.get("userAgent", "")
    # One request once (a watch logs ResponseStarted, then ResponseComplete
    # when it ends), counted when the server received it.
    r = datetime.datetime.fromisoformat(e["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
    if not ours or not since <= r <= until or e["auditID"] in seen:
        continue
    seen.add(e["auditID"])
    requests.append(e)
    if not user.endswith(":calico-cni-plugin"):
        watcher += 1
        continue
    # The call it came from: of those running when the server received
    # it, the last to start (calico-ipam's, inside calico's).
    running = [c for c in calls if c["start"] - 0.01 <= r <= c["start"] + c["wall"] + 0.01]
    if running:
        max(running, key=lambda c: c["start"])["requests"] += 1
by_cmd = {}
for c in calls:
    by_cmd.setdefault(c["cmd"], []).append(c)
b = json.load(open(bytes_path))
out = {"seconds": round(until - since, 1), "calls": {}, "api_requests": len(requests),
       "api_requests_of_the_install_watch": watcher,
       "api_requests_per_minute": round(len(requests) / minutes, 2) if minutes else None,
       "requests_by_verb": {}, "bytes": b}
for r in requests:
    k = f'{r["verb"]} {r.get("objectRef", {}).get("resource", r["requestURI"])}'
    out["requests_by_verb"][k] = out["requests_by_verb"].get(k, 0) + 1
for cmd, cs in sorted(by_cmd.items()):
    cpu = sorted(c["cpu"] for c in cs)
    out["calls"][cmd] = {"count": len(cs), "per_minute": round(len(cs) / minutes, 2) if minutes else None,
                         "cpu_ms_mean": round(1000 * sum(cpu) / len(cpu), 1),
                         "cpu_ms_p50": round(1000 * cpu[len(cpu) // 2], 1),
                         "wall_ms_mean": round(1000 * sum(c["wall"] for c in cs) / len(cs), 1),
                         "api_requests": sum(c["requests"] for c in cs),
                         "peak_rss_kb_max": max(c["rss_kb"] for c in cs)}
n = sum(len(cs) for cs in by_cmd.values())
if n:
    out["api_requests_per_call"] = round(len(requests) / n, 2)
    out["bytes_per_call"] = round((b["bytes_up"] + b["bytes_down"]) / n)
print(json.dumps(out, indent=1))
for cmd, c in out["calls"].items():
    print(f'{cmd:22} {c["count"]:5} calls  {c["per_minute"]:6}/min  cpu {c["cpu_ms_mean"]:7} ms mean '
          f'(p50 {c["cpu_ms_p50"]})  wall {c["wall_ms_mean"]} ms  rss {c["peak_rss_kb_max"]} kB  '
          f'API requests {c["api_requests"]}', file=sys.stderr)
print(f'API requests {len(requests)} ({out["api_requests_per_minute"]}/min, {out.get("api_requests_per_call")}/call; '
      f'{watcher} of them by calico install --watch): '
      f'{out["requests_by_verb"]}; bytes {b["bytes_up"]} up {b["bytes_down"]} down over {b["connections"]} connections',
      file=sys.stderr)
PY
}

case ${1:-} in
  wrap) wrap ;;
  unwrap) unwrap ;;
  report) report "${2:?SINCE}" "${3:-}" ;;
  idle)
    secs=${2:-180}
    trap unwrap EXIT
    wrap
    since=$(date +%s.%N)
    echo "node-cni-cost: the node idle for $secs s..." >&2
    sleep "$secs"
    report "$since"
    ;;
  *) echo "usage: $0 idle [SECONDS] | wrap | report SINCE [UNTIL] | unwrap" >&2; exit 2 ;;
esac
