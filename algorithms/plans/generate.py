#!/usr/bin/env python3
"""Writes MACO's shipped execution plans (algorithms/plans/*.json) from the DSL
(python-bindings/maco/language.py); tests/plans checks that the files match what this writes.

  usage: algorithms/plans/generate.py [OUT_DIR]   (default: this script's folder)

Every plan uses TBS thread blocks per rank; thread block t of every rank moves part t of
each rank's piece, with its own channel to every peer. Peers on another node are reached
through port channels (puts with a signal and a flush), peers on the same node through
memory channels.
"""

import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "maco_language", os.path.join(HERE, "..", "..", "python-bindings", "maco", "language.py"))
L = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(L)

TBS = 2


def _channels(prog, r, t):
    """Rank r's channel of thread block t to every peer (memory inside a node, port across)."""
    out = {}
    for p in range(prog.world_size):
        if p != r:
            same = prog.node(p) == prog.node(r)
            out[p] = (L.MemoryChannel if same else L.PortChannel)(dst_rank=p, src_rank=r, tb=t)
    return out


def _put_signal(ch, dst, src, t):
    if isinstance(ch, L.PortChannel):
        ch.put_with_signal_and_flush(dst, src, tb=t)
    else:
        ch.put(dst, src, tb=t)
        ch.signal(tb=t)


def allreduce_oneshot_ll(n, rpn):
    """One-shot: every rank sends its whole input to every peer (LL packets inside a node, a
    port put with a signal across nodes) and reduces all of them itself."""
    K = TBS
    with L.Program(f"allreduce_oneshot_ll", L.AllReduce(n, parts=K), ranks_per_node=rpn,
                   scratch_chunks=n * K) as prog:
        for r in range(n):
            me = L.Rank(r)
            for t in range(K):
                chans = _channels(prog, r, t)
                for p, ch in chans.items():
                    dst = L.Rank(p).scratch[r * K + t]
                    if isinstance(ch, L.PortChannel):
                        ch.put_with_signal_and_flush(dst, me.input[t], tb=t)
                    else:
                        ch.put_packets(dst, me.input[t], tb=t)
                srcs = []
                for p in range(n):
                    if p == r:
                        srcs.append(me.input[t])
                    elif isinstance(chans[p], L.PortChannel):
                        chans[p].wait(tb=t)
                        srcs.append(me.scratch[p * K + t])
                    else:
                        srcs.append(me.scratch[p * K + t].packets())
                me.reduce(me.output[t], srcs, tb=t)
    return prog


def allreduce_rsag(n, rpn):
    """Reduce-scatter then allgather: rank r reduces part r (in TBS pieces) from every rank's
    copy put into its scratch, then puts the result into every peer's output."""
    T = TBS
    with L.Program("allreduce_rsag", L.AllReduce(n, parts=n * T), ranks_per_node=rpn,
                   scratch_chunks=n * T) as prog:
        for r in range(n):
            me = L.Rank(r)
            for t in range(T):
                mine = r * T + t
                chans = _channels(prog, r, t)
                for p, ch in chans.items():
                    _put_signal(ch, L.Rank(p).scratch[r * T + t], me.input[p * T + t], t)
                for ch in chans.values():
                    ch.wait(tb=t)
                srcs = [me.input[mine] if p == r else me.scratch[p * T + t] for p in range(n)]
                me.reduce(me.output[mine], srcs, tb=t)
                for p, ch in chans.items():
                    _put_signal(ch, L.Rank(p).output[mine], me.output[mine], t)
                for ch in chans.values():
                    ch.wait(tb=t)
    return prog


def allgather(n, rpn):
    """Every rank copies its input into its own output and puts it into every peer's."""
    K = TBS
    with L.Program("allgather", L.AllGather(n, parts=K), ranks_per_node=rpn) as prog:
        for r in range(n):
            me = L.Rank(r)
            for t in range(K):
                me.copy(me.output[r * K + t], me.input[t], tb=t)
                chans = _channels(prog, r, t)
                for p, ch in chans.items():
                    _put_signal(ch, L.Rank(p).output[r * K + t], me.input[t], t)
                for ch in chans.values():
                    ch.wait(tb=t)
    return prog


def reduce_scatter(n, rpn):
    """Every rank puts the piece each peer owns into that peer's scratch; each reduces its own."""
    K = TBS
    with L.Program("reduce_scatter", L.ReduceScatter(n, parts=K), ranks_per_node=rpn,
                   scratch_chunks=n * K) as prog:
        for r in range(n):
            me = L.Rank(r)
            for t in range(K):
                chans = _channels(prog, r, t)
                for p, ch in chans.items():
                    _put_signal(ch, L.Rank(p).scratch[r * K + t], me.input[p * K + t], t)
                for ch in chans.values():
                    ch.wait(tb=t)
                srcs = [me.input[r * K + t] if p == r else me.scratch[p * K + t]
                        for p in range(n)]
                me.reduce(me.output[t], srcs, tb=t)
    return prog


ALGORITHMS = {
    "allreduce_oneshot_ll": allreduce_oneshot_ll,
    "allreduce_rsag": allreduce_rsag,
    "allgather": allgather,
    "reduce_scatter": reduce_scatter,
}
SHAPES = [(2, 2), (4, 4), (8, 8), (4, 2)]  # (world size, ranks per node); (4, 2): 2 nodes x 2


def plans():
    """{file name: Program} of every shipped plan."""
    out = {}
    for algo, make in ALGORITHMS.items():
        for n, rpn in SHAPES:
            shape = f"{n}r" if n == rpn else f"{n // rpn}x{rpn}"
            prog = make(n, rpn)
            prog.name = f"{algo}_{shape}"
            out[f"{prog.name}.json"] = prog
    return out


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else HERE
    for name, prog in plans().items():
        prog.save(os.path.join(out_dir, name))
        print(os.path.join(out_dir, name))


if __name__ == "__main__":
    main()
