"""Both clients across a lost connection (a daemon restart, or a cut) and cancelled or
timed-out calls: nothing leaks on the daemon or in the client, no event twice or skipped."""

import asyncio
import gc
import threading
import time

import pytest

from harness import SECRET, Proxy, hc

N1, N2 = 40, 40  # events before and after the restart


def deadline_loop(what, check, timeout=30.0, step=0.05):
    """Poll ``check()`` until it returns a true value (returned); fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, "timed out waiting for " + what
        time.sleep(step)


def letter(i):
    return "abcdefghij"[i % 10]


def open_16(client_subscribe, close):
    """Whether 16 subscriptions (the daemon's cap per connection) can be open at once on the
    connection: all are closed again either way."""
    subs = []
    try:
        for _ in range(16):
            subs.append(client_subscribe())
        return True
    except hc.Busy:
        return False
    finally:
        for s in subs:
            close(s)


# ---------------------------------------------------------------------------------------------
# A daemon restart mid-stream


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_subscriber_survives_a_daemon_restart_mid_stream_without_duplicates_or_gaps(
    make_daemon, flavour
):
    d = make_daemon()
    run_id = "restart-" + flavour
    producer = d.client("producer", reconnect_attempts=30)
    # StreamProducer goes on by itself: an append the restart cut off is sent again.
    prod = hc.StreamProducer(producer, run_id)
    for seq in range(1, N1 + 1):
        prod.text(letter(seq))

    def produce_after_restart():
        for seq in range(N1 + 1, N1 + N2 + 1):
            prod.text(letter(seq))
        prod.commit({"role": "assistant"}, content_from_stream=True)

    if flavour == "sync":
        sub_client = d.client("subscriber", reconnect_attempts=30)
        sub = sub_client.subscribe_stream(run_id)
        got = [sub.next(30) for _ in range(N1 // 2)]  # half taken, the rest queued or not yet
        d.restart()
        t = threading.Thread(target=produce_after_restart)
        t.start()
        got += list(sub)
        t.join()
        reconnects = sub_client.reconnects
        assert not sub_client.closed
        sub_client.close()
    else:
        async def main():
            async with hc.AsyncClient(d.socket, client="subscriber",
                                      reconnect_attempts=30) as ac:
                sub = await ac.subscribe_stream(run_id)
                evs = [await sub.next(30) for _ in range(N1 // 2)]
                await asyncio.get_running_loop().run_in_executor(None, d.restart)
                t = threading.Thread(target=produce_after_restart)
                t.start()
                evs += [ev async for ev in sub]
                t.join()
                assert not ac.closed
                return evs, ac.reconnects

        got, reconnects = asyncio.run(main())
    producer.close()
    assert reconnects == 1 and producer.reconnects == 1
    assert None not in got
    seqs = [ev["seq"] for ev in got]
    assert seqs == list(range(1, N1 + N2 + 2)), "each event once, in order, then finish: %s" \
        % seqs
    assert got[-1]["event"]["type"] == "finish"
    text = "".join(ev["event"].get("text", "") for ev in got)
    assert text == "".join(letter(i) for i in range(1, N1 + N2 + 1))
    print("%s: %d events across a daemon restart, each once and in order"
          % (flavour, len(got)))


def test_an_append_in_flight_across_a_daemon_restart_is_sent_again_and_taken_once(make_daemon):
    """The daemon took an append but restarted before its answer reached the producer (a
    proxy holds the answer): StreamProducer sends it again on the new connection, the daemon
    acknowledges it as a replay, and the run's text has it once."""
    d = make_daemon()
    proxy = Proxy(d.socket)
    try:
        producer = hc.Client(proxy.path, client="producer", reconnect_attempts=30)
        prod = hc.StreamProducer(producer, "inflight")
        prod.text("a")
        proxy.hold = lambda idx, msg: (idx == 0 and isinstance(msg.get("result"), dict)
                                       and "acked_seq" in msg["result"])
        acked = []
        t = threading.Thread(target=lambda: acked.append(prod.text("b")))
        t.start()
        proxy.wait(lambda: proxy.conns[0]["held"], "the append's answer (held)")
        proxy.hold = None  # the held answer dies with the old connection
        d.restart()
        t.join(60)
        assert not t.is_alive() and acked == [2], acked
        prod.text("c")
        prod.commit({"role": "assistant"}, content_from_stream=True)
        assert producer.reconnects == 1
        producer.close()
        with d.client("reader") as c:
            got = c.stream_get("inflight", reveal=True)
        assert got["status"] == "committed" and got["final_message"]["content"] == "abc", got
    finally:
        proxy.close()


def test_calls_after_a_restart_go_on_the_new_connection_and_watches_say_resync(make_daemon):
    d = make_daemon()
    with d.client("writer") as w:
        w.set_value("k1", SECRET)
    c = d.client("survivor")
    watch = c.subscribe_cred()
    legacy = c.watch()
    d.restart()
    # A call made while the client reconnects waits for the new connection.
    assert c.get("k1").value() == SECRET
    assert c.reconnects == 1 and c.hello["server"] == "holdfast"
    ev = watch.next(30)
    assert ev["type"] == "resync" and ev["missed"] is None and ev["subscription"] == watch.id
    ev = c.next_event(30)
    assert ev["type"] == "resync" and ev["subscription"] == legacy
    with d.client("writer") as w:
        w.set_value("k2", "v")
    ev = watch.next(30)
    assert (ev["type"], ev["id"], ev["subscription"]) == ("cred.changed", "k2", watch.id)
    ev = c.next_event(30)
    assert (ev["type"], ev["id"], ev["subscription"]) == ("cred.changed", "k2", legacy)
    # Ids are the client's: unsubscribing the legacy one by the id watch() gave works.
    assert c.unsubscribe(legacy) is True
    assert c.unsubscribe(legacy) is False
    assert c.unsubscribe(watch.id) is True
    assert watch.next(5) is None and watch.finished, "unsubscribe ends the iteration"
    # Both were unsubscribed on the new connection: its 16 slots are free.
    assert open_16(c.subscribe_cred, lambda s: s.close())
    c.close()


def test_a_client_gives_up_after_its_attempts_and_says_why(make_daemon):
    d = make_daemon()
    c = d.client("doomed", reconnect_attempts=2)
    sub = c.subscribe_cred()
    assert d.stop() == 0
    with pytest.raises(hc.ConnectionClosed) as ei:
        deadline_loop("the client to give up", lambda: c.closed, timeout=30)
        c.get("x")
    assert "could not reconnect" in str(ei.value), str(ei.value)
    with pytest.raises(hc.ConnectionClosed):
        sub.next(30)
    c.close()

    async def main():
        d2 = make_daemon()
        ac = await hc.AsyncClient.connect(d2.socket, client="doomed", reconnect_attempts=2)
        asub = await ac.subscribe_cred()
        assert d2.stop() == 0
        with pytest.raises(hc.ConnectionClosed):
            await asub.next(30)
        with pytest.raises(hc.ConnectionClosed) as ei:
            await ac.get("x")
        assert "could not reconnect" in str(ei.value), str(ei.value)
        await ac.close()

    asyncio.run(main())


# ---------------------------------------------------------------------------------------------
# A subscription closed while it is being re-made


def _held_subscribe_answers(proxy):
    """Hold the daemon's answers to subscribes on every connection after the first."""
    proxy.hold = lambda idx, msg: (idx >= 1 and isinstance(msg.get("result"), dict)
                                   and "subscription" in msg["result"])


def _check_close_during_resubscribe(proxy, old_id):
    """After the close and the release: the only unsubscribe on the new connection names the
    new connection's id (never ``old_id``), and the daemon answered it."""
    new_id = proxy.messages(1, "recv")
    held = [m["result"]["subscription"] for m in new_id
            if isinstance(m.get("result"), dict) and "subscription" in m["result"]]
    assert len(held) == 1, held
    new_id = held[0]
    assert new_id != old_id, "the test needs two different ids to tell them apart"

    def unsubscribed():
        sent = [m for m in proxy.messages(1, "sent") if m.get("method") == "unsubscribe"]
        if not sent:
            return False
        answered = {m.get("id") for m in proxy.messages(1, "recv") if "result" in m}
        return sent if all(m["id"] in answered for m in sent) else False

    proxy.wait(unsubscribed, "the re-made subscription's unsubscribe and its answer")
    sent = unsubscribed()
    assert [m["params"]["subscription"] for m in sent] == [new_id], sent


def test_a_subscription_closed_while_it_is_remade_frees_its_slot_and_sends_no_old_id(daemon):
    proxy = Proxy(daemon.socket)
    try:
        c = hc.Client(proxy.path, client="proxied")
        # Two made and closed first, so the subscription's id on this connection is not the
        # one the next connection gives it.
        for s in [c.subscribe_cred(), c.subscribe_cred()]:
            s.close()
        sub = c.subscribe_cred()
        old_id = sub._rec.daemon_id
        _held_subscribe_answers(proxy)
        proxy.cut()
        proxy.wait(lambda: len(proxy.conns) > 1 and proxy.conns[1]["held"],
                   "the re-subscribe's answer on the new connection (held)")
        sub.close()  # while the re-subscribe's answer is held
        assert not [m for m in proxy.messages(1, "sent") if m.get("method") == "unsubscribe"], \
            "an unsubscribe was sent for a subscription the new connection has not answered"
        proxy.release()
        _check_close_during_resubscribe(proxy, old_id)
        # Its slot is free: 16 subscriptions at once on the new connection.
        assert open_16(c.subscribe_cred, lambda s: s.close())
        assert c.reconnects == 1
        c.close()
    finally:
        proxy.close()


def test_async_a_subscription_closed_while_it_is_remade_frees_its_slot(daemon):
    proxy = Proxy(daemon.socket)

    async def main():
        ac = await hc.AsyncClient.connect(proxy.path, client="proxied")
        for s in [await ac.subscribe_cred(), await ac.subscribe_cred()]:
            await s.close()
        sub = await ac.subscribe_cred()
        old_id = sub._rec.daemon_id
        _held_subscribe_answers(proxy)
        proxy.cut()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(
            None, proxy.wait, lambda: len(proxy.conns) > 1 and proxy.conns[1]["held"],
            "the re-subscribe's answer on the new connection (held)")
        await sub.close()
        assert not [m for m in proxy.messages(1, "sent") if m.get("method") == "unsubscribe"]
        proxy.release()
        await loop.run_in_executor(None, _check_close_during_resubscribe, proxy, old_id)
        subs = [await ac.subscribe_cred() for _ in range(16)]
        for s in subs:
            await s.close()
        assert ac.reconnects == 1
        await ac.close()

    try:
        asyncio.run(main())
    finally:
        proxy.close()


# ---------------------------------------------------------------------------------------------
# Cancelled and timed-out calls


def test_cancelled_and_timed_out_async_subscribes_release_their_daemon_subscriptions(daemon):
    """20 subscribe calls given up while in flight (10 tasks cancelled, 10 wait_for timeouts):
    the daemon made each subscription; each must be unsubscribed, or the connection's 16 slots
    are gone for good."""
    with daemon.client("producer") as p:
        prod = hc.StreamProducer(p, "cx")
        prod.text("a")

        async def main():
            async with hc.AsyncClient(daemon.socket, client="canceller") as ac:
                gave_up, attempts = 0, 0
                while gave_up < 20:  # one that was answered first is simply closed
                    attempts += 1
                    assert attempts < 500, "subscribes were answered before they gave up"
                    try:
                        if attempts % 2:
                            t = asyncio.ensure_future(ac.subscribe_stream("cx"))
                            await asyncio.sleep(0)  # sent, not yet answered
                            t.cancel()
                            sub = await t
                        else:
                            sub = await asyncio.wait_for(ac.subscribe_cred(), 0.000001)
                    except (asyncio.CancelledError, asyncio.TimeoutError):
                        gave_up += 1
                    else:
                        await sub.close()
                # The late answers are unsubscribed as they come: 16 fit again (polled: the
                # unsubscribes are in flight).
                deadline = time.monotonic() + 30
                while True:
                    subs = []
                    try:
                        for _ in range(16):
                            subs.append(await ac.subscribe_cred())
                        break
                    except hc.Busy:
                        assert time.monotonic() < deadline, \
                            "cancelled subscribes still hold daemon subscriptions"
                        await asyncio.sleep(0.1)
                    finally:
                        for s in subs:
                            await s.close()
                sub = await ac.subscribe_stream("cx")
                assert (await sub.next(10))["event"]["text"] == "a"
                await sub.close()
                assert ac._pending == {} and ac._on_answer == {}

        asyncio.run(main())
        prod.commit({"role": "assistant"}, content_from_stream=True)


def test_300_timed_out_async_calls_leave_nothing_behind(daemon):
    """300 calls given up at once (wait_for): most of them while they wait for the connection's
    write lock behind a large request (100 KB each: the transport's buffer fills and the
    writer waits for the daemon to read). None may stay pending or leave an exception nobody
    retrieves."""
    errors = []
    big = "x" * 100_000  # an id the daemon refuses (invalid_params): nothing is stored

    async def main():
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx.get("message")))
        ac = await hc.AsyncClient.connect(daemon.socket, client="impatient")
        await ac.set_value("k", SECRET)
        got = await asyncio.gather(
            *(asyncio.wait_for(ac.exists(big), 0.000001) for _ in range(300)),
            return_exceptions=True,
        )
        kinds = {type(g).__name__ for g in got}
        assert kinds <= {"TimeoutError", "InvalidParams"}, kinds
        assert sum(isinstance(g, asyncio.TimeoutError) for g in got) >= 200, kinds
        # One more round trip: every late answer has been read by then.
        assert (await ac.get("k")).value() == SECRET
        assert ac._pending == {}, "%d futures left waiting" % len(ac._pending)
        assert ac._on_answer == {}
        await ac.close()
        gc.collect()  # a future dropped with an exception nobody took is reported here

    asyncio.run(main())
    gc.collect()
    assert errors == [], errors


