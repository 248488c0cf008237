"""The arithmetic of :func:`maco.profiler`'s summary: how much of each operation's time ran
beside work of the other kind, and how much of the communication was hidden.

A span is ``(name, kind, start_ms, duration_ms, sms)``: ``kind`` is "comm" (a collective, a
copy-engine transfer, a barrier) or "compute" (a GEMM or a sum that MACO enqueued); ``sms`` the
SMs it occupies where known (an int; 0 for the copy engines), else None. Times are GPU times
between CUDA events, in ms from the profiled block's start.

Definitions (the seeds' profiler table: operation, time, overlap %, SMs):

- a row's time: the sum of its spans' durations;
- a row's overlap %: the share of that time during which work of the other kind (any span of
  it, on any stream) was running: for a communication row the part hidden behind compute,
  for a compute row the part that had communication beside it;
- total overlap efficiency: |C ∩ K| / |C|, with C the union of all communication spans and K
  that of all compute spans: the share of the time the GPU spent communicating that was
  hidden behind MACO's compute. Compute that MACO did not enqueue (the model's other torch
  kernels) is not seen, so the figure is a lower bound of what the user's program hides.

Pure Python: tested on the CPU (tests/python/test_overlap.py).
"""

from __future__ import annotations

import bisect
from typing import Iterable, Optional

__all__ = ["merge", "covered", "overlap_table", "format_table"]


def merge(intervals: Iterable[tuple]) -> list:
    """The union of ``(start, end)`` intervals as sorted, disjoint ``(start, end)`` pairs
    (empty and reversed intervals are dropped)."""
    out: list = []
    for a, b in sorted((a, b) for a, b in intervals if b > a):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def covered(a: float, b: float, merged: list, starts: Optional[list] = None) -> float:
    """The length of [a, b) that lies inside ``merged`` (the output of :func:`merge`).
    ``starts``: ``[s for s, _ in merged]``, precomputed by callers that ask many times."""
    if b <= a or not merged:
        return 0.0
    if starts is None:
        starts = [s for s, _ in merged]
    i = max(bisect.bisect_right(starts, a) - 1, 0)
    total = 0.0
    while i < len(merged) and merged[i][0] < b:
        lo, hi = max(a, merged[i][0]), min(b, merged[i][1])
        if hi > lo:
            total += hi - lo
        i += 1
    return total


def overlap_table(spans: Iterable[tuple]) -> tuple:
    """``(rows, efficiency)`` for ``spans`` (the module's text). ``rows``: one dict per name
    (name, kind, calls, time_ms, mean_us, overlap_pct, sms: the largest known value or
    None), by time, largest first. ``efficiency``: total overlap efficiency in percent, None
    without communication.

    Raises: ValueError for a kind other than "comm" and "compute" or a negative duration."""
    spans = list(spans)
    by_kind: dict = {"comm": [], "compute": []}
    for name, kind, start, dur, _ in spans:
        if kind not in by_kind:
            raise ValueError(f"overlap_table: span {name!r} has kind {kind!r}; expected "
                             f"'comm' or 'compute'")
        if dur < 0:
            raise ValueError(f"overlap_table: span {name!r} has duration {dur} ms < 0")
        by_kind[kind].append((start, start + dur))
    union = {k: merge(v) for k, v in by_kind.items()}
    starts = {k: [s for s, _ in v] for k, v in union.items()}
    other = {"comm": "compute", "compute": "comm"}
    rows: dict = {}
    for name, kind, start, dur, sms in spans:
        r = rows.setdefault((name, kind), dict(name=name, kind=kind, calls=0, time_ms=0.0,
                                               hidden_ms=0.0, sms=None))
        r["calls"] += 1
        r["time_ms"] += dur
        o = other[kind]
        r["hidden_ms"] += covered(start, start + dur, union[o], starts[o])
        if sms is not None:
            r["sms"] = sms if r["sms"] is None else max(r["sms"], sms)
    out = []
    for r in sorted(rows.values(), key=lambda r: (-r["time_ms"], r["name"])):
        t = r.pop("time_ms")
        h = r.pop("hidden_ms")
        out.append(dict(r, time_ms=t, mean_us=t / r["calls"] * 1e3,
                        overlap_pct=100.0 * h / t if t > 0 else 0.0))
    comm_ms = sum(b - a for a, b in union["comm"])
    if comm_ms <= 0:
        return out, None
    hidden = sum(covered(a, b, union["compute"], starts["compute"]) for a, b in union["comm"])
    return out, 100.0 * hidden / comm_ms


def format_table(rows: list, efficiency: Optional[float], device_sms: Optional[int]) -> str:
    """The table as the seeds print it (box drawing), one line per row, then the total
    overlap efficiency. SMs: the value where known ("0 (CE)": the copy engines), else
    "<= device_sms" (cuBLAS chooses its own grid)."""
    def sms_text(r: dict) -> str:
        if r["sms"] is None:
            return f"<= {device_sms}" if device_sms else "?"
        return "0 (CE)" if r["sms"] == 0 else str(r["sms"])

    head = ("Operation", "Kind", "Calls", "Time(ms)", "Mean(us)", "Overlap%", "SMs")
    body = [(r["name"], r["kind"], str(r["calls"]), f"{r['time_ms']:.3f}",
             f"{r['mean_us']:.1f}", f"{r['overlap_pct']:.0f}%", sms_text(r)) for r in rows]
    w = [max(len(head[i]), *(len(b[i]) for b in body)) if body else len(head[i])
         for i in range(len(head))]

    def line(cells: tuple) -> str:
        return "│ " + " │ ".join(c.ljust(w[i]) if i < 2 else c.rjust(w[i])
                                 for i, c in enumerate(cells)) + " │"

    bar = lambda left, mid, right: left + mid.join("─" * (x + 2) for x in w) + right  # noqa
    lines = [bar("┌", "┬", "┐"), line(head), bar("├", "┼", "┤")]
    lines += [line(b) for b in body]
    lines.append(bar("└", "┴", "┘"))
    if efficiency is None:
        lines.append("Total overlap efficiency: - (no communication)")
    else:
        lines.append(f"Total overlap efficiency: {efficiency:.0f}% (communication time hidden "
                     f"behind MACO's compute)")
    return "\n".join(lines) + "\n"
