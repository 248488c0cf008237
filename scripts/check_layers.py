#!/usr/bin/env python3
"""Checks MACO's layer rules on a build folder (docs/design.md, "Layers").

For every object file of the library (libmaco's objects: the maco_core and maco_gpu object
libraries), it reads the symbols the file defines and the ones it uses (`nm`), links each use
of a MACO symbol to the file that defines it, and fails when
  - files call each other in a loop (a strongly connected component of more than one file), or
  - a file calls into a layer above its own (the order in LAYERS, lowest first).
It also checks the #include graph of the library's own headers and sources for loops
(headers that include each other, directly or through others).

  usage: scripts/check_layers.py BUILD_DIR SOURCE_DIR
Prints the file-level call graph's edges with -v. Exit status 1 on a violation.
"""
import os
import re
import subprocess
import sys

# Lowest first: a file may call files of its own layer or of layers below (listed earlier).
LAYERS = [
    ("base", r"^src/host/base/"),
    ("os", r"^src/host/os/"),
    ("cuda", r"^src/host/cuda/"),
    ("bootstrap", r"^src/host/bootstrap/"),
    ("comm-base", r"^src/host/comm/comm_base\.c"),
    ("memory", r"^src/host/memory/"),
    ("comm", r"^src/host/comm/"),
    ("channel", r"^src/host/channel/"),
    ("proxy", r"^proxy/"),
    ("algorithms", r"^(algorithms|src/device)/"),
    ("persistent", r"^src/host/persistent/"),
]


def layer_of(path):
    for i, (name, rx) in enumerate(LAYERS):
        if re.search(rx, path):
            return i, name
    return len(LAYERS), "unknown"


def objects(build):
    """The library's object files of the current build (compile_commands.json), so stale
    objects of moved or deleted sources are not counted."""
    import json
    with open(os.path.join(build, "compile_commands.json")) as fh:
        cmds = json.load(fh)
    out = []
    for c in cmds:
        m = re.search(r"\s-o\s+(\S+)", c.get("command", ""))
        o = c.get("output") or (m.group(1) if m else "")
        if "maco_core.dir" in o or "maco_gpu.dir" in o:
            path = o if os.path.isabs(o) else os.path.join(c.get("directory", build), o)
            if os.path.exists(path):
                out.append(path)
    return sorted(set(out))


def source_of(obj):
    m = re.search(r"\.dir/(.*)\.o$", obj)
    return m.group(1) if m else obj


def nm(obj, *flags):
    res = subprocess.run(["nm", "-P", *flags, obj], capture_output=True, text=True, check=True)
    syms = set()
    for line in res.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            syms.add(parts[0])
    return syms


def sccs(nodes, edges):
    """Tarjan's strongly connected components."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def include_graph(src):
    edges, nodes = {}, set()
    roots = ["src", "proxy", "algorithms", "include"]
    files = []
    for r in roots:
        for root, _, names in os.walk(os.path.join(src, r)):
            for n in names:
                if n.endswith((".c", ".h", ".cu", ".cuh")):
                    files.append(os.path.relpath(os.path.join(root, n), src))
    by_name = {}
    for f in files:
        by_name.setdefault(os.path.basename(f), []).append(f)
    for f in files:
        nodes.add(f)
        with open(os.path.join(src, f), errors="replace") as fh:
            for line in fh:
                m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                if not m:
                    continue
                inc = m.group(1)
                cands = [c for c in by_name.get(os.path.basename(inc), []) if c.endswith(inc)]
                if len(cands) == 1:
                    edges.setdefault(f, set()).add(cands[0])
    return nodes, edges


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    build, src = sys.argv[1], sys.argv[2]
    verbose = "-v" in sys.argv
    objs = objects(build)
    if not objs:
        print(f"check_layers: no library objects under {build}")
        return 2
    defined, used = {}, {}
    for o in objs:
        f = source_of(o)
        for s in nm(o, "--defined-only"):
            if s.startswith("maco_"):
                defined.setdefault(s, f)
        used[f] = {s for s in nm(o, "-u") if s.startswith("maco_")}
    edges, nodes = {}, set(used)
    for f, syms in used.items():
        for s in syms:
            g = defined.get(s)
            if g is not None and g != f:
                edges.setdefault(f, set()).add(g)
    problems = 0
    if verbose:
        for f in sorted(edges):
            print(f"{f} -> {', '.join(sorted(edges[f]))}")
    for comp in sccs(nodes, edges):
        if len(comp) > 1:
            problems += 1
            print("call loop between files: " + " <-> ".join(comp))
            for a in comp:
                for b in sorted(edges.get(a, ())):
                    if b in comp:
                        why = sorted(s for s in used[a] if defined.get(s) == b)
                        print(f"    {a} calls {b}: {', '.join(why[:6])}")
    for f in sorted(edges):
        lf, nf = layer_of(f)
        for g in sorted(edges[f]):
            lg, ng = layer_of(g)
            if lg > lf:
                problems += 1
                why = sorted(s for s in used[f] if defined.get(s) == g)
                print(f"layer violation: {f} ({nf}) calls {g} ({ng}): {', '.join(why[:6])}")
    inodes, iedges = include_graph(src)
    for comp in sccs(inodes, iedges):
        if len(comp) > 1:
            problems += 1
            print("include loop: " + " <-> ".join(comp))
    nedges = sum(len(v) for v in edges.values())
    print(f"check_layers: {len(nodes)} files, {nedges} call edges, {problems} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
