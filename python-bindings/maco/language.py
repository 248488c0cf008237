"""maco.language: write a collective algorithm as channel operations on chunks, get a MACO
execution plan (docs/plan-format.md) that ``maco-plan verify`` checks and the C executor runs.

Pure Python (it does not need the extension), so it also runs where the library is not built.
The shape follows MSCCL++'s DSL (``mscclpp.language``): a :class:`Program` is the context;
inside it, :class:`Rank` gives each rank's buffers (``input``, ``output``, ``scratch``) cut
into chunks, :class:`MemoryChannel` and :class:`PortChannel` link two ranks, and every
operation names the thread block (``tb``) that runs it. Operations of one thread block run in
the order they are written. Example (a two-rank allgather)::

    from maco.language import AllGather, MemoryChannel, Program, Rank

    with Program("allgather_2", AllGather(world_size=2)) as prog:
        for r in range(2):
            p = 1 - r
            Rank(r).copy(Rank(r).output[r], Rank(r).input[0], tb=0)
            ch = MemoryChannel(dst_rank=p, src_rank=r, tb=0)
            ch.put(Rank(p).output[r], Rank(r).input[0], tb=0)
            ch.signal(tb=0)
            ch.wait(tb=0)
    text = prog.to_json()

Chunks: the collective's unit count N (allreduce: the buffer; allgather: one rank's send
buffer; reduce-scatter: one rank's receive buffer) is cut into ``parts`` parts; a buffer of
m units has m * parts chunks (docs/plan-format.md gives the element ranges). Scratch has
``scratch_chunks`` chunks, each big enough for any part, as data or as LL packets.

Thread-block groups: ``tb=ThreadBlockGroup([0, 1, 2, 3])`` spreads an operation over several
thread blocks at chunk granularity: the operation's chunk range is cut into as many contiguous,
near-equal parts as the group has thread blocks (the first ones get one chunk more when it does
not divide), and thread block ``tbs[i]`` runs the operation on part ``i`` (nothing when its part
is empty). A channel made with ``tb=group`` is one channel per thread block of the group; its
``signal``, ``wait`` and ``flush`` run on every thread block of the group, each on its own
channel, and its i-th channel pairs with the i-th of the peer's group channel (so both sides
use groups of the same size and cut the same ranges alike; the verifier rejects a plan that
does not). This is all in the DSL: the plan lists each thread block's share, and the verifier
and the executor see ordinary thread blocks.

Errors raise :class:`PlanError` naming the rank, thread block and operation index.
"""

import json
import os
import tempfile

PLAN_MAGIC = "MACO-PLAN"
PLAN_VERSION = 1

__all__ = ["AllGather", "AllReduce", "Chunk", "MemoryChannel", "PlanError", "PortChannel",
           "Program", "Rank", "ReduceScatter", "ThreadBlockGroup", "PLAN_MAGIC", "PLAN_VERSION"]


class ThreadBlockGroup:
    """Thread blocks that share operations (see the module's text): ``tbs`` distinct
    thread-block numbers, in the order their parts are dealt."""

    def __init__(self, tbs):
        tbs = list(tbs)
        if not tbs or any(not isinstance(t, int) or isinstance(t, bool) or t < 0 for t in tbs):
            raise PlanError(f"ThreadBlockGroup({tbs!r}): needs one or more thread-block "
                            f"numbers >= 0")
        if len(set(tbs)) != len(tbs):
            raise PlanError(f"ThreadBlockGroup({tbs!r}): a thread block appears twice")
        self.tbs = tbs

    def __len__(self):
        return len(self.tbs)

    def __repr__(self):
        return f"ThreadBlockGroup({self.tbs})"

    def parts(self, size: int):
        """(i, tb, offset, length) of each non-empty part of a ``size``-chunk range."""
        n = len(self.tbs)
        base, extra = divmod(size, n)
        at = 0
        for i, t in enumerate(self.tbs):
            length = base + (1 if i < extra else 0)
            if length:
                yield i, t, at, length
            at += length


class PlanError(ValueError):
    """A program that cannot make a valid plan: the message names rank, thread block and
    operation (its index in the thread block's list)."""


# ---------------------------------------------------------------------------- collectives


class _Collective:
    name = ""
    in_units = 1
    out_units = 1

    def __init__(self, world_size: int, parts: int = 1):
        if not isinstance(world_size, int) or not 1 <= world_size <= 64:
            raise PlanError(f"world_size={world_size!r} must be an int in [1, 64]")
        if not isinstance(parts, int) or not 1 <= parts <= 1024:
            raise PlanError(f"parts={parts!r} must be an int in [1, 1024]")
        self.world_size = world_size
        self.parts = parts


