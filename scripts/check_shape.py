#!/usr/bin/env python3
"""Checks the shape rules of MACO's C, C++ and CUDA code (docs/design.md, "Layers") and of the
Python package (docs/design.md, "Python package"):

  length   no function body longer than MAX_LINES lines (150), counted from its opening
           brace's line to its closing brace's line;
  macros   no #define inside a function body (a macro there hides control flow or captures
           the function's locals: use a function, a lambda or a template instead);
  files    no file longer than FILE_LINES lines (700) under FILE_FOLDERS (python-bindings:
           its Python modules, the extension's sources and its build files): a longer one is
           split by topic.

Files: every .c, .h, .cc, .cpp, .cu and .cuh of the tree under the folders the library, its
clients and the examples live in (include, src, algorithms, proxy, nccl, tools,
python-bindings/src, examples); tests, generated code and docs/results are not checked.
Function bodies (C++ member functions too) are found the way clang-format lays them out in
this tree (.clang-format: a function's opening brace alone on its line, the closing one at
the same indentation); a brace alone on a line after a `namespace`, `extern "C"`, struct,
class, enum or union head is not a function.

  usage: scripts/check_shape.py SOURCE_DIR [--max-lines N]
Prints one line per problem (file:line: what); exit status 1 when there is one, 2 on bad
usage.
"""
import os
import re
import sys

FOLDERS = ("include", "src", "algorithms", "proxy", "nccl", "tools", "python-bindings/src",
           "examples")
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


def check_file(path, rel, max_lines, problems):
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
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
    max_lines = 150
    if "--max-lines" in args:
        k = args.index("--max-lines")
        try:
            max_lines = int(args[k + 1])
        except (IndexError, ValueError):
            print(__doc__, file=sys.stderr)
            return 2
        del args[k:k + 2]
    if len(args) != 1 or not os.path.isdir(args[0]):
        print(__doc__, file=sys.stderr)
        return 2
    root = args[0]
    problems = []
    nfiles = 0
    for folder in FOLDERS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, folder)):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(("build", ".")))
            for fn in sorted(filenames):
                if fn.endswith(SOURCE_EXT):
                    path = os.path.join(dirpath, fn)
                    nfiles += 1
                    check_file(path, os.path.relpath(path, root), max_lines, problems)
    nlong = check_file_lengths(root, problems)
    for p in problems:
        print(p)
    print(f"check_shape: {nfiles} files, {nlong} files' lengths, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
