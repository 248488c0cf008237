#!/usr/bin/env python3
"""ctest `plans`: the DSL (python-bindings/maco/language.py), the shipped plans
(algorithms/plans) and the verifier (maco-plan verify), without a GPU.

  usage: tests/plans/test_plans.py MACO_PLAN_TOOL   (the built tools/maco-plan)

- DSL unit tests: programs build the expected operations; mistakes raise PlanError naming
  rank, thread block and operation.
- The shipped plans are exactly what algorithms/plans/generate.py writes, match the JSON
  Schema (algorithms/plans/plan.schema.json, python3-jsonschema), and verify.
- Mutations of shipped plans (dropped signals, swapped chunks, missing or doubled
  reductions, out-of-bounds chunks, ...) are each rejected with the message that names the
  problem.
Plain unittest (no pytest needed).
"""

import copy
import glob
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PLANS = os.path.join(REPO, "algorithms", "plans")
TOOL = None


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


L = _load("maco_language", os.path.join(REPO, "python-bindings", "maco", "language.py"))
GEN = _load("maco_plan_generate", os.path.join(PLANS, "generate.py"))


def shipped():
    return sorted(p for p in glob.glob(os.path.join(PLANS, "*.json"))
                  if not p.endswith("schema.json"))


def verify(doc_or_path):
    """(exit status, output) of maco-plan verify on a plan dict or file."""
    if isinstance(doc_or_path, dict):
        fd, path = tempfile.mkstemp(suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(doc_or_path, f)
    else:
        path = doc_or_path
    try:
        r = subprocess.run([TOOL, "verify", path], capture_output=True, text=True, timeout=60)
        return r.returncode, r.stdout + r.stderr
    finally:
        if isinstance(doc_or_path, dict):
            os.unlink(path)


class Dsl(unittest.TestCase):
    def test_allgather_two_ranks(self):
        with L.Program("ag", L.AllGather(world_size=2)) as prog:
            for r in range(2):
                p = 1 - r
                L.Rank(r).copy(L.Rank(r).output[r], L.Rank(r).input[0], tb=0)
                ch = L.MemoryChannel(dst_rank=p, src_rank=r, tb=0)
                ch.put(L.Rank(p).output[r], L.Rank(r).input[0], tb=0)
                ch.signal(tb=0)
                ch.wait(tb=0)
        d = prog.to_dict()
        self.assertEqual(d["magic"], "MACO-PLAN")
        self.assertEqual(d["version"], 1)
        self.assertEqual(d["ranks"][1]["channels"], [{"type": "memory", "peer": 0}])
        ops = d["ranks"][1]["thread_blocks"][0]["ops"]
        self.assertEqual([o["op"] for o in ops], ["copy", "put", "signal", "wait"])
        self.assertEqual(ops[1]["dst"], {"buffer": "output", "index": 1})
        self.assertEqual(json.loads(prog.to_json()), d)
        code, out = verify(d)
        self.assertEqual(code, 0, out)

    def test_chunk_slices_and_counts(self):
        with L.Program("ar", L.AllReduce(world_size=2, parts=4)) as prog:
            c = L.Rank(0).input[1:3]
            self.assertEqual((c.index, c.size), (1, 2))
            self.assertEqual(c.ref(), {"buffer": "input", "index": 1, "count": 2})
            self.assertEqual(len(L.Rank(1).output), 4)
        with L.Program("rs", L.ReduceScatter(world_size=4, parts=2)) as prog:
            self.assertEqual(prog.chunks("input"), 8)
            self.assertEqual(prog.chunks("output"), 2)

    def assertPlanError(self, regex, fn):
        with self.assertRaises(L.PlanError) as cm:
            fn()
        self.assertRegex(str(cm.exception), regex)

    def test_errors_name_rank_tb_op(self):
        with L.Program("x", L.AllReduce(world_size=4, parts=1), ranks_per_node=2,
                       scratch_chunks=2):
            ch = L.MemoryChannel(dst_rank=1, src_rank=0, tb=0)
            ch.signal(tb=0)
            self.assertPlanError(r"rank 0 tb 0 op 1 \(put\): rank 2 output\[0:1\] is not on the "
                                 r"channel's peer rank 1",
                                 lambda: ch.put(L.Rank(2).output[0], L.Rank(0).input[0], tb=0))
            self.assertPlanError(r"rank 0 tb 1 op 0 \(wait\): channel 0 \(to rank 1\) belongs "
                                 r"to tb 0", lambda: ch.wait(tb=1))
            self.assertPlanError(r"memory channel cannot reach rank 2 on another node",
                                 lambda: L.MemoryChannel(dst_rank=2, src_rank=0, tb=0))
            self.assertPlanError(r"rank 0 input\[1:2\] is outside its 1 chunks",
                                 lambda: L.Rank(0).input[1])
            self.assertPlanError(r"rank 0 tb 0 op 1 \(put_packets\): packets go into scratch",
                                 lambda: ch.put_packets(L.Rank(1).output[0], L.Rank(0).input[0],
                                                        tb=0))
            self.assertPlanError(r"rank 0 tb 0 op 1 \(reduce\): .* is not on rank 0",
                                 lambda: L.Rank(0).reduce(L.Rank(0).output[0],
                                                          [L.Rank(1).input[0]], tb=0))
            port = L.PortChannel(dst_rank=2, src_rank=0, tb=1)
            self.assertPlanError(r"packets go through memory channels only",
                                 lambda: port.put_packets(L.Rank(2).scratch[0],
                                                          L.Rank(0).input[0], tb=1))
            self.assertPlanError(r"differ in size",
                                 lambda: ch.put(L.Rank(1).scratch[0:2], L.Rank(0).input[0],
                                                tb=0))
        self.assertPlanError(r"no Program is active", lambda: L.Rank(0))
        self.assertPlanError(r"ranks_per_node=3 must divide world_size=4",
                             lambda: L.Program("y", L.AllReduce(4), ranks_per_node=3))

    def test_thread_blocks_without_gaps(self):
        with L.Program("g", L.AllGather(world_size=1)) as prog:
            L.Rank(0).copy(L.Rank(0).output[0], L.Rank(0).input[0], tb=1)
        self.assertRaisesRegex(L.PlanError, r"rank 0: thread blocks must be numbered from 0 "
                               r"without gaps; tb 0", prog.to_dict)

    def test_remote_reduce_source(self):
        with L.Program("r", L.AllReduce(world_size=2)) as prog:
            for r in range(2):
                p = 1 - r
                ch = L.MemoryChannel(dst_rank=p, src_rank=r, tb=0)
                ch.signal(tb=0)
                ch.wait(tb=0)
                me = L.Rank(r)
                me.reduce(me.output[0], [me.input[0], ch.remote(L.Rank(p).input[0])], tb=0)
                ch.signal(tb=0)
                ch.wait(tb=0)
        op = prog.to_dict()["ranks"][0]["thread_blocks"][0]["ops"][2]
        self.assertEqual(op["srcs"][1], {"buffer": "input", "index": 0, "channel": 0})
        code, out = verify(prog.to_dict())
        self.assertEqual(code, 0, out)


def grouped_read_allreduce(n, parts=8, tbs=(0, 1, 2, 3)):
    """Every rank reads every peer's whole input through memory channels and reduces it,
    the work spread over a thread-block group."""
    with L.Program(f"ar_tbg_{n}r", L.AllReduce(world_size=n, parts=parts)) as prog:
        g = L.ThreadBlockGroup(tbs)
        for r in range(n):
            me = L.Rank(r)
            srcs = [me.input[0:parts]]
            for q in range(n):
                if q != r:
                    ch = L.MemoryChannel(dst_rank=q, src_rank=r, tb=g)
                    srcs.append(ch.remote(L.Rank(q).input[0:parts]))
            me.reduce(me.output[0:parts], srcs, tb=g)
    return prog


def grouped_allgather(sizes=(3, 3), parts=7):
    """Two ranks put their input into each other's output in thread-block groups (of
    sizes[r] on rank r), then signal and wait on every member channel."""
    with L.Program("ag_tbg", L.AllGather(world_size=2, parts=parts)) as prog:
        for r in range(2):
            p, me = 1 - r, L.Rank(r)
            g = L.ThreadBlockGroup(range(sizes[r]))
            mine = slice(r * parts, (r + 1) * parts)
            me.copy(me.output[mine], me.input[0:parts], tb=g)
            ch = L.MemoryChannel(dst_rank=p, src_rank=r, tb=g)
            ch.put(L.Rank(p).output[mine], me.input[0:parts], tb=g)
            ch.signal(tb=g)
            ch.wait(tb=g)
    return prog


class ThreadBlockGroups(unittest.TestCase):
    def test_parts_are_near_equal_and_skip_empty(self):
        g = L.ThreadBlockGroup([5, 2, 7])
        self.assertEqual(list(g.parts(7)), [(0, 5, 0, 3), (1, 2, 3, 2), (2, 7, 5, 2)])
        self.assertEqual(list(g.parts(2)), [(0, 5, 0, 1), (1, 2, 1, 1)])

    def test_grouped_reduce_spreads_over_thread_blocks(self):
        for n in (2, 4):
            d = grouped_read_allreduce(n).to_dict()
            tbs = d["ranks"][1]["thread_blocks"]
            self.assertEqual(len(tbs), 4)
            self.assertEqual(len(d["ranks"][1]["channels"]), 4 * (n - 1))
            for t, tb in enumerate(tbs):
                (op,) = tb["ops"]
                self.assertEqual(op["op"], "reduce")
                self.assertEqual(op["dst"], {"buffer": "output", "index": 2 * t, "count": 2})
                self.assertEqual(len(op["srcs"]), n)
            code, out = verify(d)
            self.assertEqual(code, 0, out)

    def test_grouped_channel_ops_verify(self):
        d = grouped_allgather().to_dict()
        ops = [o["op"] for o in d["ranks"][0]["thread_blocks"][2]["ops"]]
        self.assertEqual(ops, ["copy", "put", "signal", "wait"])
        code, out = verify(d)
        self.assertEqual(code, 0, out)

    def test_grouped_port_put_with_signal_verifies(self):
        # 2 nodes x 1 rank: 3 chunks over a group of 4, so one member has no data and still
        # signals (its peer waits for it)
        with L.Program("ag_port_tbg", L.AllGather(world_size=2, parts=3),
                       ranks_per_node=1) as prog:
            for r in range(2):
                p, me = 1 - r, L.Rank(r)
                g = L.ThreadBlockGroup(range(4))
                mine = slice(r * 3, (r + 1) * 3)
                me.copy(me.output[mine], me.input[0:3], tb=g)
                ch = L.PortChannel(dst_rank=p, src_rank=r, tb=g)
                ch.put_with_signal_and_flush(L.Rank(p).output[mine], me.input[0:3], tb=g)
                ch.wait(tb=g)
        d = prog.to_dict()
        ops = [[o["op"] for o in tb["ops"]] for tb in d["ranks"][0]["thread_blocks"]]
        self.assertEqual(ops[0], ["copy", "put_with_signal_and_flush", "wait"])
        self.assertEqual(ops[3], ["signal", "flush", "wait"])
        code, out = verify(d)
        self.assertEqual(code, 0, out)

    def test_groups_of_different_sizes_are_rejected(self):
        code, out = verify(grouped_allgather(sizes=(3, 2)).to_dict())
        self.assertNotEqual(code, 0, out)

    def test_errors(self):
        self.assertRaisesRegex(L.PlanError, r"needs one or more", L.ThreadBlockGroup, [])
        self.assertRaisesRegex(L.PlanError, r"appears twice", L.ThreadBlockGroup, [1, 1])
        with L.Program("e", L.AllGather(world_size=2, parts=4)):
            g = L.ThreadBlockGroup([0, 1])
            ch = L.MemoryChannel(dst_rank=1, src_rank=0, tb=g)
            self.assertRaisesRegex(L.PlanError, r"belongs to ThreadBlockGroup\(\[0, 1\]\)",
                                   ch.signal, 0)
            self.assertRaisesRegex(L.PlanError, r"belongs to ThreadBlockGroup\(\[0, 1\]\)",
                                   ch.signal, L.ThreadBlockGroup([0, 2]))
            one = L.MemoryChannel(dst_rank=1, src_rank=0, tb=0)
            self.assertRaisesRegex(L.PlanError, r"belongs to tb 0, not to", one.wait, g)


class Shipped(unittest.TestCase):
    def test_generated_files_are_current(self):
        with tempfile.TemporaryDirectory() as tmp:
            for name, prog in GEN.plans().items():
                prog.save(os.path.join(tmp, name))
            want = sorted(os.listdir(tmp))
            have = sorted(os.path.basename(p) for p in shipped())
            self.assertEqual(want, have, "run algorithms/plans/generate.py")
            for name in want:
                with open(os.path.join(tmp, name)) as a, open(os.path.join(PLANS, name)) as b:
                    self.assertEqual(a.read(), b.read(),
                                     f"{name} is stale: run algorithms/plans/generate.py")

    def test_shapes(self):
        names = {os.path.basename(p) for p in shipped()}
        for algo in ("allreduce_oneshot_ll", "allreduce_rsag", "allgather", "reduce_scatter"):
            for shape in ("2r", "4r", "8r", "2x2"):
                self.assertIn(f"{algo}_{shape}.json", names)

    def test_schema(self):
        import jsonschema  # Debian: python3-jsonschema
        with open(os.path.join(PLANS, "plan.schema.json")) as f:
            schema = json.load(f)
        jsonschema.Draft202012Validator.check_schema(schema)
        for path in shipped():
            with open(path) as f:
                jsonschema.validate(json.load(f), schema)
        with open(shipped()[0]) as f:
            doc = json.load(f)
        for bad in ({"version": 2}, {"magic": "NOPE"}, {"collective": "broadcast"},
                    {"parts": 0}, {"extra": 1}):
            d = copy.deepcopy(doc)
            d.update(bad)
            with self.assertRaises(jsonschema.ValidationError, msg=str(bad)):
                jsonschema.validate(d, schema)

    def test_example_plans(self):
        ex = _load("maco_plan_example", os.path.join(REPO, "examples", "plan_allreduce.py"))
        for n in (2, 4):
            path = os.path.join(REPO, "examples", "plans", f"allreduce_read_{n}r.json")
            with open(path) as f:
                self.assertEqual(f.read(), ex.read_reduce_allreduce(n).to_json(),
                                 f"{path} is stale: run examples/plan_allreduce.py")
            code, out = verify(path)
            self.assertEqual(code, 0, out)

    def test_every_plan_verifies(self):
        code, out = verify_many(shipped())
        self.assertEqual(code, 0, out)
        self.assertEqual(out.count(": ok"), len(shipped()), out)


def verify_many(paths):
    r = subprocess.run([TOOL, "verify"] + paths, capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout + r.stderr


def load(name):
    with open(os.path.join(PLANS, name)) as f:
        return json.load(f)


def ops(doc, rank, tb=0):
    return doc["ranks"][rank]["thread_blocks"][tb]["ops"]


def first(doc, rank, kind, tb=0, nth=0):
    idx = [i for i, o in enumerate(ops(doc, rank, tb)) if o["op"] == kind]
    return idx[nth]


# Each mutation: (name, plan file, function changing the plan dict, regex of the message).
def _drop(kind, rank=1, tb=0, nth=0):
    def f(d):
        del ops(d, rank, tb)[first(d, rank, kind, tb, nth)]
    return f


def _set(rank, kind, path, value, tb=0, nth=0):
    def f(d):
        o = ops(d, rank, tb)[first(d, rank, kind, tb, nth)]
        for k in path[:-1]:
            o = o[k]
        o[path[-1]] = value
    return f


def _reduce_srcs(rank, how, tb=0):
    def f(d):
        srcs = ops(d, rank, tb)[first(d, rank, "reduce", tb)]["srcs"]
        how(srcs)
    return f


def _top(key, value):
    def f(d):
        d[key] = value
    return f


def _swap_tb_channel(d):
    # tb 1 of rank 0 signals on tb 0's channel 0.
    ops(d, 0, 1).append({"op": "signal", "channel": 0})


def _reduce_before_wait(d):
    o = ops(d, 0)
    r = o.pop(first(d, 0, "reduce"))
    o.insert(first(d, 0, "wait"), r)


def _memory_across_nodes(d):
    for ch in d["ranks"][0]["channels"]:
        ch["type"] = "memory"


def _extra_signal(d):
    ops(d, 2).append({"op": "signal", "channel": 0})


def _write_input(d):
    o = ops(d, 0)[first(d, 0, "copy")]
    o["dst"] = {"buffer": "input", "index": 0}


def _packets_twice(d):
    o = ops(d, 0)
    o.insert(0, copy.deepcopy(o[first(d, 0, "put_packets")]))


def _packets_as_data(d):
    # Read a packet slot as plain data.
    srcs = ops(d, 1)[first(d, 1, "reduce")]["srcs"]
    for s in srcs:
        if s.get("packets"):
            del s["packets"]
            break


def _peer_missing_channel(d):
    d["ranks"][1]["channels"].pop()


def _copy_after_read_race(d):
    # Rank 1's tb 1 overwrites output[0] of rank 1, which tb 0 writes too.
    ops(d, 1, 1).append({"op": "copy", "src": {"buffer": "input", "index": 0},
                         "dst": {"buffer": "output", "index": 0}})


def _port_put_no_signal(d):
    # 2 nodes x 2: a cross-node put_with_signal_and_flush becomes a plain put (no signal).
    o = ops(d, 0)
    i = first(d, 0, "put_with_signal_and_flush")
    o[i]["op"] = "put"


def _flush_on_memory(d):
    ops(d, 0).append({"op": "flush", "channel": 0})


MUTATIONS = [
    ("dropped signal", "allreduce_rsag_4r.json", _drop("signal"),
     r"deadlock: rank \d tb 0 op \d+ \(wait\) on channel \d \(to rank 1\) waits for signal \d, "
     r"but rank 1 signals its channel \d only \d times"),
    ("dropped signal (allgather)", "allgather_8r.json", _drop("signal", rank=5, nth=3),
     r"deadlock: .*\(to rank 5\) waits for signal 1, but rank 5 signals its channel \d only 0"),
    ("dropped wait", "allreduce_rsag_2r.json", _drop("wait"),
     r"rank 0 tb 0: channel 0 \(to rank 1\) signals 2 times but rank 1 waits 1 times"),
    ("reduce moved before the wait", "allreduce_rsag_2r.json", _reduce_before_wait,
     r"race on rank 0 scratch\[2\]: rank 0 tb 0 op 2 \(reduce\) reads it and rank 1 tb 0 op 0 "
     r"\(put\) writes it with no signal/wait ordering them"),
    ("swapped chunk (put source)", "allgather_4r.json",
     _set(2, "put", ["src", "index"], 1),
     r"rank 2 tb 0 op 1 \(put\) writes part 1 of the unit into output\[4\] of rank 0, which "
     r"holds part 0"),
    ("swapped chunk (put destination)", "allgather_4r.json",
     _set(2, "put", ["dst", "index"], 6),
     r"postcondition: rank 0 output\[4\] (lacks|holds)|race on rank 0 output\[6\]"),
    ("swapped chunk (copy)", "reduce_scatter_2r.json",
     _set(1, "put", ["src", "index"], 2),
     r"postcondition: rank 0 output\[0\] holds input\[2\] of rank 1, which does not belong"),
    ("missing reduce source", "allreduce_rsag_4r.json", _reduce_srcs(1, lambda s: s.pop()),
     r"postcondition: rank \d output\[2\] lacks input\[2\] of rank 3"),
    ("doubled reduction", "allreduce_rsag_4r.json",
     _reduce_srcs(1, lambda s: s.append(dict(s[0]))),
     r"postcondition: rank \d output\[2\] holds input\[2\] of rank 0 2 times \(reduced more "
     r"than once\)"),
    ("doubled reduction (one-shot)", "allreduce_oneshot_ll_2r.json",
     _reduce_srcs(0, lambda s: s.append(dict(s[0]))),
     r"postcondition: rank 0 output\[0\] holds input\[0\] of rank 0 2 times"),
    ("missing reduce", "reduce_scatter_4r.json", _drop("reduce", rank=3),
     r"postcondition: rank 3 output\[0\]: no operation writes it"),
    ("out-of-bounds chunk", "allreduce_rsag_2r.json", _set(0, "put", ["dst", "index"], 99),
     r"bounds: rank 0 tb 0 op 0 \(put\): dst scratch\[99\] is out of bounds: the scratch "
     r"buffer has 4 chunks"),
    ("out-of-bounds count", "allgather_2r.json", _set(0, "copy", ["src", "count"], 3),
     r"bounds: rank 0 tb 0 op 0 \(copy\): src input\[0:3\] is out of bounds"),
    ("out-of-bounds channel", "allgather_2r.json", _set(1, "signal", ["channel"], 7),
     r"bounds: rank 1 tb 0 op 2 \(signal\): channel 7 does not exist \(rank 1 has 2\)"),
    ("wrong magic", "allgather_2r.json", _top("magic", "NCCL"),
     r"magic: must be \"MACO-PLAN\""),
    ("future version", "allgather_2r.json", _top("version", 2),
     r"version 2 is not supported: this library reads version 1"),
    ("world size mismatch", "allgather_2r.json", _top("world_size", 4),
     r"plan\.ranks has 2 entries; it must have 4 to 4"),
    ("channel used by two thread blocks", "allgather_2r.json", _swap_tb_channel,
     r"rank 0 tb 1 op 4 \(signal\): channel 0 \(to rank 1\) is also used by tb 0"),
    ("memory channel across nodes", "allgather_2x2.json", _memory_across_nodes,
     r"rank 0 channel \d: a memory channel to rank [23] on another node"),
    ("extra signal", "allreduce_oneshot_ll_2x2.json", _extra_signal,
     r"rank 2 tb 0: channel 0 \(to rank \d\) signals \d times but rank \d waits \d times"),
    ("write into input", "allgather_2r.json", _write_input,
     r"rank 0 tb 0 op 0 \(copy\): writes input\[0\] of rank 0: the input buffer is read-only"),
    ("dropped packets", "allreduce_oneshot_ll_4r.json", _drop("put_packets", rank=2),
     r"deadlock: rank [013] tb 0 op \d \(reduce\) waits for LL packets in scratch\[4\] of rank "
     r"[013] that no operation writes"),
    ("packets written twice", "allreduce_oneshot_ll_2r.json", _packets_twice,
     r"rank 1 scratch\[0\] is written as LL packets 2 times in one launch"),
    ("packets read as data", "allreduce_oneshot_ll_2r.json", _packets_as_data,
     r"rank 1 scratch\[0\] is used both as LL packets"),
    ("channel without partner", "allgather_2r.json", _peer_missing_channel,
     r"rank 0 channel 1 \(its channel 1 to rank 1\) has no partner: rank 1 has 1 channels"),
    ("race between thread blocks", "allgather_2r.json", _copy_after_read_race,
     r"race on rank 1 output\[0\]: rank 0 tb 0 op 1 \(put\) writes it and rank 1 tb 1 op 4 "
     r"\(copy\) writes it"),
    ("port put without a signal", "allgather_2x2.json", _port_put_no_signal,
     r"race on rank [23] output\[0\]|deadlock: .* waits for signal"),
    ("flush on a memory channel", "allgather_2x2.json", _flush_on_memory,
     r"rank 0 tb 0 op \d+ \(flush\): channel 0 is a memory channel; flush and put_with_signal "
     r"need a port channel"),
    ("not JSON", None, None, r"not valid JSON"),
]


class Mutations(unittest.TestCase):
    def test_at_least_twenty(self):
        self.assertGreaterEqual(len(MUTATIONS), 20)

    def test_each_is_rejected_with_its_message(self):
        for name, plan, mutate, regex in MUTATIONS:
            with self.subTest(mutation=name):
                if plan is None:
                    fd, path = tempfile.mkstemp(suffix=".json")
                    with os.fdopen(fd, "w") as f:
                        f.write('{"magic": "MACO-PLAN", ')
                    code, out = verify(path)
                    os.unlink(path)
                else:
                    doc = load(plan)
                    mutate(doc)
                    code, out = verify(doc)
                self.assertEqual(code, 1, f"{name}: not rejected:\n{out}")
                self.assertRegex(out, regex, f"{name}: wrong message")


def _copies(ntb, nops):
    """2 ranks, ntb thread blocks of nops copies each into one scratch chunk: all race."""
    op = {"op": "copy", "src": {"buffer": "input", "index": 0},
          "dst": {"buffer": "scratch", "index": 0}}
    return {"magic": "MACO-PLAN", "version": 1, "name": "copies", "collective": "allgather",
            "world_size": 2, "ranks_per_node": 2, "parts": 1, "scratch_chunks": 1,
            "ranks": [{"rank": r, "channels": [],
                       "thread_blocks": [{"ops": [op] * nops} for _ in range(ntb)]}
                      for r in range(2)]}


def _big_reduces(nops):
    """2 ranks, each reduces 64 sources of 1024 chunks nops times: values of 2048 input chunks
    for every chunk of every source, far past the verifier's step budget."""
    src = {"buffer": "scratch", "index": 0, "count": 1024}
    ops = [{"op": "copy", "src": {"buffer": "input", "index": 0, "count": 1024}, "dst": src}]
    ops += [{"op": "reduce", "srcs": [src] * 64,
             "dst": {"buffer": "scratch", "index": 1024, "count": 1024}}] * nops
    return {"magic": "MACO-PLAN", "version": 1, "name": "reduces", "collective": "allreduce",
            "world_size": 2, "ranks_per_node": 2, "parts": 1024, "scratch_chunks": 4096,
            "ranks": [{"rank": r, "channels": [], "thread_blocks": [{"ops": ops}]}
                      for r in range(2)]}


class Bounded(unittest.TestCase):
    """Hostile plans cost bounded time: many accesses of one chunk are checked in linear time
    (the 1.6 MB plan below took 9.4 s when every pair was compared), and a plan whose values
    would take too long is refused, saying so, within seconds."""

    def timed_verify(self, doc):
        import time
        t0 = time.monotonic()
        code, out = verify(doc)
        return code, out, time.monotonic() - t0

    def test_many_accesses_of_one_chunk(self):
        code, out, secs = self.timed_verify(_copies(8, 1000))
        self.assertEqual(code, 1, out)
        self.assertRegex(out, r"race on rank 0 scratch\[0\]")
        self.assertLess(secs, 3.0, out)

    def test_too_costly_is_refused_in_seconds(self):
        code, out, secs = self.timed_verify(_big_reduces(200))
        self.assertEqual(code, 1, out)
        self.assertRegex(out, r"too large to verify: checking it takes more than \d+ steps")
        self.assertLess(secs, 5.0, out)


class JsonLibrary(unittest.TestCase):
    def test_a_library_without_jansson_names_the_variable(self):
        path = shipped()[0]
        for lib, regex in (("libc.so.6", r"libc\.so\.6 \(MACO_JSON_LIBRARY\) lacks json_"),
                           ("/no/such/libjansson.so.4",
                            r"MACO_JSON_LIBRARY=/no/such/libjansson\.so\.4")):
            with self.subTest(lib=lib):
                env = dict(os.environ, MACO_JSON_LIBRARY=lib)
                r = subprocess.run([TOOL, "verify", path], capture_output=True, text=True,
                                   timeout=60, env=env)
                self.assertNotEqual(r.returncode, 0, r.stdout + r.stderr)
                self.assertRegex(r.stdout + r.stderr, regex)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_plans.py MACO_PLAN_TOOL")
    TOOL = sys.argv.pop(1)
    unittest.main(verbosity=1)
