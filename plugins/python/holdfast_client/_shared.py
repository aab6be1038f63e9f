"""What ``Client`` (threads) and ``AsyncClient`` (an event loop) share: the words and checks
of a connection and its reconnect (plain functions), the subscription objects' common part
(``SubscriptionBase``), and the subscription bookkeeping both run from their reader (thread or
task), never waiting on anything (``SubscriptionsMixin``). Where they differ — a lock or none,
a condition to notify or none, how a request is sent and read — each client fills in the few
hooks of the mixin; whatever waits (a call, a subscribe, a close) stays in each client."""

from __future__ import annotations

import json
import logging
from typing import Any, Callable, Dict, List, Optional, Tuple

from ._errors import ConnectionClosed, HoldfastError, StorageError, error_from_response
from ._protocol import (
    CLOSED,
    OWED_SLOTS_WAIT,
    RECONNECT_HINT,
    SubQueue,
    SubRecord,
    SubRegistry,
    SubscriptionTable,
)

logger = logging.getLogger("holdfast_client")

Event = Dict[str, Any]

#: A client's connection state (``_state``): closed is for good (not while reconnecting).
_CONNECTED, _RECONNECTING, _CLOSED = "connected", "reconnecting", "closed"

#: Why a connection's read loop ended.
READ_EOF = "the daemon closed the connection"
READ_NOT_JSON = "the daemon sent a line that is not JSON"
READ_FAILED = "the connection to the daemon failed"


# -- the connection's words, the same for both clients -------------------------------------------

def cannot_connect(socket_path: str, e: OSError) -> ConnectionClosed:
    """The first connect (or a reconnect's) to ``socket_path`` failed with ``e``."""
    return ConnectionClosed(
        message="cannot connect to the holdfast daemon at %s: %s"
        % (socket_path, e.strerror or type(e).__name__)
    )


def in_flight_lost(reason: str, give_up: bool) -> str:
    """What a call in flight when the connection ended is told (``give_up``: no reconnect)."""
    return reason + (
        "" if give_up
        else "; the call was in flight, so it may or may not have been carried out"
    )


def hello_failed(e: HoldfastError) -> Tuple[str, bool]:
    """Why saying hello on a new connection failed, and whether to stop trying: the daemon
    refused us (a plugin grant gone), so retrying won't help; close now, saying why."""
    if e.kind not in ("storage", "busy"):
        return "the daemon refused the hello (%s): %s" % (e.kind, e.message), True
    return e.message, False


def could_not_reconnect(reason: str, socket_path: str, last: str) -> str:
    """The close reason once every reconnect attempt failed (``last``: the last one's)."""
    return "lost the connection to the holdfast daemon (%s) and could not reconnect to %s: " \
        "%s" % (reason, socket_path, last)


def hello_answer(line: bytes, rid: int) -> Optional[Dict[str, Any]]:
    """A line read after the hello (request ``rid``) on a new connection: the hello's result
    if it is its answer (a refusal raised as its error), ``None`` for a line to pass over.
    ``ConnectionClosed`` at the end of the connection, ``ValueError`` if it is not JSON."""
    if not line:
        raise ConnectionClosed(message="the daemon closed the connection at hello")
    msg = json.loads(line)
    if not (isinstance(msg, dict) and msg.get("id") in (rid, None) and "method" not in msg):
        return None
    if "error" in msg:
        raise error_from_response(msg["error"])
    if not isinstance(msg.get("result"), dict):
        raise StorageError(message="a hello answer without a result")
    result: Dict[str, Any] = msg["result"]
    return result


def owed_wait_bound(timeout: Optional[float]) -> float:
    """How long a subscribe answered busy waits for owed slots: ``OWED_SLOTS_WAIT`` seconds,
    or the call timeout if that is shorter."""
    return OWED_SLOTS_WAIT if timeout is None else min(OWED_SLOTS_WAIT, timeout)


def daemon_said(msg: Dict[str, Any]) -> Optional[str]:
    """An answer to no request of ours (the daemon's refusal of the connection, or of a line
    it could not attribute): its message, kept for the callers that will see the close."""
    err = msg.get("error")
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return "the daemon said: %s" % err["message"]
    return None


