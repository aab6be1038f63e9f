#!/usr/bin/env python3
"""Print the import graph between holdfast's top-level modules (src/<module>) and fail if it
has a cycle. An edge A -> B means some file of A names `crate::B`. Then the same between the
files of src/ipc/ (the request path: an edge a -> b when a.rs names `super::b` or
`crate::ipc::b`), which must have no circle either. Run by scripts/test.sh."""
import os, re, sys

root = os.path.join(os.path.dirname(__file__), "..", "src")
mods = sorted(
    n[:-3] if n.endswith(".rs") else n
    for n in os.listdir(root)
    if n not in ("lib.rs", "main.rs") and (n.endswith(".rs") or os.path.isdir(os.path.join(root, n)))
)
edges = {m: set() for m in mods}
for m in mods:
    path = os.path.join(root, m)
    files = [path + ".rs"] if os.path.isfile(path + ".rs") else [
        os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs if f.endswith(".rs")]
    for f in files:
        if f.endswith("tests.rs") or "/tests/" in f:
            continue
        text = open(f).read()
        # drop #[cfg(test)] modules at the end of a file (tests may reach anywhere)
        text = text.split("#[cfg(test)]\nmod tests {")[0]
        for other in re.findall(r"crate::([a-z_]+)", text):
            if other != m and other in edges:
                edges[m].add(other)

def cycle(edges=edges, mods=mods):
    state = {}
    stack = []
    def visit(n):
        state[n] = 1
        stack.append(n)
        for o in sorted(edges[n]):
            if state.get(o) == 1:
                return stack[stack.index(o):] + [o]
            if o not in state:
                c = visit(o)
                if c:
                    return c
        stack.pop()
        state[n] = 2
        return None
    for n in mods:
        if n not in state:
            c = visit(n)
            if c:
                return c
    return None

for m in mods:
    print(f"{m:10} -> {', '.join(sorted(edges[m])) or '-'}")
c = cycle()
if c:
    print("cycle: " + " -> ".join(c))
    sys.exit(1)
print("no cycle between top-level modules")

ipc = os.path.join(root, "ipc")
files = sorted(n[:-3] for n in os.listdir(ipc) if n.endswith(".rs") and n != "mod.rs")
file_edges = {f: set() for f in files}
for f in files:
    text = open(os.path.join(ipc, f + ".rs")).read().split("#[cfg(test)]\nmod tests {")[0]
    for other in re.findall(r"(?:super|crate::ipc)::([a-z_]+)", text):
        if other != f and other in file_edges:
            file_edges[f].add(other)
print()
for f in files:
    print(f"ipc/{f:14} -> {', '.join(sorted(file_edges[f])) or '-'}")
c = cycle(file_edges, files)
if c:
    print("cycle inside ipc/: " + " -> ".join(c))
    sys.exit(1)
print("no cycle between the files of ipc/")
