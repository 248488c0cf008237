#!/usr/bin/env python3
"""Hostile command lines and environments for MACO's tools, without a GPU.

    python3 tests/fuzz/hostile_cli.py BUILD_DIR PLANS_DIR [RUNS] [SEED]

Draws RUNS invocations (default 2000, a fresh seed unless SEED is given; the seed is printed),
a quarter each of:
  maco-perf --dry-run   a collective (or garbage) and up to 8 flags of nccl-tests' and MACO's,
                        with hostile values (negative, past 2^64, units, text, 5000 bytes);
  maco-info --env       with 1 to 6 MACO_* variables set to hostile values;
  maco-run              hostile -n / --timeout / --simulate-nodes / --mps / --gpus (at most 4
                        ranks start), then /bin/true, a failing shell, no program or a missing one;
  maco-plan verify      a shipped plan of PLANS_DIR with random mutations (keys dropped, lists
                        repeated or cut, numbers past 2^64, wrong types, cut JSON).
Each must end by itself (15 s; 30 s for plans), without a signal, and a failing run must say
something. Exit status 1 with the offending command lines when one does not."""
import glob
import json
import os
import random
import subprocess
import sys
import tempfile

B, PLANS = sys.argv[1], sys.argv[2]
N = int(sys.argv[3]) if len(sys.argv) > 3 else 2000
SEED = int(sys.argv[4]) if len(sys.argv) > 4 else random.SystemRandom().randrange(2 ** 32)
rnd = random.Random(SEED)
HOSTILE = ["", "-1", "0", "1", "2", "3", "-0", "00", "1e30", "nan", "inf", "-inf", "0x10", "1K",
           "1M", "1G", "999G", "1T", "-1G", "18446744073709551615", "18446744073709551616",
           "9223372036854775807", "-9223372036854775808", "2147483648", "4294967296", "abc",
           "%s%s%n", "\x01\x02", "\u00fc", "1.5", " 8", "8 ", "8x", "--", "-", "=", "all", "none",
           "sum", "bfloat16", "int8", "f8e4m3", "a" * 5000]
PERF_FLAGS = ["-b", "-e", "-f", "-i", "-d", "-o", "-r", "-n", "-m", "-w", "-c", "-G", "-N", "-a",
              "-T", "-R", "--placement", "--json", "--minbytes", "--maxbytes", "-g", "-t", "-z",
              "-p", "--unknown", "-x"]
COLLS = ["allreduce", "allgather", "reduce_scatter", "broadcast", "reduce", "alltoall",
         "sendrecv", "all_reduce_perf", "./build/all_gather_perf", "hypercube_perf", "bogus", ""]
bad = []
codes = {}


def run(cmd, env=None, limit=15):
    try:
        p = subprocess.run(cmd, capture_output=True, env=env, timeout=limit)
    except subprocess.TimeoutExpired:
        bad.append(f"did not end within {limit} s: {cmd!r}")
        return
    codes[p.returncode] = codes.get(p.returncode, 0) + 1
    if p.returncode < 0 or p.returncode >= 128:
        bad.append(f"exit status {p.returncode} (a signal): {cmd!r}: {p.stderr[-300:]!r}")
    elif p.returncode not in (0, 77) and not (p.stderr.strip() or p.stdout.strip()):
        bad.append(f"exit status {p.returncode} without a word: {cmd!r}")


def val():
    return str(rnd.randint(-10 ** 12, 10 ** 12)) if rnd.random() < 0.3 else rnd.choice(HOSTILE)


def perf():
    args = [rnd.choice(COLLS)]
    for _ in range(rnd.randint(0, 8)):
        f, r = rnd.choice(PERF_FLAGS), rnd.random()
        args += [f + val()] if r < 0.2 else [f + "=" + val()] if r < 0.3 else [f, val()]
    for i, a in enumerate(args[:-1]):
        if a == "--json":
            args[i + 1] = os.path.join(tempfile.gettempdir(), "hostile-cli-perf.json")
    run([f"{B}/tools/maco-perf", "--dry-run"] + args)


_vars = []


def info():
    if not _vars:
        out = subprocess.run([f"{B}/tools/maco-info", "--env"], capture_output=True,
                             text=True).stdout
        _vars.extend(sorted({w for w in out.split() if w.startswith("MACO_") and w[5:].isupper()}))
    env = dict(os.environ)
    for _ in range(rnd.randint(1, 6)):
        env[rnd.choice(_vars)] = val()
    run([f"{B}/tools/maco-info", "--env"], env=env)


def maco_run():
    args = []
    for _ in range(rnd.randint(0, 5)):
        f, v = rnd.choice(["-n", "--timeout", "--simulate-nodes", "--mps", "--gpus", "--", "-x",
                           "--bogus"]), val()
        if f in ("-n", "--gpus") and v.lstrip("-").isdigit() and int(v) > 4:
            v = "2"  # no storm of processes
        args += [f, v]
    prog = rnd.choice([["/bin/true"], ["/bin/sh", "-c", "exit 3"], [], ["/no/such/program"]])
    run([f"{B}/tools/maco-run"] + args + ["--mps", "off", "--timeout", "5"] + prog, limit=20)


PLAN_DOCS = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(PLANS, "*.json")))]


def mutate(x):
    if isinstance(x, dict):
        x = dict(x)
        if x and rnd.random() < 0.3:
            k = rnd.choice(list(x))
            if rnd.random() < 0.5:
                del x[k]
            else:
                x[k] = mutate(x[k])
        return {k: mutate(v) if rnd.random() < 0.15 else v for k, v in x.items()}
    if isinstance(x, list):
        if x and rnd.random() < 0.2:
            x = x * rnd.randint(2, 40) if rnd.random() < 0.3 else x[:rnd.randint(0, len(x))]
        return [mutate(e) if rnd.random() < 0.2 else e for e in x]
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return rnd.choice([-1, 0, 1, 2 ** 31, 2 ** 32, 2 ** 63, 2 ** 64, -2 ** 63, 1e300, 0.5, "7",
                           None, x + 1, x * 1000])
    if isinstance(x, str):
        return rnd.choice(["", "copy", "reduce", "scratch", "input", "output", x + "x", "\u0000",
                           x * 100])
    return rnd.choice([None, True, [], {}, 0])


def plan():
    text = json.dumps(mutate(rnd.choice(PLAN_DOCS)))
    if rnd.random() < 0.05:
        text = text[:rnd.randint(0, 200)]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        f.write(text)
    try:
        run([f"{B}/tools/maco-plan", "verify", f.name], limit=30)
    finally:
        os.unlink(f.name)


if not PLAN_DOCS:
    sys.exit(f"hostile_cli: no plans in {PLANS}")
kinds = (perf, info, maco_run, plan)
for i in range(N):
    kinds[i % 4]()
print(f"hostile_cli: seed {SEED}: {N} runs, exit statuses {dict(sorted(codes.items()))}, "
      f"{len(bad)} bad")
for b in bad[:20]:
    print("BAD", b)
sys.exit(1 if bad else 0)
