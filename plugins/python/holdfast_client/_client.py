"""The thread-safe client: one connection at a time, any number of threads, pipelined requests;
it reconnects after the daemon restarts and re-makes its subscriptions."""

from __future__ import annotations

import itertools
import json
import logging
import os
import socket
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from ._errors import (
    Busy,
    CallTimeout,
    ConnectionClosed,
    HoldfastError,
    StorageError,
    error_from_response,
    scrub,
)
from ._paths import default_socket_path
from ._shared import (
    READ_EOF,
    READ_FAILED,
    READ_NOT_JSON,
    _CLOSED,
    _CONNECTED,
    _RECONNECTING,
    SubscriptionBase,
    SubscriptionsMixin,
    cannot_connect,
    could_not_reconnect,
    daemon_said,
    hello_answer,
    hello_failed,
    in_flight_lost,
    owed_wait_bound,
)
from ._protocol import (
    as_dict,
    as_int,
    as_list,
    CLOSED,
    DEFAULT_STORE,
    PROTOCOL_VERSION,
    RECONNECT_ATTEMPTS,
    CredentialRecord,
    Lease,
    SetResult,
    SubQueue,
    SubRecord,
    SubRegistry,
    SubscriptionTable,
    check_peer,
    encode_request,
    max_frame_bytes,
    reconnect_delays,
    lease,
    record,
    set_result,
)

logger = logging.getLogger("holdfast_client")

Event = Dict[str, Any]
Sink = Callable[[Event], None]

class _Gone(Exception):
    """A request bound to a connection that is no longer the current one (an unsubscribe of
    an id of a lost connection): not sent, as it would name another subscription."""


class _Pending:
    __slots__ = ("event", "result", "error", "on_answer", "on_error", "epoch")

    def __init__(self, on_answer: Optional[Callable[[Any, int], None]] = None,
                 on_error: Optional[Callable[[HoldfastError], None]] = None) -> None:
        self.event = threading.Event()
        self.epoch = -1  # the connection it was sent on
        self.result: Any = None
        self.error: Optional[HoldfastError] = None
        # For subscriptions: run by the reader thread when the answer arrives, before it reads
        # the next line (so no event of the subscription is misfiled) — also when the caller
        # has stopped waiting (a timeout), so its subscription is unsubscribed, not leaked.
        self.on_answer = on_answer
        self.on_error = on_error


