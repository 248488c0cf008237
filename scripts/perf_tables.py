#!/usr/bin/env python3
"""Markdown tables from maco-perf --json files (eager and -G runs of one collective).

usage: scripts/perf_tables.py DIR COLLECTIVE NRANKS [SUFFIX]
Reads DIR/perf-<collective>-n<N>-g0<SUFFIX>.json (eager) and -g10<SUFFIX>.json
(graph-replayed, optional), maco-perf --json's files named that way (SUFFIX: -R0 or -R1), and prints one row per size: MACO and NCCL time in us,
MACO and NCCL busbw in GB/s, and MACO/NCCL (time ratio below 64 KiB, busbw ratio above).
"""
import json
import os
import sys


def load(path):
    with open(path) as f:
        return {(r["size_bytes"]): r for r in json.load(f) if not r["inplace"]}


def size_text(b):
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= div and b % div == 0:
            return f"{b // div}{unit}"
    return str(b)


def main():
    d, coll, n = sys.argv[1], sys.argv[2], sys.argv[3]
    sfx = sys.argv[4] if len(sys.argv) > 4 else ""
    eager = load(f"{d}/perf-{coll}-n{n}-g0{sfx}.json")
    gpath = f"{d}/perf-{coll}-n{n}-g10{sfx}.json"
    graph = load(gpath) if os.path.exists(gpath) else {}
    print("| size | algorithm | MACO us | NCCL us | MACO busbw | NCCL busbw | ratio "
          "| MACO us -G | NCCL us -G | ratio -G |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for size in sorted(eager):
        e, g = eager[size], graph.get(size)
        # Below 64 KiB the target is about time (MACO/NCCL time); above, about bandwidth.
        small = size <= 65536
        def ratio(r):
            if small:
                return f"{r['time_us'] / r['nccl_time_us']:.2f}t"
            return f"{r['busbw_gbps'] / r['nccl_busbw_gbps']:.2f}"
        row = [size_text(size), e["algorithm"], f"{e['time_us']:.2f}", f"{e['nccl_time_us']:.2f}",
               f"{e['busbw_gbps']:.1f}", f"{e['nccl_busbw_gbps']:.1f}", ratio(e)]
        if g:
            row += [f"{g['time_us']:.2f}", f"{g['nccl_time_us']:.2f}", ratio(g)]
        else:
            row += ["", "", ""]
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
