#!/usr/bin/env python3
"""Memory a daemon holds per stream event: start each given holdfast binary on a temporary HOME,
append one run of 200,000 text events (200 appends of 1,000), and print the daemon's RSS growth
per event (read from /proc/PID/status). A run keeps every event while it is active (a
subscriber with after_seq 0 is replayed all of it), so this is the cost of a long answer.

    python3 scripts/stream-memory.py target/release/holdfast [OTHER_BINARY ...]

With STREAM_MEMORY_CONFIG set, its text is the daemons' config file (e.g. a [backend] section
putting the streams on PostgreSQL, whose runs keep no published event in memory).
"""
import json, os, signal, socket, subprocess, sys, tempfile, time
def run(binary):
    tmp = tempfile.mkdtemp(prefix="hf-mem-")
    home = os.path.join(tmp, "home"); rund = os.path.join(home, "run"); os.makedirs(rund, mode=0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOLDFAST_", "HIVE_", "XDG_"))}
    env.update(HOME=home, XDG_RUNTIME_DIR=rund, XDG_CONFIG_HOME=os.path.join(home, "config"), XDG_STATE_HOME=os.path.join(home, "state"))
    if os.environ.get("STREAM_MEMORY_CONFIG"):
        os.makedirs(os.path.join(home, "config", "holdfast"), exist_ok=True)
        with open(os.path.join(home, "config", "holdfast", "config.toml"), "w") as c:
            c.write(os.environ["STREAM_MEMORY_CONFIG"])
    subprocess.run([binary, "init"], env=env, check=True, capture_output=True)
    d = subprocess.Popen([binary, "daemon"], env=env, stderr=subprocess.DEVNULL)
    sock = os.path.join(rund, "holdfast", "holdfast.sock")
    for _ in range(200):
        if os.path.exists(sock): break
        time.sleep(0.05)
    time.sleep(0.3)
    s = socket.socket(socket.AF_UNIX); s.connect(sock); f = s.makefile("rwb")
    n = [0]
    def call(m, p):
        n[0] += 1
        f.write((json.dumps({"jsonrpc": "2.0", "id": n[0], "method": m, "params": p}) + "\n").encode()); f.flush()
        while True:
            r = json.loads(f.readline())
            if r.get("id") == n[0]: return r.get("result", r.get("error"))
    call("hello", {})
    def rss():
        for l in open(f"/proc/{d.pid}/status"):
            if l.startswith("VmRSS"): return int(l.split()[1])
    base = rss()
    b = call("stream.begin", {"run_id": "big"})
    seq = 1
    for _ in range(200):
        call("stream.append", {"run_id": "big", "stream_id": b["stream_id"], "seq": seq, "events": [{"type": "text", "text": "tok%05d " % i} for i in range(seq, seq + 1000)]})
        seq += 1000
    time.sleep(0.5)
    after = rss()
    d.send_signal(signal.SIGTERM); d.wait()
    return base, after
for b in sys.argv[1:]:
    base, after = run(b)
    print(f"{b}: RSS {base} KiB idle, {after} KiB with one run of 200,000 text events: +{(after-base)/1024:.1f} MiB ({(after-base)*1024/200000:.0f} B/event)")
