"""AsyncClient and subscriptions with queues of their own, against the real daemon."""

import asyncio
import threading
import time

import pytest

from harness import SECRET, assert_no_secret, hc


def run(coro):
    return asyncio.run(coro)


def expected(n):
    return "".join("abcdefghij"[i % 10] for i in range(n))


def test_async_client_helpers_errors_and_pipelining(daemon):
    async def main():
        async with hc.AsyncClient(daemon.socket, client="aio") as hf:
            assert hf.hello["server"] == "holdfast"
            assert (await hf.set_value("k1", SECRET)).generation == 1
            rec = await hf.get("k1")
            assert rec.value() == SECRET and rec.generation == 1
            assert SECRET not in repr(rec)
            assert await hf.exists("k1") and not await hf.exists("nope")
            assert [c["id"] for c in await hf.list()] == ["k1"]
            with pytest.raises(hc.NotFound) as e:
                await hf.get("nope")
            assert e.value.kind == "not_found"
            with pytest.raises(hc.Conflict) as e:
                await hf.set_value("k1", "x", if_generation=7)
            assert e.value.data["generation"] == 1
            with pytest.raises(hc.InvalidParams) as e:
                await hf.set({"id": "bad", "keys": {"api_key": {"value": SECRET},
                                                    "other": {"value": 42}}})
            assert_no_secret(e.value)
            lease = await hf.refresh_lease("k1", 5000)
            assert lease.granted and await hf.release_lease("k1")
            # 200 requests in flight at once on one connection, each answered to its caller.
            for i in range(20):
                await hf.set_value("p%d" % i, "v%d" % i)
            got = await asyncio.gather(*(hf.get("p%d" % (i % 20)) for i in range(200)))
            assert [r.value() for r in got] == ["v%d" % (i % 20) for i in range(200)]
            assert await hf.delete("k1") and not await hf.delete("k1")
            st = await hf.status()
            assert st["stores"][0]["name"] == "default"
        assert hf.closed
        with pytest.raises(hc.ConnectionClosed):
            await hf.get("p1")
        print("aio: helpers, 3 error kinds, 200 pipelined gets on one connection")

    run(main())


def test_async_subscription_sees_every_event_once_in_order(daemon):
    n = 300

    async def main():
        async with hc.AsyncClient(daemon.socket, client="aio") as hf:
            with daemon.client("producer") as p:
                prod = hc.StreamProducer(p, "r1")
                sub = await hf.subscribe_stream("r1")

                def produce():
                    for i in range(n):
                        prod.text("abcdefghij"[i % 10])
                    prod.commit({"role": "assistant"}, content_from_stream=True)

                t = threading.Thread(target=produce)
                t.start()
                seqs, text = [], ""
                async for ev in sub:
                    seqs.append(ev["seq"])
                    if ev["event"]["type"] == "text":
                        text += ev["event"]["text"]
                t.join()
                return seqs, text

    seqs, text = run(main())
    assert seqs == list(range(1, n + 2)), "each event once, in order, then finish"
    assert text == expected(n)
    print("aio subscription: %d events + finish, each once and in order" % n)


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_stream_subscription_read_late_drops_nothing(daemon, flavour):
    """A subscriber that reads nothing while 400 events arrive and the run commits, with a
    max_queued of 10 (which applies to credential watches only): every event arrives once."""
    n = 400
    run_id = "lag-" + flavour
    with daemon.client("producer") as p:
        prod = hc.StreamProducer(p, run_id)
        prod.text("a")  # the run exists

        def produce_rest():
            for i in range(1, n):
                prod.text("abcdefghij"[i % 10])
            prod.commit({"role": "assistant"}, content_from_stream=True)

        if flavour == "sync":
            with daemon.client("slow") as hf:
                sub = hf.subscribe_stream(run_id, max_queued=10)
                produce_rest()
                evs = list(sub)
        else:
            async def main():
                async with hc.AsyncClient(daemon.socket, client="slow") as hf:
                    sub = await hf.subscribe_stream(run_id, max_queued=10)
                    await asyncio.get_running_loop().run_in_executor(None, produce_rest)
                    return [ev async for ev in sub]

            evs = run(main())
    assert [e["seq"] for e in evs] == list(range(1, n + 2))
    assert "".join(e["event"].get("text", "") for e in evs) == expected(n)
    print("%s: %d events read only after the commit, none dropped or repeated"
          % (flavour, len(evs)))


