#!/usr/bin/env python3
"""Checks MACO's layer rules (docs/design.md, "Layers").

The rule is the layer table of docs/design.md, read from there, so the page and the check
cannot disagree. Rows run from the top layer down; a file belongs to the row with the longest
path that holds it. A row named "<name>, beside <other>" is at the level of row <other>: both
may use what is below them, neither may include or call the other. The checks:

  design.md   the table is there, each row names paths that exist, no path twice, each
              row's `includes` is public, below or any, and a row beside another names a
              row of the table of the same `includes`;
  coverage    every C, C++ and CUDA file of the tree (git's files, tracked or not but not
              ignored; docs/results excluded) is in a row;
  includes    every #include of every such file keeps its row's `includes` rule:
                public  public headers as maco/... (include/), files of its own folder by
                        name, or headers from outside the tree (system, CUDA, generated);
                below   public headers as maco/..., private ones by their path from the
                        repository root (never a bare name), of its own layer or below
                        (not of a layer beside it);
                any     anything (tests);
              transports include no other transport's files, and the proxy's core includes
              none; no header includes itself through others;
  python      the Python package's layers (scripts/check_py_layers.py: its own table in
              docs/design.md, "Python package");
  objects     (with a build folder) the library's objects (maco_core, maco_gpu, maco_gpu_gmma)
              call one way: no call loop between files, no call into a layer above or
              beside, no call between transports, and only proxy/transport.c calls into
              proxy/transport/; the clients' objects (nccl/, tools/, python-bindings/,
              examples/) use no internal symbol (maco__*), and the files of one client
              folder (the NCCL library's, a tool's) call each other one way too: no loop.
              A weak reference (nm's `w`) is a hook, not a call: a lower layer names a
              function an upper one may define (src/host/comm/comm_internal.h,
              maco__collectives_extension); it pulls nothing in, so it is no edge.

  usage: scripts/check_layers.py BUILD_DIR SOURCE_DIR [-v]
         scripts/check_layers.py --sources SOURCE_DIR [-v]    (no build: all but `objects`)
Prints the file-level call graph's edges with -v. Exit status 1 on a violation, 2 on bad usage.
"""
import json
import os
import re
import subprocess
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_py_layers  # noqa: E402 - beside this file

SOURCE_EXT = (".c", ".h", ".cc", ".cpp", ".hpp", ".cu", ".cuh")
INCLUDE_KINDS = ("public", "below", "any")
TRANSPORTS = "proxy/transport/"


class Problems:
    def __init__(self):
        self.n = 0

    def __call__(self, text):
        self.n += 1
        print(text)


# ---------------------------------------------------------------- the table in design.md

def read_table(src, problem):
    """The layer rows of docs/design.md, top first: [(name, [paths], includes)]."""
    path = os.path.join(src, "docs", "design.md")
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().split("\n")
    except OSError as e:
        problem(f"docs/design.md: cannot read it ({e}): the layer table lives there")
        return []
    start = next((i for i, l in enumerate(lines) if l.startswith("<!-- layers:")), None)
    if start is None:
        problem("docs/design.md: no layer table (a line starting '<!-- layers:' before it)")
        return []
    rows = []
    for l in lines[start + 1:]:
        if not l.startswith("|"):
            if rows:
                break
            continue
        cells = [c.strip() for c in l.strip().strip("|").split("|")]
        if cells[0] in ("layer", "") or set(cells[0]) <= set("-: "):
            continue
        if len(cells) < 3:
            problem(f"docs/design.md: layer row '{l}' has fewer than 3 columns")
            continue
        name, paths, includes = cells[0], re.findall(r"`([^`]+)`", cells[1]), cells[2]
        beside = None
        m = re.fullmatch(r"(\S+), beside (\S+)", name)
        if m:
            name, beside = m.group(1), m.group(2)
        if includes not in INCLUDE_KINDS:
            problem(f"docs/design.md: layer {name}: includes '{includes}' is none of "
                    f"{', '.join(INCLUDE_KINDS)}")
        if not paths:
            problem(f"docs/design.md: layer {name} names no path")
        rows.append([name, paths, includes, beside])
    if not rows:
        problem("docs/design.md: the layer table has no rows")
    # Levels: the rows in order, a row beside another at that row's level.
    level, n = {}, 0
    for r in rows:
        if r[3] is None:
            level[r[0]] = n
            n += 1
    for r in rows:
        if r[3] is not None:
            other = next((o for o in rows if o[0] == r[3] and o[3] is None), None)
            if other is None or other[2] != r[2]:
                problem(f"docs/design.md: layer {r[0]} is beside '{r[3]}', which is no row of "
                        f"the table with includes '{r[2]}'")
                level[r[0]] = n
                n += 1
            else:
                level[r[0]] = level[other[0]]
    rows = [(name, paths, includes, level[name]) for name, paths, includes, _ in rows]
    seen = {}
    for name, paths, _, _ in rows:
        for p in paths:
            if p in seen:
                problem(f"docs/design.md: {p} is in layer {seen[p]} and in layer {name}")
            seen[p] = name
            if not os.path.exists(os.path.join(src, p)):
                problem(f"docs/design.md: layer {name} names {p}, which is not in the tree")
    return rows