class SubscriptionBase:
    """What ``Subscription`` and ``AsyncSubscription`` share: the queue's view and the end."""

    _NAME = "Subscription"
    _q: SubQueue
    _reason: Optional[str]
    id: Any

    @property
    def kind(self) -> str:
        return self._q.kind

    @property
    def last_seq(self) -> int:
        """The seq of the last stream event taken (``after_seq`` to resume from)."""
        return self._q.last_seq

    @property
    def complete(self) -> Optional[bool]:
        """After a stream's ``finish`` was taken: whether every event before it was delivered
        (``False``: the run ended while the client was away — a reconnect — or before this
        subscription began from below its end, and the events in between are gone from the
        daemon; the finish's ``complete`` says the same). ``None`` before the finish."""
        return self._q.complete

    def _push(self, params: Any) -> None:
        raise NotImplementedError

    def _taken(self, what: str, ev: Optional[Event], client: "SubscriptionsMixin"
               ) -> Optional[Event]:
        """What ``next()`` gives for a take that was not ``"empty"``: the event (a stream's
        finish also stops the client routing to it), ``None`` once ended, or
        ``ConnectionClosed`` once the connection is gone for good and the queue drained."""
        if what == "event":
            if self._q.done:
                client._forget(self.id)
            return ev
        if what == "done":
            return None
        raise ConnectionClosed(
            message=self._reason or client._close_reason or "the connection is closed"
        )

    def _close_queue(self) -> None:
        """Drop the queue: ``next()`` ends, as after ``close()``."""
        self._q.close()

    def _end(self, reason: str) -> None:
        """The subscription cannot go on (the client gave up reconnecting, or re-making it
        failed): ``next()`` raises ``ConnectionClosed`` with ``reason`` once drained."""
        if self._reason is None:
            self._reason = reason
        self._push(CLOSED)

    def __repr__(self) -> str:
        return "%s(kind=%r, id=%r, last_seq=%r)" % (self._NAME, self.kind, self.id,
                                                    self.last_seq)


