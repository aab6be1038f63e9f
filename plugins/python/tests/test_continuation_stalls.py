"""Issue 35 through the real daemon: the text a user sees is exactly the model's (continuation
declared, never guessed), a provider that goes silent is caught (``stall_timeout``), each chunk
is rendered as soon as it is durable, and a run whose producer is killed ends for every viewer."""

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from harness import HERE, render
from holdfast_client.streaming import RecoveringStream, SplitToolCall, StreamStalled

CODE = "def f(x):\n    if x:\n        return 3\n    return 0\n" * 3


class Reset(ConnectionResetError):
    pass


def chunks(s, n=3):
    return [s[i:i + n] for i in range(0, len(s), n)]


def breaking(s, k):
    """A provider that sends ``s[:k]`` in chunks, then drops the connection."""
    def gen():
        yield from chunks(s[:k])
        raise Reset()
    return gen()


# ---------------------------------------------------------------------------------------------
# Continuation


@pytest.mark.parametrize("text", [CODE, "-" * 300, "ha " * 200, "1" + "0" * 100, "日本語🙂 " * 30])
def test_an_exact_continuation_is_the_models_text_at_every_break_point(make_daemon, text):
    d = make_daemon()
    # Every break point of the shorter texts; a stride over the longer ones (the Rust property
    # test covers every point of generated texts; this is the same rule through the socket).
    stride = 1 if len(text) <= 110 else 7
    points = list(range(1, len(text), stride))
    with d.client("agent") as hf:
        for i, k in enumerate(points):
            rs = RecoveringStream(hf, "exact-%d" % i, breaking(text, k),
                                  reopen=lambda prefix: iter(chunks(text[len(prefix):])),
                                  sleep=lambda s: None)
            shown = render(rs)
            assert shown == text == rs.final_message["content"], (k, shown)
            assert [p["continuation"] for p in rs.plans] == ["exact"]
    print("exact: %d break points of a %d-char text: shown == stored == the model's text"
          % (len(points), len(text)))


def test_a_restated_continuation_removes_the_restatement(daemon):
    text = "The quick brown fox jumps over the lazy dog. It was not amused at all."
    k = text.index("over") + 2  # broken inside a word
    with daemon.client("agent") as hf:
        def reopen(prefix):
            # The model restates the last words, then goes on.
            restate = prefix[prefix.rindex("jumps"):]
            return iter(chunks(restate + text[len(prefix):]))

        rs = RecoveringStream(hf, "restated", breaking(text, k), reopen=reopen,
                              continuation="restated", sleep=lambda s: None)
        shown = render(rs)
    assert shown == text == rs.final_message["content"], shown
    assert rs.plans[0]["continuation"] == "restated"


def test_continuation_and_stall_timeout_are_checked(daemon):
    with daemon.client("agent") as hf:
        with pytest.raises(ValueError, match="continuation"):
            RecoveringStream(hf, "x", iter(()), reopen=lambda p: iter(()), continuation="maybe")
        with pytest.raises(ValueError, match="stall_timeout"):
            RecoveringStream(hf, "x", iter(()), reopen=lambda p: iter(()), stall_timeout=0)
        # The daemon refuses an unknown continuation too.
        from holdfast_client import InvalidParams
        sid = hf.stream_begin("bad-cont")["stream_id"]
        hf.stream_append("bad-cont", sid, 1, [{"type": "text", "text": "x"}])
        with pytest.raises(InvalidParams):
            hf.stream_interrupt("bad-cont", sid, "connection_reset", continuation="maybe")


# ---------------------------------------------------------------------------------------------
# Stalls and render latency


def silent_after(items, gate):
    """Yields ``items``, then blocks until ``gate`` is set (a provider gone silent)."""
    def gen():
        yield from items
        gate.wait(60)
    return gen()