class Subscription(SubscriptionBase):
    """The events of one subscription (``stream.subscribe`` or ``cred.watch``), in order, from
    a queue of its own: iterate over it (blocking), or call ``next(timeout)``.

    A stream subscription ends after its run's ``finish`` event; iteration stops there. It
    drops nothing, however slowly it is read: every event arrives exactly once and in order,
    also across a reconnect (it is re-made from the last seq it received). A credential watch
    keeps at most ``max_queued`` events; past that the oldest are dropped and a
    ``{"type": "resync"}`` event says how many (list again); a reconnect adds a ``resync`` too
    (``missed`` is ``None``: changes while disconnected were not seen).

    ``id`` is this client's id for it (stable across reconnects; its events carry it in
    ``subscription``). ``close()`` unsubscribes: once it returns, no further event of it
    arrives.
    """

    def __init__(self, client: "Client", kind: str, params: Dict[str, Any],
                 max_queued: int) -> None:
        self._client = client
        self._q = SubQueue(kind, max_queued, int(params.get("after_seq") or 0))
        self._cv = threading.Condition(threading.Lock())
        self._listener: Optional[Callable[[], None]] = None
        self._reason: Optional[str] = None
        method = "stream.subscribe" if kind == "stream" else "cred.watch"
        self._rec: SubRecord = client._subscribe(method, params, self._push, self)
        self.id: Any = self._rec.local

    def _push(self, params: Any) -> None:  # the reader thread
        with self._cv:
            self._q.push(params)
            self._cv.notify_all()
        listener = self._listener
        if listener is not None:
            listener()  # outside the queue's lock: it may take its own

    def _close_queue(self) -> None:
        with self._cv:
            self._q.close()

    def _listen(self, listener: Optional[Callable[[], None]]) -> None:
        """Call ``listener`` (from the reader thread) after each event is queued: a waiter on
        several sources at once (``RecoveringStream``) wakes for this one too."""
        self._listener = listener

    def next(self, timeout: Optional[float] = None) -> Optional[Event]:
        """The next event's ``params`` (for a stream: ``{"subscription", "run_id", "seq",
        "event"}``), or ``None`` if none comes within ``timeout`` seconds or the subscription
        has ended (after ``finish``, or ``close()``). ``ConnectionClosed`` if the connection is
        gone for good (the client gave up reconnecting) and every queued event has been
        taken."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._cv:
                what, ev = self._q.take(self.id)
                if what == "empty":
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return None
                    self._cv.wait(remaining)
                    continue
            return self._taken(what, ev, self._client)

    @property
    def finished(self) -> bool:
        """Nothing more will come: the run's ``finish`` was taken (or the subscription closed)."""
        with self._cv:
            return self._q.done

    def __iter__(self) -> Iterator[Event]:
        while True:
            ev = self.next()
            if ev is None:
                return
            yield ev

    def close(self) -> None:
        """Unsubscribe (if the connection is still open); the queue is dropped."""
        self._close_queue()
        try:
            self._client._close_sub(self._rec)
        except ConnectionClosed:
            pass  # the connection is gone, and the daemon's subscription with it

    def __enter__(self) -> "Subscription":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Client(SubscriptionsMixin):
    """A connection to the daemon, said hello to.

    ``socket_path``: default ``default_socket_path()``. ``client``: a name for the daemon's
    logs. ``plugin``: bind this connection to a plugin grant from the daemon's config file
    (``Forbidden`` if there is no such plugin). ``timeout``: seconds to wait for each response
    (``None``: forever). ``on_event``: called with each event's ``params`` from the reader
    thread (keep it short; it must not call this client and wait). ``max_queued_events``: events
    kept for ``events()``; past that the oldest are dropped and a ``{"type": "resync"}`` event
    says how many.

    Reconnecting (``reconnect=True``, the default): when the connection is lost (the daemon
    restarted or was upgraded), the client connects again to the same socket path, up to
    ``reconnect_attempts`` times with a doubling wait (0.05 s to 2 s; about 11 s in all for the
    default 10), says hello again with the same ``client`` and ``plugin``, and re-makes every
    open subscription (a stream's from the last seq it received: no event twice, none skipped).
    A call that was in flight when the connection broke raises ``ConnectionClosed`` — it is
    never retried, as the daemon may or may not have carried it out (retry it yourself if it is
    idempotent: every read is; ``cred.set`` with ``if_generation``, ``stream.append`` and the
    ``run.*`` log calls are too). Calls made while reconnecting wait for the new connection
    (within ``timeout``). If every attempt fails, the client is closed and every call and
    subscription raises ``ConnectionClosed``. What the old connection held is gone: its leases,
    and the producer role of a stream it had begun (``stream_resume`` takes it back). The
    first connect is not retried: ``Client(...)`` raises ``ConnectionClosed`` at once.

    The daemon's answer to ``hello`` is in ``.hello`` (its version, the methods it serves, and
    this connection's grant); ``.reconnects`` counts the reconnects so far.
    """

    def __init__(
        self,
        socket_path: Optional[str] = None,
        client: str = "python",
        plugin: Optional[str] = None,
        *,
        timeout: Optional[float] = 60.0,
        on_event: Optional[Sink] = None,
        max_queued_events: int = 10000,
        reconnect: bool = True,
        reconnect_attempts: int = RECONNECT_ATTEMPTS,
    ) -> None:
        self.socket_path = os.fspath(socket_path) if socket_path else default_socket_path()
        self.timeout = timeout
        self.on_event = on_event
        self.reconnect = reconnect
        self.reconnect_attempts = reconnect_attempts
        self.reconnects = 0
        self.max_pending = 0  # the most requests this client has had in flight at once
        self._ids = itertools.count(1)
        # Connection state, the pending map and the subscription registry.
        self._lock = threading.RLock()
        self._state_cv = threading.Condition(self._lock)
        self._send_lock = threading.Lock()
        self._pending: Dict[int, _Pending] = {}
        self._state = _CONNECTED
        self._close_reason: Optional[str] = None
        self._stop = threading.Event()  # close() was called: stop reconnecting
        self._hello_params: Dict[str, Any] = {"client": client, "protocol": PROTOCOL_VERSION}
        if plugin is not None:
            self._hello_params["plugin"] = plugin
        # The shared queue of events(): drop-oldest with a resync, as a credential watch's.
        self._events = SubQueue("cred", max_queued_events)
        self._events_cv = threading.Condition(threading.Lock())
        # Subscriptions: "user" ones feed events(), Subscription objects their own queues,
        # "internal" ones (single_flight_refresh) only the generation table. The table routes
        # the current connection's daemon ids; the registry holds what outlives a connection.
        self._subs = SubRegistry(self._lock)
        self._table = SubscriptionTable()
        self._internal_watches: Dict[str, Any] = {}  # store name -> internal local id
        self._changes: Dict[Tuple[Any, Any], Any] = {}  # (store, id) -> last generation seen
        self._changes_cv = threading.Condition(threading.Lock())
        # Daemon subscription slots the application no longer has but the daemon may still
        # count, on the current connection: a given-up subscribe until its answer comes, a
        # late-answered subscription until its unsubscribe is answered. A subscribe answered
        # busy waits for them (bounded) and is sent once more.
        self._owed: Dict[Any, int] = {}

        self._sock = self._connect()
        self._rfile = self._sock.makefile("rb")
        self._reader = threading.Thread(
            target=self._run_reader, name="holdfast-client-reader", daemon=True
        )
        self._reader.start()
        try:
            self.hello: Dict[str, Any] = self.call("hello", **self._hello_params)
        except BaseException:
            self.close()
            raise

    # -- connection ----------------------------------------------------------------------------

    def _connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.socket_path)
        except OSError as e:
            sock.close()
            raise cannot_connect(self.socket_path, e) from None
        try:
            check_peer(sock)
        except BaseException:
            sock.close()
            raise
        return sock

    def close(self) -> None:
        """Close the connection (and stop reconnecting); calls in flight fail with
        ``ConnectionClosed``."""
        with self._lock:
            already = self._state == _CLOSED
            self._state = _CLOSED
            if self._close_reason is None:
                self._close_reason = "the client closed the connection"
            self._state_cv.notify_all()
            sock = self._sock
        self._stop.set()
        if not already:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._reader is not threading.current_thread():
            self._reader.join(timeout=5)
        with self._lock:
            sock, rfile = self._sock, self._rfile
        try:
            rfile.close()
        except OSError:
            pass
        sock.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- reader thread -------------------------------------------------------------------------

    def _run_reader(self) -> None:
        while True:
            reason = self._read_loop(self._rfile)
            if not self._reconnect(reason):
                return

    def _read_loop(self, rfile: Any) -> str:
        """Read the connection until it ends; returns why."""
        reason = READ_EOF
        try:
            for line in rfile:
                if not line.strip():
                    continue
                try:
                    msg = json.loads(line)
                except ValueError:
                    reason = READ_NOT_JSON
                    break
                finally:
                    line = None
                self._dispatch(msg)
        except (OSError, ValueError):
            reason = READ_FAILED
        return reason

    def _reconnect(self, reason: str) -> bool:
        """The connection ended: fail what was in flight, then connect again (unless closed or
        ``reconnect`` is off). Returns whether a new connection is up."""
        with self._lock:
            if self._close_reason is not None and self._state != _CLOSED:
                reason = self._close_reason  # the daemon's own refusal, if it said one
                self._close_reason = None
            give_up = self._state == _CLOSED or not self.reconnect or self._stop.is_set()
            self._state = _CLOSED if give_up else _RECONNECTING
            pending, self._pending = self._pending, {}
            self._owed.clear()  # the lost connection's slots went with it
            self._state_cv.notify_all()
            old = (self._sock, self._rfile)
        lost = in_flight_lost(reason, give_up)
        for w in pending.values():
            w.error = ConnectionClosed(message=lost)
            w.event.set()
        with self._send_lock:
            for f in old:
                try:
                    f.close()
                except OSError:
                    pass
        if give_up:
            self._fail_all(reason)
            return False
        logger.warning("holdfast: %s; reconnecting to %s", reason, self.socket_path)
        last = reason
        for delay in reconnect_delays(self.reconnect_attempts):
            if self._stop.wait(delay):
                break
            try:
                sock, rfile, hello = self._open_again()
            except HoldfastError as e:
                last, final = hello_failed(e)
                if final:
                    break
                continue
            with self._lock:
                if self._state == _CLOSED:
                    rfile.close()
                    sock.close()
                    return False
                self._sock, self._rfile = sock, rfile
                live, epoch = self._connection_up(hello)
                self._state = _CONNECTED
                self._state_cv.notify_all()
            self._resubscribe_all(live, epoch)
            return True
        with self._lock:
            if self._close_reason is None:
                self._close_reason = could_not_reconnect(reason, self.socket_path, last)
            self._state = _CLOSED
        self._fail_all(self._close_reason or reason)
        return False

    def _open_again(self) -> Tuple[socket.socket, Any, Dict[str, Any]]:
        """Connect and say hello (the reader thread, before it reads the new connection)."""
        sock = self._connect()
        rfile = None
        try:
            sock.settimeout(self.timeout if self.timeout is not None else 60.0)
            rid = next(self._ids)
            sock.sendall(encode_request(rid, "hello", self._hello_params))
            rfile = sock.makefile("rb")
            while True:
                hello = hello_answer(rfile.readline(), rid)
                if hello is not None:
                    break
            sock.settimeout(None)
            return sock, rfile, hello
        except HoldfastError:
            # The daemon's own answer (a refused hello: Forbidden is a PermissionError and
            # InvalidParams a ValueError, so the clause below would hide it as a failed
            # connect and retry): its kind and message reach _reconnect as they are.
            if rfile is not None:
                rfile.close()
            sock.close()
            raise
        except (OSError, ValueError):
            if rfile is not None:
                rfile.close()
            sock.close()
            raise ConnectionClosed(message="hello on the new connection failed") from None
        except BaseException:
            if rfile is not None:
                rfile.close()
            sock.close()
            raise

    def _dispatch_response(self, msg: Dict[str, Any]) -> None:
        mid = msg.get("id")
        with self._lock:
            waiter = self._pending.pop(mid, None) if isinstance(mid, int) else None
            if waiter is None:
                # An answer to no request of ours (id null): keep its message for the callers
                # that will see the connection close.
                said = daemon_said(msg)
                if said is not None:
                    self._close_reason = said
                return
        if "error" in msg:
            waiter.error = error_from_response(msg["error"])
            if waiter.on_error is not None:
                waiter.on_error(waiter.error)
        elif "result" in msg:
            waiter.result = msg["result"]
            if waiter.on_answer is not None:
                waiter.on_answer(waiter.result, waiter.epoch)
        else:
            waiter.error = StorageError(message="a response with neither result nor error")
        with self._lock:  # after on_answer: it owes the late answer's unsubscribe
            if self._owed.pop(("sub", mid), None) is not None:
                self._state_cv.notify_all()
            waiter.event.set()

    def _dispatch_event(self, params: Any) -> None:
        if not isinstance(params, dict):
            return
        if params.get("type") == "cred.changed":
            key = (params.get("store"), params.get("id"))
            with self._changes_cv:
                self._changes[key] = params.get("generation")
                self._changes_cv.notify_all()
        elif params.get("type") == "resync":
            with self._changes_cv:
                self._changes_cv.notify_all()
        self._table.route(params)

    def _deliver(self, params: Event) -> None:
        with self._events_cv:
            self._events.push(params)
            self._events_cv.notify_all()
        cb = self.on_event
        if cb is not None:
            try:
                cb(params)
            except Exception:  # a callback's bug must not kill the reader
                pass

    def _fail_all(self, reason: str) -> None:
        with self._lock:
            self._state = _CLOSED
            if self._close_reason is None:
                self._close_reason = reason
            reason = self._close_reason
            pending, self._pending = self._pending, {}
            self._state_cv.notify_all()
        for w in pending.values():
            w.error = ConnectionClosed(message=reason)
            w.event.set()
        with self._events_cv:
            self._events.push(CLOSED)
            self._events_cv.notify_all()
        self._end_subscriptions(reason)
        with self._changes_cv:
            self._changes_cv.notify_all()

    # -- calls ---------------------------------------------------------------------------------

    def call(self, method: str, /, **params: Any) -> Any:
        """Call ``method`` with ``params`` and return its ``result``; raises ``HoldfastError``.
        Parameters whose value is ``None`` are left out. (For ``cred.watch`` use ``watch()``,
        which routes the subscription's events to ``events()``.) Subscription ids in results,
        events and ``unsubscribe`` are this client's (stable across reconnects)."""
        if method in ("cred.watch", "stream.subscribe"):
            return self._subscribe(method, params, self._deliver).answer
        if method == "unsubscribe" and set(params) == {"subscription"}:
            return {"unsubscribed": self.unsubscribe(params["subscription"])}
        return self._call(method, params)

    def _call(
        self,
        method: str,
        params: Dict[str, Any],
        on_answer: Optional[Callable[[Any, int], None]] = None,
        *,
        epoch: Optional[int] = None,
        wait: bool = True,
        on_error: Optional[Callable[[HoldfastError], None]] = None,
    ) -> Any:
        """Send a request and wait for its answer. ``epoch``: only on that connection
        (``_Gone`` if it is not the current one). ``wait=False``: send only (the reader thread's
        own requests; their answers go to ``on_answer``/``on_error``)."""
        rid = next(self._ids)
        line: Optional[bytes] = encode_request(rid, method, params,
                                               max_frame_bytes(getattr(self, "hello", None)))
        waiter = _Pending(on_answer, on_error)
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        dead: Optional[socket.socket] = None  # a connection a send found broken
        try:
            while True:
                with self._lock:
                    while wait and epoch is None and (
                        self._state == _RECONNECTING
                        or (self._state == _CONNECTED and self._sock is dead)
                    ):
                        remaining = None if deadline is None else deadline - time.monotonic()
                        if remaining is not None and remaining <= 0:
                            raise CallTimeout(message="no connection to the daemon for %s "
                                              "within %ss (reconnecting)"
                                              % (method, self.timeout))
                        self._state_cv.wait(remaining)
                    if self._state == _CLOSED:
                        raise ConnectionClosed(
                            message=self._close_reason or "the connection is closed")
                    if epoch is not None and (
                        epoch != self._subs.epoch or self._state != _CONNECTED
                    ):
                        raise _Gone()
                    if self._state != _CONNECTED or self._sock is dead:
                        raise ConnectionClosed(message="not connected to the daemon "
                                               "(reconnecting)")
                    waiter.epoch = self._subs.epoch
                    self._pending[rid] = waiter
                    if len(self._pending) > self.max_pending:
                        self.max_pending = len(self._pending)
                    sock = self._sock
                try:
                    with self._send_lock:
                        sock.sendall(line)  # type: ignore[arg-type]
                    break
                except OSError:
                    with self._lock:
                        self._pending.pop(rid, None)
                    # The line did not get through whole, so the daemon did not act on it:
                    # safe to send again on the next connection, once the reader has one.
                    if not (self.reconnect and wait and epoch is None):
                        raise ConnectionClosed(message="sending to the daemon failed") from None
                    dead = sock
        finally:
            line = None
        if not wait:
            return None
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not waiter.event.wait(remaining):
            with self._lock:
                if on_answer is None:
                    self._pending.pop(rid, None)
                elif not waiter.event.is_set() and waiter.epoch == self._subs.epoch:
                    # A subscribe given up on: the daemon may make it anyway, and counts it
                    # until its answer is read and unsubscribed (an unsubscribe given up on
                    # frees its slot only when the daemon answers it).
                    self._owed[("sub", rid)] = waiter.epoch
            # else: left pending, so its answer still reaches on_answer (which unsubscribes a
            # subscription nobody waits for); the answer, or the connection's end, removes it.
            raise CallTimeout(message="no answer to %s within %ss" % (method, self.timeout))
        if waiter.error is not None:
            err, waiter.error = waiter.error, None
            scrub(err, params)
            raise err
        return waiter.result

    def _send_nowait(self, method: str, params: Dict[str, Any], epoch: int,
                     on_answer: Optional[Callable[[Any, int], None]] = None,
                     on_error: Optional[Callable[[HoldfastError], None]] = None) -> bool:
        """A request of the client's own, on connection ``epoch`` only, whose answer nobody
        waits for. From the reader thread it is sent by a thread of its own: the reader must
        never wait for the send lock (a caller blocked in a send may be waiting for the daemon
        to read, and the daemon for the reader). Returns ``True``: a request that cannot be
        sent is dropped here, as its connection is gone."""
        def send() -> None:
            try:
                self._call(method, params, on_answer, epoch=epoch, wait=False,
                           on_error=on_error)
            except (_Gone, ConnectionClosed):
                pass  # that connection is gone, and what the request was about with it

        if threading.current_thread() is self._reader:
            threading.Thread(target=send, name="holdfast-client-send", daemon=True).start()
        else:
            send()
        return True

    def _subscribe(
        self,
        method: str,
        params: Dict[str, Any],
        sink: Sink,
        owner: Optional[Subscription] = None,
    ) -> SubRecord:
        """Subscribe, routing the subscription's events to ``sink`` from the moment its answer
        is read (``owner``: the ``Subscription`` told when the connection closes for good).
        A subscribe that fails or times out leaves nothing behind: if the daemon made the
        subscription anyway, it is unsubscribed when its answer arrives."""
        rec = self._subs.add(method, params, sink, owner)
        with self._lock:
            owed = bool(self._owed)  # (they may be freed before the busy answer is read)
        try:
            try:
                result = self._call(method, rec.resubscribe_params(), self._claim(rec))
            except Busy as e:
                # The connection's 16 slots are full, perhaps only with subscribes this
                # client gave up on whose answers are still on their way: once those are
                # unsubscribed, try once more.
                if isinstance(e, CallTimeout) or not (self._wait_owed() or owed):
                    raise
                result = self._call(method, rec.resubscribe_params(), self._claim(rec))
        except BaseException:
            self._abandon_sub(rec)
            raise
        rec.answer = dict(result, subscription=rec.local)
        return rec

    def _owed_freed(self) -> None:
        self._state_cv.notify_all()

    def _wait_owed(self) -> bool:
        """Whether slots were owed on this connection; if so, wait (at most
        ``OWED_SLOTS_WAIT`` seconds, or the timeout) until they are free."""
        deadline = time.monotonic() + owed_wait_bound(self.timeout)
        with self._lock:
            if not self._owed:
                return False
            while self._owed and self._state == _CONNECTED:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._state_cv.wait(remaining)
            return True

    def _resync_seen(self) -> None:
        with self._changes_cv:
            self._changes_cv.notify_all()

    def _resubscribe_failed(self, rec: SubRecord, err: HoldfastError, why: str) -> None:
        if rec.sink == self._deliver:
            # A watch()/stream_subscribe() id: its events go to events(), so that is where
            # the application learns it ended (nothing more of it will come).
            rec.sink({"subscription": rec.local, "type": "closed", "kind": err.kind,
                      "reason": why})
        else:  # single_flight_refresh's own watch: the next use makes it again
            with self._lock:
                for store, local in list(self._internal_watches.items()):
                    if local == rec.local:
                        del self._internal_watches[store]

    def _close_sub(self, rec: SubRecord) -> bool:
        """Close ``rec``: unsubscribe its daemon subscription if the current connection has
        one; if its (re-)subscribe is in flight, the answer is unsubscribed when it comes.
        Never sends a daemon id of a lost connection. Returns whether it was open."""
        was_open, epoch, d = self._closing(rec)
        if d is None:
            return was_open
        try:
            # on_answer: an unsubscribe that times out stays pending, its slot owed until the
            # daemon answers (a subscribe answered busy meanwhile waits for it).
            res = self._call("unsubscribe", {"subscription": d}, lambda _r, _e: None,
                             epoch=epoch)
        except _Gone:
            return was_open  # the connection went, and the subscription with it
        finally:
            self._table.release(d)
        return bool(res["unsubscribed"])

    # -- subscriptions -------------------------------------------------------------------------

    def subscribe_stream(
        self, run_id: str, after_seq: int = 0, *, max_queued: int = 10000
    ) -> Subscription:
        """``stream.subscribe`` into a queue of its own: the run's events with seq >
        ``after_seq``, each once and in order, ending with ``finish`` (an ended run: ``finish``
        alone; read its final message with ``stream_get(reveal=True)``). Iterate over the
        returned ``Subscription``; ``close()`` it to stop early. ``max_queued`` applies to
        credential watches only."""
        return Subscription(self, "stream", {"run_id": run_id, "after_seq": after_seq},
                            max_queued)

    def subscribe_cred(self, store: Optional[str] = None, *, max_queued: int = 10000
                       ) -> Subscription:
        """``cred.watch`` into a queue of its own (``watch()`` feeds ``events()`` instead)."""
        return Subscription(self, "cred", {"store": store}, max_queued)

    def unsubscribe(self, subscription: Any) -> bool:
        """``unsubscribe``: once it returns, no event of ``subscription`` (an id this client
        gave) arrives. Returns whether it was open (a stream subscription ends by itself with
        ``finish``)."""
        rec = self._unsubscribing(subscription)
        if rec is None:
            return False
        return self._close_sub(rec)

    # -- typed helpers -------------------------------------------------------------------------

    def get(self, id: str, store: Optional[str] = None) -> CredentialRecord:
        """``cred.get`` -> ``CredentialRecord``."""
        return record(self.call("cred.get", id=id, store=store))

    def set(
        self,
        credential: Dict[str, Any],
        if_generation: Optional[int] = None,
        store: Optional[str] = None,
        keep_updated_at: bool = False,
    ) -> SetResult:
        """``cred.set`` with a whole credential document (``{"id", "credential_type"?, "keys":
        {name: {"value", …}}, …}``); with ``if_generation``, only if the stored generation is
        that (``Conflict`` otherwise; 0: only if it does not exist); with ``keep_updated_at``,
        the document's own ``updated_at`` is stored instead of the write's time.
        -> ``SetResult``."""
        return set_result(
            self.call("cred.set", credential=credential, if_generation=if_generation, store=store,
                      keep_updated_at=keep_updated_at or None)
        )

    def set_value(
        self,
        id: str,
        value: str,
        if_generation: Optional[int] = None,
        store: Optional[str] = None,
    ) -> SetResult:
        """``cred.set`` shorthand: an ``api_key`` credential with one key ``api_key``."""
        return set_result(
            self.call("cred.set", id=id, value=value, if_generation=if_generation, store=store)
        )

    def delete(self, id: str, store: Optional[str] = None) -> bool:
        """``cred.delete`` -> whether it existed."""
        return bool(self.call("cred.delete", id=id, store=store)["deleted"])

    def list(self, store: Optional[str] = None) -> List[Dict[str, Any]]:
        """``cred.list`` -> a list of ``{id, generation, …metadata}`` (no secret values)."""
        return as_list(self.call("cred.list", store=store)["credentials"])

    def exists(self, id: str, store: Optional[str] = None) -> bool:
        """``cred.exists`` -> bool."""
        return bool(self.call("cred.exists", id=id, store=store)["exists"])

    def watch(self, store: Optional[str] = None) -> Any:
        """``cred.watch``: subscribe to change events of ``store`` (default: every store this
        connection may touch). Returns the subscription id; events arrive through
        ``events()`` / ``next_event()`` / ``on_event``."""
        return self._subscribe("cred.watch", {"store": store}, self._deliver).local

    def refresh_lease(self, id: str, ttl_ms: int, store: Optional[str] = None) -> Lease:
        """``cred.refresh_lease`` -> ``Lease``. Granted: refresh the credential and write it
        (with ``if_generation``) within ``ttl_ms``; the write releases the lease."""
        return lease(self.call("cred.refresh_lease", id=id, ttl_ms=ttl_ms, store=store))

    def release_lease(self, id: str, store: Optional[str] = None) -> bool:
        """``cred.release_lease`` -> whether this connection held it."""
        return bool(self.call("cred.release_lease", id=id, store=store)["released"])

    def status(self) -> Dict[str, Any]:
        """``admin.status`` -> dict (uptime, stores, sealed state, counts, connections)."""
        return as_dict(self.call("admin.status"))

    # -- streams (docs/protocol.md "Streams") --------------------------------------------------

    def stream_begin(
        self,
        run_id: str,
        thread_id: Optional[str] = None,
        model: Optional[str] = None,
        takeover: bool = False,
    ) -> Dict[str, Any]:
        """``stream.begin`` -> ``{stream_id, epoch, next_seq}``. ``Conflict`` if the run is
        streaming and ``takeover`` is false, or if it already ended."""
        return as_dict(self.call(
            "stream.begin", run_id=run_id, thread_id=thread_id, model=model,
            takeover=takeover or None,
        ))

    def stream_append(self, run_id: str, stream_id: str, seq: int,
                      events: List[Dict[str, Any]]) -> int:
        """``stream.append`` -> the last seq acknowledged (durable). A batch already taken is
        acknowledged again and dropped, so retrying after a lost answer is safe."""
        return as_int(self.call(
            "stream.append", run_id=run_id, stream_id=stream_id, seq=seq, events=events
        )["acked_seq"])

    def stream_interrupt(self, run_id: str, stream_id: str, cause: Any,
                         continuation: Optional[str] = None) -> Dict[str, Any]:
        """``stream.interrupt`` -> the recovery plan (``plan``, ``wait_ms``, ``next_seq``, …).
        ``cause``: a cause name, or ``{"status", "message", "retry_after"}``. ``continuation``:
        how you will continue the text after an R1/R3 plan, ``"exact"`` (the daemon's default:
        the provider continues the prefix, nothing is trimmed) or ``"restated"`` (the model may
        restate the prefix's end; the restatement is removed)."""
        return as_dict(self.call("stream.interrupt", run_id=run_id, stream_id=stream_id,
                                 cause=cause, continuation=continuation))

    def stream_resume(
        self,
        run_id: str,
        model: Optional[str] = None,
        thread_id: Optional[str] = None,
        fail_on_stale: bool = False,
        continuation: Optional[str] = None,
    ) -> Dict[str, Any]:
        """``stream.resume`` -> ``{stream_id, epoch, next_seq, checkpoint, plan}``
        (``continuation`` as for ``stream_interrupt``)."""
        return as_dict(self.call(
            "stream.resume", run_id=run_id, model=model, thread_id=thread_id,
            fail_on_stale=fail_on_stale or None, continuation=continuation,
        ))

    def stream_commit(
        self,
        run_id: str,
        stream_id: str,
        final_message: Any,
        content_from_stream: bool = False,
    ) -> Dict[str, Any]:
        """``stream.commit``: the final message durable and the run ended, in one step. With
        ``content_from_stream``, the message's ``content`` is the text the run streamed."""
        return as_dict(self.call(
            "stream.commit", run_id=run_id, stream_id=stream_id, final_message=final_message,
            content_from_stream=content_from_stream or None,
        ))

    def stream_abort(self, run_id: str, stream_id: str,
                     reason: Optional[str] = None) -> Dict[str, Any]:
        """``stream.abort``."""
        return as_dict(self.call("stream.abort", run_id=run_id, stream_id=stream_id, reason=reason))

    def stream_subscribe(self, run_id: str, after_seq: int = 0) -> Any:
        """``stream.subscribe``: the run's events with seq > ``after_seq`` arrive through
        ``events()`` / ``next_event()`` as ``{"subscription", "run_id", "seq", "event"}``,
        ending with an event of type ``finish``. Returns the subscription id. If this client's
        event queue overflows (a ``resync``), subscribe again from the last seq seen. (For a
        queue of its own that never drops an event: ``subscribe_stream``.)"""
        return self._subscribe(
            "stream.subscribe", {"run_id": run_id, "after_seq": after_seq}, self._deliver
        ).local

    def stream_get(self, run_id: str, reveal: bool = False) -> Dict[str, Any]:
        """``stream.get``."""
        return as_dict(self.call("stream.get", run_id=run_id, reveal=reveal or None))

    def stream_list(self) -> List[Dict[str, Any]]:
        """``stream.list`` -> the active runs."""
        return as_list(self.call("stream.list")["runs"])

    def checkpoint_put(self, run_id: str, snapshot: Dict[str, Any]) -> Dict[str, Any]:
        """``checkpoint.put``: an idempotent upsert of a runtime's own snapshot."""
        return as_dict(self.call("checkpoint.put", run_id=run_id, snapshot=snapshot))

    def checkpoint_get(self, run_id: str) -> Dict[str, Any]:
        """``checkpoint.get`` -> the snapshot (``NotFound`` if none)."""
        return as_dict(self.call("checkpoint.get", run_id=run_id))

    def checkpoint_delete(self, run_id: str) -> bool:
        """``checkpoint.delete`` -> whether there was one."""
        return bool(self.call("checkpoint.delete", run_id=run_id)["deleted"])

    # -- run logs (docs/protocol.md "Run logs") ------------------------------------------------

    def run_log_node(self, run_id: str, detail: Dict[str, Any]) -> Dict[str, Any]:
        """``run.log_node``: a node completion (hive's NodeDetail fields). The same
        ``(node_id, attempt)`` again keeps one entry: the same content writes nothing, other
        content replaces it. -> ``{seq, written, replaced}``."""
        return as_dict(self.call("run.log_node", run_id=run_id, detail=detail))

    def run_ensure_node(self, run_id: str, node_id: str,
                        detail: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """``run.ensure_node``: log ``detail`` only if the log has no entry for ``node_id``;
        atomic against every other writer (threads, processes, restarts). -> ``{seq, written}``."""
        return as_dict(self.call("run.ensure_node", run_id=run_id, node_id=node_id,
                                 detail=detail or {}))

    def run_log_step(self, run_id: str, step: Dict[str, Any]) -> Dict[str, Any]:
        """``run.log_step``: a step (hive's NodeStepLog), idempotent by
        ``(node_id, step_index)``."""
        return as_dict(self.call("run.log_step", run_id=run_id, step=step))

    def run_tool_begin(self, run_id: str, tool_call_id: str, name: str,
                       input: Any = None) -> Dict[str, Any]:
        """``run.tool_begin``: call it before running a tool, so a resumed stream's R2 plan
        knows the call began."""
        return as_dict(self.call(
            "run.tool_begin", run_id=run_id, tool_call_id=tool_call_id, name=name, input=input
        ))

    def run_tool_end(self, run_id: str, tool_call_id: str, result: Any = None,
                     is_error: bool = False) -> Dict[str, Any]:
        """``run.tool_end``: the tool finished (the first end is kept)."""
        return as_dict(self.call(
            "run.tool_end", run_id=run_id, tool_call_id=tool_call_id, result=result,
            is_error=is_error,
        ))

    def run_end(self, run_id: str, status: str, **fields: Any) -> Dict[str, Any]:
        """``run.end`` -> the summary (hive's summary.json). Idempotent: a second end returns
        the same summary. ``fields``: agent_id, goal_id, execution_quality, trace_id,
        execution_id, started_at, duration_ms, node_path."""
        return as_dict(self.call("run.end", run_id=run_id, status=status, **fields)["summary"])

    def run_get(self, run_id: str) -> Dict[str, Any]:
        """``run.get`` -> the run's entries, summary (so far) and load report."""
        return as_dict(self.call("run.get", run_id=run_id))

    def run_list(self, status: Optional[str] = None, since_ms: Optional[int] = None,
                 until_ms: Optional[int] = None) -> List[Dict[str, Any]]:
        """``run.list`` -> runs, newest activity first."""
        return as_list(self.call("run.list", status=status, since_ms=since_ms,
                                 until_ms=until_ms)["runs"])

    # -- events --------------------------------------------------------------------------------

    def next_event(self, timeout: Optional[float] = None) -> Optional[Event]:
        """The next event's ``params`` (``{"subscription", "type": "cred.changed", "store",
        "id", "generation", "deleted", "source"}``, a ``resync``, a stream's event, or
        ``{"subscription", "type": "closed", "kind", "reason"}``: that subscription could not
        be re-made after a reconnect and has ended), or ``None`` if none comes
        within ``timeout`` seconds. ``ConnectionClosed`` once the connection is gone and every
        queued event has been taken."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._events_cv:
            while True:
                what, ev = self._events.take(None)
                if what == "event":
                    return ev
                if what == "closed":
                    raise ConnectionClosed(
                        message=self._close_reason or "the connection is closed"
                    )
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._events_cv.wait(remaining)

    def events(self, timeout: Optional[float] = None) -> Iterator[Event]:
        """Iterate over event ``params`` as they arrive; stop when none arrives for ``timeout``
        seconds (``None``: never; the iteration then ends only by ``ConnectionClosed``)."""
        while True:
            ev = self.next_event(timeout)
            if ev is None:
                return
            yield ev

    # -- for single_flight_refresh -------------------------------------------------------------

    def _internal_watch(self, store: Optional[str]) -> Any:
        """A subscription whose events feed only the generation table (not ``events()``)."""
        key = store or DEFAULT_STORE
        with self._lock:
            sub = self._internal_watches.get(key)
        if sub is None:
            sub = self._subscribe("cred.watch", {"store": store}, lambda _ev: None).local
            with self._lock:
                self._internal_watches.setdefault(key, sub)
        return sub

    def _wait_for_change(self, store: Optional[str], id: str, newer_than: int,
                         timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for an event saying ``(store, id)`` is past
        generation ``newer_than`` (or deleted). Returns whether one came."""
        deadline = time.monotonic() + timeout
        key = (store or DEFAULT_STORE, id)
        with self._changes_cv:
            while True:
                if key in self._changes:
                    gen = self._changes[key]
                    if gen is None or gen > newer_than:
                        return True
                if self.closed:
                    return False
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changes_cv.wait(remaining)
