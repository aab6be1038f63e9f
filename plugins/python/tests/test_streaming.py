"""RecoveringStream and the streaming example against the real daemon: what a UI renders equals
the stored final message, no token twice, across a 429, a reset, a stalled tool call, an
agent process killed with SIGKILL and a new one resuming."""

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from harness import HERE, hc, render
from holdfast_client.streaming import (
    ChunkAdapter,
    RecoveringStream,
    SplitToolCall,
    StreamFailed,
    classify_error,
)

EXAMPLE = HERE.parent / "examples" / "agent_loop.py"
WORDS = ["w%02d " % i for i in range(60)]
ANSWER = "".join(WORDS)


class Http(Exception):
    def __init__(self, status, retry_after=None, message="provider error"):
        super().__init__(message)
        self.status_code = status
        self.headers = {"retry-after": retry_after} if retry_after is not None else {}


def provider(fail_at=None, exc=None, prefix=None, text=ANSWER):
    """Words of ``text`` after ``prefix``; raises ``exc`` before word ``fail_at``."""
    start = len(prefix) if prefix else 0
    for i, w in enumerate(re.findall(r"\S+\s*|\s+", text[start:])):
        if fail_at is not None and i == fail_at:
            raise exc
        yield w


# ---------------------------------------------------------------------------------------------
# Pure parts


def test_chunk_adapter_reads_strings_events_and_openai_chunks():
    a = ChunkAdapter()
    assert a.events("Hi ") == [{"type": "text", "text": "Hi "}]
    assert a.events("") == []
    assert a.events({"type": "text", "text": "x"}) == [{"type": "text", "text": "x"}]

    class Obj:  # the SDKs' attribute objects
        def __init__(self, **kw):
            self.__dict__.update(kw)

    tc = Obj(index=0, id="call_a", function=Obj(name="read_file", arguments='{"p":'))
    ch = Obj(choices=[Obj(delta=Obj(content="ok ", tool_calls=[tc]), finish_reason=None)])
    assert a.events(ch) == [
        {"type": "text", "text": "ok "},
        {"type": "tool_call_delta", "id": "call_a", "name": "read_file",
         "arguments_delta": '{"p":'},
    ]
    # A second call by index ends the first; finish_reason ends the rest.
    evs = a.events({"choices": [{"delta": {"tool_calls": [
        {"index": 0, "function": {"arguments": '"x"}'}},
        {"index": 1, "id": "call_b", "function": {"name": "ls", "arguments": "{}"}},
    ]}, "finish_reason": "tool_calls"}]})
    assert evs == [
        {"type": "tool_call_delta", "id": "call_a", "arguments_delta": '"x"}'},
        {"type": "tool_call_end", "id": "call_a"},
        {"type": "tool_call_delta", "id": "call_b", "name": "ls", "arguments_delta": "{}"},
        {"type": "tool_call_end", "id": "call_b"},
    ]
    assert a.finish() == []
    assert ChunkAdapter().events({"choices": []}) == []  # usage-only chunk
    with pytest.raises(TypeError):
        ChunkAdapter().events(42)
    # Calls without ids get ones unique to the attempt.
    b = ChunkAdapter(attempt=2)
    ev = b.events({"choices": [{"delta": {"tool_calls": [
        {"index": 0, "function": {"name": "x", "arguments": ""}}]}}]})
    assert ev[0]["id"] == "call_2_0" and b.finish() == [{"type": "tool_call_end", "id": "call_2_0"}]


def test_provider_exceptions_become_causes():
    assert classify_error(Http(429, "30"), True) == {
        "status": 429, "message": "provider error", "retry_after": "30"}
    resp = type("R", (), {"status_code": 529, "headers": {"Retry-After": "2"}})()
    e = Exception("overloaded")
    e.response = resp
    assert classify_error(e, False) == {"status": 529, "message": "overloaded",
                                        "retry_after": "2"}
    assert classify_error(ConnectionResetError(), True) == "connection_reset"
    assert classify_error(BrokenPipeError(), False) == "connection_reset"
    assert classify_error(TimeoutError(), True) == "idle_stall"
    assert classify_error(TimeoutError(), False) == "timeout"
    named = type("APIConnectionError", (Exception,), {})
    assert classify_error(named("x"), True) == "connection_reset"
    assert classify_error(KeyError("bug"), True) is None
    assert len(classify_error(Http(400, message="x" * 5000), True)["message"]) == 1000