class SubscriptionsMixin:
    """The subscription bookkeeping of a client (and its state, ``closed`` and repr), the
    part that never waits. ``_lock`` orders it against the reader (a
    ``threading.RLock``, or a no-op in an event loop); the table routes the current
    connection's daemon ids, the registry holds what outlives a connection, and ``_owed``
    counts the daemon slots the application no longer has but the daemon may still count."""

    _NAME = "Client"
    socket_path: str
    _state: str
    hello: Dict[str, Any]
    reconnects: int
    _close_reason: Optional[str]
    _lock: Any
    _subs: SubRegistry
    _table: SubscriptionTable
    _owed: Dict[Any, int]

    @property
    def closed(self) -> bool:
        """Closed for good (by ``close()``, or reconnecting failed); not while reconnecting."""
        return self._state == _CLOSED

    def __repr__(self) -> str:
        return "%s(socket_path=%r, closed=%r)" % (self._NAME, self.socket_path, self.closed)

    # -- hooks ---------------------------------------------------------------------------------

    def _send_nowait(self, method: str, params: Dict[str, Any], epoch: int,
                     on_answer: Optional[Callable[[Any, int], None]] = None,
                     on_error: Optional[Callable[[HoldfastError], None]] = None) -> bool:
        """Send a request of the client's own on connection ``epoch`` only, waiting for
        nothing. Returns ``False`` if it is known not to have been sent."""
        raise NotImplementedError

    def _dispatch_event(self, params: Any) -> None:
        """An event's ``params`` (the reader)."""
        raise NotImplementedError

    def _dispatch_response(self, msg: Dict[str, Any]) -> None:
        """An answer, or a message that is not an event (the reader)."""
        raise NotImplementedError

    def _owed_freed(self) -> None:
        """An owed slot is free (under ``_lock``): wake whoever waits for one."""

    def _resync_seen(self) -> None:
        """A watch re-made after a reconnect is about to get its ``resync`` event."""

    def _resubscribe_failed(self, rec: SubRecord, err: HoldfastError, why: str) -> None:
        """Re-making ``rec``, which has no subscription object, failed."""

    # -- shared --------------------------------------------------------------------------------

    def _dispatch(self, msg: Any) -> None:
        """One message read from the daemon (the reader, before it reads the next line)."""
        if not isinstance(msg, dict):
            return
        if msg.get("method") == "event" and "id" not in msg:
            self._dispatch_event(msg.get("params"))
        else:
            self._dispatch_response(msg)

    def _connection_up(self, hello: Dict[str, Any]) -> Tuple[List[SubRecord], int]:
        """A new connection said ``hello`` (under ``_lock``): every old daemon id is void.
        Returns the records to re-make on it (``_resubscribe_all``) and its epoch."""
        self.hello = hello
        self.reconnects += 1
        self._table = SubscriptionTable()
        live = self._subs.new_connection()
        return live, self._subs.epoch

    def _resubscribe_all(self, live: List[SubRecord], epoch: int) -> None:
        logger.warning("holdfast: reconnected to %s", self.socket_path)
        for rec in live:
            self._resubscribe(rec, epoch)

    def _unsubscribing(self, subscription: Any) -> Optional[SubRecord]:
        """The record of ``subscription`` (an id of this client) about to be closed by
        ``unsubscribe``, its subscription object's queue dropped; ``None`` if none is open."""
        rec = self._subs.get(subscription)
        if rec is not None and isinstance(rec.owner, SubscriptionBase):
            rec.owner._close_queue()
        return rec

    def _closing(self, rec: SubRecord) -> Tuple[bool, int, Optional[Any]]:
        """Mark ``rec`` closed. Returns whether it was open, the connection it was made on,
        and the daemon id to unsubscribe now (``None``: none on the current connection; if
        its (re-)subscribe is in flight, the answer is unsubscribed when it comes)."""
        with self._lock:
            was_open = not rec.closed and not rec.finished
            epoch = rec.epoch
        return was_open, epoch, self._subs.close(rec)

    def _end_subscriptions(self, reason: str) -> None:
        """The connection is gone for good: every subscription object ends with ``reason``."""
        for rec in self._subs.all():
            if isinstance(rec.owner, SubscriptionBase):
                rec.owner._end(reason)

    def _settle(self, token: Any) -> None:
        """A slot owed (``_owed``) is free."""
        with self._lock:
            if self._owed.pop(token, None) is not None:
                self._owed_freed()

    def _unsubscribe_owed(self, sub: Any, epoch: int) -> None:
        """Unsubscribe daemon id ``sub`` of connection ``epoch`` that nobody wants, its slot
        owed until the daemon answers."""
        token = ("unsub", epoch, sub)
        with self._lock:
            if epoch == self._subs.epoch:
                self._owed[token] = epoch

        def settle(*_: Any) -> None:
            self._settle(token)

        if not self._send_nowait("unsubscribe", {"subscription": sub}, epoch, settle, settle):
            settle()

    def _claim(self, rec: SubRecord) -> Callable[[Any, int], None]:
        def claim(result: Any, epoch: int) -> None:  # the reader, before the next line
            if not isinstance(result, dict):
                return
            sub = result.get("subscription")
            table = self._table
            if self._subs.answered(rec, epoch, sub):
                table.claim(sub, lambda ev: self._route(rec, sub, ev))
            else:
                table.release(sub)
                self._unsubscribe_owed(sub, epoch)
        return claim

    def _route(self, rec: SubRecord, daemon_id: Any, ev: Event) -> None:  # the reader
        if not rec.accept(ev):
            return
        rec.sink(ev)
        if rec.finished:  # the daemon ended the subscription with the run's finish
            self._subs.drop(rec)
            self._table.release(daemon_id)

    def _resubscribe(self, rec: SubRecord, epoch: int) -> None:
        """Make ``rec`` again on a new connection (the reader: nothing is waited for)."""
        if rec.closed:
            return  # closed while the client reconnected: nothing to re-make
        claim = self._claim(rec)

        def answered(result: Any, epoch: int) -> None:
            if not rec.stream and not rec.closed:
                # Changes while disconnected were not seen: say so before any new event.
                ev: Event = {"subscription": rec.local, "type": "resync", "missed": None,
                             "hint": RECONNECT_HINT}
                self._resync_seen()
                rec.sink(ev)
            claim(result, epoch)

        def failed(err: HoldfastError) -> None:
            self._subs.close(rec)
            why = "re-making the subscription after a reconnect failed: %s" % err
            logger.warning("holdfast: %s", why)
            if isinstance(rec.owner, SubscriptionBase):
                rec.owner._end(why)
            else:
                self._resubscribe_failed(rec, err, why)

        self._send_nowait(rec.method, rec.resubscribe_params(), epoch, answered, failed)

    def _abandon_sub(self, rec: SubRecord) -> None:
        """A subscribe failed, timed out or was cancelled: leave nothing behind."""
        d = self._subs.close(rec)
        if d is not None:  # claimed just as the caller gave up
            self._table.release(d)
            with self._lock:
                epoch = rec.epoch if rec.epoch >= 0 else self._subs.epoch
            self._unsubscribe_owed(d, epoch)

    def _forget(self, sub: Any) -> None:
        """A subscription ended (its run finished): stop routing to it."""
        rec = self._subs.get(sub)
        if rec is not None:
            self._subs.drop(rec)
