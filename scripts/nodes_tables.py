#!/usr/bin/env python3
"""Markdown tables of maco-perf runs on 2 simulated nodes x 2 ranks next to one node of 4
(scripts/gpu-nodes-apps.sh perf): for each collective, per size the algorithm, time (us) and
busbw (GB/s) of both shapes and the time ratio 2x2 / 4x1, and the transports the 2x2 run's
proxies reported (MACO_LOG_LEVEL=info lines "rank N's proxy uses the T transport").

    python3 scripts/nodes_tables.py DIR [COLLECTIVE ...]

Reads DIR/perf-2x2-<collective>.json and DIR/perf-4x1-<collective>.json (maco-perf --json:
a list of objects with size_bytes, algorithm, time_us, busbw_gbps, wrong, inplace) and
DIR/perf-2x2-<collective>.txt (the run's log). Out-of-place rows only. A missing file leaves
its columns empty; exit status 1 when a run reported wrong values, else 0.
"""

from __future__ import annotations

import json
import os
import re
import sys

COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "broadcast", "reduce", "alltoall",
               "sendrecv")
TRANSPORT = re.compile(r"proxy uses the (\S+) transport")


def load(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return {r["size_bytes"]: r for r in json.load(f) if not r.get("inplace")}


def transports(path: str) -> list:
    if not os.path.exists(path):
        return []
    with open(path, errors="replace") as f:
        return sorted({m.group(1) for m in TRANSPORT.finditer(f.read())})


def size_text(b: int) -> str:
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= div and b % div == 0:
            return f"{b // div}{unit}"
    return str(b)


def table(d: str, coll: str) -> tuple[str, int]:
    two, one = load(f"{d}/perf-2x2-{coll}.json"), load(f"{d}/perf-4x1-{coll}.json")
    tr = transports(f"{d}/perf-2x2-{coll}.txt")
    wrong = sum(r.get("wrong", 0) for r in list(two.values()) + list(one.values()))
    head = (f"**{coll}**, 2 nodes x 2 (between nodes: {', '.join(tr) or 'transport not logged'}; "
            f"inside a node: memory channels) next to 1 node x 4; time in us, busbw in GB/s"
            f"{'; WRONG VALUES: %d' % wrong if wrong else ''}\n\n")
    rows = ["| size | 4x1 algorithm | 4x1 us | 4x1 busbw | 2x2 algorithm | 2x2 us | 2x2 busbw "
            "| 2x2 / 4x1 time |", "| ---: | --- | ---: | ---: | --- | ---: | ---: | ---: |"]
    for size in sorted(set(two) | set(one)):
        a, b = one.get(size), two.get(size)

        def cols(r):
            return ("-", "-", "-") if r is None else (
                r["algorithm"], f"{r['time_us']:.2f}", f"{r['busbw_gbps']:.2f}")
        ratio = f"{b['time_us'] / a['time_us']:.2f}" if a and b and a["time_us"] > 0 else "-"
        rows.append(f"| {size_text(size)} | " + " | ".join(cols(a)) + " | "
                    + " | ".join(cols(b)) + f" | {ratio} |")
    return head + "\n".join(rows) + "\n", wrong


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(__doc__.strip().split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    d, colls = argv[0], argv[1:] or list(COLLECTIVES)
    bad = 0
    for c in colls:
        text, wrong = table(d, c)
        print(text)
        bad += wrong
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