def test_timed_out_sync_subscribes_release_their_daemon_subscriptions(daemon):
    c = daemon.client("impatient")
    timeouts, attempts = 0, 0
    while timeouts < 20:
        attempts += 1
        assert attempts < 500, "subscribes were answered within a microsecond"
        c.timeout = 0.000001
        try:
            sub = c.subscribe_cred()
        except hc.CallTimeout:
            timeouts += 1
            continue
        c.timeout = 30
        sub.close()
    c.timeout = 30

    def all_16():
        return open_16(c.subscribe_cred, lambda s: s.close())

    deadline_loop("the timed-out subscribes' daemon subscriptions to be released", all_16)
    assert c._pending == {}, c._pending
    c.close()


# ---------------------------------------------------------------------------------------------
# A reconnect the daemon refuses


def test_a_refused_hello_on_reconnect_closes_the_client_with_the_daemons_reason(make_daemon):
    """The plugin grant is gone after a restart: the daemon refuses the new hello. The client
    closes at once, its error saying the daemon's reason (it used to retry for ~11 s and say
    only "hello on the new connection failed")."""
    grant = '[plugins.p]\nstores = ["default"]\nmethods = ["cred.*"]\n'
    d = make_daemon(config=grant)
    cfg = d.home / "config" / "holdfast" / "config.toml"
    # 1000 attempts would take over half an hour: only the refusal can close it in time.
    c = d.client("granted", plugin="p", reconnect_attempts=1000, timeout=60)
    sub = c.subscribe_cred()
    cfg.write_text("")
    d.restart()
    with pytest.raises(hc.ConnectionClosed) as ei:
        c.exists("x")
    assert "no such plugin" in str(ei.value) and "refused" in str(ei.value), str(ei.value)
    assert c.closed
    with pytest.raises(hc.ConnectionClosed) as ei:
        sub.next(30)
    assert "no such plugin" in str(ei.value), str(ei.value)
    c.close()

    async def main():
        cfg.write_text(grant)
        await asyncio.get_running_loop().run_in_executor(None, d.restart)
        ac = await hc.AsyncClient.connect(d.socket, client="granted", plugin="p",
                                          reconnect_attempts=1000, timeout=60)
        asub = await ac.subscribe_cred()
        cfg.write_text("")
        await asyncio.get_running_loop().run_in_executor(None, d.restart)
        with pytest.raises(hc.ConnectionClosed) as ei:
            await ac.exists("x")
        assert "no such plugin" in str(ei.value) and "refused" in str(ei.value), str(ei.value)
        assert ac.closed
        with pytest.raises(hc.ConnectionClosed) as ei:
            await asub.next(30)
        assert "no such plugin" in str(ei.value), str(ei.value)
        await ac.close()

    asyncio.run(main())


