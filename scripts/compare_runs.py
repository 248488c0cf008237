#!/usr/bin/env python3
"""Compares training runs of tests/python/bench_ddp.py (their --json files): the first is the
reference, every other is checked against it.

    python3 scripts/compare_runs.py REF.json OTHER.json [MORE.json ...] [--rtol 0.02]
        [--noise NOISE.json] [--markdown FILE]

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

--noise NOISE.json: a run of the reference's own backend with bench_ddp --perturb-ulp (every
gradient element moved by about one bf16 ulp, what another summation order changes). Once a
model starts to learn, its curve is chaotic: when the loss breaks away depends on the last
bits, so two correct backends can differ by far more than rtol late in the run (seen on an
H100: 3-22% at step 49). With --noise the tolerance at step s is the larger of rtol and twice
the largest relative difference between NOISE and the reference at any step up to s: "within
bf16 noise", measured on the same machine. The noise run is shown in the table, not judged.

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


def rel_diffs(ref: list, other: list) -> list:
    """|other - ref| / |ref| per step (inf where a loss is not finite)."""
    return [abs(b - a) / max(abs(a), 1e-12) if math.isfinite(a) and math.isfinite(b)
            else math.inf for a, b in zip(ref, other)]


def tolerances(ref: list, noise: list | None, rtol: float) -> list:
    """Per step: rtol, or twice the noise run's largest relative difference so far."""
    if noise is None:
        return [rtol] * len(ref)
    out, worst = [], 0.0
    for d in rel_diffs(ref, noise):
        worst = max(worst, d if math.isfinite(d) else 0.0)
        out.append(max(rtol, 2.0 * worst))
    return out


def curve_diff(ref: list, other: list, tol: list | None = None) -> tuple[float, int, bool]:
    """The largest |other - ref| / |ref| over the steps, its step (inf when a loss is not
    finite or the lengths differ), and whether every step is within `tol` (per step)."""
    if len(ref) != len(other):
        return math.inf, -1, False
    worst, at, ok = 0.0, 0, True
    for i, d in enumerate(rel_diffs(ref, other)):
        if not math.isfinite(d):
            return math.inf, i, False
        if tol is not None and d > tol[i]:
            ok = False
        if d > worst:
            worst, at = d, i
    return worst, at, ok


def compare(runs: list, rtol: float, noise: dict | None = None) -> tuple[list, list]:
    """Rows for the table and the problems found, the first run being the reference; `noise`
    (a --perturb-ulp run of the reference's backend) sets the per-step tolerance."""
    ref = runs[0]
    rows, problems = [], []
    tol = tolerances(ref["loss"], noise["loss"] if noise else None, rtol)
    for i, run in enumerate(runs + ([noise] if noise else [])):
        name = run.get("label") or run["_path"]
        mism = [k for k in SAME if run.get(k) != ref.get(k)]
        is_noise = noise is not None and i == len(runs)
        if i == 0:
            diff, at, verdict = 0.0, 0, "reference"
        elif mism:
            diff, at = math.inf, -1
            verdict = "not comparable"
            problems.append(f"{name}: not the same benchmark as {ref.get('label')}: "
                            + ", ".join(f"{k} {run.get(k)!r} vs {ref.get(k)!r}" for k in mism))
        elif is_noise:
            diff, at, _ = curve_diff(ref["loss"], run["loss"])
            verdict = "noise floor (--perturb-ulp)"
        else:
            diff, at, ok = curve_diff(ref["loss"], run["loss"], tol)
            verdict = "same curve" if ok else "DIFFERENT"
            if not ok:
                bad = next(j for j, d in enumerate(rel_diffs(ref["loss"], run["loss"]))
                           if not d <= tol[j])
                problems.append(f"{name}: loss differs from {ref.get('label')} by "
                                f"{abs(run['loss'][bad] - ref['loss'][bad]) / abs(ref['loss'][bad]):.3%}"
                                f" at step {bad} (tolerance there {tol[bad]:.2%}"
                                f"{', from the noise run' if noise else ''}); largest "
                                f"{diff:.3%} at step {at}")
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


def markdown(rows: list, ref: dict, rtol: float, noise: dict | None = None) -> str:
    how = (f"the larger of {rtol:.2%} and twice the noise run's largest difference so far "
           f"(at the last step {tolerances(ref['loss'], noise['loss'], rtol)[-1]:.2%})"
           if noise else f"{rtol:.2%}")
    out = [f"{ref.get('mode')}: {ref.get('params', 0):,} parameters, {ref.get('steps')} steps "
           f"({ref.get('warmup')} warm-up steps left out of the times), reference "
           f"{rows[0]['name']}; loss tolerance per step: {how}", "",
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
    p.add_argument("--noise", metavar="NOISE.json",
                   help="a bench_ddp --perturb-ulp run of the reference's backend: the "
                        "tolerance follows its difference from the reference")
    p.add_argument("--markdown", metavar="FILE", help="also write the table to FILE")
    a = p.parse_args(argv)
    if len(a.runs) < 2:
        p.error("give a reference and at least one run to compare with it")
    try:
        runs = [load(r) for r in a.runs]
        noise = load(a.noise) if a.noise else None
    except (OSError, ValueError) as e:
        print(f"compare_runs: {e}", file=sys.stderr)
        return 2
    if noise is not None and not noise.get("perturbed"):
        print(f"compare_runs: --noise {a.noise} is not a --perturb-ulp run", file=sys.stderr)
        return 2
    rows, problems = compare(runs, a.rtol, noise)
    table = markdown(rows, runs[0], a.rtol, noise)
    print(table, end="")
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(table)
    for pr in problems:
        print(f"FAIL {pr}")
    if problems:
        return 1
    print(f"PASS compare_runs: {len(runs) - 1} run(s) on the reference's curve within "
          f"{'the noise run' if noise else format(a.rtol, '.2%')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
