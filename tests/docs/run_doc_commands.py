#!/usr/bin/env python3
"""Runs the shell commands of Markdown pages as printed (ctest docs_commands).

    usage: run_doc_commands.py --build BUILD --src SRC --work WORK [--nvcc NVCC] PAGE...

Every fenced block opened with ```sh (or ```bash) in each PAGE (a path under SRC), in page
order, becomes one bash script, run from a scratch copy of the repository's root:
  WORK/tree/build     a link to BUILD (so `cmake --install build ...` installs this build);
  WORK/tree/examples  a copy of SRC/examples (so `make -C examples` writes into the copy);
  HOME=WORK/home      so `$HOME/maco` is a fresh prefix; PKG_CONFIG_PATH and LD_LIBRARY_PATH
                      unset; nvcc's and cmake's folders first on PATH; CUDAARCHS=90 and
                      CUDA_ARCH (the examples' Makefile) set to one architecture, which only
                      shortens the CUDA builds.
A block is left out when the nearest non-blank line above its fence is an HTML comment
`<!-- doc-test: skip: REASON -->` (REASON says why: it builds the whole tree, it needs a GPU
and PyTorch...). The pages mark such blocks, and this script prints each with its reason.

Each command must exit 0, or 77: MACO's programs exit 77 when they skip for want of a usable
GPU (after printing "SKIP:" and why), so on a machine without one a command such as
`maco-run -n 4 ./allreduce` counts as run and skipped. Any other status fails the run, naming
the page and line of the command. Exits 0 when every block ran, 1 otherwise, 2 on bad usage.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

FENCE_OPEN = re.compile(r"^```(sh|bash)\s*$")
FENCE_CLOSE = re.compile(r"^```\s*$")
SKIP_MARK = re.compile(r"^<!--\s*doc-test:\s*skip:\s*(.*?)\s*-->\s*$")
SKIPPED_EXIT = 77


def blocks_of(path, shown):
    """The sh blocks of a page: (shown name, first line number of the body, body lines, reason
    to leave it out or None)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    out = []
    i = 0
    while i < len(lines):
        if FENCE_OPEN.match(lines[i]):
            k = i - 1
            while k >= 0 and not lines[k].strip():
                k -= 1
            m = SKIP_MARK.match(lines[k].strip()) if k >= 0 else None
            j = i + 1
            while j < len(lines) and not FENCE_CLOSE.match(lines[j]):
                j += 1
            if j == len(lines):
                raise ValueError(f"{shown}:{i + 1}: a ```sh block that is never closed")
            out.append((shown, i + 2, lines[i + 1:j], m.group(1) if m else None))
            i = j + 1
        else:
            i += 1
    return out


def script_of(blocks):
    """The bash script and, per script line, the (page, line) it came from."""
    head = [
        "set -uo pipefail",
        "skipped=0",
        "on_err() {",
        f"  if [ \"$1\" -eq {SKIPPED_EXIT} ]; then skipped=$((skipped + 1));",
        "    echo \"docs_commands: exit 77 (skipped) at script line $2\" >&2; set -x",
        "  else echo \"docs_commands: FAILED: exit status $1 at script line $2\" >&2; exit \"$1\"; fi",
        "}",
        "trap '{ err_rc=$? err_line=$LINENO; set +x; } 2>/dev/null; on_err $err_rc $err_line' ERR",
        "PS4='+ '",
    ]
    where = [None] * len(head)
    text = list(head)
    for page, first, body, reason in blocks:
        if reason is not None:
            continue
        text.append(f"echo '=== {page}:{first - 1}' >&2")
        where.append(None)
        text.append("set -x")
        where.append(None)
        for n, line in enumerate(body):
            text.append(line)
            where.append((page, first + n))
        text.append("{ set +x; } 2>/dev/null")
        where.append(None)
    text.append("echo \"docs_commands: commands that skipped (exit 77): $skipped\"")
    where.append(None)
    return "\n".join(text) + "\n", where


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--src", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--nvcc", default=shutil.which("nvcc") or "nvcc")
    ap.add_argument("--timeout", type=int, default=850, help="seconds for all blocks")
    ap.add_argument("pages", nargs="+")
    a = ap.parse_args(argv[1:])

    blocks = []
    for page in a.pages:
        found = blocks_of(os.path.join(a.src, page), page)
        if not any(r is None for _, _, _, r in found):
            print(f"docs_commands: {page} has no ```sh block to run", file=sys.stderr)
            return 1
        blocks += found
    for page, first, _, reason in blocks:
        if reason is not None:
            print(f"docs_commands: not run: {page}:{first - 1}: {reason}")

    work = os.path.abspath(a.work)
    shutil.rmtree(work, ignore_errors=True)
    tree, home = os.path.join(work, "tree"), os.path.join(work, "home")
    os.makedirs(tree)
    os.makedirs(home)
    os.symlink(os.path.abspath(a.build), os.path.join(tree, "build"))
    shutil.copytree(os.path.join(a.src, "examples"), os.path.join(tree, "examples"),
                    ignore=shutil.ignore_patterns("bin", "build*"))
    script, where = script_of(blocks)
    with open(os.path.join(work, "commands.sh"), "w", encoding="utf-8") as f:
        f.write(script)

    env = dict(os.environ)
    for name in ("PKG_CONFIG_PATH", "LD_LIBRARY_PATH", "MAKEFLAGS", "CUDA_HOME"):
        env.pop(name, None)
    nvcc_dir = os.path.dirname(os.path.abspath(shutil.which(a.nvcc) or a.nvcc))
    cmake = shutil.which("cmake")
    front = [nvcc_dir] + ([os.path.dirname(cmake)] if cmake else [])
    env["PATH"] = os.pathsep.join(front + [env.get("PATH", "")])
    env.update(HOME=home, CUDAARCHS="90", CUDA_ARCH="-gencode arch=compute_90,code=sm_90")
    try:
        p = subprocess.run(["bash", os.path.join(work, "commands.sh")], cwd=tree, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=a.timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout if isinstance(e.stdout, str) else (e.stdout or b"").decode(errors="replace")
        print(out[-8000:])
        print(f"docs_commands: FAILED: the commands took more than {a.timeout} s")
        return 1
    out = p.stdout

    def name_lines(m):
        k = int(m.group(2)) - 1
        src = where[k] if 0 <= k < len(where) else None
        return m.group(1) + (f"{src[0]}:{src[1]}" if src else f"script line {k + 1}")

    out = re.sub(r"(docs_commands: (?:exit 77 \(skipped\)|FAILED: exit status \d+) at )"
                 r"script line (\d+)", name_lines, out)
    print(out[-20000:])
    if p.returncode != 0:
        print(f"docs_commands: FAILED (exit status {p.returncode}); the script is "
              f"{work}/commands.sh, run in {tree}")
        return 1
    ran = sum(1 for b in blocks if b[3] is None)
    print(f"docs_commands: {ran} block(s) ran as printed; {len(blocks) - ran} left out (above)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
