#!/usr/bin/env python3
"""Fold a `holdfast bench --profile` recording into shares of the daemon's CPU: each sample
counted once, under the syscall it was in (`sys:recvfrom`), else the kernel function it was in
(`kernel:…`: interrupts, scheduling), else its innermost holdfast frame (`user:…`).

    python3 scripts/perf-fold.py DIR/append-256x1.data [TOP] [THREAD]

THREAD (a prefix of the thread name, e.g. `holdfast-journa` for the journal's committer or
`holdfast-worker` for tokio's workers) counts only that thread's samples.
docs/benchmarks.md's table "Where a request's CPU goes" was made with it."""
import collections
import re
import subprocess
import sys

data = sys.argv[1]
top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
only = sys.argv[3] if len(sys.argv) > 3 else None
out = subprocess.run(["perf", "script", "-i", data, "-F", "comm,tid,ip,sym"],
                     capture_output=True, text=True, check=True).stdout
shares, threads, n = collections.Counter(), collections.Counter(), 0
for sample in out.split("\n\n"):
    lines = [l.strip() for l in sample.strip().split("\n") if l.strip()]
    if not lines:
        continue
    thread = lines[0].split()[0]
    if only and not thread.startswith(only):
        continue
    n += 1
    threads[thread] += 1
    frames = [re.sub(r"^[0-9a-f]+\s+", "", l) for l in lines[1:]]
    syscall = next((f for f in frames if f.startswith(("__x64_sys_", "__do_sys_"))), None)
    if syscall:
        key = "sys:" + syscall.split()[0].replace("__x64_sys_", "").replace("__do_sys_", "")
    elif frames and frames[0].startswith(("_raw", "finish_task", "asm_", "irq")):
        key = "kernel:" + frames[0].split()[0]
    else:
        f = next((f for f in frames if "holdfast::" in f), frames[0] if frames else "?")
        key = "user:" + re.sub(r"\s*\(.*", "", f)[:110]
    shares[key] += 1
print("samples", n, "by thread", dict(threads.most_common(6)))
for key, v in shares.most_common(top):
    print("%6.2f%%  %s" % (100 * v / n, key))
