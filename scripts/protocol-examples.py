#!/usr/bin/env python3
"""Print a real request/response exchange for every method of the holdfast socket protocol.

Starts the daemon (target/debug/holdfast unless HOLDFAST_BIN is set) on a temporary HOME, runs
each example, prints `-> request` / `<- response` lines (and `<~ event` notifications), and
stops the daemon. docs/protocol.md quotes this output; rerun it after changing the protocol:

    cargo build && python3 scripts/protocol-examples.py
"""
import json, os, signal, socket, subprocess, sys, tempfile, time

BIN = os.environ.get("HOLDFAST_BIN", os.path.join(os.path.dirname(__file__), "..", "target", "debug", "holdfast"))


def main():
    tmp = tempfile.mkdtemp(prefix="hf-proto-")
    home = os.path.join(tmp, "home")
    run = os.path.join(home, "run")
    os.makedirs(run, mode=0o700)
    os.chmod(run, 0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOLDFAST_", "HIVE_", "XDG_"))}
    env.update(HOME=home, XDG_RUNTIME_DIR=run, XDG_CONFIG_HOME=os.path.join(home, "config"),
               XDG_STATE_HOME=os.path.join(home, "state"))
    cfg = os.path.join(home, "config", "holdfast")
    os.makedirs(cfg, exist_ok=True)
    with open(os.path.join(cfg, "config.toml"), "w") as f:
        f.write('[plugins.reader]\nstores = ["default"]\nmethods = ["cred.get", "cred.list"]\n'
                '[plugins.agent-a]\nstores = []\nmethods = ["stream.*", "checkpoint.*", "run.*"]\n'
                'runs = ["agent-a-*"]\n'
                '[streams]\norphan_timeout_s = 1\n')
    subprocess.run([BIN, "init"], env=env, check=True, capture_output=True)
    daemon = subprocess.Popen([BIN, "daemon"], env=env, stderr=subprocess.DEVNULL)
    sock_path = os.path.join(run, "holdfast", "holdfast.sock")
    for _ in range(100):
        if os.path.exists(sock_path):
            break
        time.sleep(0.05)
    try:
        if sys.argv[1:] == ["streams"]:
            streams_examples(sock_path)
            return
        if sys.argv[1:] == ["runs"]:
            runs_examples(sock_path)
            return
        if sys.argv[1:] == ["grants"]:
            grants_examples(sock_path)
            return
        a = Conn(sock_path, "a")
        b = Conn(sock_path, "b")
        a.call("hello", {"client": "docs-example", "protocol": 1})
        b.call("hello", {"client": "watcher"}, quiet=True)
        b.call("cred.watch", {"store": "default"})
        a.call("cred.set", {"id": "openai", "value": "sk-example-1"})
        b.event()
        a.call("cred.set", {"credential": {"id": "github/bot", "credential_type": "oauth2",
                                          "keys": {"access_token": {"value": "gho_example", "expires_at": "2026-12-01T00:00:00Z"},
                                                   "refresh_token": {"value": "ghr_example"}},
                                          "description": "CI bot", "team": "infra"},
                            "if_generation": 0})
        b.event()
        a.call("cred.set", {"credential": {"id": "github/bot", "keys": {"access_token": {"value": "x"}}}, "if_generation": 0})
        a.call("cred.get", {"id": "openai"})
        a.call("cred.list", {})
        a.call("cred.exists", {"id": "openai"})
        a.call("cred.refresh_lease", {"id": "github/bot", "ttl_ms": 30000})
        b.call("cred.refresh_lease", {"id": "github/bot", "ttl_ms": 30000})
        a.call("cred.set", {"credential": {"id": "github/bot", "credential_type": "oauth2",
                                          "keys": {"access_token": {"value": "gho_example_2"}, "refresh_token": {"value": "ghr_example"}}},
                            "if_generation": 1})
        b.event()
        b.call("cred.release_lease", {"id": "github/bot"})
        a.call("cred.delete", {"id": "openai"})
        b.event()
        b.call("unsubscribe", {"subscription": 1})
        a.call("cred.delete", {"id": "openai"})
        a.call("cred.get", {"id": "../etc/passwd"})
        a.call("cred.get", {"id": "nope"})
        a.call("admin.status", {})
        a.call("admin.fsck", {"repair": False})
        a.call("admin.reindex", {})
        a.call("admin.rotate_key", {})
        a.call("admin.prune_keys", {})
        a.call("no.such.method", {})
        a.raw(b'{"jsonrpc":"2.0","id":99,"method":"cred.get","params":{"id":"x","extra":1}}')
        a.raw(b'{not json')
        c = Conn(sock_path, "c")
        c.call("cred.get", {"id": "x"})
        c.call("hello", {"plugin": "reader"})
        c.call("cred.set", {"id": "x", "value": "y"})
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)