def test_a_silent_provider_mid_text_is_a_stalled_interruption_sync(daemon):
    gate = threading.Event()
    with daemon.client("agent") as hf:
        rs = RecoveringStream(hf, "stall-text", silent_after(["Hello, ", "wor"], gate),
                              reopen=lambda prefix: iter(["ld!"]), stall_timeout=0.5,
                              sleep=lambda s: None)
        t0 = time.monotonic()
        seen = []
        for ev in rs:
            seen.append((round(time.monotonic() - t0, 2), ev.type, ev.text))
        took = time.monotonic() - t0
    gate.set()
    assert rs.text == "Hello, world!" == rs.final_message["content"], seen
    assert [(p["cause"], p["plan"]) for p in rs.plans] == [("stalled", "R1")]
    # The text already stored was rendered before the stall was declared (the order of the
    # events, not a clock: the machine may be slow).
    kinds = [kind for _, kind, _ in seen]
    assert kinds.index("text") < kinds.index("interrupted"), seen
    first_text = next(t for t, kind, _ in seen if kind == "text")
    assert took < 20, took  # a hang guard, 40 times the stall timeout
    print("sync stall mid-text: rendered %r at %.2f s, stalled at 0.5 s, done at %.2f s"
          % ("Hello, ", first_text, took))


def test_a_tool_call_that_stalls_again_and_again_raises_split_sync(daemon):
    gate = threading.Event()
    partial = [{"type": "text", "text": "Writing it. "},
               {"type": "tool_call_delta", "id": "w1", "name": "write_file",
                "arguments_delta": '{"path": "big.txt", "content": "lorem'}]
    with daemon.client("agent") as hf:
        attempts = []

        def reopen(prefix):
            attempts.append(prefix)
            # The continuation streams the same huge call and stalls again.
            return silent_after([{"type": "tool_call_delta", "id": "w2", "name": "write_file",
                                  "arguments_delta": '{"path": "big.txt", "content": "ips'}],
                                gate)

        rs = RecoveringStream(hf, "stall-tool", silent_after(partial, gate), reopen=reopen,
                              stall_timeout=0.4, sleep=lambda s: None)
        shown = []
        with pytest.raises(SplitToolCall) as e:
            for ev in rs:
                shown.append(ev)
        state = hf.stream_get("stall-tool")
    gate.set()
    assert isinstance(e.value.__cause__, StreamStalled)
    assert e.value.tool == "write_file"
    assert [(p["cause"], p["plan"]) for p in rs.plans] == [("stalled", "R3"), ("stalled", "R3")]
    assert attempts == ["Writing it. "], "continued from the text, the call cancelled"
    assert state["status"] == "aborted", state
    # Never a tool call turned into a text reply: the only text is the model's own.
    assert render(shown) == "Writing it. "
    assert [ev.data["id"] for ev in shown if ev.type == "tool_call_cancel"] == ["w1", "w2"]


def test_a_chunk_is_rendered_while_the_provider_is_silent_sync(daemon):
    # The provider sends its next chunk only once the consumer has rendered the first: a
    # wrapper that renders a chunk when the next one comes would leave the gate to its
    # 30 s timeout. Ordering, not a clock (the machine may be slow); the latency is printed.
    rendered = threading.Event()
    released = []

    def provider():
        yield "first "
        released.append(rendered.wait(30))
        yield "second"

    with daemon.client("agent") as hf:
        t0 = time.monotonic()
        times = {}
        for ev in RecoveringStream(hf, "latency", provider(), reopen=lambda p: iter(())):
            if ev.type == "text":
                times[ev.text] = time.monotonic() - t0
                rendered.set()
    assert released == [True], "the first chunk was not rendered while the provider waited"
    assert times["first "] < times["second"], times
    print("sync render latency: first chunk rendered at %.3f s while the provider waited"
          % times["first "])


