#!/usr/bin/env python3
"""Check that one holdfast binary replays the streams another one wrote.

    python3 scripts/journal-compat.py OLD_BINARY NEW_BINARY

Starts OLD on a temporary HOME and leaves streams in every state the journal can hold: a run
streaming (begin + ev records), a run interrupted and resumed (plan records, a second begin),
a run taken over (a second holder), runs re-sealed by a key rotation (snap records), a run
committed (end record + state file) and a checkpoint. It reads every run back (stream.get with
reveal, stream.list, checkpoint.get), stops OLD with SIGTERM, starts NEW on the same data
directory, reads the same things and compares them. Exit 0 and "same" when NEW sees exactly
what OLD saw; otherwise the differences and exit 1. Used when the journal's record format
changes (docs/design.md, "Journal records"); it needs an OLD binary, so it is not part of the
test command: build one from the commit before the change (git worktree + cargo build).
"""
import json, os, signal, socket, subprocess, sys, tempfile, time


class Conn:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(path)
        self.f = self.s.makefile("rwb")
        self.next = 0
        self.call("hello", {"client": "journal-compat"})

    def call(self, method, params):
        self.next += 1
        self.f.write((json.dumps({"jsonrpc": "2.0", "id": self.next, "method": method,
                                  "params": params}) + "\n").encode())
        self.f.flush()
        while True:
            msg = json.loads(self.f.readline())
            if msg.get("id") == self.next:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]


def start(binary, env, sock):
    d = subprocess.Popen([binary, "daemon"], env=env, stderr=subprocess.DEVNULL)
    for _ in range(200):
        if os.path.exists(sock):
            try:
                Conn(sock)
                return d
            except OSError:
                pass
        time.sleep(0.05)
    d.kill()
    sys.exit(f"{binary} did not start")


def stop(d):
    d.send_signal(signal.SIGTERM)
    d.wait(timeout=30)


def text(i):
    return {"type": "text", "text": f"delta {i}. "}


def write_streams(c):
    a = c.call("stream.begin", {"run_id": "run-a", "model": "m1", "thread_id": "t1"})
    c.call("stream.append", {"run_id": "run-a", "stream_id": a["stream_id"], "seq": 1,
                             "events": [text(i) for i in range(20)]})
    b = c.call("stream.begin", {"run_id": "run-b", "model": "m1"})
    c.call("stream.append", {"run_id": "run-b", "stream_id": b["stream_id"], "seq": 1,
                             "events": [text(0), {"type": "tool_call_delta", "id": "c1",
                                                  "name": "search", "arguments_delta": "{\"q\": \"ru"}]})
    p = c.call("stream.interrupt", {"run_id": "run-b", "stream_id": b["stream_id"],
                                    "cause": "connection_reset"})
    r = c.call("stream.resume", {"run_id": "run-b", "model": "m1"})
    c.call("stream.append", {"run_id": "run-b", "stream_id": r["stream_id"],
                             "seq": r["next_seq"], "events": [text(1)]})
    t = c.call("stream.begin", {"run_id": "run-a", "takeover": True})
    c.call("stream.append", {"run_id": "run-a", "stream_id": t["stream_id"], "seq": 21,
                             "events": [text(21)]})
    d = c.call("stream.begin", {"run_id": "run-done"})
    c.call("stream.append", {"run_id": "run-done", "stream_id": d["stream_id"], "seq": 1,
                             "events": [text(0)]})
    c.call("stream.commit", {"run_id": "run-done", "stream_id": d["stream_id"],
                             "final_message": {"role": "assistant"}, "content_from_stream": True})
    c.call("checkpoint.put", {"run_id": "run-cp", "snapshot": {"partial_text": "half", "updated_at_ms": 1}})
    # A key rotation writes snap records of the active runs (and re-seals state files).
    c.call("admin.rotate_key", {})
    e = c.call("stream.begin", {"run_id": "run-after"})
    c.call("stream.append", {"run_id": "run-after", "stream_id": e["stream_id"], "seq": 1,
                             "events": [text(0), text(1)]})
    return p


def read_streams(c):
    out = {}
    for run in ["run-a", "run-b", "run-done", "run-after"]:
        g = c.call("stream.get", {"run_id": run, "reveal": True})
        for volatile in ["at_ms"]:
            g.pop(volatile, None)
        out[run] = g
    listed = c.call("stream.list", {})
    out["list"] = sorted((r["run_id"], r["next_seq"], r["status"]) for r in listed["runs"])
    out["checkpoint"] = c.call("checkpoint.get", {"run_id": "run-cp"})
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    old, new = sys.argv[1], sys.argv[2]
    tmp = tempfile.mkdtemp(prefix="hf-compat-")
    home = os.path.join(tmp, "home")
    run = os.path.join(home, "run")
    os.makedirs(run, mode=0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOLDFAST_", "HIVE_", "XDG_"))}
    env.update(HOME=home, XDG_RUNTIME_DIR=run, XDG_CONFIG_HOME=os.path.join(home, "config"),
               XDG_STATE_HOME=os.path.join(home, "state"))
    subprocess.run([old, "init"], env=env, check=True, capture_output=True)
    sock = os.path.join(run, "holdfast", "holdfast.sock")
    d = start(old, env, sock)
    try:
        c = Conn(sock)
        write_streams(c)
        before = read_streams(c)
    finally:
        stop(d)
    d = start(new, env, sock)
    try:
        after = read_streams(Conn(sock))
    finally:
        stop(d)
    records = sum(1 for n in os.listdir(os.path.join(home, "state", "holdfast", "streams"))
                  if n.startswith("journal-"))
    if before == after:
        print(f"same: {len(before) - 2} runs, the list and a checkpoint read identically "
              f"from {records} journal segment(s) written by {old}")
        return 0
    for k in before:
        if before[k] != after.get(k):
            print(f"differs: {k}\n  old: {json.dumps(before[k], sort_keys=True)}\n"
                  f"  new: {json.dumps(after.get(k), sort_keys=True)}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