def runs_examples(sock_path):
    """`python3 scripts/protocol-examples.py runs`: the run.* exchanges."""
    a = Conn(sock_path, "agent")
    a.call("hello", {"client": "agent"}, quiet=True)
    a.call("run.log_node", {"run_id": "run-7", "detail": {
        "node_id": "plan", "node_name": "Plan", "node_type": "llm", "success": True, "attempt": 1,
        "input_tokens": 812, "output_tokens": 164, "tokens_used": 976, "latency_ms": 1840, "total_steps": 2}})
    a.call("run.ensure_node", {"run_id": "run-7", "node_id": "plan", "detail": {"success": True}})
    a.call("run.log_step", {"run_id": "run-7", "step": {
        "node_id": "plan", "node_type": "llm", "step_index": 0, "llm_text": "Searching first.",
        "tool_calls": [], "input_tokens": 400, "output_tokens": 80}})
    a.call("run.tool_begin", {"run_id": "run-7", "tool_call_id": "toolu_01", "name": "search", "input": {"q": "holdfast"}})
    a.call("run.tool_end", {"run_id": "run-7", "tool_call_id": "toolu_01", "result": "3 results", "is_error": False})
    a.call("run.log_node", {"run_id": "run-7", "detail": {
        "node_id": "act", "node_type": "tool", "success": False, "attempt": 1, "retry_count": 4,
        "error": "search API returned 500", "input_tokens": 10, "output_tokens": 2}})
    a.call("run.end", {"run_id": "run-7", "status": "degraded", "agent_id": "researcher",
                       "duration_ms": 2350, "node_path": ["plan", "act"],
                       "execution_quality": "degraded"})
    a.call("run.end", {"run_id": "run-7", "status": "success"})
    a.call("run.log_node", {"run_id": "run-7", "detail": {"node_id": "late"}})
    a.call("run.get", {"run_id": "run-7"})
    a.call("run.list", {"status": "degraded"})
    a.call("run.prune", {"older_than_days": 30, "dry_run": True})


def grants_examples(sock_path):
    """`python3 scripts/protocol-examples.py grants`: a plugin whose grant limits its runs."""
    o = Conn(sock_path, "owner")
    o.call("hello", {"client": "agent-b"}, quiet=True)
    o.call("stream.begin", {"run_id": "agent-b-1"}, quiet=True)
    a = Conn(sock_path, "agent-a")
    a.call("hello", {"client": "agent-a", "plugin": "agent-a"})
    a.call("stream.begin", {"run_id": "agent-a-1", "model": "claude-x"})
    a.call("stream.subscribe", {"run_id": "agent-b-1"})
    a.call("stream.resume", {"run_id": "agent-b-1"})
    a.call("stream.list", {})


