#!/usr/bin/env python3
"""A custom allreduce written with MACO's plan DSL (maco.language): every rank reads part t of
every peer's input through a memory channel and reduces all of them itself, in rank order, in
thread block t. No signal is needed inside the plan: inputs are only read, and the executor
starts every launch with a barrier across ranks (after each rank has copied its input in) and
ends it with another (before a rank copies its output out).

  usage: examples/plan_allreduce.py WORLD_SIZE OUT.json   then:  maco-plan verify OUT.json
         MACO_ALGO_ALLREDUCE=plan:OUT.json maco-run -n WORLD_SIZE ./your_program

Runs with the installed package (`import maco.language`) or from the source tree.
"""
import os
import sys

try:
    from maco.language import AllReduce, MemoryChannel, Program, Rank
except ImportError:  # the source tree, without the installed package
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python-bindings", "maco"))
    from language import AllReduce, MemoryChannel, Program, Rank


def read_reduce_allreduce(n: int, tbs: int = 4) -> Program:
    with Program(f"allreduce_read_{n}r", AllReduce(world_size=n, parts=tbs)) as prog:
        for r in range(n):
            me = Rank(r)
            for t in range(tbs):
                srcs = []
                for q in range(n):
                    if q == r:
                        srcs.append(me.input[t])
                    else:
                        ch = MemoryChannel(dst_rank=q, src_rank=r, tb=t)
                        srcs.append(ch.remote(Rank(q).input[t]))
                me.reduce(me.output[t], srcs, tb=t)
    return prog


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    read_reduce_allreduce(int(sys.argv[1])).save(sys.argv[2])