def layer_of(rows, path):
    """(index, name, includes, level) of the row holding `path` (longest path wins), or None."""
    best = None
    for i, (name, paths, includes, level) in enumerate(rows):
        for p in paths:
            if path == p.rstrip("/") or (p.endswith("/") and path.startswith(p)):
                if best is None or len(p) > best[0]:
                    best = (len(p), i, name, includes, level)
    return None if best is None else best[1:]


def reach(lf, lt):
    """Why a file of layer lf may not reach layer lt ("above", "beside"), or None."""
    if lt[3] < lf[3]:
        return "above"
    if lt[3] == lf[3] and lt[0] != lf[0]:
        return "beside"
    return None


# ---------------------------------------------------------------- source files and includes

def tree_files(src):
    try:
        out = subprocess.run(["git", "-C", src, "ls-files", "--cached", "--others",
                              "--exclude-standard"], capture_output=True, text=True,
                             check=True).stdout.split("\n")
        files = [f for f in out if f]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for root, dirs, names in os.walk(src):
            rel = os.path.relpath(root, src)
            dirs[:] = [d for d in dirs if not d.startswith((".", "build"))]
            files += [os.path.normpath(os.path.join(rel, n)) for n in names]
    return sorted(f for f in files if f.endswith(SOURCE_EXT) and not f.startswith("docs/results/")
                  and os.path.exists(os.path.join(src, f)))


INCLUDE_RX = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)


def includes_of(src, f):
    with open(os.path.join(src, f), errors="replace") as fh:
        text = fh.read()
    # Comments out, so that an include written in a comment is not counted.
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return [(m.group(1), m.group(2)) for m in INCLUDE_RX.finditer(text)]


def transport_of(path):
    """The transport folder's name of a file under proxy/transport/<name>/, else None."""
    if path.startswith(TRANSPORTS):
        rest = path[len(TRANSPORTS):]
        return rest.split("/", 1)[0] if "/" in rest else None
    return None


def proxy_core(path):
    return path.startswith("proxy/") and not path.startswith(TRANSPORTS) \
        and path != "proxy/transport.c"


