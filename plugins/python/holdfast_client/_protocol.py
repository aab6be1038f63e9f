"""What both clients share: the wire format of a request, the peer check, the result types, and
the table that routes event notifications to their subscription."""

from __future__ import annotations

import collections
import itertools
import json
import os
import socket
import struct
import threading
from typing import Any, Callable, Deque, Dict, List, Mapping, NamedTuple, Optional, Set

from ._errors import Forbidden, InvalidParams, StorageError

PROTOCOL_VERSION = 1

#: The store a request without ``store`` means.
DEFAULT_STORE = "default"

#: Events of a subscription kept while its subscribe answer has not been read yet (the daemon
#: may send a subscription's first events before the answer that names it).
MAX_UNCLAIMED = 1000


#: The daemon's default cap on one request line (``[limits] max_frame_bytes``), for a daemon
#: whose ``hello`` does not say its own.
DEFAULT_MAX_FRAME_BYTES = 1024 * 1024


def max_frame_bytes(hello: Optional[Mapping[str, Any]]) -> int:
    """The longest request line the daemon reads, from its ``hello`` answer."""
    value = (hello or {}).get("max_frame_bytes")
    return value if isinstance(value, int) and value > 0 else DEFAULT_MAX_FRAME_BYTES


def encode_request(rid: int, method: str, params: Mapping[str, Any],
                   max_bytes: Optional[int] = None) -> bytes:
    """One request line. Parameters whose value is ``None`` are left out. A line longer than
    ``max_bytes`` (the daemon's ``hello.max_frame_bytes``) is refused here, unsent: the daemon
    answers one by closing the connection, and sending it again would only repeat that."""
    params = {k: v for k, v in params.items() if v is not None}
    try:
        line = json.dumps(
            {"jsonrpc": "2.0", "id": rid, "method": method, "params": params},
            separators=(",", ":"),
            ensure_ascii=False,
        ).encode("utf-8")
    except (TypeError, ValueError):
        # json's message names the type only; still, never pass it on.
        raise InvalidParams(message="parameters of %s are not JSON-serializable" % method) from None
    if max_bytes is not None and len(line) > max_bytes:
        raise InvalidParams(
            message="%s request of %d bytes is over the daemon's %d-byte limit on a request "
            "line (hello.max_frame_bytes); not sent" % (method, len(line), max_bytes),
            data={"bytes": len(line), "max_frame_bytes": max_bytes})
    return line + b"\n"


