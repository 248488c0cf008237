#!/usr/bin/env python3
"""MACO against NCCL: tables and target checks from maco-perf --json files (scripts/gpu-perf.sh).

usage: scripts/perf_report.py DIR [--before OLD_DIR]

DIR holds perf-<collective>-R<0|1>-g<0|10>-<run>.json, <run> = run1, run2, ... (this code,
NCCL as installed) or new (the newest NCCL through MACO_NCCL_LIBRARY). -R 0 pairs MACO and
NCCL on the same cudaMalloc buffers (NCCL's classic kernels); -R 1 pairs MACO's registered
buffers with NCCL's ncclMemAlloc buffers registered as symmetric windows (its symmetric
kernels where it has one; the "path" column says which it took). OLD_DIR (default
docs/results/2026-11-22b, the last 4-GPU tables) holds perf-<collective>-n4-g<G>-R<R>.json,
as files or in its raw.tgz.

Prints markdown: per collective, registration and mode, one row per size with MACO's median
time over the runs (and its spread, max-min over median), NCCL's median time and path, busbw
and MACO/NCCL ratios, the newest NCCL, and MACO's time before; then each target (targets()
below) with the sizes that miss it. "Slower than before" means: median of the runs above the old
time by more than max(5%, the spread of the runs). Times in us; busbw in GB/s (1e9 B/s),
nccl-tests' definition as maco-perf prints it. Exit status 0 (it reports; it does not judge).
"""
import glob
import json
import os
import re
import statistics
import sys
import tarfile

COLLS = ["allreduce", "allgather", "reduce_scatter", "broadcast", "reduce", "alltoall",
         "sendrecv"]
KIB, MIB = 1 << 10, 1 << 20


def size_text(b):
    for unit, div in (("G", 1 << 30), ("M", MIB), ("K", KIB)):
        if b >= div and b % div == 0:
            return f"{b // div}{unit}"
    return str(b)


def json_rows(f):
    """{size: record} of the out-of-place rows of an open maco-perf --json file."""
    return {r["size_bytes"]: r for r in json.load(f) if not r["inplace"]}


def load(path):
    """json_rows() of the maco-perf --json file at path."""
    with open(path) as f:
        return json_rows(f)


def load_before(old_dir, name):
    """load() of OLD_DIR/name, or of that member of OLD_DIR/raw.tgz (docs/results packs its
    raw files); None when neither has it."""
    path = os.path.join(old_dir, name)
    if os.path.exists(path):
        return load(path)
    packed = os.path.join(old_dir, "raw.tgz")
    if not os.path.exists(packed):
        return None
    with tarfile.open(packed) as t:
        try:
            f = t.extractfile(name)
        except KeyError:
            return None
        return json_rows(f) if f else None


def collect(d):
    """{(coll, reg, graph): {"runs": [{size: rec}], "new": {size: rec} or None}}."""
    out = {}
    pat = re.compile(r"perf-(\w+?)-R([01])-g(\d+)-(run\d+|new)\.json$")
    for path in sorted(glob.glob(os.path.join(d, "perf-*.json"))):
        m = pat.search(os.path.basename(path))
        if not m:
            continue
        key = (m.group(1), int(m.group(2)), int(m.group(3)))
        slot = out.setdefault(key, {"runs": [], "new": None})
        if m.group(4) == "new":
            slot["new"] = load(path)
        else:
            slot["runs"].append(load(path))
    return out