def test_a_watch_feeding_events_that_cannot_be_remade_says_so_in_events(make_daemon):
    """watch() / stream_subscribe() ids feed events(): when one cannot be re-made after a
    reconnect (the grant lost the method), events() gets a ``closed`` event for it with the
    daemon's reason (it used to go silent, and the client kept the id as live)."""
    d = make_daemon(config='[plugins.p]\nstores = ["default"]\nmethods = ["cred.*", "stream.*"]\n')
    c = d.client("granted", plugin="p", reconnect_attempts=30, timeout=30)
    wid = c.watch()
    with d.client("producer") as pc:
        pc.stream_begin("r")
    sid = c.stream_subscribe("r")
    (d.home / "config" / "holdfast" / "config.toml").write_text(
        '[plugins.p]\nstores = ["default"]\nmethods = ["cred.get", "stream.begin"]\n')
    d.restart()
    closed = {}
    while len(closed) < 2:
        ev = c.next_event(30)
        assert ev is not None, "events() went silent; got %s" % closed
        if "event" in ev:
            continue  # the stream's own (its producer's connection closed: interrupted)
        assert ev.get("type") == "closed", ev
        closed[ev["subscription"]] = ev
    assert set(closed) == {wid, sid}, closed
    for ev in closed.values():
        assert ev["kind"] == "forbidden" and "re-making" in ev["reason"], ev
    assert c.reconnects == 1 and not c.closed
    assert c.unsubscribe(wid) is False and c.unsubscribe(sid) is False, "no longer open"
    c.close()


