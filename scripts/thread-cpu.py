#!/usr/bin/env python3
"""Where the daemon's CPU goes by thread during `holdfast bench --streams`' first phase
(single-delta appends): CPU microseconds and voluntary / involuntary context switches per
append for each thread name, read from /proc/<daemon>/task/*/{stat,status} over 3 s of the
phase. docs/benchmarks.md ("Issue 15, fifth session") quotes it.

    python3 scripts/thread-cpu.py [HOLDFAST_BIN] [STREAMS]     (defaults: target/release/holdfast, 256)

It starts the bench (target/release/holdfast-bench) and reads only the daemon that bench started
(its child whose command line says `daemon`); nothing else is looked at or signalled."""
import collections
import glob
import os
import subprocess
import sys
import time

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
binary = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "target/release/holdfast")
streams = sys.argv[2] if len(sys.argv) > 2 else "256"
bench = subprocess.Popen(
    [os.path.join(root, "target/release/holdfast-bench"), "--holdfast", binary, "--streams",
     "--no-peers", "--clients", streams, "--seconds", "5"],
    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

daemon = None
for _ in range(500):
    try:
        kids = open("/proc/%d/task/%d/children" % (bench.pid, bench.pid)).read().split()
    except OSError:
        kids = []
    for k in kids:
        try:
            if b"daemon" in open("/proc/%s/cmdline" % k, "rb").read():
                daemon = int(k)
        except OSError:
            pass
    if daemon:
        break
    time.sleep(0.02)
if not daemon:
    sys.exit("thread-cpu: the bench started no daemon")
time.sleep(1.5)  # into the timed phase, past the clients' setup


def snapshot():
    by = collections.defaultdict(lambda: [0, 0, 0])
    for t in glob.glob("/proc/%d/task/*" % daemon):
        try:
            comm = open(t + "/comm").read().strip()
            stat = open(t + "/stat").read().rsplit(")", 1)[1].split()
            ctxt = dict(l.split(":") for l in open(t + "/status").read().splitlines()
                        if "ctxt_switches" in l)
        except OSError:
            continue  # a thread that ended meanwhile
        v = by[comm]
        v[0] += int(stat[11]) + int(stat[12])
        v[1] += int(ctxt["voluntary_ctxt_switches"])
        v[2] += int(ctxt["nonvoluntary_ctxt_switches"])
    return by


before, t0 = snapshot(), time.time()
time.sleep(3)
after, dt = snapshot(), time.time() - t0
out = bench.communicate()[0]
line = next(l for l in out.splitlines() if "holdfast stream.append " in l)
rate = int(line.split()[3].replace(",", ""))
print(line)
hz = os.sysconf("SC_CLK_TCK")
for name, (cpu, vol, invol) in sorted(after.items()):
    b = before.get(name, [0, 0, 0])
    secs = (cpu - b[0]) / hz
    print("%-16s cpu %5.2f s = %5.1f µs/append  voluntary %5.2f/append  involuntary %5.2f/append" % (
        name, secs, secs / dt / rate * 1e6, (vol - b[1]) / dt / rate, (invol - b[2]) / dt / rate))