def test_async_stalls_and_render_latency(daemon):
    from holdfast_client.aio import AsyncClient

    rendered = {}

    async def silent(items, then):
        """``items``, then: silence ("forever"), "second" once the consumer rendered the first
        ("late": at most 30 s), or the end."""
        for x in items:
            yield x
        if then == "forever":
            await asyncio.sleep(3600)
        elif then == "late":
            try:
                await asyncio.wait_for(rendered["first"].wait(), 30)
                rendered["released"] = True
            except asyncio.TimeoutError:
                rendered["released"] = False
            yield "second"

    async def main():
        async with AsyncClient(daemon.socket, client="agent") as hf:
            # Render as soon as durable: the provider waits for the first chunk to be shown
            # (ordering, not a clock).
            rendered["first"] = asyncio.Event()
            t0 = time.monotonic()
            times = {}
            rs = RecoveringStream(hf, "a-latency", silent(["first "], "late"),
                                  reopen=lambda p: silent([], "end"))
            async for ev in rs:
                if ev.type == "text":
                    times[ev.text] = time.monotonic() - t0
                    rendered["first"].set()
            assert rendered["released"] is True, "not rendered while the provider waited"
            assert times["first "] < times["second"], times
            # Stall mid-text.
            rs = RecoveringStream(hf, "a-stall", silent(["Hello, ", "wor"], "forever"),
                                  reopen=lambda p: silent(["ld!"], "end"), stall_timeout=0.5,
                                  sleep=lambda s: None)
            shown = ""
            async for ev in rs:
                shown += ev.text
            assert [(p["cause"], p["plan"]) for p in rs.plans] == [("stalled", "R1")]
            assert shown == "Hello, world!" == rs.final_message["content"], rs.final_message
            # Stall mid tool-call, again and again.
            call = {"type": "tool_call_delta", "id": "w", "name": "write_file",
                    "arguments_delta": '{"content": "x'}
            n = {"i": 0}

            def reopen(prefix):
                n["i"] += 1
                return silent([dict(call, id="w%d" % n["i"])], "forever")

            rs = RecoveringStream(hf, "a-tool", silent([{"type": "text", "text": "On it. "},
                                                        call], "forever"),
                                  reopen=reopen, stall_timeout=0.4, sleep=lambda s: None)
            with pytest.raises(SplitToolCall) as e:
                async for _ in rs:
                    pass
            assert isinstance(e.value.__cause__, StreamStalled)
            assert [p["cause"] for p in rs.plans] == ["stalled", "stalled"]
            return times

    times = asyncio.run(main())
    print("async: first chunk rendered at %.3f s; stalls mid-text and mid tool-call planned"
          % times["first "])


# ---------------------------------------------------------------------------------------------
# A producer killed: every viewer ends


PRODUCER = r"""
import sys, time
from holdfast_client import Client
hf = Client(socket_path=sys.argv[1], client="doomed")
sid = hf.stream_begin("doomed")["stream_id"]
hf.stream_append("doomed", sid, 1, [{"type": "text", "text": "partial answer"}])
print("ready", flush=True)
time.sleep(3600)
"""