def test_async_a_call_written_to_an_already_dead_connection_is_sent_on_the_new_one(make_daemon):
    """The daemon dies while the event loop is busy, so the reader has not seen the end when
    the next call is written: nothing of it reached any daemon, so it is sent on the new
    connection (as Client does) instead of raising ConnectionClosed."""
    import signal

    d = make_daemon()

    def start_new():
        d._log = open(d.log_path, "ab")
        d._start()

    async def main():
        async with hc.AsyncClient(d.socket, client="late", timeout=60,
                                  reconnect_attempts=30) as a:
            for i in range(3):
                await a.exists("x")
                d.proc.send_signal(signal.SIGKILL)  # the loop is blocked: no reader runs
                d.proc.wait()
                t = threading.Thread(target=start_new)
                t.start()
                try:
                    got = await a.set_value("k%d" % i, "v", if_generation=0)
                finally:
                    await asyncio.get_running_loop().run_in_executor(None, t.join)
                assert got.generation == 1
            assert a.reconnects == 3 and not a.closed
            return [await a.exists("k%d" % i) for i in range(3)]

    assert asyncio.run(main()) == [True, True, True]


def test_subscribes_given_up_on_do_not_make_the_next_subscribe_busy(daemon):
    """15 subscriptions held, one slot free. A subscribe (sync: timed out; async: cancelled
    once written) still holds the daemon's 16th slot until its late answer is read and
    unsubscribed; the application's next subscribe waits for that instead of getting busy."""
    c = daemon.client("given-up")
    kept = [c.subscribe_cred() for _ in range(15)]
    busy = timed_out = 0
    for _ in range(20):
        c.timeout = 0.00005  # the answer cannot be read in time
        try:
            c.subscribe_cred().close()
        except hc.CallTimeout:
            timed_out += 1
        c.timeout = 60
        try:
            c.subscribe_cred().close()
        except hc.Busy:
            busy += 1
    assert timed_out > 0, "the test needs subscribes that time out"
    assert busy == 0, "busy on %d of 20 subscribes made while the app held 15" % busy
    for s in kept:
        s.close()
    c.close()

    async def main():
        async with hc.AsyncClient(daemon.socket, client="given-up-async") as a:
            held = [await a.subscribe_cred() for _ in range(15)]
            busy = cancelled = 0
            for _ in range(20):
                t = asyncio.ensure_future(a.subscribe_cred())
                await asyncio.sleep(0)
                await asyncio.sleep(0)  # written to the socket, not answered yet
                t.cancel()
                try:
                    await (await t).close()
                    continue  # answered before the cancel: nothing given up
                except asyncio.CancelledError:
                    cancelled += 1
                try:
                    s = await a.subscribe_cred()
                    await s.close()
                except hc.Busy:
                    busy += 1
            assert cancelled > 0, "the test needs cancelled subscribes"
            for s in held:
                await s.close()
            return busy

    busy = asyncio.run(main())
    assert busy == 0, "async: busy on %d of 20 subscribes made while the app held 15" % busy
