#!/usr/bin/env python3
"""CuPy's one-process, several-GPU NCCL sequence (issue 33), checked bit for bit.

    LD_PRELOAD=build/nccl/libmaco_nccl.so python3 tests/nccl/cupy_check.py
    (or tests/nccl/run_cupy_check.sh build/nccl, which ctest's gpu_nccl_cupy runs)

cupy.cuda.nccl.NcclCommunicator.initAll over every visible GPU (2 or more), then, for each
kind of stream a client may pass (0, the legacy default stream, as CuPy's own examples do;
cudaStreamLegacy; cudaStreamPerThread; a non-blocking and a blocking cupy.cuda.Stream of each
device): nccl.groupStart(), one allReduce per device issued inside ``with
cupy.cuda.Device(i):``, nccl.groupEnd() with device 0 current, on random int32 data against
the sum made by NumPy, the output poisoned first. Then an in-place ring of send/recv.
A watchdog turns a hang into a failure (TEST_TIMEOUT seconds, default 180): a timer thread
prints FAIL and exits; faulthandler, which needs no GIL, dumps the threads' stacks and exits
20 s later if the timer could not run.
Prints the library in use (MACO's, found by its marker symbol, or another libnccl), then one
PASS or FAIL line per check, and ends with PASS or FAIL. Exit 0 pass, 1 fail, 77 skip (no
CuPy, no CUDA device, fewer than 2 GPUs: the reason printed).
"""
import ctypes
import faulthandler
import os
import sys
import threading

TIMEOUT = int(os.environ.get("TEST_TIMEOUT", "180"))
step = "import"


def watchdog():
    print(f"FAIL: cupy_check: hang: no result within {TIMEOUT} s (step: {step})", flush=True)
    os._exit(1)


timer = threading.Timer(TIMEOUT, watchdog)
timer.daemon = True
timer.start()
faulthandler.dump_traceback_later(TIMEOUT + 20, exit=True)


def skip(why):
    print(f"SKIP: cupy_check: {why}", flush=True)
    sys.exit(77)


# Each missing piece named as what it is: NumPy (which the check and CuPy need), CuPy, or
# CuPy's NCCL module (a CuPy built without NCCL support).
try:
    import numpy as np
except ImportError as e:
    skip(f"NumPy is not installed for {sys.executable} ({e}); the check and CuPy need it: "
         f"{sys.executable} -m pip install numpy cupy-cuda13x")
try:
    import cupy
except ImportError as e:
    if getattr(e, "name", None) not in (None, "cupy"):
        skip(f"CuPy is installed but cannot be imported: it needs {e.name!r} ({e})")
    skip(f"CuPy is not installed for {sys.executable} ({e}): "
         f"{sys.executable} -m pip install cupy-cuda13x")
except Exception as e:  # noqa: BLE001 - a broken CuPy (CUDA libraries missing...) skips too
    skip(f"CuPy cannot be imported ({type(e).__name__}: {e})")
try:
    from cupy.cuda import nccl
except Exception as e:  # noqa: BLE001
    skip(f"this CuPy has no NCCL support ({type(e).__name__}: {e})")

try:
    ndev = cupy.cuda.runtime.getDeviceCount()
except Exception as e:  # noqa: BLE001
    skip(f"no CUDA device ({e})")
if ndev < 2:
    skip(f"drives 2 or more GPUs from one process; {ndev} visible")

lib = "MACO's libnccl.so.2" if hasattr(ctypes.CDLL(None), "maco_nccl_marker") else "another libnccl.so.2 (not MACO's)"
print(f"cupy_check: CuPy {cupy.__version__}, NCCL version {nccl.get_version()} ({lib}), "
      f"{ndev} GPUs, watchdog {TIMEOUT} s", flush=True)

failures = 0


def report(ok, what):
    global failures
    print(f"{'PASS' if ok else 'FAIL'}: {what}", flush=True)
    failures += 0 if ok else 1


step = "NcclCommunicator.initAll"
comms = nccl.NcclCommunicator.initAll(ndev)
cupy.cuda.Device(0).use()

count = (1 << 20) + 3
rng = np.random.default_rng(33)


def streams_of(kind):
    """One stream handle per device for `kind` (kept alive by the caller)."""
    out = []
    for i in range(ndev):
        with cupy.cuda.Device(i):
            if kind == "stream 0":
                out.append((0, None))
            elif kind == "cudaStreamLegacy":
                out.append((1, None))
            elif kind == "cudaStreamPerThread":
                out.append((2, None))
            else:
                s = cupy.cuda.Stream(non_blocking=(kind == "non-blocking stream"))
                out.append((s.ptr, s))
    return out


for kind in ("stream 0", "cudaStreamLegacy", "cudaStreamPerThread", "non-blocking stream",
             "blocking stream"):
    step = f"allreduce on {kind}"
    host = [rng.integers(-1000, 1001, count, dtype=np.int32) for _ in range(ndev)]
    want = np.sum(np.stack(host), axis=0, dtype=np.int32)
    sends, recvs = [], []
    for i in range(ndev):
        with cupy.cuda.Device(i):
            sends.append(cupy.asarray(host[i]))
            recvs.append(cupy.full(count, -1, dtype=cupy.int32))
            cupy.cuda.Device(i).synchronize()
    handles = streams_of(kind)
    nccl.groupStart()
    for i in range(ndev):
        with cupy.cuda.Device(i):
            comms[i].allReduce(sends[i].data.ptr, recvs[i].data.ptr, count, nccl.NCCL_INT32,
                               nccl.NCCL_SUM, handles[i][0])
    nccl.groupEnd()
    ok = cupy.cuda.runtime.getDevice() == 0
    for i in range(ndev):
        with cupy.cuda.Device(i):
            cupy.cuda.Device(i).synchronize()
            got = cupy.asnumpy(recvs[i])
        same = np.array_equal(got, want)
        if not same:
            bad = np.flatnonzero(got != want)
            print(f"  rank {i}: {bad.size} wrong values, first at {bad[0]}: {got[bad[0]]}, "
                  f"expected {want[bad[0]]}", flush=True)
        ok = ok and same
    report(ok, f"allreduce of {count} int32 on {kind} (CuPy's sequence)")

step = "send/recv in place over the ring"
host = [rng.integers(-1000, 1001, count, dtype=np.int32) for _ in range(ndev)]
bufs = []
for i in range(ndev):
    with cupy.cuda.Device(i):
        bufs.append(cupy.asarray(host[i]))
        cupy.cuda.Device(i).synchronize()
nccl.groupStart()
for i in range(ndev):
    with cupy.cuda.Device(i):
        comms[i].send(bufs[i].data.ptr, count, nccl.NCCL_INT32, (i + 1) % ndev, 0)
        comms[i].recv(bufs[i].data.ptr, count, nccl.NCCL_INT32, (i - 1) % ndev, 0)
nccl.groupEnd()
ok = True
for i in range(ndev):
    with cupy.cuda.Device(i):
        cupy.cuda.Device(i).synchronize()
        ok = ok and np.array_equal(cupy.asnumpy(bufs[i]), host[(i - 1) % ndev])
report(ok, f"send/recv of {count} int32 in place over the ring")

step = "NcclCommunicator.destroy"
for c in comms:
    c.destroy()
timer.cancel()
faulthandler.cancel_dump_traceback_later()
print("PASS: cupy_check" if failures == 0 else f"FAIL: cupy_check: {failures} check(s) failed",
      flush=True)
sys.exit(0 if failures == 0 else 1)