def check_includes(src, rows, files, problem):
    fileset = set(files)
    edges = {}
    for f in files:
        lay = layer_of(rows, f)
        if lay is None:
            problem(f"{f}: in no layer of docs/design.md's table (add its folder to a row)")
            continue
        idx, name, kind, _ = lay
        folder = os.path.dirname(f)
        client_root = next((p for p in rows[idx][1] if f.startswith(p)), folder + "/")
        for bracket, inc in includes_of(src, f):
            line = f'#include {bracket}{inc}{">" if bracket == "<" else bracket}'
            public = "include/" + inc
            here = os.path.normpath(os.path.join(folder, inc))
            if inc.startswith("maco/") and public in fileset:
                continue  # the public API: every layer may include it
            target = None
            if bracket == '"' and here in fileset:
                target = here
            elif inc in fileset:
                target = inc
            elif public in fileset:
                target = public
            if kind == "any":
                if target is not None:
                    edges.setdefault(f, set()).add(target)
                continue
            if kind == "public":
                if target is None:
                    continue  # the system's, CUDA's, NCCL's, nanobind's or a generated header
                if target.startswith("include/maco/"):
                    problem(f"{f}: {line}: public headers are named maco/...")
                elif not target.startswith(client_root) or target != here:
                    problem(f"{f} ({name}): {line} reaches {target}: this layer "
                            "includes the public API (maco/...) and its own folder only")
                else:
                    edges.setdefault(f, set()).add(target)
                continue
            # kind == "below": the library.
            if target is None:
                same = sorted(x for x in fileset if x.endswith("/" + inc))
                if bracket == '"' and same:  # compiles only through an include folder
                    problem(f"{f} ({name}): {line} names a file of another folder by a bare "
                            f"name ({', '.join(same[:3])}); write its path from the "
                            "repository root")
                continue  # not a file of the tree: the system's or CUDA's
            if target != inc:
                problem(f"{f} ({name}): {line} names {target} by a relative "
                        f"path; write its path from the repository root: \"{target}\"")
                continue
            tl = layer_of(rows, target)
            if tl is None:
                continue  # reported as a file in no layer
            if tl[2] != "below":
                problem(f"{f} ({name}): {line} reaches layer {tl[1]}, which the "
                        "library never includes")
            elif reach(lay, tl) is not None:
                problem(f"{f} ({name}): {line} reaches layer {tl[1]}, {reach(lay, tl)} {name}")
            ta, tb = transport_of(f), transport_of(target)
            if tb is not None and ta != tb and (ta is not None or proxy_core(f)):
                problem(f"{f}: {line}: a transport's files are its own (transports "
                        "never include each other; the proxy's core names none)")
            edges.setdefault(f, set()).add(target)
    return edges


# ---------------------------------------------------------------- objects

def objects(build, src, rows):
    """(library objects, client objects) of the current build (compile_commands.json), so
    stale objects of moved or deleted sources are not counted. Clients: files of a layer whose
    includes are public (nccl/, tools/, ...)."""
    with open(os.path.join(build, "compile_commands.json")) as fh:
        cmds = json.load(fh)
    lib, clients = [], []
    for c in cmds:
        m = re.search(r"\s-o\s+(\S+)", c.get("command", ""))
        o = c.get("output") or (m.group(1) if m else "")
        path = o if os.path.isabs(o) else os.path.join(c.get("directory", build), o)
        if not os.path.exists(path):
            continue
        if re.search(r"(maco_core|maco_gpu|maco_gpu_gmma)\.dir/", o):
            lib.append(path)
        else:
            f = c.get("file", "")
            rel = os.path.relpath(f if os.path.isabs(f) else os.path.join(c.get("directory", ""), f),
                                  src)
            lay = layer_of(rows, rel)
            if lay is not None and lay[2] == "public" and not rel.startswith("include/"):
                clients.append((path, rel))
    return sorted(set(lib)), sorted(set(clients))


def source_of(obj):
    m = re.search(r"\.dir/(.*)\.o$", obj)
    return m.group(1) if m else obj


def nm_typed(obj, *flags):
    """{symbol: nm's type letter} of an object."""
    res = subprocess.run(["nm", "-P", *flags, obj], capture_output=True, text=True, check=True)
    return {line.split()[0]: line.split()[1] for line in res.stdout.splitlines()
            if len(line.split()) >= 2}


def nm(obj, *flags):
    return set(nm_typed(obj, *flags))


def calls_of(obj):
    """(strong undefined symbols, weak undefined ones: hooks) of an object."""
    und = nm_typed(obj, "-u")
    return ({s for s, t in und.items() if t not in "wv"},
            {s for s, t in und.items() if t in "wv"})


def file_loops(nodes, edges, used, defined, problem, where):
    for comp in sccs(nodes, edges):
        if len(comp) > 1:
            problem(f"call loop between files{where}: " + " <-> ".join(comp))
            for a in comp:
                for b in sorted(edges.get(a, ())):
                    if b in comp:
                        syms = sorted(s for s in used[a] if defined.get(s) == b)[:6]
                        print(f"    {a} calls {b}: {', '.join(syms)}")


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