# ---------------------------------------------------------------------------------------------
# In process


def test_a_429_after_30_chunks_renders_the_final_text_once(daemon):
    waits = []
    with daemon.client("agent") as hf:
        calls = []

        def reopen(prefix):
            calls.append(prefix)
            return provider(prefix=prefix)

        rs = RecoveringStream(hf, "r429", provider(30, Http(429, "1")), reopen=reopen,
                              model="m", sleep=waits.append)
        shown = render(rs)
    assert shown == ANSWER == rs.text == rs.final_message["content"]
    assert calls == ["".join(WORDS[:30])], "continued from the text shown, once"
    assert [p["plan"] for p in rs.plans] == ["R1"] and waits == [1.0], (rs.plans, waits)
    assert rs.stop_reason == "end_turn"
    print("429 after 30 of 60 chunks: rendered %d chars == final, 1 reopen from the prefix, "
          "waited %s s (Retry-After: 1)" % (len(shown), waits[0]))


def test_a_failure_before_any_text_starts_over_with_a_reset(daemon):
    with daemon.client("agent") as hf:
        rs = RecoveringStream(hf, "r4", provider(0, Http(503)),
                              reopen=lambda prefix: provider(prefix=prefix), sleep=lambda s: None)
        evs = list(rs)
    assert [p["plan"] for p in rs.plans] == ["R4"]
    assert [e.type for e in evs].count("stream_reset") == 1
    assert render(evs) == ANSWER == rs.final_message["content"]


def test_permanent_errors_fail_and_abort_and_unknown_ones_propagate(daemon):
    with daemon.client("agent") as hf:
        rs = RecoveringStream(hf, "r401", provider(5, Http(401)),
                              reopen=lambda p: provider(prefix=p), sleep=lambda s: None)
        with pytest.raises(StreamFailed) as e:
            list(rs)
        assert e.value.plan["plan"] == "fail" and isinstance(e.value.__cause__, Http)
        assert hf.stream_get("r401")["status"] == "aborted"
        # A bug in the caller's code is not a stream failure: it propagates, the run stays
        # resumable for whoever comes next.
        rs = RecoveringStream(hf, "rbug", provider(5, KeyError("bug")),
                              reopen=lambda p: provider(prefix=p))
        with pytest.raises(KeyError):
            list(rs)
        assert hf.stream_get("rbug")["status"] == "streaming"
        resumed = RecoveringStream(hf, "rbug", resume=True,
                                   reopen=lambda p: provider(prefix=p), sleep=lambda s: None)
        assert render(resumed) == ANSWER


def test_a_tool_call_that_keeps_stalling_surfaces_the_split_hint(daemon):
    def stalling(prefix=None):
        if not prefix:
            yield "Writing it. "
        yield {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "c%d" % time.time_ns(),
                            "function": {"name": "write_file", "arguments": '{"x": "'}}]}}]}
        raise TimeoutError("idle")

    reopens = []
    with daemon.client("agent") as hf:
        rs = RecoveringStream(hf, "rsplit", stalling(),
                              reopen=lambda p: reopens.append(p) or stalling(p),
                              sleep=lambda s: None)
        with pytest.raises(SplitToolCall) as e:
            render(rs)
        assert e.value.tool == "write_file" and "Split" in e.value.message
        assert len(reopens) == 1, "one retry, then the hint instead of a loop"
        assert hf.stream_get("rsplit")["status"] == "aborted"


def test_completed_tool_calls_end_the_turn_with_them(daemon):
    def tool_turn():
        yield "Let me look. "
        yield {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "call_1", "function": {
            "name": "read_file", "arguments": '{"path": "a.txt"}'}}]}}]}
        yield {"choices": [{"delta": {"tool_calls": [{"index": 1, "id": "call_2", "function": {
            "name": "write_file", "arguments": '{"path": "b.txt", "content": "lo'}}]}}]}
        raise ConnectionResetError()

    with daemon.client("agent") as hf:
        hf.run_tool_begin("rtools", "call_1", "read_file", {"path": "a.txt"})
        rs = RecoveringStream(hf, "rtools", tool_turn(), reopen=lambda p: iter(()),
                              sleep=lambda s: None)
        evs = list(rs)
    assert [p["plan"] for p in rs.plans] == ["R2"]
    assert "tool_call_cancel" in [e.type for e in evs]
    assert rs.stop_reason == "tool_use"
    assert [(c["id"], c["execution"]) for c in rs.tool_calls] == [("call_1", "began")]
    assert rs.final_message["tool_calls"] == [
        {"id": "call_1", "name": "read_file", "arguments": {"path": "a.txt"}}]
    assert rs.final_message["content"] == "Let me look. "


