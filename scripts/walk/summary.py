"""The walk a reader takes following one request through the calls that
scripts/walk/trace.py recorded (one JSON line per call of one of our
functions: caller's file, callee's file, callee), in order: first the
orchestration (the calls the process edge and the plugin layer make, each
call into another layer one stay there), the same reading each function
only the first time it is called (a reader who has read `ctx.deadline()`
once does not open it again), then every call.

The reader starts in src/main.rs. For each call: if it is made from
another file than the one being read, the reader goes back there (a
return: a stay, neither an entry nor a climb); if the callee is in another
file, the reader follows it (a stay, and an entry into that file); a call
into a file of a higher tier than the caller's is a climb back up. Tiers: the crate's layers (tests/layering.rs), and
inside the plugin layer its own order (dispatcher, release queue, verbs,
workload kinds, shared steps). Prints the figures and each file's entries.
"""
import json
import sys
from collections import Counter

# Higher is nearer the entry point. Longest matching prefix wins.
TIERS = [
    ("src/main.rs", 9),
    ("src/app", 8),
    ("src/cli", 7),
    ("src/plugin/mod.rs", 6.9),
    ("src/plugin/release_queue.rs", 6.8),
    ("src/plugin/journal.rs", 6.1),
    ("src/plugin/add.rs", 6.5),
    ("src/plugin/del.rs", 6.5),
    ("src/plugin/check.rs", 6.5),
    ("src/plugin/status.rs", 6.5),
    ("src/plugin/gc.rs", 6.5),
    ("src/plugin/connection.rs", 6.5),
    ("src/plugin/add_k8s.rs", 6.3),
    ("src/plugin/del_k8s.rs", 6.3),
    ("src/plugin/workload", 6.3),
    ("src/plugin/endpoint.rs", 6.2),
    ("src/plugin/rollback.rs", 6.2),
    ("src/plugin/teardown.rs", 6.2),
    ("src/plugin", 6.1),
    ("src/ipam", 5),
    ("src/dataplane", 4),
    ("src/datastore", 4),
    ("src/fault.rs", 2),
    ("src/cni", 3),
    ("src/etcd", 2),
    ("src/k8s", 2),
    ("src/logging.rs", 2),
    ("src", 0),
]


def tier(path):
    best = max((p for p in TIERS if path.startswith(p[0])), key=lambda p: len(p[0]))
    return best[1]


ORCHESTRATION = ("src/main.rs", "src/app", "src/plugin")


def walk(calls, title, once=False):
    pos = "src/main.rs"
    stays, climbs = 1, []
    entered = Counter({pos: 1})
    read, followed = set(), 0
    for caller, callee, name in calls:
        if once:
            # A function already read is not read again: the reader knows
            # what it does and stays where they are.
            if name in read:
                continue
            read.add(name)
        followed += 1
        caller = caller or pos
        if caller != pos:
            # Back to the caller's file (a return): a stay, not an entry.
            pos = caller
            stays += 1
        if callee != caller:
            if tier(callee) > tier(caller):
                climbs.append(f"{caller} -> {callee} ({name})")
            pos = callee
            stays += 1
            entered[pos] += 1
    print(f"== {title}")
    print(f"calls followed: {followed}")
    print(f"stays: {stays} in {len(entered)} files")
    print(f"climbs back up: {len(climbs)}")
    for c in climbs:
        print(f"  {c}")
    top = entered.most_common()
    print(f"most entered: {top[0][0]} ({top[0][1]} times)")
    for f, n in top:
        print(f"  {n:4d}  {f}")


def main(path):
    calls = [json.loads(line) for line in open(path) if line.strip()]
    # The orchestration as a reader follows it: the calls made from the
    # process edge and the plugin layer (a call into another layer is one
    # stay there; what that layer does inside is its own business).
    top = [c for c in calls if (c[0] or "src/main.rs").startswith(ORCHESTRATION)]
    walk(top, "the orchestration (calls made from src/main.rs, src/app, src/plugin)")
    print()
    walk(top, "the orchestration, each function read once", once=True)
    print()
    walk(calls, "every call of our functions")


if __name__ == "__main__":
    main(sys.argv[1])