def check_objects(build, src, rows, problem, verbose):
    lib, clients = objects(build, src, rows)
    if not lib:
        print(f"check_layers: no library objects under {build}")
        return None
    defined, used, hooks = {}, {}, {}
    for o in lib:
        f = source_of(o)
        for s in nm(o, "--defined-only"):
            if s.startswith("maco_"):
                defined.setdefault(s, f)
        strong, weak = calls_of(o)
        used[f] = {s for s in strong if s.startswith("maco_")}
        if weak & {s for s in weak if s.startswith("maco_")}:
            hooks[f] = {s for s in weak if s.startswith("maco_")}
    edges, nodes = {}, set(used)
    for f, syms in used.items():
        for s in syms:
            g = defined.get(s)
            if g is not None and g != f:
                edges.setdefault(f, set()).add(g)
    if verbose:
        for f in sorted(edges):
            print(f"{f} -> {', '.join(sorted(edges[f]))}")
        for f in sorted(hooks):
            print(f"{f} names hooks (weak): {', '.join(sorted(hooks[f]))}")

    def why(a, b):
        return ", ".join(sorted(s for s in used[a] if defined.get(s) == b)[:6])

    file_loops(nodes, edges, used, defined, problem, "")
    for f in sorted(edges):
        lf = layer_of(rows, f)
        for g in sorted(edges[f]):
            lg = layer_of(rows, g)
            if lf is None or lg is None:
                continue  # reported as a file in no layer
            if reach(lf, lg) is not None:
                problem(f"layer violation: {f} ({lf[1]}) calls {g} ({lg[1]}, a layer "
                        f"{reach(lf, lg)} it): {why(f, g)}")
            ta, tb = transport_of(f), transport_of(g)
            if tb is not None and ta != tb and f != "proxy/transport.c":
                problem(f"transport rule: {f} calls {g}: {why(f, g)} (transports never call "
                        "each other; only proxy/transport.c reaches their ops tables)")
    for o, rel in clients:
        bad = sorted(s for s in nm(o, "-u") if s.startswith("maco__"))
        if bad:
            problem(f"{rel}: a client of the public API uses internal symbols: "
                    f"{', '.join(bad[:6])}")
    check_client_loops(rows, clients, problem)
    return len(nodes), sum(len(v) for v in edges.values()), len(clients)


def check_client_loops(rows, clients, problem):
    """The files of each client folder (a path of a client row: nccl/, tools/, ...) call each
    other one way: no loop among them, through their strong global symbols."""
    folders = {}
    for o, rel in clients:
        lay = layer_of(rows, rel)
        root = next((p for p in rows[lay[0]][1] if rel.startswith(p)), os.path.dirname(rel))
        folders.setdefault(root, []).append((o, rel))
    for root, objs in sorted(folders.items()):
        defined, used = {}, {}
        for o, rel in objs:
            for s, t in nm_typed(o, "--defined-only").items():
                if t in "TDBR":
                    defined.setdefault(s, rel)
            used[rel] = calls_of(o)[0]
        edges = {}
        for f, syms in used.items():
            for s in syms:
                g = defined.get(s)
                if g is not None and g != f:
                    edges.setdefault(f, set()).add(g)
        file_loops(set(used), edges, used, defined, problem, f" of {root}")


def main():
    args = [a for a in sys.argv[1:] if a != "-v"]
    verbose = "-v" in sys.argv
    if len(args) != 2:
        print(__doc__)
        return 2
    build = None if args[0] == "--sources" else args[0]
    src = args[1]
    problem = Problems()
    rows = read_table(src, problem)
    files = tree_files(src)
    if not files:
        print(f"check_layers: no source files under {src}")
        return 2
    inc_edges = check_includes(src, rows, files, problem) if rows else {}
    for comp in sccs(set(files), inc_edges):
        if len(comp) > 1:
            problem("include loop: " + " <-> ".join(comp))
    summary = f"{len(rows)} layers, {len(files)} source files"
    py = check_py_layers.check(src, problem)  # the Python package's own stack
    if py is not None:
        summary += f", {py[0]} Python layers with {py[1]} modules"
    if build is not None and rows:
        res = check_objects(build, src, rows, problem, verbose)
        if res is None:
            return 2
        summary += f", {res[0]} library objects with {res[1]} call edges, {res[2]} client objects"
    print(f"check_layers: {summary}, {problem.n} problem(s)")
    return 1 if problem.n else 0


if __name__ == "__main__":
    sys.exit(main())