def test_a_sigkilled_producer_is_interrupted_then_finished(make_daemon):
    d = make_daemon(config="[streams]\norphan_timeout_s = 2\n")
    env = dict(os.environ, PYTHONPATH=str(HERE.parent))
    p = subprocess.Popen([sys.executable, "-c", PRODUCER, str(d.socket)], env=env,
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        with d.client("viewer") as hf:
            sub = hf.subscribe_stream("doomed", 0)
            first = sub.next(10)
            assert first["event"] == {"type": "text", "text": "partial answer"}
            t0 = time.monotonic()
            os.kill(p.pid, signal.SIGKILL)
            events = []
            lost_at = None
            for ev in sub:
                events.append((time.monotonic() - t0, ev["event"]))
                if lost_at is None and ev["event"].get("cause") == "producer_lost":
                    # Announced while the run is still there, unheld since the loss.
                    live = hf.stream_get("doomed")
                    assert live["status"] == "interrupted", live
                    lost_at = live["no_producer_since_ms"]
            state = hf.stream_get("doomed", reveal=True)
    finally:
        p.kill()
        p.wait()
    kinds = [(e["type"], e.get("cause") or e.get("status")) for _, e in events]
    assert kinds == [("interrupted", "producer_lost"), ("finish", "abandoned")], events
    # By the daemon's own clock: the loss was recorded when the producer died, and the end
    # came the timeout after it (the client's clock only for the figures printed).
    assert state["at_ms"] - lost_at >= 2000, (state["at_ms"], lost_at)
    assert state["status"] == "abandoned"
    assert state["partial_message"]["content"] == "partial answer"
    print("SIGKILLed producer: interrupted after %.2f s, finish (abandoned) after %.2f s"
          % (events[0][0], events[1][0]))


def test_a_restated_continuation_that_only_restates_commits_sync_and_async(daemon):
    """Regression (attack round, issue 35): the daemon holds a restated continuation's text
    while it may still be a restatement; the wrapper commits without waiting for it to be shown
    (it is decided by the commit) instead of timing out."""
    from holdfast_client.aio import AsyncClient

    def first():
        yield "The answer is 42."
        raise Reset()

    with daemon.client("agent") as hf:
        t0 = time.monotonic()
        rs = RecoveringStream(hf, "only-restates", first(), reopen=lambda p: iter(["is 42."]),
                              continuation="restated", sleep=lambda s: None)
        assert render(rs) == "The answer is 42." == rs.final_message["content"]
        assert time.monotonic() - t0 < 10

    async def main():
        async with AsyncClient(daemon.socket, client="agent") as hf:
            async def afirst():
                yield "The answer is 42."
                raise Reset()

            rs = RecoveringStream(hf, "only-restates-a", afirst(),
                                  reopen=lambda p: iter(["is 42."]), continuation="restated",
                                  sleep=lambda s: None)
            shown = ""
            async for ev in rs:
                shown += ev.text
            return shown, rs.final_message["content"]

    t0 = time.monotonic()
    assert asyncio.run(main()) == ("The answer is 42.", "The answer is 42.")
    assert time.monotonic() - t0 < 10


def test_async_stalls_of_sync_providers_and_blocking_reopens(daemon):
    """Regression (attack round, issue 35): under AsyncClient, each stalled sync provider used
    to hold one of the loop's few shared executor threads, until healthy runs starved and
    stalled; and a sync reopen that blocked was not covered by stall_timeout."""
    from holdfast_client.aio import AsyncClient
    forever = threading.Event()

    def hanging(text):
        yield text
        forever.wait()
        yield "LATE"

    def healthy(text):
        for w in text.split(" "):
            yield w + " "

    async def main():
        async with AsyncClient(daemon.socket, client="agent") as hf:
            # More hung providers than the default executor has threads (cpu + 4).
            for i in range((os.cpu_count() or 1) + 6):
                n = [0]

                def reopen(prefix, n=n):
                    n[0] += 1
                    return hanging("again ") if n[0] < 2 else healthy("good")

                rs = RecoveringStream(hf, "hung-%d" % i, hanging("hello "), reopen=reopen,
                                      stall_timeout=0.3, sleep=lambda s: None)
                shown = ""
                async for ev in rs:
                    shown += ev.text
                assert "LATE" not in shown
                assert [p["cause"] for p in rs.plans] == ["stalled", "stalled"], rs.plans
            rs = RecoveringStream(hf, "healthy", healthy("a b c"), reopen=lambda p: healthy("x"),
                                  stall_timeout=0.3)
            shown = ""
            async for ev in rs:
                shown += ev.text
            assert shown == "a b c " and rs.plans == []
            # A sync reopen that blocks 2 s is a stall at 0.3 s; its late stream is dropped.
            def slow_reopen(prefix):
                if slow_reopen.calls == 0:
                    slow_reopen.calls += 1
                    time.sleep(2)
                    return iter(["LATE-SYNC"])
                return iter(["d!"])
            slow_reopen.calls = 0

            def broken():
                yield "Hello wor"
                raise Reset()

            rs = RecoveringStream(hf, "slow-reopen", broken(), reopen=slow_reopen,
                                  stall_timeout=0.3, sleep=lambda s: None)
            shown = ""
            async for ev in rs:
                shown += ev.text
            assert shown == "Hello word!", shown
            assert [p["cause"] for p in rs.plans] == ["connection_reset", "stalled"]
        forever.set()

    asyncio.run(main())


class Http429(Exception):
    status_code = 429

    def __init__(self):
        super().__init__("rate limited")
        self.headers = {"retry-after": "2"}


def test_second_attack_round_regressions_sync(daemon):
    """Regression (second attack round): the plan's `interrupted` is shown before its wait;
    a stream opened after its stall was declared is closed; a stream whose subscription is
    refused (the connection's cap) ends the run it began instead of leaving it held."""
    from holdfast_client import Busy

    seen = []
    waits = []

    def first():
        yield "Hello "
        raise Http429()

    with daemon.client("agent") as hf:
        rs = RecoveringStream(hf, "wait-shown", first(), reopen=lambda p: iter(["world"]),
                              sleep=lambda s: waits.append((s, [e.type for e in seen])))
        for ev in rs:
            seen.append(ev)
        assert rs.text == "Hello world"
        assert waits and waits[0][0] >= 2 and "interrupted" in waits[0][1], waits

        closed = []

        class Late:
            def __init__(self, n):
                self.n = n

            def __iter__(self):
                return iter(["late %d" % self.n])

            def close(self):
                closed.append(self.n)

        calls = []

        def reopen(prefix):
            calls.append(prefix)
            if len(calls) == 1:
                time.sleep(1.0)  # the request hangs past the stall timeout
                return Late(1)
            return Late(2)

        def broken():
            yield "Hi "
            raise Reset()

        rs = RecoveringStream(hf, "late-open", broken(), reopen=reopen, stall_timeout=0.3,
                              sleep=lambda s: None)
        assert render(rs) == "Hi late 2"
        deadline = time.monotonic() + 5
        while 1 not in closed and time.monotonic() < deadline:
            time.sleep(0.05)
        assert 1 in closed, "the stream opened after the stall was never closed"

        hf.stream_begin("live")  # a live run: its subscriptions stay open
        subs = [hf.subscribe_stream("live", 0) for _ in range(16)]
        with pytest.raises(Busy):
            list(RecoveringStream(hf, "one-too-many", iter(["x"]), reopen=lambda p: iter(())))
        state = hf.stream_get("one-too-many")
        assert state["status"] == "aborted" and "subscribe" in state["reason"], state
        # A resume whose subscription is refused takes nothing over.
        sid = hf.stream_begin("resume-busy")["stream_id"]
        hf.stream_append("resume-busy", sid, 1, [{"type": "text", "text": "x"}])
        with pytest.raises(Busy):
            list(RecoveringStream(hf, "resume-busy", resume=True, reopen=lambda p: iter(())))
        assert hf.stream_get("resume-busy")["epoch"] == 1, "taken over without a subscription"
        for sub in subs:
            sub.close()


def test_third_attack_round_regressions(daemon):
    """Regression (third attack round): the async wrapper stops (Conflict) when its run is
    ended under it instead of spinning; an unreadable Retry-After does not stop a recovery;
    the async stall clock runs from the request; `async for` over a sync Client is refused
    before anything begins; a sync provider's blocking close() does not stop the loop."""
    from holdfast_client import Conflict
    from holdfast_client.aio import AsyncClient
    gate = threading.Event()

    with daemon.client("other") as other:
        for ra in ("soon", "", "1.5"):
            def limited(ra=ra):
                yield "x "
                e = Http429()
                e.headers = {"retry-after": ra}
                raise e

            rs = RecoveringStream(other, "ra-%s" % (ra or "empty").replace(".", "_"),
                                  limited(), reopen=lambda p: iter(["y"]), sleep=lambda s: None)
            assert render(rs) == "x y", ra

        with pytest.raises(TypeError):
            RecoveringStream(other, "misuse", iter(["x"]), reopen=lambda p: iter(())).__aiter__()
        with pytest.raises(Exception):
            other.stream_get("misuse")  # nothing was begun

        async def main():
            async with AsyncClient(daemon.socket, client="agent") as hf:
                async def silent():
                    yield "first "
                    await asyncio.sleep(3600)

                rs = RecoveringStream(hf, "ended-under", silent(),
                                      reopen=lambda p: silent())
                t0 = time.monotonic()

                async def consume():
                    async for ev in rs:
                        if ev.type == "text":
                            sid = rs.stream_id
                            # Someone else takes the run over and aborts it.
                            r = other.stream_begin("ended-under", takeover=True)
                            other.stream_abort("ended-under", r["stream_id"], "elsewhere")
                            assert sid != r["stream_id"]

                with pytest.raises(Conflict):
                    await asyncio.wait_for(consume(), 10)
                assert time.monotonic() - t0 < 10

                # The stall clock runs from the request: slow to open + slow first chunk.
                async def slow_first():
                    await asyncio.sleep(0.4)
                    yield "late"

                async def slow_open():
                    await asyncio.sleep(0.4)
                    return slow_first()

                n = {"i": 0}

                def reopen(prefix):
                    n["i"] += 1
                    return iter(["ok"])

                rs = RecoveringStream(hf, "clock-a", slow_open, reopen=reopen,
                                      stall_timeout=0.6, sleep=lambda s: None)
                shown = ""
                async for ev in rs:
                    shown += ev.text
                assert [p["cause"] for p in rs.plans] == ["stalled"], rs.plans
                assert shown == "ok"

                # A sync provider whose close() blocks: the loop goes on meanwhile.
                class Blocking:
                    def __iter__(self):
                        yield "a "
                        gate.wait(30)

                    def close(self):
                        time.sleep(3)

                beats = []

                async def heartbeat():
                    for _ in range(30):
                        beats.append(time.monotonic())
                        await asyncio.sleep(0.05)

                hb = asyncio.ensure_future(heartbeat())
                rs = RecoveringStream(hf, "blocking-close", Blocking(),
                                      reopen=lambda p: iter(["b"]), stall_timeout=0.3,
                                      sleep=lambda s: None)
                async for _ in rs:
                    pass
                await hb
                gaps = [b - a for a, b in zip(beats, beats[1:])]
                # Closed on the loop, the 3 s close would show as a gap of 3 s or more.
                assert max(gaps) < 2.5, max(gaps)

        asyncio.run(main())
    gate.set()


def test_fourth_attack_round_regressions_sync(daemon):
    """Regression (fourth attack round): the sync wrapper stops with Conflict (it deadlocked)
    when its run is ended under it; a stalled sync generator is closed (its `finally` runs)
    by the thread that runs it once it wakes, not left to the garbage collector."""
    from holdfast_client import Conflict
    gate = threading.Event()
    with daemon.client("agent") as hf, daemon.client("other") as other:
        def silent():
            yield "first "
            gate.wait(30)

        rs = RecoveringStream(hf, "ended-under-sync", silent(), reopen=lambda p: iter(()))
        t0 = time.monotonic()
        with pytest.raises(Conflict):
            for ev in rs:
                if ev.type == "text":
                    r = other.stream_begin("ended-under-sync", takeover=True)
                    other.stream_abort("ended-under-sync", r["stream_id"], "elsewhere")
        assert time.monotonic() - t0 < 10
        gate.set()

        finished = []
        wake = threading.Event()

        def stalls():
            try:
                yield "a "
                wake.wait(30)
                yield "late"
            finally:
                finished.append("closed")

        rs = RecoveringStream(hf, "gen-closed", stalls(), reopen=lambda p: iter(["b"]),
                              stall_timeout=0.3, sleep=lambda s: None)
        assert render(rs) == "a b"
        wake.set()  # the provider wakes after it was let go
        deadline = time.monotonic() + 5
        while not finished and time.monotonic() < deadline:
            time.sleep(0.05)
        assert finished == ["closed"], "the abandoned generator was not closed"
        assert rs is not None  # still referenced: closing did not wait for the collector