def test_async_stream_with_an_async_provider(daemon):
    async def aprovider(fail_at=None, prefix=None):
        for w in provider(fail_at, ConnectionResetError("reset"), prefix):
            await asyncio.sleep(0)
            yield w

    async def main():
        async with hc.AsyncClient(daemon.socket, client="aio-agent") as hf:
            rs = RecoveringStream(hf, "raio", aprovider(20),
                                  reopen=lambda p: aprovider(prefix=p), sleep=lambda s: None)
            evs = [ev async for ev in rs]
            with pytest.raises(TypeError):
                iter(rs)
            return evs, rs

    evs, rs = asyncio.run(main())
    assert render(evs) == ANSWER == rs.final_message["content"]
    assert [p["cause"] for p in rs.plans] == ["connection_reset"]


MANY = "".join("m%04d " % i for i in range(2000))


def test_chunks_arriving_while_an_append_is_in_flight_share_the_next(daemon):
    """A provider faster than the disk: 2,000 chunks with no pause. Rendered exactly once, in
    order, equal to the stored message, in far fewer appends than chunks (sync and async)."""
    with daemon.client("fast") as hf:
        rs = RecoveringStream(hf, "rfast", provider(text=MANY), reopen=lambda p: None)
        shown = render(rs)
    assert shown == MANY == rs.final_message["content"]
    assert 0 < rs.appends < 2000, rs.appends

    async def aprovider():
        for w in provider(text=MANY):
            await asyncio.sleep(0)
            yield w

    async def main():
        async with hc.AsyncClient(daemon.socket, client="afast") as ahf:
            ars = RecoveringStream(ahf, "rafast", aprovider(), reopen=lambda p: None)
            return [ev async for ev in ars], ars

    evs, ars = asyncio.run(main())
    assert render(evs) == MANY == ars.final_message["content"]
    assert 0 < ars.appends < 2000, ars.appends
    print("2,000 chunks: %d appends (sync), %d appends (async); rendered once each"
          % (rs.appends, ars.appends))


def test_a_break_after_batched_chunks_keeps_them_all(daemon):
    """The chunks handed over before the provider broke are durable before the interruption:
    the reopen's prefix is every one of them."""
    calls = []

    def reopen(prefix):
        calls.append(prefix)
        return provider(prefix=prefix, text=MANY)

    with daemon.client("fastbreak") as hf:
        rs = RecoveringStream(hf, "rfastbreak", provider(1500, Http(503), text=MANY),
                              reopen=reopen, sleep=lambda s: None)
        shown = render(rs)
    assert calls == [MANY[:1500 * 6]], len(calls[0]) if calls else calls
    assert shown == MANY == rs.final_message["content"]


# ---------------------------------------------------------------------------------------------
# The example, as a user runs it