def streams_examples(sock_path):
    """`python3 scripts/protocol-examples.py streams`: the stream.* and checkpoint.* exchanges."""
    p = Conn(sock_path, "producer")
    w = Conn(sock_path, "watcher")
    p.call("hello", {"client": "agent"}, quiet=True)
    w.call("hello", {"client": "ui"}, quiet=True)
    r = p.call("stream.begin", {"run_id": "run-42", "thread_id": "t-7", "model": "claude-x"})
    sid = r["result"]["stream_id"]
    w.call("stream.subscribe", {"run_id": "run-42", "after_seq": 0})
    p.call("stream.append", {"run_id": "run-42", "stream_id": sid, "seq": 1, "events": [
        {"type": "text", "text": "Let me check the "},
        {"type": "text", "text": "file and fix the bu"}]})
    w.event(); w.event()
    p.call("stream.append", {"run_id": "run-42", "stream_id": sid, "seq": 1, "events": [
        {"type": "text", "text": "Let me check the "}]})
    p.call("stream.append", {"run_id": "run-42", "stream_id": sid, "seq": 3, "events": [
        {"type": "tool_call_delta", "id": "call_1", "name": "read_file", "arguments_delta": "{\"path\": "},
        {"type": "tool_call_delta", "id": "call_1", "arguments_delta": "\"src/x\"}"},
        {"type": "tool_call_end", "id": "call_1"},
        {"type": "tool_call_delta", "id": "call_2", "name": "write_file", "arguments_delta": "{\"path\": \"src/x\", \"body\": \"fn ma"}]})
    for _ in range(4):
        w.event()
    p.call("stream.append", {"run_id": "run-42", "stream_id": sid, "seq": 9, "events": [{"type": "text", "text": "x"}]})
    p.call("stream.interrupt", {"run_id": "run-42", "stream_id": sid,
                                "cause": {"status": 429, "message": "rate limited", "retry_after": "2"}})
    for _ in range(2):
        w.event()
    p.call("stream.get", {"run_id": "run-42"})
    p.call("stream.list", {})
    z = Conn(sock_path, "new-process")
    z.call("hello", {"client": "agent-restarted"}, quiet=True)
    r = z.call("stream.resume", {"run_id": "run-42", "model": "claude-x"})
    w.event()
    sid2 = r["result"]["stream_id"]
    p.call("stream.append", {"run_id": "run-42", "stream_id": sid, "seq": 9, "events": [{"type": "text", "text": "zombie"}]})
    z.call("stream.commit", {"run_id": "run-42", "stream_id": sid2, "content_from_stream": True,
                             "final_message": {"role": "assistant",
                                               "tool_calls": [{"id": "call_1", "name": "read_file", "arguments": {"path": "src/x"}}]}})
    w.event()
    z.call("stream.resume", {"run_id": "run-42"})
    z.call("stream.get", {"run_id": "run-42"})
    z.call("stream.get", {"run_id": "run-42", "reveal": True})
    r = z.call("stream.begin", {"run_id": "run-43"})
    z.call("stream.abort", {"run_id": "run-43", "stream_id": r["result"]["stream_id"], "reason": "user closed the tab"})
    # A continuation declared restated: the model restates the end of the prefix.
    r = z.call("stream.begin", {"run_id": "run-46"})
    sid6 = r["result"]["stream_id"]
    z.call("stream.append", {"run_id": "run-46", "stream_id": sid6, "seq": 1, "events": [
        {"type": "text", "text": "The fox jumps over the la"}]})
    z.call("stream.interrupt", {"run_id": "run-46", "stream_id": sid6, "cause": "stalled",
                                "continuation": "restated"})
    z.call("stream.append", {"run_id": "run-46", "stream_id": sid6, "seq": 3, "events": [
        {"type": "text", "text": "over the lazy dog."}]})
    z.call("stream.commit", {"run_id": "run-46", "stream_id": sid6, "content_from_stream": True,
                             "final_message": {"role": "assistant"}})
    z.call("stream.get", {"run_id": "run-46", "reveal": True})
    # A producer whose connection closes without a commit or abort.
    d = Conn(sock_path, "doomed")
    d.call("hello", {"client": "agent"}, quiet=True)
    r = d.call("stream.begin", {"run_id": "run-45"})
    sid5 = r["result"]["stream_id"]
    d.call("stream.append", {"run_id": "run-45", "stream_id": sid5, "seq": 1, "events": [
        {"type": "text", "text": "Half an ans"}]})
    w.call("stream.subscribe", {"run_id": "run-45", "after_seq": 1})
    d.close()
    w.event(); w.event()
    z.call("stream.get", {"run_id": "run-45", "reveal": True})
    z.call("checkpoint.put", {"run_id": "run-44", "snapshot": {"thread_id": "t-9", "upstream_model": "claude-x",
                                                               "partial_text": "Half an ans", "completed_tool_calls": [],
                                                               "in_flight_tool": None}})
    z.call("checkpoint.get", {"run_id": "run-44"})
    z.call("checkpoint.delete", {"run_id": "run-44"})


class Conn:
    def __init__(self, path, tag):
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(path)
        self.f = self.s.makefile("rwb")
        self.tag = tag
        self.next = 1

    def call(self, method, params, quiet=False):
        req = {"jsonrpc": "2.0", "id": self.next, "method": method, "params": params}
        self.next += 1
        line = json.dumps(req).encode()
        if not quiet:
            print(f"[{self.tag}] -> {line.decode()}")
        self.f.write(line + b"\n")
        self.f.flush()
        while True:
            resp = self.f.readline()
            msg = json.loads(resp)
            if msg.get("method") == "event":
                print(f"[{self.tag}] <~ {resp.decode().strip()}")
                continue
            if not quiet:
                print(f"[{self.tag}] <- {resp.decode().strip()}")
            return msg

    def close(self):
        print(f"[{self.tag}] (closes its connection)")
        self.f.close()
        self.s.close()

    def raw(self, line):
        print(f"[{self.tag}] -> {line.decode()}")
        self.f.write(line + b"\n")
        self.f.flush()
        print(f"[{self.tag}] <- {self.f.readline().decode().strip()}")

    def event(self):
        self.s.settimeout(5)
        print(f"[{self.tag}] <~ {self.f.readline().decode().strip()}")
        self.s.settimeout(None)


if __name__ == "__main__":
    main()
