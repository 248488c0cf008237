#!/usr/bin/env python3
"""Compares training runs of tests/python/bench_ddp.py (their --json files): the first is the
reference, every other is checked against it.

    python3 scripts/compare_runs.py REF.json OTHER.json [MORE.json ...] [--rtol 0.02]
        [--markdown FILE]

Same curve: the runs must be of the same benchmark (mode, model shape, steps, seed, learning
rate; the world size may differ, bench_ddp's data and weights do not depend on it), every
loss finite, and at every step |loss - loss_ref| <= rtol * |loss_ref|. The default rtol,
0.02, is about 5 units in the last place of bfloat16 (8 significand bits: 2^-8 = 0.39%
relative): two correct backends differ only in the rounding of their reductions (summation
order of bf16 gradients or activations), which changes the first step's update in the last
bits and grows slowly over 50 steps; a wrong reduction (a missing average, a dropped bucket,
stale data) moves the curve by far more within a few steps. Calibrate on the machine: two
runs of one backend (run-to-run noise) and NCCL with NCCL_ALGO=Ring against Tree (rounding
noise) show the floor; the table prints the largest relative difference of each run.

Prints a markdown table (and writes it to --markdown FILE): per run its backend, NCCL
library, world size, GPU, median and mean step time, the ratio of its median step time to the
reference's, the largest relative loss difference and the verdict. Exit status: 0 when every
curve matches the reference, 1 when one differs (or a run failed its own checks), 2 for
unusable input. Step times are reported, never judged.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

# Fields that must agree for two runs to be comparable.
SAME = ("bench", "mode", "shape", "steps", "seed", "lr")


def load(path: str) -> dict:
    with open(path) as f:
        run = json.load(f)
    if run.get("bench") != "bench_ddp" or not isinstance(run.get("loss"), list):
        raise ValueError(f"{path}: not a bench_ddp --json file")
    run["_path"] = path
    return run


def curve_diff(ref: list, other: list) -> tuple[float, int]:
    """The largest |other - ref| / |ref| over the steps, and its step (inf when a loss is not
    finite or the lengths differ)."""
    if len(ref) != len(other):
        return math.inf, -1
    worst, at = 0.0, 0
    for i, (a, b) in enumerate(zip(ref, other)):
        if not (math.isfinite(a) and math.isfinite(b)):
            return math.inf, i
        d = abs(b - a) / max(abs(a), 1e-12)
        if d > worst:
            worst, at = d, i
    return worst, at


def compare(runs: list, rtol: float) -> tuple[list, list]:
    """Rows for the table and the problems found, the first run being the reference."""
    ref = runs[0]
    rows, problems = [], []
    for i, run in enumerate(runs):
        name = run.get("label") or run["_path"]
        mism = [k for k in SAME if run.get(k) != ref.get(k)]
        if i == 0:
            diff, at, verdict = 0.0, 0, "reference"
        elif mism:
            diff, at = math.inf, -1
            verdict = "not comparable"
            problems.append(f"{name}: not the same benchmark as {ref.get('label')}: "
                            + ", ".join(f"{k} {run.get(k)!r} vs {ref.get(k)!r}" for k in mism))
        else:
            diff, at = curve_diff(ref["loss"], run["loss"])
            verdict = "same curve" if diff <= rtol else "DIFFERENT"
            if diff > rtol:
                problems.append(f"{name}: loss differs from {ref.get('label')} by "
                                f"{diff:.3%} at step {at} (tolerance {rtol:.2%})")
        if not run.get("ok", True):
            verdict += ", its checks FAILED"
            problems.append(f"{name}: failed its own checks: {run.get('failures')}")
        rows.append(dict(name=name, backend=run.get("backend"),
                         nccl=run.get("nccl_library") or "-", world=run.get("world_size"),
                         gpu=run.get("gpu"), median=run.get("median_ms"),
                         mean=run.get("mean_ms"),
                         ratio=run["median_ms"] / ref["median_ms"] if ref.get("median_ms") else
                         math.nan,
                         diff=diff, at=at, final=run["loss"][-1] if run["loss"] else math.nan,
                         verdict=verdict))
    return rows, problems


def markdown(rows: list, ref: dict, rtol: float) -> str:
    out = [f"{ref.get('mode')}: {ref.get('params', 0):,} parameters, {ref.get('steps')} steps "
           f"({ref.get('warmup')} warm-up steps left out of the times), reference "
           f"{rows[0]['name']}; loss tolerance {rtol:.2%} per step", "",
           "| run | backend | NCCL library | world size | GPU | median step (ms) | mean step (ms) "
           "| median / reference | max loss difference (step) | final loss | curve |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        diff = "-" if r["verdict"] == "reference" else (
            "n/a" if math.isinf(r["diff"]) else f"{r['diff']:.3%} ({r['at']})")
        out.append(f"| {r['name']} | {r['backend']} | {r['nccl']} | {r['world']} | {r['gpu']} | "
                   f"{r['median']:.2f} | {r['mean']:.2f} | {r['ratio']:.3f} | {diff} | "
                   f"{r['final']:.4f} | {r['verdict']} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", metavar="RUN.json", help="bench_ddp --json files; the "
                   "first is the reference")
    p.add_argument("--rtol", type=float, default=0.02,
                   help="largest relative loss difference per step (default 0.02)")
    p.add_argument("--markdown", metavar="FILE", help="also write the table to FILE")
    a = p.parse_args(argv)
    if len(a.runs) < 2:
        p.error("give a reference and at least one run to compare with it")
    try:
        runs = [load(r) for r in a.runs]
    except (OSError, ValueError) as e:
        print(f"compare_runs: {e}", file=sys.stderr)
        return 2
    rows, problems = compare(runs, a.rtol)
    table = markdown(rows, runs[0], a.rtol)
    print(table, end="")
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(table)
    for pr in problems:
        print(f"FAIL {pr}")
    if problems:
        return 1
    print(f"PASS compare_runs: {len(runs) - 1} run(s) on the reference's curve within "
          f"{a.rtol:.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
