#!/usr/bin/env python3
"""Checks the shape rules of MACO's C, C++ and CUDA code (docs/design.md, "Layers") and of the
Python package (docs/design.md, "Python package"):

  length        no function body longer than MAX_LINES lines (150), counted from its opening
                brace's line to its closing brace's line;
  macros        no #define inside a function body (a macro there hides control flow or
                captures the function's locals: use a function, a lambda or a template);
  file length   no file of the libraries (include, src, proxy, algorithms, runtime, nccl)
                longer than MAX_FILE_LINES lines (700): split it by topic;
  files         no file longer than FILE_LINES lines (700) under FILE_FOLDERS (python-bindings:
                its Python modules, the extension's sources and its build files);
  registration  no __attribute__((constructor)) in the libraries: what attaches to what is a
                call a reader can follow (the collectives' hook: comm_internal.h);
  provenance    no machine name (H100, GH200, ...) and no date (2026-11-27) in the libraries'
                and tools' code: measurements, where and when they ran, are in
                docs/performance.md (the tuning table, algorithms/tuning.h, points there).
EXCEPTIONS, below, lists what a rule leaves alone and why: the one place for them.

Files: every .c, .h, .cc, .cpp, .cu and .cuh of the tree under the folders the library, its
clients and the examples live in (include, src, runtime, algorithms, proxy, nccl, tools,
python-bindings/src, examples); tests, generated code (the plans, algorithms/plans/*.json, are
data) and docs/results are not checked.
Function bodies (C++ member functions too) are found the way clang-format lays them out in
this tree (.clang-format: a function's opening brace alone on its line, the closing one at
the same indentation); a brace alone on a line after a `namespace`, `extern "C"`, struct,
class, enum or union head is not a function.

  usage: scripts/check_shape.py SOURCE_DIR [--max-lines N] [--max-file-lines N]
Prints one line per problem (file:line: what); exit status 1 when there is one, 2 on bad
usage.
"""
import os
import re
import sys

FOLDERS = ("include", "src", "runtime", "algorithms", "proxy", "nccl", "tools",
           "python-bindings/src", "examples")
LIBRARIES = ("include/", "src/", "runtime/", "algorithms/", "proxy/", "nccl/")
PROVENANCE = LIBRARIES + ("tools/",)
MAX_FILE_LINES = 700
# (rule, file): why the rule does not apply to it. Every entry must still be needed (a stale
# one is reported), so the list stays true.
EXCEPTIONS = {
    ("file length", "src/host/bootstrap/setup.c"):
        "the bootstrap's setup (hello, table, peer links) grew with the fault-tolerance work "
        "(watched setups, agreement); its split by topic is a change of its own",
    ("file length", "src/host/bootstrap/progress.c"):
        "the progress engine grew with the fault-tolerance work (revocation, partial frames); "
        "its split (failures < frames < posting and running) is a change of its own",
    ("registration", "nccl/env.c"):
        "maps NCCL_* variables to MACO_* ones when libnccl.so.2 loads, before any call reads "
        "them, as NCCL reads its environment at load; it attaches nothing to anything",
}
CONSTRUCTOR = re.compile(r"__attribute__\s*\(\(\s*(__)?constructor|\[\[\s*gnu::constructor")
MACHINE = re.compile(r"\b(?:[Gg][HhBb][0-9]{3}s?|[HAB][0-9]{3}s?|V100s?|L40S?)\b")
DATE = re.compile(r"\b20[0-9]{2}-[0-9]{2}\b")
SOURCE_EXT = (".c", ".h", ".cc", ".cpp", ".cu", ".cuh")
FILE_LINES = 700
FILE_FOLDERS = ("python-bindings",)
FILE_EXT = SOURCE_EXT + (".py", ".pyi", ".cmake", ".toml", "CMakeLists.txt")
NOT_FUNCTION = re.compile(r"^\s*(namespace|extern\s+\"C\"|struct|class|enum|union|typedef)\b")
DEFINE = re.compile(r"^\s*#\s*define\b")


def heading(lines, i):
    """The declaration that ends right before line i (the brace's line): the lines above it
    up to a blank line, a comment's end, a statement's end, a brace, an access specifier or
    a directive."""
    j = i - 1
    text = []
    while j >= 0 and len(text) < 12:
        line = lines[j].rstrip()
        if (not line or line.endswith((";", "*/", "{", ":")) or
                line.lstrip().startswith(("}", "#"))):
            break
        text.insert(0, line.strip())
        j -= 1
    return " ".join(text)


