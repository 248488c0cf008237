#!/usr/bin/env python3
"""Why tests skipped, one line per distinct reason (scripts/test.sh prints it after ctest).

    usage: scripts/skip_summary.py JUNIT_XML

JUNIT_XML is what `ctest --output-junit FILE` wrote. Two groups:
  - tests ctest skipped (exit status 77 or a SKIP pattern): the reason is the first line of the
    test's output that starts with "SKIP:" (after maco-run's "[rank] " prefix);
  - tests that ran but skipped parts (pytest's and GoogleTest's skipped cases print "SKIP:"
    lines): every distinct reason once.
A reason is the text after "SKIP:", with a leading test id ("file.py::case: ") and rank numbers
("rank 3 of 4" becomes "a rank") taken out, so the same cause on many ranks or cases reads as one line with a
count. Prints nothing when nothing skipped; exits 0 unless the file cannot be read (1).
"""
import collections
import re
import sys
import xml.etree.ElementTree as ET

SKIP_LINE = re.compile(r"^(?:\[\d+\] )?SKIP:\s*(.*)$")


def reason_of(text):
    """The reason of a SKIP: line's text, with what differs between ranks and cases removed."""
    r = text.strip()
    r = re.sub(r"^[\w./-]+::\S+: ", "", r)  # pytest node id: "test_x.py::test_y[p]: "
    r = re.sub(r"\brank \d+ of \d+\b", "a rank", r)
    return r


def skip_lines(out):
    return [m.group(1) for m in map(SKIP_LINE.match, out.splitlines()) if m]


def names(tests, most=6):
    shown = ", ".join(tests[:most])
    return shown + (f" and {len(tests) - most} more" if len(tests) > most else "")


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    try:
        root = ET.parse(argv[1]).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"skip_summary: cannot read {argv[1]}: {e}", file=sys.stderr)
        return 1
    skipped = collections.OrderedDict()  # reason -> [test]
    inside = collections.OrderedDict()  # reason -> [test] (tests that ran)
    for case in root.iter("testcase"):
        name = case.get("name", "?")
        out = case.findtext("system-out") or ""
        lines = skip_lines(out)
        if case.find("skipped") is not None:
            if lines:
                reason = reason_of(lines[0])
            else:
                reason = "(no SKIP: line) " + case.find("skipped").get("message", "")
            skipped.setdefault(reason, []).append(name)
        else:
            for reason in dict.fromkeys(reason_of(line) for line in lines):
                tests = inside.setdefault(reason, [])
                if name not in tests:
                    tests.append(name)
    if skipped:
        total = sum(len(t) for t in skipped.values())
        print(f"Skipped tests: {total}, for {len(skipped)} reason(s):")
        for reason, tests in sorted(skipped.items(), key=lambda kv: -len(kv[1])):
            print(f"  {len(tests)} test(s) ({names(tests)}): {reason}")
    if inside:
        print(f"Skipped inside tests that ran, {len(inside)} reason(s):")
        for reason, tests in sorted(inside.items(), key=lambda kv: -len(kv[1])):
            print(f"  in {names(tests)}: {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
