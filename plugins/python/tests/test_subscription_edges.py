"""Edges of subscriptions found by attacking the client: a subscription from at or past a
run's end, a finish that says events were skipped, a subscription that cannot be re-made
after a reconnect when it feeds events()."""

import asyncio
import json

import pytest

from harness import Proxy, hc


def _ended_run(c, run_id):
    """A committed run of two text events; returns its finish seq."""
    b = c.stream_begin(run_id)
    c.stream_append(run_id, b["stream_id"], 1, [{"type": "text", "text": "a"},
                                                  {"type": "text", "text": "b"}])
    return c.stream_commit(run_id, b["stream_id"], {"role": "assistant", "content": "ab"})[
        "finish_seq"]


def _collect(sub, timeout=30):
    """A sync subscription's events until it ends (or none comes for ``timeout`` seconds:
    then ``finished`` is false and the caller's assertion says so)."""
    out = []
    while True:
        ev = sub.next(timeout)
        if ev is None:
            assert sub.finished, "no end within %ss after %s" % (timeout, out)
            return out
        out.append(ev)


def _types(evs):
    return [(ev["seq"], ev["event"]["type"]) for ev in evs]


def test_a_subscription_from_at_or_past_an_ended_runs_finish_ends_with_that_finish(daemon):
    with daemon.client("edges") as c:
        fin = _ended_run(c, "done")
        assert fin == 3
        for after in (fin - 1, fin, fin + 5):
            sub = c.subscribe_stream("done", after_seq=after)
            got = _collect(sub)
            assert _types(got) == [(fin, "finish")], (after, got)
            assert sub.last_seq == max(after, fin), "last_seq never goes back"
            sub.close()
        # The same through events() (stream_subscribe), the subscription ends there too.
        sid = c.stream_subscribe("done", after_seq=fin + 5)
        ev = c.next_event(30)
        assert ev is not None and ev["subscription"] == sid and ev["seq"] == fin
        assert ev["event"]["type"] == "finish"
        assert c.unsubscribe(sid) is False, "the finish ended it"

    async def main():
        async with hc.AsyncClient(daemon.socket, client="edges-async") as a:
            for after in (fin, fin + 5):
                sub = await a.subscribe_stream("done", after_seq=after)
                got = [ev async for ev in sub]  # ends: no timeout needed
                assert _types(got) == [(fin, "finish")], (after, got)
    asyncio.run(asyncio.wait_for(main(), 60))


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_subscription_past_a_live_runs_end_gets_nothing_below_and_then_the_finish(
        daemon, flavour):
    producer = daemon.client("producer")
    b = producer.stream_begin("live")
    producer.stream_append("live", b["stream_id"], 1,
                           [{"type": "text", "text": x} for x in "abc"])  # seqs 1..3

    def rest():
        producer.stream_append("live", b["stream_id"], 4, [{"type": "text", "text": "d"}])
        return producer.stream_commit("live", b["stream_id"], {"role": "assistant"},
                                      content_from_stream=True)["finish_seq"]

    if flavour == "sync":
        with daemon.client("sub") as c:
            past = c.subscribe_stream("live", after_seq=10)
            mid = c.subscribe_stream("live", after_seq=2)
            assert _types([mid.next(30)]) == [(3, "text")]
            fin = rest()
            got_past = _collect(past)  # ends by itself once the run's finish comes
            got_mid = _collect(mid)
    else:
        async def main():
            async with hc.AsyncClient(daemon.socket, client="sub") as a:
                past = await a.subscribe_stream("live", after_seq=10)
                mid = await a.subscribe_stream("live", after_seq=2)
                assert _types([await mid.next(30)]) == [(3, "text")]
                fin = await asyncio.get_running_loop().run_in_executor(None, rest)
                return fin, [ev async for ev in past], [ev async for ev in mid]
        fin, got_past, got_mid = asyncio.run(asyncio.wait_for(main(), 60))
    producer.close()
    assert fin == 5
    assert _types(got_past) == [(5, "finish")], got_past
    assert _types(got_mid) == [(4, "text"), (5, "finish")], got_mid


def test_a_finish_says_whether_events_before_it_were_skipped(daemon):
    """An ended run's events are gone from the daemon: a subscription from below its end gets
    the finish alone. The finish (and the subscription) says so: ``complete`` is false."""
    with daemon.client("gaps") as c:
        fin = _ended_run(c, "done")
        for after, complete in ((0, False), (1, False), (fin - 1, True), (fin, True),
                                (fin + 5, True)):
            sub = c.subscribe_stream("done", after_seq=after)
            assert sub.complete is None
            got = _collect(sub)
            assert _types(got) == [(fin, "finish")], got
            assert got[0]["complete"] is complete and sub.complete is complete, (after, got)
        # A run watched from its start: every event, and a complete finish.
        producer = daemon.client("producer")
        b = producer.stream_begin("whole")
        sub = c.subscribe_stream("whole")
        producer.stream_append("whole", b["stream_id"], 1, [{"type": "text", "text": "x"}])
        producer.stream_commit("whole", b["stream_id"], {"role": "assistant"},
                               content_from_stream=True)
        got = _collect(sub)
        assert _types(got) == [(1, "text"), (2, "finish")]
        assert got[-1]["complete"] is True and sub.complete is True
        producer.close()

    async def main():
        async with hc.AsyncClient(daemon.socket, client="gaps-async") as a:
            sub = await a.subscribe_stream("done")
            got = [ev async for ev in sub]
            assert _types(got) == [(fin, "finish")] and got[0]["complete"] is False
            assert sub.complete is False
    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_subscriber_away_while_the_run_ended_gets_an_incomplete_finish(daemon):
    """The subscriber's connection holds events 3.. (a proxy) while the run ends; the
    connection is then lost, and the subscription re-made from seq 2 gets the finish alone:
    it says the events in between were not delivered."""
    proxy = Proxy(daemon.socket)
    try:
        sub_client = hc.Client(proxy.path, client="away", reconnect_attempts=30)
        producer = daemon.client("producer")
        b = producer.stream_begin("away")
        producer.stream_append("away", b["stream_id"], 1,
                               [{"type": "text", "text": x} for x in "ab"])
        sub = sub_client.subscribe_stream("away")
        assert _types([sub.next(30), sub.next(30)]) == [(1, "text"), (2, "text")]
        proxy.hold = lambda idx, msg: idx == 0 and msg.get("method") == "event"
        producer.stream_append("away", b["stream_id"], 3,
                               [{"type": "text", "text": x} for x in "cd"])
        fin = producer.stream_commit("away", b["stream_id"], {"role": "assistant"},
                                     content_from_stream=True)["finish_seq"]
        proxy.wait(lambda: any(json_seq(line) == fin for line in proxy.conns[0]["held"]),
                   "the finish (held)")
        proxy.hold = None
        proxy.cut()  # the held events die with the connection
        got = _collect(sub)
        assert _types(got) == [(fin, "finish")], got
        assert got[0]["complete"] is False and sub.complete is False
        assert sub_client.reconnects == 1
        producer.close()
        sub_client.close()
    finally:
        proxy.close()


def json_seq(line):
    return (json.loads(line).get("params") or {}).get("seq")
