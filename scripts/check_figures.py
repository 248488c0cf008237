#!/usr/bin/env python3
"""Every measured figure in the user docs names the date it was measured (ctest doc_figures).

    usage: scripts/check_figures.py FILE...   (ctest passes README.md and docs/performance.md)

A *figure* is a number with a unit of time, rate, ratio or share, written in prose or a table:
  12 us, 3.5 ms, 386 s, 2 minutes, 345.3 GB/s, 74.8 MB/s, 654 TFLOP/s, 1.16x, 40%
(a range such as 0.98-1.29x counts as one). Not figures: numbers in `code spans`, fenced code
blocks and HTML comments (commands, settings such as `MACO_DEVICE_TIMEOUT=60s`); sizes and
counts (1 GiB, 4 ranks); a GPU count before a GPU name (4x H200).

A figure is *dated* when the text it belongs to names a date as YYYY-MM-DD (link targets do not
count). The text it belongs to is the smallest of: its table row's table together with the
paragraph just above the table; its list item (with the paragraph just above the list when
that paragraph ends with ":"); its paragraph; and, in every case, the headings it sits under.

Prints each undated figure as FILE:LINE: and exits 1 when there is one, else 0. The rule
behind it (every figure names machine, date, commit and raw output) is in docs/performance.md,
"How to read this page"; this check covers the date.
"""
import re
import sys

DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
UNIT = (r"(?:\s?(?:ns|us|µs|ms|s|sec|seconds|min|minutes|h|hours|GB/s|MB/s|GiB/s|MiB/s|Gb/s"
        r"|TFLOP/s)(?![\w/])|x(?![\w])|%)")
FIGURE = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)?(?:\s?-\s?\d+(?:\.\d+)?)?" + UNIT)
GPU_COUNT = re.compile(r"^\d+x\s+(?:H100|H200|A100|B200|GB200|GPU)")
LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s")


def strip_inline(line):
    """The line without code spans, HTML comments and link targets."""
    line = re.sub(r"<!--.*?-->", " ", line)
    line = re.sub(r"`[^`]*`", " ", line)
    line = re.sub(r"\]\([^)]*\)", "]", line)
    return line


def units_of(lines):
    """Splits a Markdown file into units: (kind, first line, last line) with 0-based indexes,
    kind one of heading, table, item, para; fenced code and HTML comment blocks dropped."""
    units = []
    i, n = 0, len(lines)
    while i < n:
        line = lines[i]
        s = line.strip()
        if s.startswith("```"):
            i += 1
            while i < n and not lines[i].strip().startswith("```"):
                i += 1
            i += 1
            continue
        if s.startswith("<!--") and "-->" not in s:
            while i < n and "-->" not in lines[i]:
                i += 1
            i += 1
            continue
        if not s:
            i += 1
            continue
        if s.startswith("#"):
            units.append(("heading", i, i))
            i += 1
            continue
        if s.startswith("|"):
            j = i
            while j + 1 < n and lines[j + 1].strip().startswith("|"):
                j += 1
            units.append(("table", i, j))
            i = j + 1
            continue
        if LIST_ITEM.match(line):
            j = i
            while (j + 1 < n and lines[j + 1].strip() and not LIST_ITEM.match(lines[j + 1])
                   and not lines[j + 1].strip().startswith(("#", "|", "```"))):
                j += 1
            units.append(("item", i, j))
            i = j + 1
            continue
        j = i
        while (j + 1 < n and lines[j + 1].strip() and not LIST_ITEM.match(lines[j + 1])
               and not lines[j + 1].strip().startswith(("#", "|", "```"))):
            j += 1
        units.append(("para", i, j))
        i = j + 1
    return units


def check(path):
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    clean = [strip_inline(line) for line in lines]
    units = units_of(lines)
    problems = []
    headings = {}  # level -> text
    prev = None  # the unit before this one
    lead = None  # the paragraph before the current list, when it ends with ":"
    for kind, a, b in units:
        text = "\n".join(clean[a:b + 1])
        if kind == "heading":
            level = len(lines[a]) - len(lines[a].lstrip("#"))
            headings = {k: v for k, v in headings.items() if k < level}
            headings[level] = text
            prev, lead = None, None
            continue
        context = [text] + list(headings.values())
        if kind == "table" and prev is not None and prev[0] == "para":
            context.append("\n".join(clean[prev[1]:prev[2] + 1]))
        if kind == "item":
            if prev is not None and prev[0] == "para" and clean[prev[2]].rstrip().endswith(":"):
                lead = "\n".join(clean[prev[1]:prev[2] + 1])
            elif prev is None or prev[0] != "item":
                lead = None
            if lead:
                context.append(lead)
        dated = any(DATE.search(c) for c in context)
        if not dated:
            for k in range(a, b + 1):
                for m in FIGURE.finditer(clean[k]):
                    if GPU_COUNT.match(clean[k][m.start():]):
                        continue
                    problems.append(f"{path}:{k + 1}: undated figure '{m.group(0).strip()}' "
                                    "(no YYYY-MM-DD in its paragraph, list item or table, nor "
                                    "in its headings)")
        prev = (kind, a, b)
    return problems


def main(argv):
    if len(argv) < 2:
        print("usage: scripts/check_figures.py FILE...", file=sys.stderr)
        return 2
    problems = []
    for path in argv[1:]:
        try:
            problems += check(path)
        except OSError as e:
            print(f"check_figures: cannot read {path}: {e}", file=sys.stderr)
            return 2
    for p in problems:
        print(p)
    if problems:
        print(f"check_figures: {len(problems)} undated figure(s): name the date each was "
              "measured (docs/performance.md, \"How to read this page\")")
        return 1
    print(f"check_figures: every figure in {', '.join(argv[1:])} is dated")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