def check_peer(sock: socket.socket) -> None:
    """The peer must run as our uid (the daemon checks the same of us): never hand a credential
    to a process that took over the socket path."""
    opt = getattr(socket, "SO_PEERCRED", None)
    if opt is None:
        return  # not Linux: rely on the socket directory's permissions
    creds = sock.getsockopt(socket.SOL_SOCKET, opt, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    if uid != os.geteuid():
        raise Forbidden(
            message="the process on the socket runs as uid %d, not %d: refusing to talk to it"
            % (uid, os.geteuid())
        )


class SubscriptionTable:
    """Routes each event notification to the sink of its subscription. Events are routed and
    subscriptions claimed by the connection's one reader (a thread or a task): a
    subscription's sink is claimed when its subscribe answer is read, before the next line, so
    no event of it is misfiled; events that come before that answer are held (at most
    ``MAX_UNCLAIMED``) and handed over with it. ``release`` may come from any thread; sinks
    are called outside the table's lock, so a sink may take locks of its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sinks: Dict[Any, Callable[[Dict[str, Any]], None]] = {}
        self._early: Dict[Any, List[Dict[str, Any]]] = {}
        # Recently released ids: a guard only (the daemon sends nothing of a subscription after
        # its unsubscribe answer or its finish), so a bounded memory is enough.
        self._released: Set[Any] = set()
        self._released_order: Deque[Any] = collections.deque()

    def route(self, params: Dict[str, Any]) -> None:
        sub = params.get("subscription")
        with self._lock:
            sink = self._sinks.get(sub)
            if sink is None:
                if sub is not None and sub not in self._released:
                    held = self._early.setdefault(sub, [])
                    if len(held) < MAX_UNCLAIMED:
                        held.append(params)
                return
        sink(params)

    def claim(self, sub: Any, sink: Callable[[Dict[str, Any]], None]) -> None:
        with self._lock:
            self._sinks[sub] = sink
            early = self._early.pop(sub, [])
        for ev in early:
            sink(ev)

    def release(self, sub: Any) -> None:
        """Stop routing ``sub``: its late events (sent before an unsubscribe was answered) are
        dropped, not held."""
        with self._lock:
            self._sinks.pop(sub, None)
            self._early.pop(sub, None)
            if sub not in self._released:
                self._released.add(sub)
                self._released_order.append(sub)
                if len(self._released_order) > MAX_UNCLAIMED:
                    self._released.discard(self._released_order.popleft())


# ---------------------------------------------------------------------------------------------
# Subscriptions as the application sees them (both clients)

#: Reconnect attempts after a lost connection, and the first and longest wait between them
#: (doubling): about 11 s in all, long enough for a daemon restart or upgrade.
RECONNECT_ATTEMPTS = 10
RECONNECT_FIRST_DELAY = 0.05
RECONNECT_MAX_DELAY = 2.0


def reconnect_delays(attempts: int) -> List[float]:
    """The waits before each reconnect attempt."""
    out, d = [], RECONNECT_FIRST_DELAY
    for _ in range(max(0, attempts)):
        out.append(d)
        d = min(d * 2, RECONNECT_MAX_DELAY)
    return out


#: Longest wait, after a subscribe answered ``busy``, for the daemon slots still held by
#: subscribes the application gave up on (their late answers are unsubscribed as they come)
#: before the subscribe is sent once more.
OWED_SLOTS_WAIT = 10.0

#: Why a reconnect may have hidden changes from a credential watch (its ``resync`` event).
RECONNECT_HINT = (
    "reconnected to the daemon: changes made while disconnected were not seen; list again"
)


class SubRecord:
    """One subscription as the application knows it. ``local`` is the client's own id for it:
    it is what the application is given and what its events carry in ``subscription``, and it
    outlives connections. ``daemon_id`` is the daemon's number for it on connection ``epoch``
    (a daemon's numbers are per connection: after a reconnect the old one means nothing, or
    another subscription); ``None`` while a subscribe of it is in flight."""

    __slots__ = ("local", "method", "params", "sink", "owner", "daemon_id", "epoch",
                 "closed", "finished", "last_seq", "stream", "answer")

    def __init__(self, local: int, method: str, params: Mapping[str, Any],
                 sink: Callable[[Dict[str, Any]], None], owner: Any) -> None:
        self.local = local
        self.method = method
        self.params = dict(params)
        self.sink = sink
        self.owner = owner
        self.daemon_id: Any = None
        self.epoch = -1
        self.closed = False
        self.finished = False
        self.stream = method == "stream.subscribe"
        #: The subscribe's answer as the application sees it (with the local id).
        self.answer: Dict[str, Any] = {}
        #: The seq of the last stream event handed on (a re-subscribe starts after it).
        self.last_seq = int(self.params.get("after_seq") or 0)

    def resubscribe_params(self) -> Dict[str, Any]:
        params = dict(self.params)
        if self.stream:
            params["after_seq"] = self.last_seq
        return params

    def accept(self, ev: Dict[str, Any]) -> bool:
        """Whether ``ev`` is to be handed on (the connection's reader only): not after a close,
        and a stream's events each once, in seq order, across reconnects. Stamps the event
        with the local id."""
        if self.closed or self.finished:
            return False
        if self.stream:
            seq = ev.get("seq")
            event = ev.get("event")
            finish = isinstance(event, dict) and event.get("type") == "finish"
            if isinstance(seq, int):
                # A finish is always taken, whatever its seq: it is what ends a subscription
                # made from at or past the run's end (its seq may be at or below after_seq,
                # docs/protocol.md "stream.subscribe"). Anything else at or below the last
                # seq handed on was seen already.
                if seq <= self.last_seq and not finish:
                    return False
                if finish:
                    # Whether every event before the finish was handed on: not so when the
                    # run ended while this subscription was away (a reconnect) or before it
                    # began from below its end, since an ended run's events are gone from
                    # the daemon and the finish comes alone.
                    ev["complete"] = seq <= self.last_seq + 1
                self.last_seq = max(self.last_seq, seq)
            if finish:
                self.finished = True
        ev["subscription"] = self.local
        return True


class SubRegistry:
    """Every open subscription of one client, by local id, and the connection epoch. One lock
    (the client's) orders a close against a (re-)subscribe's answer and a reconnect, so a
    daemon subscription is always either handed to a live record or unsubscribed, and an
    unsubscribe only ever names a number of the connection that gave it."""

    def __init__(self, lock: Any) -> None:
        self.lock = lock
        self.epoch = 0
        self._ids = itertools.count(1)
        self.recs: Dict[int, SubRecord] = {}

    def add(self, method: str, params: Mapping[str, Any],
            sink: Callable[[Dict[str, Any]], None], owner: Any = None) -> SubRecord:
        with self.lock:
            rec = SubRecord(next(self._ids), method, params, sink, owner)
            self.recs[rec.local] = rec
            return rec

    def get(self, local: Any) -> Optional[SubRecord]:
        with self.lock:
            try:
                return self.recs.get(local)
            except TypeError:  # unhashable: no subscription of ours
                return None

    def answered(self, rec: SubRecord, epoch: int, daemon_id: Any) -> bool:
        """A subscribe of ``rec`` sent on connection ``epoch`` was answered ``daemon_id``.
        False: nobody wants it any more (closed, cancelled, timed out): unsubscribe it."""
        with self.lock:
            if rec.closed or epoch != self.epoch:
                return False
            if rec.daemon_id is not None and rec.epoch == epoch:
                return False  # made twice on one connection (a guard): keep the first
            rec.daemon_id = daemon_id
            rec.epoch = epoch
            return True

    def close(self, rec: SubRecord) -> Optional[Any]:
        """Mark ``rec`` closed. Returns the daemon id to unsubscribe now, or ``None`` if there is
        none on the current connection (its subscribe is still in flight: its answer will be
        unsubscribed; or the connection that had it is gone, and the subscription with it)."""
        with self.lock:
            rec.closed = True
            self.recs.pop(rec.local, None)
            d, rec.daemon_id = rec.daemon_id, None
            return d if d is not None and rec.epoch == self.epoch else None

    def drop(self, rec: SubRecord) -> None:
        """Forget ``rec`` (its run finished: the daemon ended the subscription itself)."""
        with self.lock:
            self.recs.pop(rec.local, None)
            rec.daemon_id = None

    def new_connection(self) -> List[SubRecord]:
        """A new connection is up: every daemon id is void; returns the records to
        re-subscribe: those made on an earlier connection (a record whose first subscribe has
        not been answered is its caller's: that call fails, or it waits for the new connection
        and subscribes there)."""
        with self.lock:
            self.epoch += 1
            live = []
            for local, rec in list(self.recs.items()):
                rec.daemon_id = None
                if rec.closed or rec.finished:
                    del self.recs[local]
                elif rec.epoch >= 0:
                    live.append(rec)
            return live

    def all(self) -> List[SubRecord]:
        with self.lock:
            return list(self.recs.values())


# ---------------------------------------------------------------------------------------------
# Results


class CredentialRecord:
    """A credential as ``cred.get`` returns it: ``credential`` (the whole document, secrets
    included) and ``generation``. Its ``repr`` shows the id, type, generation and key names,
    never a value."""

    __slots__ = ("credential", "generation")

    def __init__(self, credential: Dict[str, Any], generation: int) -> None:
        self.credential = credential
        self.generation = generation

    @property
    def id(self) -> Optional[str]:
        return self.credential.get("id")

    @property
    def credential_type(self) -> Optional[str]:
        return self.credential.get("credential_type")

    @property
    def keys(self) -> List[str]:
        """The key names."""
        keys = self.credential.get("keys") or {}
        return sorted(keys)

    def value(self, key: str = "api_key") -> str:
        """The value of key ``key`` (``KeyError`` naming only the key if there is none)."""
        keys = self.credential.get("keys") or {}
        if key not in keys:
            raise KeyError(key)
        value = keys[key]["value"]
        return value if isinstance(value, str) else str(value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CredentialRecord):
            return NotImplemented
        return self.generation == other.generation and self.credential == other.credential

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return "CredentialRecord(id=%r, credential_type=%r, generation=%r, keys=%r)" % (
            self.id,
            self.credential_type,
            self.generation,
            self.keys,
        )


class SetResult(NamedTuple):
    """What ``cred.set`` answers: the credential id and its new generation."""

    id: str
    generation: int


class Lease(NamedTuple):
    """What ``cred.refresh_lease`` answers. ``granted``: this connection holds the lease for
    ``expires_in_ms``; otherwise another does, for ``expires_in_ms`` more at most."""

    granted: bool
    lease_id: Optional[str]
    expires_in_ms: int

    def __bool__(self) -> bool:
        return bool(self.granted)


def as_dict(value: Any) -> Dict[str, Any]:
    """A daemon answer that must be an object (``StorageError`` if it is not)."""
    if not isinstance(value, dict):
        raise StorageError(message="a malformed answer from the daemon (not an object)")
    return value


def as_list(value: Any) -> List[Dict[str, Any]]:
    """A daemon answer that must be a list (``StorageError`` if it is not)."""
    if not isinstance(value, list):
        raise StorageError(message="a malformed answer from the daemon (not a list)")
    return value


def as_int(value: Any) -> int:
    """A daemon answer that must be an integer (``StorageError`` if it is not)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise StorageError(message="a malformed answer from the daemon (not an integer)")
    return value


def record(result: Dict[str, Any]) -> CredentialRecord:
    return CredentialRecord(result["credential"], result["generation"])


def set_result(result: Dict[str, Any]) -> SetResult:
    return SetResult(result["id"], result["generation"])


def lease(result: Dict[str, Any]) -> Lease:
    return Lease(bool(result.get("granted")), result.get("lease_id"),
                 result.get("expires_in_ms", 0))


# ---------------------------------------------------------------------------------------------
# One subscription's queue (no I/O, no locking: the sync and asyncio clients wrap it)

#: Marks the end of the connection in a queue.
CLOSED: Any = object()


class SubQueue:
    """The events of one subscription waiting to be taken.

    A stream subscription never drops an event: its queue holds at most the run, which the
    daemon holds in memory too until the run ends (and after the end the events are gone from
    the daemon — a late subscriber gets ``finish`` alone — so a subscription that dropped
    events could not get them back). A credential watch runs for as long as the connection:
    past ``max_queued`` waiting events it drops the oldest and reports how many with a
    ``resync`` event (list again).
    """

    def __init__(self, kind: str, max_queued: int, after_seq: int = 0) -> None:
        self.kind = kind  # "stream" or "cred"
        self.max = max(1, int(max_queued))
        self.items: Deque[Any] = collections.deque()
        self.dropped = 0
        self.done = False
        #: The seq of the last stream event taken (``after_seq`` to resume from).
        self.last_seq = int(after_seq or 0)
        #: The finish's ``complete`` once it was taken (``None`` before).
        self.complete: Optional[bool] = None

    def push(self, params: Any) -> None:
        if params is CLOSED or self.kind == "stream" or len(self.items) < self.max:
            if not self.done or params is CLOSED:
                self.items.append(params)
        else:
            self.items.popleft()
            self.dropped += 1
            self.items.append(params)

    def take(self, sub_id: Any) -> "tuple[str, Optional[Dict[str, Any]]]":
        """``("event", ev)``, ``("empty", None)`` (wait), ``("done", None)`` (after ``finish``
        or ``close``) or ``("closed", None)`` (the connection)."""
        if self.dropped:
            n, self.dropped = self.dropped, 0
            return "event", {
                "subscription": sub_id,
                "type": "resync",
                "missed": n,
                "hint": "the client's event queue overflowed: list again",
            }
        while self.items:
            ev = self.items[0]
            if ev is CLOSED:
                return "closed", None
            self.items.popleft()
            if self.kind == "stream":
                seq = ev.get("seq")
                if isinstance(seq, int) and seq > self.last_seq:
                    self.last_seq = seq
                if (ev.get("event") or {}).get("type") == "finish":
                    self.done = True
                    complete = ev.get("complete")
                    self.complete = complete if isinstance(complete, bool) else None
            return "event", ev
        if self.done:
            return "done", None
        return "empty", None

    def close(self) -> bool:
        """Stop; whether it was still open (an unsubscribe is due)."""
        was_open = not self.done
        self.done = True
        self.items.clear()
        return was_open
