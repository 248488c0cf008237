#!/usr/bin/env python3
"""Checks the layers of the Python package maco (docs/design.md, "Python package"): a one-way
stack of modules, read from the table of that section (rows from the top layer down; each names
modules of python-bindings/maco/), so the page and the check cannot disagree.

  table      the table is there when python-bindings/maco/ is, each row names modules that
             exist, no module twice, and every module of python-bindings/maco/ (.py, and the
             extension as _maco.pyi) is in a row;
  imports    a module imports modules of the package of its own layer or below, never above,
             and no modules import each other, directly or through others;
  lazy       an import inside a function (a def or a lambda, at any depth) imports an optional
             package (OPTIONAL: the program may lack it, so it is imported where it is used), a
             module of the package that imports one when it loads (it needs it too), or the
             extension from a module that imports nothing of the package when it loads (it
             must run without the extension: the DSL); nothing else, so no import loop can hide
             inside a function.

scripts/check_layers.py runs check() (the `layers` test); run alone:
  usage: scripts/check_py_layers.py SOURCE_DIR
Exit status 1 on a violation, 2 on bad usage.
"""
import ast
import os
import re
import sys

PACKAGE = "python-bindings/maco"
EXTENSION = "_maco.pyi"  # the extension maco._maco, by its interface file
OPTIONAL = ("torch", "cupy", "numpy", "ml_dtypes")
MARK = "<!-- python layers:"


def read_table(src, problem):
    """[(layer, [module file names])] from docs/design.md, top first; None without a table."""
    try:
        with open(os.path.join(src, "docs", "design.md"), encoding="utf-8") as fh:
            lines = fh.read().split("\n")
    except OSError:
        return None
    start = next((i for i, l in enumerate(lines) if l.startswith(MARK)), None)
    if start is None:
        return None
    rows = []
    for l in lines[start + 1:]:
        if not l.startswith("|"):
            if rows:
                break
            continue
        cells = [c.strip() for c in l.strip().strip("|").split("|")]
        if cells[0] in ("layer", "") or set(cells[0]) <= set("-: "):
            continue
        mods = re.findall(r"`([^`]+)`", cells[1]) if len(cells) > 1 else []
        if not mods:
            problem(f"docs/design.md: Python layer {cells[0]} names no module")
        rows.append((cells[0], mods))
    if not rows:
        problem("docs/design.md: the Python layer table has no rows")
    return rows


def package_files(src):
    d = os.path.join(src, PACKAGE)
    return sorted(f for f in os.listdir(d) if f.endswith(".py") or f == EXTENSION)


