#!/usr/bin/env python3
"""Pod start-up on the test bed's node, as a user sees it: N pods of the
echo image (peers/echo/echo.c) created at once in a fresh namespace, and
for each pod the time from its creation (the API's answer to the POST) to
Running (its phase, polled every 50 ms) and to the first TCP connection
from the node to its address on 8080 that the echo server answers (tried
every 20 ms). Then the namespace is deleted and its pods waited for.

Usage: node-startup.py N [N...]    (environment: scripts/testbed.sh env)
Prints one JSON object per N on stdout: p50/p99/max of both, in ms.
"""
import json
import os
import socket
import ssl
import sys
import threading
import time
import urllib.request
import uuid

API = os.environ["TESTBED_API"]
NODE = os.environ["TESTBED_NODE"]
IMAGE = os.environ["TESTBED_ECHO_IMAGE"]
CTX = ssl.create_default_context(cafile=os.environ["TESTBED_CA"])
CTX.load_cert_chain(os.environ["TESTBED_ADMIN_CERT"], os.environ["TESTBED_ADMIN_KEY"])


def call(method, path, body=None):
    req = urllib.request.Request(
        API + path,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, context=CTX, timeout=30) as r:
        return json.loads(r.read() or b"{}")


def pct(values, p):
    v = sorted(values)
    return round(v[min(len(v) - 1, int(len(v) * p / 100))], 1)


def run(n):
    ns = "startup-" + uuid.uuid4().hex[:8]
    call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    # The namespace's default ServiceAccount, which pod admission waits for.
    for _ in range(100):
        try:
            call("GET", f"/api/v1/namespaces/{ns}/serviceaccounts/default")
            break
        except Exception:
            time.sleep(0.1)
    created, running, connected = {}, {}, {}
    lock = threading.Lock()

    def create(i):
        name = f"p{i}"
        pod = {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": NODE},
                "containers": [{"name": "c", "image": IMAGE, "imagePullPolicy": "Never"}],
                "dnsPolicy": "Default", "automountServiceAccountToken": False,
                "terminationGracePeriodSeconds": 1,
            },
        }
        call("POST", f"/api/v1/namespaces/{ns}/pods", pod)
        with lock:
            created[name] = time.monotonic()

    def connect(name, ip):
        end = time.monotonic() + 120
        while time.monotonic() < end:
            try:
                with socket.create_connection((ip, 8080), timeout=0.5) as s:
                    s.sendall(b"GET / HTTP/1.0\r\n\r\n")
                    if s.recv(64).startswith(b"HTTP/1.0 200"):
                        with lock:
                            connected[name] = time.monotonic()
                        return
            except OSError:
                pass
            time.sleep(0.02)

    t0 = time.monotonic()
    threads = [threading.Thread(target=create, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    probes = {}
    end = time.monotonic() + 300
    while (len(running) < n or len(connected) < n) and time.monotonic() < end:
        pods = call("GET", f"/api/v1/namespaces/{ns}/pods")["items"]
        now = time.monotonic()
        for p in pods:
            name, ip = p["metadata"]["name"], p["status"].get("podIP")
            if p["status"].get("phase") == "Running" and name not in running:
                running[name] = now
            if ip and name not in probes:
                probes[name] = threading.Thread(target=connect, args=(name, ip))
                probes[name].start()
        time.sleep(0.05)
    all_up = time.monotonic() - t0
    for t in probes.values():
        t.join()
    call("DELETE", f"/api/v1/namespaces/{ns}")
    end = time.monotonic() + 180
    while time.monotonic() < end:
        try:
            if not call("GET", f"/api/v1/namespaces/{ns}/pods")["items"]:
                break
        except Exception:
            break
        time.sleep(0.5)
    to_running = [1000 * (running[k] - created[k]) for k in running]
    to_conn = [1000 * (connected[k] - created[k]) for k in connected]
    return {
        "pods": n, "running": len(running), "connected": len(connected),
        "all_connected_s": round(all_up, 2),
        "to_running_ms": {"p50": pct(to_running, 50), "p99": pct(to_running, 99), "max": pct(to_running, 100)} if to_running else None,
        "to_first_connection_ms": {"p50": pct(to_conn, 50), "p99": pct(to_conn, 99), "max": pct(to_conn, 100)} if to_conn else None,
    }


for arg in sys.argv[1:]:
    print(json.dumps(run(int(arg))), flush=True)