def test_a_credential_watch_read_late_says_resync(daemon):
    with daemon.client("watcher") as w, daemon.client("writer") as wr:
        cw = w.subscribe_cred(max_queued=5)
        for i in range(20):
            wr.set_value("r%d" % i, "v")
        # Every event has reached the client before the first is read (delivery is async).
        deadline = time.monotonic() + 10
        while cw._q.dropped + len(cw._q.items) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        evs = []
        while True:
            ev = cw.next(1)
            if ev is None:
                break
            evs.append(ev)
        assert evs[0]["type"] == "resync" and evs[0]["missed"] == 15, evs[0]
        assert [e["id"] for e in evs[1:]] == ["r%d" % i for i in range(15, 20)]
        cw.close()


def test_close_unsubscribes_exactly_and_frees_the_slot(daemon):
    with daemon.client("producer") as p, daemon.client("watcher") as w:
        prod = hc.StreamProducer(p, "u1")
        prod.text("a")
        # 16 is the per-connection cap: open and close 40 in turn, all fine.
        for _ in range(40):
            sub = w.subscribe_stream("u1")
            assert sub.next(5)["event"]["text"] == "a"
            sub.close()
        sub = w.subscribe_stream("u1")
        assert sub.next(5)["seq"] == 1
        sub.close()
        prod.text("b")
        assert sub.next(0.3) is None, "an event after close()"
        # That holds by the closed queue alone; what can go wrong is routing: events of the
        # closed subscription must not reach another queue of this client, and a new one gets
        # its own events once each.
        assert w.next_event(0.2) is None, "a closed subscription's event reached events()"
        again = w.subscribe_stream("u1")
        got = [(ev["seq"], ev["event"]["text"]) for ev in (again.next(5), again.next(5))]
        assert got == [(1, "a"), (2, "b")], got
        assert again.next(0.2) is None
        again.close()
        # Credential watches too, and the legacy events() queue stays empty of them.
        cw = w.subscribe_cred()
        with daemon.client("writer") as wr:
            wr.set_value("c1", SECRET)
        ev = cw.next(5)
        assert ev["type"] == "cred.changed" and ev["id"] == "c1"
        cw.close()
        assert w.next_event(0.2) is None
        prod.commit({"role": "assistant"}, content_from_stream=True)
    print("unsubscribe: 40 subscribe/close cycles past the cap of 16, nothing after close")


def test_connection_loss_ends_calls_and_subscriptions(make_daemon):
    """Without reconnecting (``reconnect=False``; with it, test_reconnect.py)."""
    d = make_daemon()
    hf = d.client("doomed", reconnect=False)
    with d.client("producer") as p:
        prod = hc.StreamProducer(p, "c1")
        prod.text("a")
        sub = hf.subscribe_stream("c1")
        assert sub.next(5)["seq"] == 1
    assert d.stop() == 0
    # The producer's connection closed before the daemon stopped: its loss (interrupted,
    # producer_lost) may be queued ahead of the end.
    with pytest.raises(hc.ConnectionClosed):
        for _ in range(2):
            ev = sub.next(5)
            assert ev is not None and ev["event"]["cause"] == "producer_lost", ev
    with pytest.raises(hc.ConnectionClosed):
        hf.get("x")
    hf.close()

    async def main():
        d2 = make_daemon()
        ac = await hc.AsyncClient.connect(d2.socket, client="doomed", reconnect=False)
        with d2.client("producer") as p:
            prod = hc.StreamProducer(p, "c2")
            prod.text("a")
            sub = await ac.subscribe_stream("c2")
            assert (await sub.next(5))["seq"] == 1
        assert d2.stop() == 0
        with pytest.raises(hc.ConnectionClosed):
            for _ in range(2):
                ev = await sub.next(5)
                assert ev is not None and ev["event"]["cause"] == "producer_lost", ev
        with pytest.raises(hc.ConnectionClosed):
            await ac.get("x")
        await ac.close()

    run(main())