def med(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def summarize(runs, size):
    """Median MACO and NCCL time and busbw over the runs at one size, MACO's spread."""
    recs = [r[size] for r in runs if size in r]
    t = [r["time_us"] for r in recs]
    nt = [r.get("nccl_time_us") for r in recs]
    s = {
        "t": med(t), "bw": med([r["busbw_gbps"] for r in recs]),
        "nt": med(nt), "nbw": med([r.get("nccl_busbw_gbps") for r in recs]),
        "spread": (max(t) - min(t)) / med(t) if len(t) > 1 else 0.0,
        "wrong": sum(r["wrong"] for r in recs), "algo": recs[0]["algorithm"] if recs else "?",
        "path": recs[0].get("nccl_path", "") if recs else "", "n": len(recs),
        "nranks": recs[0]["nranks"] if recs else 0,
    }
    return s


def fmt(v, spec=".2f"):
    return "" if v is None else format(v, spec)


def table(key, slot, before):
    coll, reg, graph = key
    runs, new = slot["runs"], slot["new"]
    sizes = sorted(set().union(*[set(r) for r in runs]) if runs else set(new or {}))
    label = "classic" if reg == 0 else "symmetric windows"
    nranks = next((r[sz]["nranks"] for r in runs or [new] for sz in r), 0)
    print(f"\n### {coll}, -R {reg}, {'-G ' + str(graph) if graph else 'eager'} "
          f"({nranks} ranks, {len(runs)} run(s); NCCL {label})\n")
    print("| size | algorithm | MACO us | spread | NCCL us | NCCL path | MACO busbw | NCCL busbw "
          "| MACO/NCCL busbw | new NCCL us | new NCCL path | MACO us before | vs before |")
    print("| ---: | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- | ---: | --- |")
    rows = {}
    for size in sizes:
        s = summarize(runs, size) if runs else summarize([new], size)
        nw = (new or {}).get(size)
        old = (before or {}).get(size)
        verdict = ""
        if old is not None and s["t"] is not None:
            tol = max(0.05, s["spread"])
            verdict = "slower" if s["t"] > old["time_us"] * (1 + tol) else "ok"
        ratio = s["bw"] / s["nbw"] if s["nbw"] else None
        print("| " + " | ".join([
            size_text(size), s["algo"], fmt(s["t"]), f"{s['spread'] * 100:.0f}%", fmt(s["nt"]),
            s["path"], fmt(s["bw"], ".1f"), fmt(s["nbw"], ".1f"), fmt(ratio),
            fmt(nw.get("nccl_time_us")) if nw else "", nw.get("nccl_path", "") if nw else "",
            fmt(old["time_us"]) if old else "", verdict]) + " |")
        rows[size] = dict(s, verdict=verdict, new_nt=nw.get("nccl_time_us") if nw else None,
                          new_nbw=nw.get("nccl_busbw_gbps") if nw else None)
    return rows


def targets(res):
    """The performance targets, on the medians: returns lines "target: met / missed at ..."."""
    out = []

    def check(name, coll, reg, graph, lo, hi, pred, what):
        rows = res.get((coll, reg, graph))
        if not rows:
            out.append(f"- {name}: not measured")
            return
        miss = [f"{size_text(sz)} ({what(r)})" for sz, r in sorted(rows.items())
                if lo <= sz <= hi and r["t"] is not None and not pred(r)]
        seen = [sz for sz in rows if lo <= sz <= hi]
        if not seen:
            out.append(f"- {name}: no size in range")
        else:
            out.append(f"- {name}: " + ("met" if not miss else "missed at " + ", ".join(miss)))

    def tr(r, key="nt"):
        return f"{r['t']:.2f} vs {r[key]:.2f} us" if r.get(key) else "no NCCL"

    def br(r, key="nbw"):
        return f"{r['bw']:.1f} vs {r[key]:.1f} GB/s" if r.get(key) else "no NCCL"

    for g in (0, 10):
        m = "eager" if g == 0 else "-G"
        check(f"allreduce <= 64 KiB, {m}: time <= 0.5x NCCL classic (both -R 0)", "allreduce", 0,
              g, 0, 64 * KIB, lambda r: r["nt"] and r["t"] <= 0.5 * r["nt"], tr)
        check(f"allreduce <= 64 KiB, {m}: faster than NCCL symmetric (both -R 1)", "allreduce", 1,
              g, 0, 64 * KIB, lambda r: r["nt"] and r["t"] < r["nt"], tr)
        check(f"allreduce 1-16 MiB, {m}: busbw >= 1.3x NCCL classic (-R 0)", "allreduce", 0, g,
              MIB, 16 * MIB, lambda r: r["nbw"] and r["bw"] >= 1.3 * r["nbw"], br)
        check(f"allreduce 1-16 MiB, {m}: busbw >= 1.1x NCCL symmetric (-R 1)", "allreduce", 1, g,
              MIB, 16 * MIB, lambda r: r["nbw"] and r["bw"] >= 1.1 * r["nbw"], br)
        for reg in (0, 1):
            check(f"allreduce >= 256 MiB, {m}, -R {reg}: >= 1.0x NCCL and >= 360 GB/s", "allreduce",
                  reg, g, 256 * MIB, 1 << 40,
                  lambda r: r["nbw"] and r["bw"] >= r["nbw"] and r["bw"] >= 360, br)
        for c in ("allgather", "reduce_scatter", "broadcast", "reduce"):
            for reg in (0, 1):
                check(f"{c} 1 KiB-1 GiB, {m}, -R {reg}: busbw >= 1.0x NCCL", c, reg, g, KIB,
                      1 << 30, lambda r: r["nbw"] and r["bw"] >= r["nbw"], br)
                check(f"{c} <= 64 KiB, {m}, -R {reg}: time <= 0.5x NCCL", c, reg, g, 0, 64 * KIB,
                      lambda r: r["nt"] and r["t"] <= 0.5 * r["nt"], tr)
        for c in ("alltoall", "sendrecv"):
            for reg in (0, 1):
                check(f"{c}, {m}, -R {reg}: >= 1.0x NCCL at every size", c, reg, g, 0, 1 << 40,
                      lambda r: r["nbw"] and r["bw"] >= r["nbw"], br)
    check("allreduce <= 64 KiB: <= 5 us graph-replayed (-R 1)", "allreduce", 1, 10, 0, 64 * KIB,
          lambda r: r["t"] <= 5.0, lambda r: f"{r['t']:.2f} us")
    return out


def main():
    args = sys.argv[1:]
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    d = args[0]
    old_dir = "docs/results/2026-11-22b"
    if "--before" in args:
        old_dir = args[args.index("--before") + 1]
    data = collect(d)
    if not data:
        print(f"perf_report: no perf-*-R*-g*-run*.json or -new.json in {d}")
        return 0
    print(f"# MACO against NCCL: report from {d}\n")
    res = {}
    for key in sorted(data, key=lambda k: (COLLS.index(k[0]) if k[0] in COLLS else 99, k[1],
                                           k[2])):
        coll, reg, graph = key
        before = None
        nranks = next((r[s]["nranks"] for r in data[key]["runs"] for s in r), 0)
        if nranks == 4:
            before = load_before(old_dir, f"perf-{coll}-n4-g{graph}-R{reg}.json")
        res[key] = table(key, data[key], before)
    print("\n## Targets (medians of the runs)\n")
    ranks = sorted({r["nranks"] for rows in res.values() for r in rows.values()})
    if ranks != [4]:
        print(f"(these tables have {', '.join(map(str, ranks))} rank(s); the targets are for 4 "
              "GPUs, one rank each: a rehearsal, not a verdict)\n")
    for line in targets(res):
        print(line)
    wrong = sum(r["wrong"] for rows in res.values() for r in rows.values())
    slower = [f"{k[0]} -R {k[1]} {'-G' if k[2] else 'eager'} {size_text(s)}"
              for k, rows in res.items() for s, r in sorted(rows.items()) if r["verdict"] == "slower"]
    print(f"\nwrong values in the timed tables' checks: {wrong}")
    print("slower than before beyond the runs' spread (min 5%): " +
          (", ".join(slower) if slower else "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
