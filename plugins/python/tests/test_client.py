"""Tests of holdfast_client against the real daemon binary.

Every test that needs a daemon starts its own: a private HOME / XDG_* tree in a temp dir,
``holdfast init`` (store "default"), ``holdfast daemon`` on ``$XDG_RUNTIME_DIR/holdfast/
holdfast.sock``, and SIGTERM at the end (which must exit 0). The binary is ``$HOLDFAST_BIN``,
else ``target/debug/holdfast`` (``plugins/run-tests.sh`` builds it).

Run as a script with ``refresh-worker`` this file is one process of the single-flight race.
"""

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import uuid

import pytest

from harness import SECRET, assert_no_secret, hc


def oauth_doc(cid, access, refresh):
    return {
        "id": cid,
        "credential_type": "oauth2",
        "keys": {
            "access_token": {"value": access, "expires_at": "2026-01-01T00:00:00Z"},
            "refresh_token": {"value": refresh},
        },
        "description": "an OAuth-style test credential",
    }


# ---------------------------------------------------------------------------------------------
# Finding the socket


def test_socket_path_resolution_matches_the_cli(monkeypatch, tmp_path):
    for var in ("HOLDFAST_SOCKET", "HOLDFAST_CONFIG", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hc.default_socket_path() == "/tmp/holdfast-%d/holdfast.sock" % os.geteuid()
    monkeypatch.setenv("XDG_RUNTIME_DIR", "relative/ignored")
    assert hc.default_socket_path() == "/tmp/holdfast-%d/holdfast.sock" % os.geteuid()
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/4242")
    assert hc.default_socket_path() == "/run/user/4242/holdfast/holdfast.sock"
    # The config file's socket wins over the runtime dir ("~/" expanded with HOME).
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    (tmp_path / "cfg" / "holdfast").mkdir(parents=True)
    (tmp_path / "cfg" / "holdfast" / "config.toml").write_text(
        'socket = "~/s/hf.sock"\n[plugins.x]\nstores = ["*"]\nmethods = ["*"]\n'
    )
    assert hc.default_socket_path() == str(tmp_path / "s" / "hf.sock")
    # HOLDFAST_CONFIG names another file.
    other = tmp_path / "other.toml"
    other.write_text('socket = "/elsewhere/hf.sock"\n')
    monkeypatch.setenv("HOLDFAST_CONFIG", str(other))
    assert hc.default_socket_path() == "/elsewhere/hf.sock"
    # HOLDFAST_SOCKET wins over everything; empty counts as unset.
    monkeypatch.setenv("HOLDFAST_SOCKET", "/explicit.sock")
    assert hc.default_socket_path() == "/explicit.sock"
    monkeypatch.setenv("HOLDFAST_SOCKET", "")
    assert hc.default_socket_path() == "/elsewhere/hf.sock"


def test_default_socket_finds_the_daemon_and_a_missing_one_is_connection_closed(
    daemon, monkeypatch
):
    for var in ("HOLDFAST_SOCKET", "HOLDFAST_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    for k in ("HOME", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME"):
        monkeypatch.setenv(k, daemon.env[k])
    with hc.Client(client="default-path") as c:
        assert c.socket_path == daemon.socket
        assert c.hello["server"] == "holdfast"
        assert c.hello["protocol"] == hc.PROTOCOL_VERSION
    with pytest.raises(hc.ConnectionClosed) as ei:
        hc.Client(str(daemon.root / "no-such.sock"))
    assert ei.value.kind == "storage" and isinstance(ei.value, ConnectionError)


# ---------------------------------------------------------------------------------------------
# Every helper


def test_every_helper_against_the_daemon(daemon):
    c = daemon.client("helpers")
    other = daemon.client("helpers-2")
    try:
        assert "cred.refresh_lease" in c.hello["methods"]
        assert c.hello["grant"]["stores"] == ["default"]

        # set_value / get / exists
        r = c.set_value("openai", SECRET)
        assert r == hc.SetResult("openai", 1)
        rec = c.get("openai")
        assert rec.generation == 1 and rec.id == "openai"
        assert rec.credential_type == "api_key" and rec.keys == ["api_key"]
        assert rec.value() == SECRET
        assert SECRET not in repr(rec), repr(rec)
        assert c.exists("openai") is True
        assert c.exists("nothing-here") is False

        # set (a whole document) and a second write
        doc = oauth_doc("github", "at-1", "rt-1")
        assert c.set(doc) == hc.SetResult("github", 1)
        assert c.set(doc, if_generation=1).generation == 2
        gh = c.get("github")
        assert gh.value("access_token") == "at-1" and gh.value("refresh_token") == "rt-1"
        assert gh.credential["description"] == "an OAuth-style test credential"
        assert gh.generation == 2
        with pytest.raises(KeyError):
            gh.value("api_key")

        # list: ids, generations and metadata, never a value
        listing = c.list()
        by_id = {e["id"]: e for e in listing}
        assert set(by_id) == {"openai", "github"}
        assert by_id["github"]["generation"] == 2
        assert by_id["github"]["credential_type"] == "oauth2"
        assert sorted(by_id["github"]["key_names"]) == ["access_token", "refresh_token"]
        assert SECRET not in json.dumps(listing) and "at-1" not in json.dumps(listing)

        # refresh_lease / release_lease across two connections
        lease = c.refresh_lease("github", 5000)
        assert lease.granted and lease.lease_id is not None and lease.expires_in_ms == 5000
        denied = other.refresh_lease("github", 5000)
        assert not denied.granted and 0 < denied.expires_in_ms <= 5000
        assert other.release_lease("github") is False  # not its lease
        assert c.release_lease("github") is True
        assert c.release_lease("github") is False
        assert other.refresh_lease("github", 1000).granted
        assert other.release_lease("github") is True

        # status
        st = c.status()
        assert st["server"] == "holdfast" and st["pid"] == daemon.proc.pid
        assert st["connections"] >= 2
        (store,) = st["stores"]
        assert store["name"] == "default" and store["sealed"] is False
        assert store["credentials"] == 2

        # watch returns a subscription id; delete says whether it existed
        sub = c.watch()
        assert isinstance(sub, int)
        assert c.delete("openai") is True
        assert c.delete("openai") is False
        assert not c.exists("openai")
        ev = c.next_event(timeout=5)
        assert ev is not None and ev["subscription"] == sub
        assert ev["id"] == "openai" and ev["deleted"] is True and ev["generation"] is None

        # call() for anything else
        fsck = c.call("admin.fsck")
        assert fsck["store"] == "default"
    finally:
        c.close()
        other.close()
    with pytest.raises(hc.ConnectionClosed):
        c.get("github")


# ---------------------------------------------------------------------------------------------
# Errors


def test_errors_map_to_kinds(daemon):
    with daemon.client("errors") as c:
        with pytest.raises(hc.NotFound) as ei:
            c.get("missing")
        e = ei.value
        assert (e.kind, e.code, e.data["kind"]) == ("not_found", -32001, "not_found")
        assert isinstance(e, KeyError) and isinstance(e, hc.HoldfastError)
        assert str(e).startswith("not_found: ")

        c.set_value("cas", "v1")
        c.set_value("cas", "v2", if_generation=1)
        with pytest.raises(hc.Conflict) as ei:
            c.set_value("cas", "v3", if_generation=1)
        e = ei.value
        assert (e.kind, e.code) == ("conflict", -32002)
        assert e.data["generation"] == 2 and e.data["expected"] == 1
        with pytest.raises(hc.Conflict):
            c.set_value("cas", "v3", if_generation=0)  # 0: only if absent
        assert c.set_value("fresh", "v", if_generation=0).generation == 1
        assert c.get("cas").value() == "v2"

        for bad in ["../etc/passwd", "", "/abs", ".hidden", "x" * 300]:
            with pytest.raises(hc.InvalidParams) as ei:
                c.get(bad)
            assert ei.value.kind == "invalid_params" and ei.value.code == -32602, bad
            with pytest.raises(hc.InvalidParams):
                c.set_value(bad, "v")
            with pytest.raises(hc.InvalidParams):
                c.refresh_lease(bad, 1000)
        with pytest.raises(hc.InvalidParams):
            c.call("cred.get", id="cas", unknown_field=1)
        with pytest.raises(hc.InvalidParams):
            c.refresh_lease("cas", 0)
        with pytest.raises(hc.InvalidParams):
            c.set({"id": "doc", "keys": {"k": {"value": 5}}})
        with pytest.raises(hc.InvalidParams):
            c.call("cred.set", id="x", value=object())  # not JSON: refused client-side

        with pytest.raises(hc.Unsupported) as ei:
            c.call("cred.frobnicate")
        assert ei.value.kind == "unsupported" and ei.value.code == -32601
        with pytest.raises(hc.NotFound):
            c.get("x", store="no-such-store")
        # The connection is still usable after every error.
        assert c.get("cas").generation == 2
        for kind in hc.KINDS:
            assert hc._ERROR_CLASSES[kind].kind == kind


def test_forbidden_with_a_plugin_grant_from_config(make_daemon):
    d = make_daemon(
        """
[plugins.reader]
stores = ["default"]
methods = ["cred.get", "cred.list", "cred.watch"]

[plugins.elsewhere]
stores = ["other"]
methods = ["*"]
"""
    )
    with d.client("admin") as admin:
        admin.set_value("shared", SECRET)
    with d.client("reader", plugin="reader") as r:
        assert r.hello["grant"] == {"plugin": "reader", "stores": ["default"], "runs": ["*"]}
        # hello and unsubscribe concern only the connection itself: every grant has them.
        assert set(r.hello["methods"]) == {
            "hello", "unsubscribe", "cred.get", "cred.list", "cred.watch"}
        assert r.get("shared").value() == SECRET
        assert [e["id"] for e in r.list()] == ["shared"]
        for call in (
            lambda: r.set_value("shared", "overwritten"),
            lambda: r.delete("shared"),
            lambda: r.exists("shared"),
            lambda: r.status(),
            lambda: r.refresh_lease("shared", 1000),
        ):
            with pytest.raises(hc.Forbidden) as ei:
                call()
            e = ei.value
            assert (e.kind, e.code) == ("forbidden", -32003)
            assert isinstance(e, PermissionError)
            assert_no_secret(e)
        assert r.get("shared").value() == SECRET  # nothing was changed
    with d.client("elsewhere", plugin="elsewhere") as el:
        assert el.hello["grant"]["stores"] == []  # "other" is not served
        with pytest.raises(hc.Forbidden):
            el.get("shared")  # the default store is outside its grant
    with pytest.raises(hc.Forbidden) as ei:
        d.client("stranger", plugin="no-such-plugin")
    assert ei.value.kind == "forbidden"


def test_secrets_never_in_exceptions_or_reprs(daemon):
    with daemon.client("hygiene") as c:
        c.set_value("s", SECRET)
        errors = []
        for call in (
            lambda: c.set_value("s", SECRET, if_generation=42),  # conflict
            lambda: c.call("cred.refresh_lease", id="s", ttl_ms=SECRET),  # wrong type
            lambda: c.call("cred.get", id="s", **{SECRET: 1}),  # secret as a field name
            lambda: c.set({"id": "s", "keys": {"k": {"value": 1, "note": SECRET}}}),
            lambda: c.set_value("../" + "x", SECRET),  # bad id
            lambda: c.call("cred.set", id="s", value=[SECRET]),  # wrong value type
        ):
            with pytest.raises(hc.HoldfastError) as ei:
                call()
            assert_no_secret(ei.value)
            errors.append(ei.value.kind)
        print("secret hygiene: %d failing calls, kinds %s, 0 leaks" % (len(errors), errors))
        rec = c.get("s")
        assert SECRET not in repr(rec) and SECRET not in str(rec)
        assert SECRET not in repr(c)


# ---------------------------------------------------------------------------------------------
# Pipelining


def test_pipelining_8_threads_x_50_calls_on_one_client(daemon):
    threads_n, calls_n = 8, 50
    c = daemon.client("pipeliner")
    barrier = threading.Barrier(threads_n)
    mismatches = []
    done = [0] * threads_n
    errors = []

    def work(t):
        try:
            barrier.wait()
            last = {}
            for i in range(calls_n):
                cid = "t%d-%d" % (t, i % 5)
                if i % 2 == 0:
                    value = "v-%d-%d-%s" % (t, i, uuid.uuid4().hex)
                    r = c.set_value(cid, value)
                    if r.id != cid:
                        mismatches.append((t, i, "set answered for %s" % r.id))
                    last[cid] = (value, r.generation)
                else:
                    want = last.get(cid)
                    if want is None:
                        if c.exists(cid):
                            mismatches.append((t, i, "exists before any write"))
                    else:
                        rec = c.get(cid)
                        if (rec.id, rec.value(), rec.generation) != (cid, want[0], want[1]):
                            mismatches.append((t, i, "get answered another request"))
                done[t] += 1
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    start = time.monotonic()
    threads = [threading.Thread(target=work, args=(t,)) for t in range(threads_n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    elapsed = time.monotonic() - start
    total = sum(done)
    print(
        "pipelining: %d threads x %d calls = %d calls on one connection in %.2fs, "
        "max %d in flight, %d mismatched, %d errors"
        % (threads_n, calls_n, total, elapsed, c.max_pending, len(mismatches), len(errors))
    )
    try:
        assert not errors, errors
        assert not mismatches, mismatches[:5]
        assert total == threads_n * calls_n
        assert c.max_pending > 1, "requests were never pipelined"
        assert len(c.list()) == threads_n * 5
    finally:
        c.close()


# ---------------------------------------------------------------------------------------------
# Watching


def test_watch_receives_an_event_for_a_write_from_another_client(daemon):
    seen_by_callback = []
    with daemon.client("watcher", on_event=seen_by_callback.append) as w, daemon.client(
        "writer"
    ) as writer:
        sub = w.watch()
        writer.set_value("watched", "v1")
        writer.set_value("watched", "v2")
        writer.delete("watched")
        got = []
        for ev in w.events(timeout=5):
            got.append(ev)
            if len(got) == 3:
                break
        print("watch: %d events from another client: %s" % (len(got), [
            (e["id"], e["generation"], e["deleted"]) for e in got]))
        assert [(e["type"], e["subscription"], e["store"], e["source"]) for e in got] == [
            ("cred.changed", sub, "default", "daemon")
        ] * 3
        assert [(e["id"], e["generation"], e["deleted"]) for e in got] == [
            ("watched", 1, False),
            ("watched", 2, False),
            ("watched", None, True),
        ]
        assert seen_by_callback == got
        # Nothing more: the iterator ends after its idle timeout.
        t0 = time.monotonic()
        assert list(w.events(timeout=0.3)) == []
        assert 0.25 <= time.monotonic() - t0 < 5
        # The writer never watched: it has no events.
        assert writer.next_event(timeout=0.1) is None


def test_watch_sees_an_offline_cli_write_as_external(daemon):
    with daemon.client("watcher") as w:
        w.watch()
        out = daemon.cli("--offline", "cred", "set", "from-cli", input="cli-value\n")
        assert out.returncode == 0, out.stderr
        ev = None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            ev = w.next_event(timeout=deadline - time.monotonic())
            if ev is None or ev.get("id") == "from-cli":
                break
        assert ev is not None and ev["id"] == "from-cli", ev
        assert ev["source"] == "external" and ev["generation"] == 1
        assert w.get("from-cli").value() == "cli-value"


# ---------------------------------------------------------------------------------------------
# Single-flight refresh


def _refresh_worker(argv):
    """One process of the race: read the token, say ready, wait for "go", then refresh it
    through single_flight_refresh. Prints one JSON line with what it saw."""
    sock, cid, counter_file, name = argv
    calls = 0
    with hc.Client(sock, client=name) as c:
        stale = c.get(cid)
        print(json.dumps({"ready": stale.generation}), flush=True)
        if sys.stdin.readline().strip() != "go":
            sys.exit(3)

        def refresh(record):
            nonlocal calls
            calls += 1
            fd = os.open(counter_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, ("%s\n" % name).encode())
            finally:
                os.close(fd)
            time.sleep(0.3)  # the OAuth round trip
            doc = dict(record.credential)
            keys = {k: dict(v) for k, v in doc["keys"].items()}
            keys["access_token"]["value"] = "at-" + uuid.uuid4().hex
            keys["refresh_token"]["value"] = "rt-" + uuid.uuid4().hex
            doc["keys"] = keys
            return doc

        fresh = hc.single_flight_refresh(
            c, cid, refresh, ttl_ms=15000, stale_generation=stale.generation, timeout=60
        )
        print(
            json.dumps(
                {
                    "calls": calls,
                    "token": fresh.value("access_token"),
                    "generation": fresh.generation,
                }
            ),
            flush=True,
        )


def test_single_flight_refresh_race_8_processes(daemon):
    n = 8
    cid = "oauth-race"
    with daemon.client("setup") as c:
        c.set(oauth_doc(cid, "at-stale", "rt-stale"))
        g0 = c.get(cid).generation
    counter = daemon.root / "refresh-calls"
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "refresh-worker", daemon.socket, cid, str(counter),
             "worker-%d" % i],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]
    try:
        for p in procs:
            line = p.stdout.readline()
            assert line, "worker died before ready: %s" % p.stderr.read()
            assert json.loads(line) == {"ready": g0}
        for p in procs:  # all are connected and have read the stale token: go, together
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        for p in procs:
            out, err = p.communicate(timeout=90)
            assert p.returncode == 0, "worker failed:\n%s" % err
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    calls = sum(r["calls"] for r in results)
    counted = counter.read_text().splitlines() if counter.exists() else []
    tokens = {r["token"] for r in results}
    gens = sorted({r["generation"] for r in results})
    with daemon.client("check") as c:
        final = c.get(cid)
    print(
        "single-flight refresh: %d processes, refresh_fn calls=%d (counter file %d), "
        "distinct final tokens=%d, generation %d -> %s (stored %d)"
        % (n, calls, len(counted), len(tokens), g0, gens, final.generation)
    )
    assert calls == 1 and len(counted) == 1
    assert len(tokens) == 1
    (token,) = tokens
    assert token != "at-stale" and token.startswith("at-")
    assert gens == [g0 + 1] and final.generation == g0 + 1
    assert final.value("access_token") == token
    assert final.credential_type == "oauth2"
    assert final.credential["description"] == "an OAuth-style test credential"


def test_single_flight_refresh_failure_releases_the_lease(daemon):
    with daemon.client("a") as a, daemon.client("b") as b:
        a.set(oauth_doc("tok", "at-0", "rt-0"))

        def broken(record):
            raise RuntimeError("the token endpoint said 500")

        with pytest.raises(RuntimeError):
            hc.single_flight_refresh(a, "tok", broken, ttl_ms=60000)
        # The failed holder let go at once: b gets the lease without waiting 60 s.
        assert b.refresh_lease("tok", 1000).granted
        b.release_lease("tok")
        # A late caller whose stale token was already replaced refreshes nothing.
        a.set(oauth_doc("tok", "at-1", "rt-1"))  # generation 2
        fresh = hc.single_flight_refresh(
            b, "tok", broken, ttl_ms=1000, stale_generation=1
        )
        assert fresh.generation == 2 and fresh.value("access_token") == "at-1"
        # A string from refresh_fn is written as the {id, value} shorthand.
        b.set_value("plain", "old")
        got = hc.single_flight_refresh(b, "plain", lambda r: "new-" + r.value(), ttl_ms=1000)
        assert (got.value(), got.generation) == ("new-old", 2)
        # The internal subscription of single_flight_refresh does not feed events().
        assert b.next_event(timeout=0.3) is None


# ---------------------------------------------------------------------------------------------
# Interop with the CLI


def test_interop_python_set_reads_back_through_offline_cli(daemon):
    with daemon.client("interop") as c:
        c.set_value("interop-key", SECRET)
        c.set(oauth_doc("interop-oauth", "at-interop", "rt-interop"))
    out = daemon.cli("--offline", "cred", "get", "interop-key")
    assert out.returncode == 0, out.stderr
    assert out.stdout.rstrip("\n") == SECRET
    assert "(offline)" in out.stderr
    out = daemon.cli("--offline", "cred", "get", "interop-oauth", "--field", "access_token")
    assert out.returncode == 0, out.stderr
    assert out.stdout.rstrip("\n") == "at-interop"
    out = daemon.cli("--offline", "--json", "cred", "get", "interop-oauth")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["generation"] == 1
    assert doc["credential"]["keys"]["refresh_token"]["value"] == "rt-interop"
    # And the other way: the offline CLI writes, the client reads through the daemon.
    out = daemon.cli("--offline", "cred", "set", "cli-written", input="from-the-cli\n")
    assert out.returncode == 0, out.stderr
    with daemon.client("interop-2") as c:
        assert c.get("cli-written").value() == "from-the-cli"


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "refresh-worker":
    _refresh_worker(sys.argv[2:])


# ---------------------------------------------------------------------------------------------
# Streams


def test_stream_producer_and_subscriber_see_every_delta_once(daemon):
    with hc.Client(socket_path=daemon.socket, client="producer") as p_client, \
            hc.Client(socket_path=daemon.socket, client="watcher") as w:
        p = hc.StreamProducer(p_client, "py-run-1", model="m")
        w.stream_subscribe("py-run-1")
        sent = []
        for i in range(50):
            t = "d%03d " % i
            sent.append(t)
            assert p.text(t) == i + 1
        plan = p.interrupt("connection_reset")
        assert plan["plan"] == "R1" and plan["next_seq"] == 52
        for i in range(50, 60):
            t = "d%03d " % i
            sent.append(t)
            p.text(t)
        # A retried append (its answer lost) is acknowledged and dropped.
        assert p_client.stream_append("py-run-1", p.stream_id, 52, [{"type": "text", "text": "d050 "}]) == 61
        p.commit({"role": "assistant", "content": "".join(sent)})
        seqs, text, types = [], [], []
        for ev in w.events(timeout=5):
            seqs.append(ev["seq"])
            types.append(ev["event"]["type"])
            if ev["event"]["type"] == "text":
                text.append(ev["event"]["text"])
            if ev["event"]["type"] == "finish":
                break
        assert seqs == sorted(set(seqs)), seqs
        assert "".join(text) == "".join(sent)
        assert types.count("interrupted") == 1 and types[-1] == "finish"
        got = p_client.stream_get("py-run-1", reveal=True)
        assert got["status"] == "committed" and got["final_message"]["content"] == "".join(sent)
        print("python stream: 60 deltas, one interruption, %d events to the subscriber, each once" % len(seqs))


def test_stream_producer_batches_what_threads_hand_over_while_an_append_is_in_flight(daemon):
    """8 threads x 200 single-token appends through one StreamProducer: every token durable
    once when its append returns, each thread's tokens in its order, fewer round trips than
    calls (those handed over while one was in flight went together)."""
    import threading

    n_threads, per = 8, 200
    with hc.Client(socket_path=daemon.socket, client="batcher") as c:
        p = hc.StreamProducer(c, "py-batch-1", model="m")
        acked_after = {}

        def worker(t):
            for i in range(per):
                tok = "t%d.%03d " % (t, i)
                acked_after[tok] = p.text(tok)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        total = n_threads * per
        assert p.next_seq == total + 1
        text = c.stream_get("py-batch-1", reveal=True)["checkpoint"]["partial_text"]
        toks = text.split()
        assert len(toks) == total and len(set(toks)) == total, "every token once"
        for t in range(n_threads):
            mine = [x for x in toks if x.startswith("t%d." % t)]
            assert mine == ["t%d.%03d" % (t, i) for i in range(per)], "a thread's order kept"
        # Each call returned only once its own token was durable: its seq is at most the ack.
        pos = {tok + " ": i + 1 for i, tok in enumerate(toks)}
        assert all(pos[tok] <= acked for tok, acked in acked_after.items())
        assert p.appends < total, (p.appends, total)
        p.commit({"role": "assistant", "content": text}, content_from_stream=True)
    print("python producer: %d appends from %d threads in %d round trips (%.1f tokens each)"
          % (total, n_threads, p.appends, total / p.appends))


def test_a_failed_batched_append_fails_every_waiter_and_the_producer_goes_on(daemon):
    import threading

    with hc.Client(socket_path=daemon.socket, client="a") as a, \
            hc.Client(socket_path=daemon.socket, client="b") as b:
        p = hc.StreamProducer(a, "py-batch-2")
        p.text("kept ")
        hc.StreamProducer(b, "py-batch-2", takeover=True)  # fences p
        errors, oks = [], []

        def worker(t):
            try:
                oks.append(p.text("zombie%d " % t))
            except hc.Conflict as e:
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not oks and len(errors) == 6, (oks, errors)
        text = b.stream_get("py-batch-2", reveal=True)["checkpoint"]["partial_text"]
        assert "zombie" not in text


def test_stream_resume_fences_the_old_producer(daemon):
    with hc.Client(socket_path=daemon.socket, client="first") as a, \
            hc.Client(socket_path=daemon.socket, client="second") as b:
        p1 = hc.StreamProducer(a, "py-run-2")
        p1.text("before the crash")
        with pytest.raises(hc.Conflict):
            hc.StreamProducer(b, "py-run-2")
        p2 = hc.StreamProducer(b, "py-run-2", resume=True)
        assert p2.checkpoint["partial_text"] == "before the crash"
        assert p2.plan["plan"] == "R1" and p2.plan["cause"] == "resumed_from_checkpoint"
        with pytest.raises(hc.Conflict):
            p1.text("zombie")
        p2.text(", and after")
        assert b.stream_get("py-run-2", reveal=True)["checkpoint"]["partial_text"] == \
            "before the crash, and after"
        p2.abort("test")
        with pytest.raises(hc.NotFound):
            p2.text("x")
        b.checkpoint_put("py-run-3", {"partial_text": "mine"})
        assert b.checkpoint_get("py-run-3")["partial_text"] == "mine"
        assert b.checkpoint_delete("py-run-3") is True


# ---------------------------------------------------------------------------------------------
# Run logs


def _runlog_worker(args):
    sock, me = args[0], int(args[1])
    with hc.Client(socket_path=sock, client="runlog-%d" % me) as c:
        print("ready", flush=True)
        for line in sys.stdin:
            node = line.strip()
            if not node:
                break
            if me % 2 == 0:
                c.run_log_node("py-race", {"node_id": node, "attempt": 1, "success": True,
                                           "input_tokens": 100, "output_tokens": 10})
            else:
                c.run_ensure_node("py-race", node, {"success": True})
            print("done", flush=True)


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "runlog-worker":
    _runlog_worker(sys.argv[2:])


def test_run_log_race_across_processes_keeps_one_entry_per_node(daemon):
    """hive's race from Python: 6 processes, half logging a node's completion and half its
    "ensure logged" fallback, released together each round."""
    n, rounds = 6, 25
    procs = [
        subprocess.Popen([sys.executable, __file__, "runlog-worker", daemon.socket, str(i)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
        for i in range(n)
    ]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready", p.stderr.read()
        for r in range(rounds):
            for p in procs:
                p.stdin.write("node-%d\n" % r)
                p.stdin.flush()
            for p in procs:
                assert p.stdout.readline().strip() == "done", p.stderr.read()
        for p in procs:
            p.stdin.close()
            assert p.wait(timeout=30) == 0, p.stderr.read()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    with hc.Client(socket_path=daemon.socket, client="check") as c:
        got = c.run_get("py-race")
        nodes = [d["node_id"] for d in got["details"]]
        summary = c.run_end("py-race", "success", agent_id="py")
        again = c.run_end("py-race", "failure")
        listed = c.run_list(status="success")
    dupes = len(nodes) - len(set(nodes))
    print("python run-log race: %d processes x %d rounds, %d entries, %d duplicates"
          % (n, rounds, len(nodes), dupes))
    assert sorted(set(nodes)) == sorted("node-%d" % r for r in range(rounds))
    assert dupes == 0
    assert summary["total_input_tokens"] == rounds * 100
    assert again == summary
    assert [r["run_id"] for r in listed] == ["py-race"]


def test_scrubbing_keeps_parameter_names_and_the_callers_own_run_id(daemon):
    """Issue 36 (one part): values are redacted from error messages, never the parameter names
    or the caller's own run id — "run_id must be …" and "conflict: run … has ended" stay
    useful."""
    with daemon.client("names") as c:
        with pytest.raises(hc.InvalidParams) as ei:
            c.stream_begin("x" * 200)
        assert "run_id" in str(ei.value) and "<redacted>" not in str(ei.value), ei.value
        sid = c.stream_begin("run-names")["stream_id"]
        c.stream_abort("run-names", sid, "done")
        with pytest.raises(hc.HoldfastError) as ei:
            c.stream_append("run-names", sid, 1, [{"type": "text", "text": "x"}])
        assert "<redacted>" not in str(ei.value), ei.value
        # A secret value is still cut out, wherever it is echoed.
        with pytest.raises(hc.HoldfastError) as ei:
            c.call("cred.refresh_lease", id="s", ttl_ms=SECRET)
        assert SECRET not in str(ei.value)


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_request_over_the_frame_cap_is_refused_unsent_and_the_connection_goes_on(daemon,
                                                                                   flavour):
    """A 2 MB credential or a 1.5 MB tool result passes the daemon's 1 MiB request line, which
    it answers by closing the connection: sent anyway, the client reconnected and sent it again
    for a minute, then raised a timeout that lost the reason. Refused unsent, at once, saying
    why; the connection serves the next call."""
    doc = {"id": "huge", "keys": {"api_key": {"value": "x" * 2_000_000}}}
    if flavour == "sync":
        with daemon.client("big") as c:
            t = time.monotonic()
            with pytest.raises(hc.InvalidParams) as ei:
                c.set(doc)
            took = time.monotonic() - t
            assert c.set_value("small", "v").generation == 1
            epoch_ok = c.get("small").credential["keys"]["api_key"]["value"] == "v"
    else:
        async def main():
            async with hc.AsyncClient(daemon.socket, client="big") as ac:
                t = time.monotonic()
                with pytest.raises(hc.InvalidParams) as ei:
                    await ac.set(doc)
                took = time.monotonic() - t
                await ac.set_value("small", "v")
                rec = await ac.get("small")
                return ei, took, rec.credential["keys"]["api_key"]["value"] == "v"
        ei, took, epoch_ok = asyncio.run(main())
    msg = str(ei.value)
    assert "1048576-byte limit" in msg and "not sent" in msg, msg
    assert ei.value.data["max_frame_bytes"] == 1024 * 1024
    assert took < 10, "refused at once, not after reconnect attempts: %.1f s" % took
    assert epoch_ok
    assert "x" * 100 not in msg
    print("%s: a 2 MB request refused unsent in %.3f s; the connection went on" % (flavour, took))