def example(daemon, *args, **kw):
    env = dict(daemon.env, HOLDFAST_SOCKET=daemon.socket, PYTHONDONTWRITEBYTECODE="1")
    return subprocess.Popen([sys.executable, str(EXAMPLE), "--jsonl", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def parse(lines):
    events, notes = {}, []
    for line in lines:
        if not line.strip():
            continue
        msg = json.loads(line)
        if "note" in msg:
            notes.append(msg["note"])
        else:
            events.setdefault(msg["run"], []).append(msg)
    return events, notes


def test_the_example_agent_loop(daemon):
    p = example(daemon, "--run-id", "ex")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    events, notes = parse(out.splitlines())
    finals = {n["run"]: n for n in notes if "run" in n}
    assert set(finals) == {"ex-explain", "ex-write-split", "ex-final"}
    with daemon.client("reader") as hf:
        for run_id, n in finals.items():
            shown = ""
            seqs = [e["seq"] for e in events[run_id]]
            assert len(seqs) == len(set(seqs)) and seqs == sorted(seqs), run_id
            for e in events[run_id]:
                shown = "" if e["type"] == "stream_reset" else shown + e["text"]
            stored = hf.stream_get(run_id, reveal=True)["final_message"]
            assert shown == n["rendered"] == stored["content"], run_id
            print("%-15s rendered %4d chars == stored final message; plans %s"
                  % (run_id, len(shown), [(x["plan"], x["cause"], x["wait_ms"])
                                          for x in n["plans"]]))
        explain = finals["ex-explain"]["plans"]
        assert [x["cause"] for x in explain] == ["rate_limited", "connection_reset"]
        assert explain[0]["wait_ms"] >= 1000, "Retry-After: 1 honoured"
        split = [n for n in notes if "split_tool_call" in n]
        assert split and split[0]["split_tool_call"] == "write_file"
        assert hf.stream_get("ex-write")["status"] == "aborted"
        cancels = [e for e in events["ex-write"] if e["type"] == "tool_call_cancel"]
        assert len(cancels) == 2, "each stalled write_file cancelled, no third attempt"
        ran = [n for n in notes if "tool" in n]
        assert [r["id"] for r in ran] == ["call_part0", "call_part1"]
        log = hf.run_get("ex-write-split")
        assert log["tool_calls"] == 2 and all(t["event"] in ("begin", "end")
                                              for t in log["tool_log"])


def test_an_agent_killed_mid_stream_is_resumed_by_a_new_process_without_a_duplicate(daemon):
    p = example(daemon, "--scenario", "long", "--run-id", "killed", "--slow", "0.01")
    seen, shown, last_seq = 0, "", 0
    for line in p.stdout:
        msg = json.loads(line)
        if msg.get("type") == "text":
            shown += msg["text"]
            last_seq = msg["seq"]
            seen += 1
            if seen == 120:
                break
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    p.stdout.close()
    p.stderr.close()
    assert p.returncode == -signal.SIGKILL
    # The new process renders what the old one had not shown yet, and the rest.
    q = example(daemon, "--resume", "killed", "--after-seq", str(last_seq))
    out, err = q.communicate(timeout=120)
    assert q.returncode == 0, err
    events, notes = parse(out.splitlines())
    rest = "".join(e["text"] for e in events["killed"])
    assert all(e["seq"] > last_seq for e in events["killed"])
    with daemon.client("reader") as hf:
        final = hf.stream_get("killed", reveal=True)["final_message"]["content"]
    assert shown + rest == final
    assert final == " ".join("word%03d" % i for i in range(300))
    print("kill -9 after %d chunks rendered (seq %d); the new process rendered %d more chars; "
          "old + new == final (%d chars), no duplicate" % (seen, last_seq, len(rest), len(final)))


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_appends_are_split_to_fit_the_frame_cap_and_other_runs_keep_their_producer(daemon,
                                                                                   flavour):
    """Eight 200 KB events handed over at once are 1.6 MB: one append would pass the daemon's
    1 MiB request line, which it answers by closing the connection (and every run held on it
    loses its producer). The producer splits them to fit; a second run on the same client
    keeps its producer."""
    big = [{"type": "text", "text": ("%d" % i) * 200_000} for i in range(8)]
    with daemon.client("producer") as p:
        assert p.hello.get("max_frame_bytes") == 1024 * 1024, p.hello
        other = hc.StreamProducer(p, "other-" + flavour)
        other.text("kept")
        if flavour == "sync":
            prod = hc.StreamProducer(p, "big-" + flavour)
            prod.append(big)
            assert prod.appends >= 2, prod.appends
            prod.commit({"role": "assistant"}, content_from_stream=True)
        else:
            from holdfast_client.streaming import _AsyncAppender  # RecoveringStream's

            async def main():
                async with hc.AsyncClient(daemon.socket, client="big") as ac:
                    began = await ac.stream_begin("big-" + flavour)
                    app = _AsyncAppender(ac, "big-" + flavour, began["stream_id"],
                                         began["next_seq"])
                    app.put(big)
                    await app.flush()
                    await ac.stream_commit("big-" + flavour, began["stream_id"],
                                           {"role": "assistant"}, content_from_stream=True)
                    return app.appends
            assert asyncio.run(main()) >= 2
        got = p.stream_get("big-" + flavour, reveal=True)
        assert got["final_message"]["content"] == "".join(e["text"] for e in big)
        st = p.stream_get("other-" + flavour)
        assert st["status"] == "streaming" and st.get("no_producer_since_ms") is None, st
        other.text(" still")
        other.commit({"role": "assistant"}, content_from_stream=True)
    print("%s: 1.6 MB handed over at once went in appends under the frame cap; the other run "
          "kept its producer" % flavour)