class AllReduce(_Collective):
    """Every rank's output chunk j = the reduction of input chunk j of all ranks."""

    name = "allreduce"


class AllGather(_Collective):
    """Output chunk s*parts+p of every rank = input chunk p of rank s."""

    name = "allgather"

    def __init__(self, world_size: int, parts: int = 1):
        super().__init__(world_size, parts)
        self.out_units = world_size


class ReduceScatter(_Collective):
    """Output chunk p of rank r = the reduction of input chunk r*parts+p of all ranks."""

    name = "reduce_scatter"

    def __init__(self, world_size: int, parts: int = 1):
        super().__init__(world_size, parts)
        self.in_units = world_size


# ---------------------------------------------------------------------------- program

_current = None


def _program():
    if _current is None:
        raise PlanError("no Program is active: use `with Program(...) as prog:`")
    return _current


class Program:
    """One plan: a collective for one world size and node shape.

    name: the plan's name; collective: AllReduce/AllGather/ReduceScatter(world_size, parts);
    ranks_per_node: ranks of one node (default: all; memory channels stay inside a node,
    port channels may cross); scratch_chunks: chunks of each rank's scratch buffer.
    """

    def __init__(self, name: str, collective: _Collective, ranks_per_node: int = None,
                 scratch_chunks: int = 0):
        n = collective.world_size
        rpn = n if ranks_per_node is None else ranks_per_node
        if not isinstance(rpn, int) or rpn < 1 or n % rpn:
            raise PlanError(f"ranks_per_node={ranks_per_node!r} must divide world_size={n}")
        if not isinstance(scratch_chunks, int) or not 0 <= scratch_chunks <= 4096:
            raise PlanError(f"scratch_chunks={scratch_chunks!r} must be an int in [0, 4096]")
        self.name = name
        self.collective = collective
        self.world_size = n
        self.ranks_per_node = rpn
        self.scratch_chunks = scratch_chunks
        self.channels = [[] for _ in range(n)]  # per rank: _ChannelSide
        self.tbs = [dict() for _ in range(n)]   # per rank: tb id -> list of op dicts
        self._prev = None

    def __enter__(self):
        global _current
        self._prev = _current
        _current = self
        return self

    def __exit__(self, *exc):
        global _current
        _current = self._prev
        return False

    # -- buffers
    def chunks(self, buffer: str) -> int:
        c = self.collective
        if buffer == "input":
            return c.in_units * c.parts
        if buffer == "output":
            return c.out_units * c.parts
        if buffer == "scratch":
            return self.scratch_chunks
        raise PlanError(f"unknown buffer {buffer!r}: use input, output or scratch")

    def node(self, rank: int) -> int:
        return rank // self.ranks_per_node

    # -- recording
    def _where(self, rank, tb):
        ops = self.tbs[rank].get(tb, [])
        return f"rank {rank} tb {tb} op {len(ops)}"

    def _add(self, rank: int, tb: int, op: dict):
        if not isinstance(tb, int) or not 0 <= tb < 1024:
            raise PlanError(f"rank {rank}: tb={tb!r} must be an int in [0, 1024)")
        self.tbs[rank].setdefault(tb, []).append(op)

    def to_dict(self) -> dict:
        ranks = []
        for r in range(self.world_size):
            ids = sorted(self.tbs[r])
            if ids != list(range(len(ids))):
                missing = sorted(set(range(max(ids) + 1)) - set(ids))
                raise PlanError(f"rank {r}: thread blocks must be numbered from 0 without gaps; "
                                f"tb {missing[0]} has no operations")
            ranks.append({
                "rank": r,
                "channels": [{"type": c.kind, "peer": c.peer} for c in self.channels[r]],
                "thread_blocks": [{"ops": self.tbs[r][t]} for t in ids],
            })
        return {
            "magic": PLAN_MAGIC,
            "version": PLAN_VERSION,
            "name": self.name,
            "collective": self.collective.name,
            "world_size": self.world_size,
            "ranks_per_node": self.ranks_per_node,
            "parts": self.collective.parts,
            "scratch_chunks": self.scratch_chunks,
            "ranks": ranks,
        }

    def to_json(self) -> str:
        """The plan as JSON text (one line per operation, stable for diffs)."""
        d = self.to_dict()
        ranks = d.pop("ranks")
        head = json.dumps(d, indent=1)[:-2]
        out = [head + ',\n "ranks": [']
        for i, rk in enumerate(ranks):
            out.append('  {"rank": %d,\n   "channels": %s,\n   "thread_blocks": [' %
                       (rk["rank"], json.dumps(rk["channels"])))
            for t, tb in enumerate(rk["thread_blocks"]):
                ops = ",\n      ".join(json.dumps(o) for o in tb["ops"])
                sep = "," if t + 1 < len(rk["thread_blocks"]) else ""
                out.append('    {"ops": [\n      %s]}%s' % (ops, sep))
            out.append("   ]}" + ("," if i + 1 < len(ranks) else ""))
        out.append(" ]\n}\n")
        return "\n".join(out)

    def save(self, path: str):
        with open(path, "w") as f:
            f.write(self.to_json())

    def verify(self):
        """Runs MACO's verifier (the C library's, as ``maco-plan verify`` and
        ``maco_plan_load`` do) on this plan; raises :class:`PlanError` with its report (one
        line per problem, naming rank, thread block, operation and chunk) when it rejects
        the plan. Needs the package's extension (no GPU)."""
        try:
            from maco import _maco
        except ImportError as e:
            raise PlanError(f"verify() needs the maco package's extension ({e}); or run "
                            f"`maco-plan verify FILE`") from e
        fd, path = tempfile.mkstemp(suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(self.to_json())
            status, report = _maco.plan_verify_file(path)
        finally:
            os.unlink(path)
        if status != 0:
            raise PlanError(f"plan {self.name} is rejected ({_maco.status_string(status)}):\n"
                            f"{report.replace(path, self.name)}")


# ---------------------------------------------------------------------------- ranks, chunks


class Chunk:
    """``size`` consecutive chunks of one rank's buffer, from ``index``."""

    def __init__(self, rank: int, buffer: str, index: int, size: int = 1):
        self.rank, self.buffer, self.index, self.size = rank, buffer, index, size

    def ref(self) -> dict:
        d = {"buffer": self.buffer, "index": self.index}
        if self.size != 1:
            d["count"] = self.size
        return d

    def sub(self, offset: int, length: int) -> "Chunk":
        """Chunks [offset, offset + length) of this range."""
        return Chunk(self.rank, self.buffer, self.index + offset, length)

    def packets(self) -> "_Packets":
        """This scratch chunk read as LL packets (as a reduce or copy source)."""
        return _Packets(self)

    def __repr__(self):
        return f"rank {self.rank} {self.buffer}[{self.index}:{self.index + self.size}]"


class _Packets:
    def __init__(self, chunk: Chunk):
        self.chunk = chunk


class _Remote:
    def __init__(self, channel: "_Channel", chunk: Chunk):
        self.channel, self.chunk = channel, chunk


class _Buffer:
    def __init__(self, rank: int, name: str):
        self.rank, self.name = rank, name

    def __len__(self):
        return _program().chunks(self.name)

    def __getitem__(self, key) -> Chunk:
        n = len(self)
        if isinstance(key, slice):
            if key.step not in (None, 1):
                raise PlanError(f"rank {self.rank} {self.name}: chunk slices have step 1")
            start = 0 if key.start is None else key.start
            stop = n if key.stop is None else key.stop
        elif isinstance(key, int):
            start, stop = key, key + 1
        else:
            raise PlanError(f"rank {self.rank} {self.name}: index {key!r} is not an int or slice")
        if not 0 <= start < stop <= n:
            raise PlanError(f"rank {self.rank} {self.name}[{start}:{stop}] is outside its "
                            f"{n} chunks")
        return Chunk(self.rank, self.name, start, stop - start)


def _sub_source(src, offset: int, length: int, member):
    """Part [offset, offset + length) of a copy or reduce source; a remote source through a
    group channel takes the channel of thread block `member` = (group, i)."""
    if isinstance(src, _Packets):
        return _Packets(src.chunk.sub(offset, length))
    if isinstance(src, _Remote):
        ch = src.channel
        if ch.members is not None:
            group, i = member if member is not None else (None, None)
            if group is None or len(group) != len(ch.members):
                raise PlanError(f"rank {ch.rank}: a source through group channel {ch!r} needs "
                                f"an operation on a group of {len(ch.members)} thread blocks")
            ch = ch.members[i]
        return _Remote(ch, src.chunk.sub(offset, length))
    if isinstance(src, Chunk):
        return src.sub(offset, length)
    return src  # not a chunk: the operation itself reports it


def _check_split_sizes(where: str, what: str, dst: Chunk, srcs) -> None:
    """Before an operation is split over a thread-block group: every source (a chunk, its
    packets or a remote chunk) has dst's size, as the one-thread-block operation requires
    (a split would cut a longer source silently)."""
    for x in srcs:
        c = x.chunk if isinstance(x, (_Packets, _Remote)) else x
        if isinstance(c, Chunk) and c.size != dst.size:
            raise PlanError(f"{where} ({what}): {c} and {dst} differ in size")


class Rank:
    """Rank ``rank`` of the active program: its buffers and local operations."""

    def __init__(self, rank: int):
        n = _program().world_size
        if not isinstance(rank, int) or not 0 <= rank < n:
            raise PlanError(f"rank {rank!r} is outside world_size {n}")
        self.rank = rank
        self.input = _Buffer(rank, "input")
        self.output = _Buffer(rank, "output")
        self.scratch = _Buffer(rank, "scratch")

    def _local(self, tb, what, c):
        if c.rank != self.rank:
            raise PlanError(f"{_program()._where(self.rank, tb)} ({what}): {c} is not on rank "
                            f"{self.rank}; reach other ranks through a channel")

    def copy(self, dst: Chunk, src, tb: int):
        """dst := src on this rank; src may be ``chunk.packets()`` (scratch holding LL packets:
        waits for them)."""
        if isinstance(tb, ThreadBlockGroup):
            _check_split_sizes(f"rank {self.rank}", "copy", dst, [src])
            for _, t, at, n in tb.parts(dst.size):
                self.copy(dst.sub(at, n), _sub_source(src, at, n, None), t)
            return
        prog = _program()
        packets = isinstance(src, _Packets)
        s = src.chunk if packets else src
        self._local(tb, "copy", dst)
        self._local(tb, "copy", s)
        if dst.size != s.size:
            raise PlanError(f"{prog._where(self.rank, tb)} (copy): {s} and {dst} differ in size")
        if packets and s.buffer != "scratch":
            raise PlanError(f"{prog._where(self.rank, tb)} (copy): packets live in scratch, "
                            f"not {s.buffer}")
        src_ref = s.ref()
        if packets:
            src_ref["packets"] = True
        prog._add(self.rank, tb, {"op": "copy", "src": src_ref, "dst": dst.ref()})

    def reduce(self, dst: Chunk, srcs, tb: int):
        """dst := the reduction of srcs (each read once). A source is a chunk of this rank,
        ``chunk.packets()`` (scratch LL packets of this rank) or ``channel.remote(chunk)``
        (a peer's chunk read through a memory channel). dst may be one of the sources."""
        if isinstance(tb, ThreadBlockGroup):
            _check_split_sizes(f"rank {self.rank}", "reduce", dst, srcs)
            for i, t, at, n in tb.parts(dst.size):
                self.reduce(dst.sub(at, n), [_sub_source(x, at, n, (tb, i)) for x in srcs], t)
            return
        prog = _program()
        where = prog._where(self.rank, tb)
        self._local(tb, "reduce", dst)
        if len(srcs) < 1:
            raise PlanError(f"{where} (reduce): no sources")
        refs = []
        for s in srcs:
            if isinstance(s, _Packets):
                self._local(tb, "reduce", s.chunk)
                if s.chunk.buffer != "scratch":
                    raise PlanError(f"{where} (reduce): packets live in scratch, not "
                                    f"{s.chunk.buffer}")
                ref = s.chunk.ref()
                ref["packets"] = True
                c = s.chunk
            elif isinstance(s, _Remote):
                s.channel._check_tb(tb, "reduce")
                if s.channel.kind != "memory":
                    raise PlanError(f"{where} (reduce): only memory channels read remote chunks")
                if s.chunk.rank != s.channel.peer:
                    raise PlanError(f"{where} (reduce): {s.chunk} is not on the channel's peer "
                                    f"rank {s.channel.peer}")
                ref = s.chunk.ref()
                ref["channel"] = s.channel.index
                c = s.chunk
            elif isinstance(s, Chunk):
                self._local(tb, "reduce", s)
                ref, c = s.ref(), s
            else:
                raise PlanError(f"{where} (reduce): source {s!r} is not a chunk")
            if c.size != dst.size:
                raise PlanError(f"{where} (reduce): {c} and {dst} differ in size")
            refs.append(ref)
        prog._add(self.rank, tb, {"op": "reduce", "dst": dst.ref(), "srcs": refs})


# ---------------------------------------------------------------------------- channels


class _Channel:
    kind = ""

    def __init__(self, dst_rank: int, src_rank: int, tb: int):
        prog = _program()
        n = prog.world_size
        for what, r in (("dst_rank", dst_rank), ("src_rank", src_rank)):
            if not isinstance(r, int) or not 0 <= r < n:
                raise PlanError(f"{self.kind} channel: {what}={r!r} is outside world_size {n}")
        if dst_rank == src_rank:
            raise PlanError(f"rank {src_rank}: a {self.kind} channel links two different ranks")
        if self.kind == "memory" and prog.node(dst_rank) != prog.node(src_rank):
            raise PlanError(f"rank {src_rank}: a memory channel cannot reach rank {dst_rank} on "
                            f"another node (ranks_per_node={prog.ranks_per_node}); use a "
                            f"PortChannel")
        self.rank, self.peer, self.tb = src_rank, dst_rank, tb
        self.members = None
        if isinstance(tb, ThreadBlockGroup):
            # One channel per thread block of the group, made in the group's order.
            self.members = [type(self)(dst_rank, src_rank, t) for t in tb.tbs]
            self.index = None
            return
        self.index = len(prog.channels[src_rank])
        prog.channels[src_rank].append(self)

    def __repr__(self):
        what = f"group {self.tb.tbs}" if self.members is not None else f"{self.index}"
        return f"<{self.kind} channel {what} rank {self.rank} -> {self.peer}>"

    def _group(self, tb, what) -> bool:
        """True when this is a group channel (and tb its group): the caller spreads the
        operation over the members."""
        if self.members is None:
            if isinstance(tb, ThreadBlockGroup):
                raise PlanError(f"rank {self.rank} ({what}): channel {self.index} (to rank "
                                f"{self.peer}) belongs to tb {self.tb}, not to {tb!r}")
            return False
        if not isinstance(tb, ThreadBlockGroup) or tb.tbs != self.tb.tbs:
            raise PlanError(f"rank {self.rank} ({what}): the group channel to rank {self.peer} "
                            f"belongs to {self.tb!r}; pass tb= that group")
        return True

    def _on_members(self, tb, name: str) -> bool:
        """signal/wait/flush over a group channel: each member on its own thread block.
        False when this is not a group channel (the caller does the plain operation)."""
        if not self._group(tb, name):
            return False
        for m, t in zip(self.members, tb.tbs):
            getattr(m, name)(t)
        return True

    def _spread(self, tb, name, dst: Chunk, src: Chunk):
        _check_split_sizes(f"rank {self.rank}", name, dst, [src])
        for i, t, at, n in tb.parts(src.size):
            getattr(self.members[i], name)(dst.sub(at, n), src.sub(at, n), t)

    def _check_tb(self, tb, what):
        if tb != self.tb:
            raise PlanError(f"{_program()._where(self.rank, tb)} ({what}): channel "
                            f"{self.index} (to rank {self.peer}) belongs to tb {self.tb}; "
                            f"each channel is used by one thread block")

    def _op(self, tb, name, **fields):
        self._check_tb(tb, name)
        op = {"op": name, "channel": self.index}
        op.update(fields)
        _program()._add(self.rank, tb, op)

    def _pair(self, tb, name, dst: Chunk, src: Chunk, dst_on_peer: bool):
        where = _program()._where(self.rank, tb)
        local, remote = (src, dst) if dst_on_peer else (dst, src)
        if local.rank != self.rank:
            raise PlanError(f"{where} ({name}): {local} must be on this rank {self.rank}")
        if remote.rank != self.peer:
            raise PlanError(f"{where} ({name}): {remote} is not on the channel's peer rank "
                            f"{self.peer}")
        if dst.size != src.size:
            raise PlanError(f"{where} ({name}): {src} and {dst} differ in size")

    def remote(self, chunk: Chunk) -> _Remote:
        """The peer's chunk, read through this channel (a reduce source)."""
        return _Remote(self, chunk)

    def signal(self, tb: int):
        """Signals the peer (release: this thread block's earlier writes are visible to the
        peer after its matching wait)."""
        if self._on_members(tb, "signal"):
            return
        self._op(tb, "signal")

    def wait(self, tb: int):
        """Waits for the peer's next signal on this channel (acquire, bounded)."""
        if self._on_members(tb, "wait"):
            return
        self._op(tb, "wait")

    def put(self, dst: Chunk, src: Chunk, tb: int):
        """Copies src (this rank) to dst (the peer)."""
        if self._group(tb, "put"):
            return self._spread(tb, "put", dst, src)
        self._pair(tb, "put", dst, src, True)
        self._op(tb, "put", src=src.ref(), dst=dst.ref())

    def put_packets(self, dst: Chunk, src: Chunk, tb: int):
        """Writes src (this rank) as LL packets into dst (the peer's scratch): no signal
        needed, the reader waits for the packets' flags."""
        if self._group(tb, "put_packets"):
            return self._spread(tb, "put_packets", dst, src)
        if self.kind != "memory":
            raise PlanError(f"{_program()._where(self.rank, tb)} (put_packets): packets go "
                            f"through memory channels only")
        self._pair(tb, "put_packets", dst, src, True)
        if dst.buffer != "scratch":
            raise PlanError(f"{_program()._where(self.rank, tb)} (put_packets): packets go "
                            f"into scratch, not {dst.buffer}")
        self._op(tb, "put_packets", src=src.ref(), dst=dst.ref())

    def read_put_packets(self, dst: Chunk, src: Chunk, tb: int):
        """Reads LL packets from src (this rank's scratch, waiting for them) and forwards
        them as packets into dst (the peer's scratch)."""
        if self._group(tb, "read_put_packets"):
            return self._spread(tb, "read_put_packets", dst, src)
        if self.kind != "memory":
            raise PlanError(f"{_program()._where(self.rank, tb)} (read_put_packets): packets "
                            f"go through memory channels only")
        self._pair(tb, "read_put_packets", dst, src, True)
        if dst.buffer != "scratch" or src.buffer != "scratch":
            raise PlanError(f"{_program()._where(self.rank, tb)} (read_put_packets): both "
                            f"chunks must be in scratch")
        self._op(tb, "read_put_packets", src=src.ref(), dst=dst.ref())


class MemoryChannel(_Channel):
    """A memory channel from ``src_rank`` to ``dst_rank`` (same node), used by thread block
    ``tb`` of src_rank. The k-th channel src_rank makes to dst_rank pairs with the k-th
    channel dst_rank makes to src_rank: a signal on one is a wait on the other."""

    kind = "memory"

    def get(self, dst: Chunk, src: Chunk, tb: int):
        """Copies src (the peer) to dst (this rank)."""
        if self._group(tb, "get"):
            return self._spread(tb, "get", dst, src)
        self._pair(tb, "get", dst, src, False)
        self._op(tb, "get", src=src.ref(), dst=dst.ref())


class PortChannel(_Channel):
    """A port channel (the proxy copies; may cross nodes). put is asynchronous: its source
    may be rewritten only after a flush, and its data is at the peer once the peer's wait
    matches a later signal on this channel."""

    kind = "port"

    def flush(self, tb: int):
        """Waits until every earlier put on this channel has left its source."""
        if self._on_members(tb, "flush"):
            return
        self._op(tb, "flush")

    def _group_put_signal(self, tb, name: str, dst: Chunk, src: Chunk, flush: bool):
        """put_with_signal(_and_flush) over a group channel: every member signals (and
        flushes), also one whose part is empty, since its peer waits for the signal."""
        _check_split_sizes(f"rank {self.rank}", name, dst, [src])
        parts = {i: (at, n) for i, _, at, n in tb.parts(src.size)}
        for i, (m, t) in enumerate(zip(self.members, tb.tbs)):
            if i in parts:
                at, n = parts[i]
                getattr(m, name)(dst.sub(at, n), src.sub(at, n), t)
            else:
                m.signal(t)
                if flush:
                    m.flush(t)

    def put_with_signal(self, dst: Chunk, src: Chunk, tb: int):
        if self._group(tb, "put_with_signal"):
            return self._group_put_signal(tb, "put_with_signal", dst, src, False)
        self._pair(tb, "put_with_signal", dst, src, True)
        self._op(tb, "put_with_signal", src=src.ref(), dst=dst.ref())

    def put_with_signal_and_flush(self, dst: Chunk, src: Chunk, tb: int):
        if self._group(tb, "put_with_signal_and_flush"):
            return self._group_put_signal(tb, "put_with_signal_and_flush", dst, src, True)
        self._pair(tb, "put_with_signal_and_flush", dst, src, True)
        self._op(tb, "put_with_signal_and_flush", src=src.ref(), dst=dst.ref())
