# gdb script (python): records, in order, every call of one of the crate's
# own functions during one run of the plugin: (caller's file, callee's
# file, callee). Closures and async bodies (resumptions, not calls) are not
# traced; an async fn is traced where it is called (its constructor), so
# the order is the order of the calls in the source as the request takes
# them. Written to $WALK_OUT as JSON lines.
import json
import os
import re

import gdb

OUT = open(os.environ["WALK_OUT"], "w")
SKIP = re.compile(r"\{\{closure\}\}|\{async_(fn|block)|as (serde|core|alloc|std|tracing|tracing_core)::|::fmt$|::clone$|::drop$|::eq$|::hash$|::serialize|::deserialize")


def src_file(frame):
    if frame is None:
        return None
    sal = frame.find_sal()
    if sal is None or sal.symtab is None:
        return None
    name = sal.symtab.filename
    i = name.find("src/")
    return name[i:] if i >= 0 and "/.cargo/" not in name and "/rustc/" not in name else None


class Call(gdb.Breakpoint):
    def __init__(self, addr, name):
        super().__init__(f"*{addr:#x}", internal=True)
        self.fn = name

    def stop(self):
        frame = gdb.newest_frame()
        callee = src_file(frame)
        if callee is None:
            return False
        caller = frame.older()
        # The nearest frame of ours up the stack is the caller.
        while caller is not None and src_file(caller) is None:
            caller = caller.older()
        OUT.write(json.dumps([src_file(caller), callee, self.fn]) + "\n")
        return False


gdb.execute("set pagination off")
gdb.execute("set breakpoint pending off")
gdb.execute("set print frame-arguments none")
# Our functions, from the symbol table (the debug profile keeps line
# tables only): "ADDRESS T NAME" lines of `nm -C` in $WALK_SYMBOLS.
count = 0
for line in open(os.environ["WALK_SYMBOLS"]):
    addr, kind, name = line.rstrip("\n").split(" ", 2)
    if kind not in "Tt" or not re.match(r"^<?calico_cni::", name) or SKIP.search(name):
        continue
    try:
        Call(int(addr, 16), name)
        count += 1
    except gdb.error:
        pass
print(f"walk: {count} functions traced", flush=True)
gdb.execute("run < " + os.environ["WALK_STDIN"])
OUT.close()