class Imports(ast.NodeVisitor):
    """The imports of one module: (line, target, lazy) with target "maco:<module>" for a
    module of the package (None's name: the package itself) or the top-level name of another
    package; lazy: inside a def or a lambda."""

    def __init__(self, names):
        self.names, self.depth, self.found = names, 0, []

    def _def(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _def

    def _add(self, line, target):
        self.found.append((line, target, self.depth > 0))

    def _ours(self, name):
        """maco:<module> for a module name of the package, else maco:__init__."""
        return f"maco:{name}" if name in self.names else "maco:__init__"

    def visit_Import(self, node):
        for a in node.names:
            parts = a.name.split(".")
            if parts[0] == "maco":
                self._add(node.lineno, self._ours(parts[1]) if len(parts) > 1 else
                          "maco:__init__")
            else:
                self._add(node.lineno, parts[0])

    def visit_ImportFrom(self, node):
        mod = node.module or ""
        if node.level == 0 and mod.split(".")[0] != "maco":
            self._add(node.lineno, mod.split(".")[0])
            return
        if node.level > 1:
            self._add(node.lineno, "maco:__init__")  # above the package: not ours
            return
        rest = mod.split(".")[1:] if node.level == 0 else (mod.split(".") if mod else [])
        if rest:
            self._add(node.lineno, self._ours(rest[0]))
        else:  # from . import a, b / from maco import a, b: modules, or names of __init__
            for a in node.names:
                self._add(node.lineno, self._ours(a.name) if a.name in self.names else
                          "maco:__init__")


def module_name(f):
    return "_maco" if f == EXTENSION else f[:-3]


def check(src, problem):
    """Runs the checks on SOURCE_DIR; returns (layers, modules, imports) counted, or None when
    the tree has no package."""
    if not os.path.isdir(os.path.join(src, PACKAGE)):
        return None
    rows = read_table(src, problem)
    if rows is None:
        problem("docs/design.md: no Python layer table (a line starting "
                f"'{MARK}' before it) while {PACKAGE}/ exists")
        return None
    files = package_files(src)
    layer = {}  # module file -> (row index, layer name)
    for i, (name, mods) in enumerate(rows):
        for m in mods:
            if m in layer:
                problem(f"docs/design.md: {PACKAGE}/{m} is in Python layer {layer[m][1]} and "
                        f"in layer {name}")
            elif not os.path.exists(os.path.join(src, PACKAGE, m)):
                problem(f"docs/design.md: Python layer {name} names {PACKAGE}/{m}, which is "
                        "not in the tree")
            layer[m] = (i, name)
    for f in files:
        if f not in layer:
            problem(f"{PACKAGE}/{f}: in no layer of docs/design.md's Python table (add it to "
                    "a row)")
    names = {module_name(f): f for f in files}
    imports = {}
    for f in files:
        if f == EXTENSION:
            imports[f] = []
            continue
        path = os.path.join(src, PACKAGE, f)
        with open(path, encoding="utf-8") as fh:
            try:
                tree = ast.parse(fh.read(), path)
            except SyntaxError as e:
                problem(f"{PACKAGE}/{f}:{e.lineno}: does not parse: {e.msg}")
                continue
        v = Imports(names)
        v.visit(tree)
        imports[f] = [(line, names.get(t[5:], "__init__.py") if t.startswith("maco:") else t,
                       lazy, t.startswith("maco:")) for line, t, lazy in v.found]
    # Modules that need an optional package when they load, and those that load any of ours.
    needs_optional = {f for f, imps in imports.items()
                      if any(not ours and not lazy and t in OPTIONAL
                             for _, t, lazy, ours in imps)}
    loads_ours = {f for f, imps in imports.items()
                  if any(ours and not lazy and t != f for _, t, lazy, ours in imps)}
    edges = {}
    count = 0
    for f, imps in imports.items():
        for line, t, lazy, ours in imps:
            count += 1
            where = f"{PACKAGE}/{f}:{line}"
            if lazy and not ours and t not in OPTIONAL:
                problem(f"{where}: import of {t} inside a function: only optional packages "
                        f"({', '.join(OPTIONAL)}) are imported where they are used")
            if not ours or t == f:
                continue
            if lazy and t not in needs_optional and not (t == EXTENSION and f not in loads_ours):
                problem(f"{where}: import of {module_name(t)} inside a function: it needs no "
                        "optional package, so it is imported when the module loads (an import "
                        "placed in a function to dodge a loop hides the loop)")
            edges.setdefault(f, set()).add(t)
            if f in layer and t in layer and layer[t][0] < layer[f][0]:
                problem(f"{where} ({layer[f][1]}): imports {module_name(t)} of layer "
                        f"{layer[t][1]}, above it")
    for comp in loops(set(files), edges):
        problem("Python import loop: " + " -> ".join(f"{PACKAGE}/{m}" for m in comp))
    return len(rows), len(files), count


def loops(nodes, edges):
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def main(argv):
    if len(argv) != 2 or not os.path.isdir(argv[1]):
        print(__doc__, file=sys.stderr)
        return 2
    n = [0]

    def problem(text):
        n[0] += 1
        print(text)

    res = check(argv[1], problem)
    if res is None and n[0] == 0:
        print(f"check_py_layers: no {PACKAGE}/ under {argv[1]}")
        return 0
    if res is not None:
        print(f"check_py_layers: {res[0]} layers, {res[1]} modules, {res[2]} imports, "
              f"{n[0]} problem(s)")
    return 1 if n[0] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