def function_name(head):
    """The function's name in its declaration (comments removed): the last identifier before
    a parenthesis at the top level (after `__launch_bounds__(...)` and the like)."""
    depth, name = 0, "?"
    for m in re.finditer(r"[A-Za-z_]\w*\s*\(|[()]", head):
        tok = m.group(0)
        if tok == "(" or tok.endswith("("):
            if depth == 0 and tok != "(":
                name = tok[:-1].strip()
            depth += 1
        elif tok == ")":
            depth = max(0, depth - 1)
    return name


def check_file_rules(rel, text, max_file_lines, problems, used):
    """The rules on whole files: length, registration, provenance."""
    def report(rule, msg):
        if (rule, rel) in EXCEPTIONS:
            used.add((rule, rel))
        else:
            problems.append(msg)

    nlines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
    if rel.startswith(LIBRARIES) and nlines > max_file_lines:
        report("file length", f"{rel}: {nlines} lines (a library file has at most "
               f"{max_file_lines}: split it by topic)")
    if rel.startswith(LIBRARIES):
        for i, line in enumerate(text.split("\n")):
            if CONSTRUCTOR.search(line):
                report("registration", f"{rel}:{i + 1}: a library constructor: attach with a "
                       "call a reader can follow (a named function or hook), not at load")
    if rel.startswith(PROVENANCE):
        for i, line in enumerate(text.split("\n")):
            m = MACHINE.search(line) or DATE.search(line)
            if m:
                report("provenance", f"{rel}:{i + 1}: '{m.group(0)}': machine names and dates "
                       "belong in docs/performance.md, not in code")


def check_file(path, rel, max_lines, problems, max_file_lines=MAX_FILE_LINES, used=None):
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    check_file_rules(rel, text, max_file_lines, problems, used if used is not None else set())
    lines = text.split("\n")
    start = None
    name = ""
    close = "}"
    for i, line in enumerate(lines):
        if start is None:
            if line.strip() == "{" and i > 0:
                head = re.sub(r"/\*.*?\*/|//[^\n]*", " ", heading(lines, i)).strip()
                if NOT_FUNCTION.match(head) or "(" not in head:
                    continue
                start = i
                name = function_name(head)
                close = line[: len(line) - len(line.lstrip())] + "}"
            continue
        if line.startswith(close):
            n = i - start + 1
            if n > max_lines:
                problems.append(f"{rel}:{start + 1}: {name}: a body of {n} lines "
                                f"(at most {max_lines})")
            start = None
        elif DEFINE.match(line):
            problems.append(f"{rel}:{i + 1}: {name}: #define inside a function body")


def check_file_lengths(root, problems):
    """FILE_LINES for every file of FILE_EXT under FILE_FOLDERS; returns the files counted."""
    n = 0
    for folder in FILE_FOLDERS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, folder)):
            dirnames[:] = sorted(d for d in dirnames
                                 if not d.startswith(("build", ".")) and d != "__pycache__")
            for fn in sorted(filenames):
                if not fn.endswith(FILE_EXT):
                    continue
                path = os.path.join(dirpath, fn)
                with open(path, encoding="utf-8", errors="replace") as f:
                    lines = sum(1 for _ in f)
                n += 1
                if lines > FILE_LINES:
                    problems.append(f"{os.path.relpath(path, root)}: {lines} lines (at most "
                                    f"{FILE_LINES} in {folder}/: split it by topic)")
    return n


def main(argv):
    args = argv[1:]
    limits = {"--max-lines": 150, "--max-file-lines": MAX_FILE_LINES}
    for flag in limits:
        if flag in args:
            k = args.index(flag)
            try:
                limits[flag] = int(args[k + 1])
            except (IndexError, ValueError):
                print(__doc__, file=sys.stderr)
                return 2
            del args[k:k + 2]
    max_lines, max_file_lines = limits["--max-lines"], limits["--max-file-lines"]
    if len(args) != 1 or not os.path.isdir(args[0]):
        print(__doc__, file=sys.stderr)
        return 2
    root = args[0]
    problems = []
    used = set()
    nfiles = 0
    for folder in FOLDERS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, folder)):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(("build", ".")))
            for fn in sorted(filenames):
                if fn.endswith(SOURCE_EXT):
                    path = os.path.join(dirpath, fn)
                    nfiles += 1
                    check_file(path, os.path.relpath(path, root), max_lines, problems,
                               max_file_lines, used)
    for rule, rel in sorted(set(EXCEPTIONS) - used):
        if os.path.exists(os.path.join(root, rel)):
            problems.append(f"{rel}: listed as an exception to '{rule}' in "
                            "scripts/check_shape.py, which it no longer needs: remove it")
    nlong = check_file_lengths(root, problems)
    for p in problems:
        print(p)
    print(f"check_shape: {nfiles} files, {nlong} files' lengths, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
