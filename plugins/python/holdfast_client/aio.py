"""The asyncio client: the same methods as ``Client``, awaitable; subscriptions as async
iterators. One ``AsyncClient`` is one connection at a time (it reconnects as ``Client`` does),
used from one event loop; any number of tasks may call it at once (requests are pipelined)::

    from holdfast_client import AsyncClient

    async with AsyncClient(client="my-agent") as hf:
        await hf.set_value("openai", key)
        rec = await hf.get("openai")
        async for ev in await hf.subscribe_stream("run-42"):
            print(ev["seq"], ev["event"])

A call whose task is cancelled (or that ``asyncio.wait_for`` times out) leaves nothing behind:
no entry waits for its answer, and a subscription the daemon made for a cancelled
``subscribe_*`` is unsubscribed when its answer arrives.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
from typing import Any, AsyncIterator, Callable, Dict, List, Optional, Tuple

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
    lease,
    reconnect_delays,
    record,
    set_result,
)

logger = logging.getLogger("holdfast_client")

Event = Dict[str, Any]

#: Longest line read from the daemon (a `run.get` of a long run is one line).
MAX_LINE_BYTES = 256 * 1024 * 1024

class _Gone(Exception):
    """A request bound to a connection that is no longer the current one: not sent."""


class _NotSent(Exception):
    """The connection was lost before the request was written: safe to send on the next."""


class _NoLock:
    """The registry's lock in a single-threaded event loop: nothing to exclude."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


class AsyncSubscription(SubscriptionBase):
    """The events of one subscription, in order, from a queue of its own: ``async for ev in
    sub`` (a stream subscription ends after ``finish``), or ``await sub.next(timeout)``. Like
    ``Subscription``: a stream subscription drops nothing however slowly it is read, and is
    re-made from its last seq after a reconnect; ``id`` is the client's own (stable);
    ``await sub.close()`` unsubscribes."""

    _NAME = "AsyncSubscription"

    def __init__(self, client: "AsyncClient", kind: str, params: Dict[str, Any],
                 max_queued: int) -> None:
        self._client = client
        self._params = dict(params)
        self._q = SubQueue(kind, max_queued, int(params.get("after_seq") or 0))
        self._wake = asyncio.Event()
        self._reason: Optional[str] = None
        self._rec: Optional[SubRecord] = None
        self.id: Any = None

    async def _start(self) -> "AsyncSubscription":
        method = "stream.subscribe" if self.kind == "stream" else "cred.watch"
        self._rec = await self._client._subscribe(method, self._params, self._push, self)
        self.id = self._rec.local
        return self

    def _push(self, params: Any) -> None:  # the reader task
        self._q.push(params)
        self._wake.set()

    async def next(self, timeout: Optional[float] = None) -> Optional[Event]:
        """The next event, or ``None`` after ``timeout`` seconds or once the subscription has
        ended. ``ConnectionClosed`` if the connection is gone for good (reconnecting failed)
        and the queue is drained."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            what, ev = self._q.take(self.id)
            if what != "empty":
                return self._taken(what, ev, self._client)
            self._wake.clear()
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return None
            try:
                await asyncio.wait_for(self._wake.wait(), remaining)
            except asyncio.TimeoutError:
                return None

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Event]:
        while True:
            ev = await self.next()
            if ev is None:
                return
            yield ev

    async def close(self) -> None:
        """Unsubscribe (if the connection is still open); the queue is dropped."""
        self._close_queue()
        if self._rec is None:
            return
        try:
            await self._client._close_sub(self._rec)
        except ConnectionClosed:
            pass  # the connection is gone, and the daemon's subscription with it

    async def __aenter__(self) -> "AsyncSubscription":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncClient(SubscriptionsMixin):
    """A connection to the daemon for asyncio code. ``async with AsyncClient(...) as hf``
    connects and says hello (or ``hf = await AsyncClient.connect(...)``); the arguments are
    ``Client``'s, and so is the reconnect behaviour (``reconnect``, ``reconnect_attempts``: a
    call in flight when the connection breaks raises ``ConnectionClosed``, later calls wait for
    the new connection, subscriptions are re-made). Errors are the same classes.
    ``hf.hello`` is the daemon's hello answer."""

    _NAME = "AsyncClient"

    def __init__(
        self,
        socket_path: Optional[str] = None,
        client: str = "python",
        plugin: Optional[str] = None,
        *,
        timeout: Optional[float] = 60.0,
        reconnect: bool = True,
        reconnect_attempts: int = RECONNECT_ATTEMPTS,
    ) -> None:
        self.socket_path = os.fspath(socket_path) if socket_path else default_socket_path()
        self.timeout = timeout
        self.reconnect = reconnect
        self.reconnect_attempts = reconnect_attempts
        self.reconnects = 0
        self._hello_params: Dict[str, Any] = {"client": client, "protocol": PROTOCOL_VERSION}
        if plugin is not None:
            self._hello_params["plugin"] = plugin
        self._ids = itertools.count(1)
        self._pending: Dict[int, "asyncio.Future[Any]"] = {}
        # Answers wanted by the client itself (subscriptions), also once nobody awaits them.
        self._on_answer: Dict[int, Tuple[Callable[[Any, int], None], int]] = {}
        self._on_error: Dict[int, Callable[[HoldfastError], None]] = {}
        self._lock = _NoLock()
        self._subs = SubRegistry(self._lock)
        self._table = SubscriptionTable()
        # Daemon subscription slots the application no longer has but the daemon may still
        # count (see Client._owed): a subscribe answered busy waits for them, then once more.
        self._owed: Dict[Any, int] = {}
        self._state = _CLOSED
        self._close_reason: Optional[str] = None
        self._writer: Optional[asyncio.StreamWriter] = None
        self._reader_task: Optional["asyncio.Task[None]"] = None
        self._write_lock: Optional[asyncio.Lock] = None
        self._connected: Optional[asyncio.Event] = None
        self.hello: Dict[str, Any] = {}

    @classmethod
    async def connect(cls, *args: Any, **kwargs: Any) -> "AsyncClient":
        """A connected client (the arguments are the constructor's)."""
        c = cls(*args, **kwargs)
        await c._open()
        return c

    async def _connect(self) -> Tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            reader, writer = await asyncio.open_unix_connection(
                self.socket_path, limit=MAX_LINE_BYTES
            )
        except OSError as e:
            raise cannot_connect(self.socket_path, e) from None
        try:
            check_peer(writer.get_extra_info("socket"))
        except BaseException:
            writer.close()
            raise
        return reader, writer

    async def _open(self) -> None:
        reader, writer = await self._connect()
        # A client opened again after close() starts afresh (what the old connection had was
        # ended with it).
        self._subs = SubRegistry(self._lock)
        self._table = SubscriptionTable()
        self._owed = {}
        self._writer = writer
        self._write_lock = asyncio.Lock()
        self._connected = asyncio.Event()
        self._connected.set()
        self._state = _CONNECTED
        self._close_reason = None
        self._reader_task = asyncio.get_running_loop().create_task(self._run_reader(reader))
        try:
            self.hello = await self.call("hello", **self._hello_params)
        except BaseException:
            await self.close()
            raise

    async def __aenter__(self) -> "AsyncClient":
        if self._state == _CLOSED:
            await self._open()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection (and stop reconnecting); calls in flight fail with
        ``ConnectionClosed``."""
        if self._close_reason is None:
            self._close_reason = "the client closed the connection"
        was = self._state
        self._state = _CLOSED
        if self._connected is not None:
            self._connected.set()  # wake callers waiting for a reconnect: they see closed
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except (OSError, RuntimeError):
                pass
        task = self._reader_task
        if task is not None and task is not asyncio.current_task() and not task.done():
            if was == _RECONNECTING:
                task.cancel()
            try:
                await asyncio.wait_for(asyncio.shield(task), 5)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                task.cancel()
        self._fail_all(self._close_reason or "closed")

    # -- reader task ---------------------------------------------------------------------------

    async def _run_reader(self, reader: asyncio.StreamReader) -> None:
        current: Optional[asyncio.StreamReader] = reader
        try:
            while current is not None:
                reason = await self._read_loop(current)
                current = await self._reconnect(reason)
        except asyncio.CancelledError:
            self._fail_all(self._close_reason or "the client closed the connection")
            raise

    async def _read_loop(self, reader: asyncio.StreamReader) -> str:
        reason = READ_EOF
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                if not line.strip():
                    continue
                try:
                    msg = json.loads(line)
                except ValueError:
                    reason = READ_NOT_JSON
                    break
                self._dispatch(msg)
        except (OSError, ValueError, asyncio.LimitOverrunError):
            reason = READ_FAILED
        return reason

    def _dispatch_event(self, params: Any) -> None:
        if isinstance(params, dict):
            self._table.route(params)

    async def _reconnect(self, reason: str) -> Optional[asyncio.StreamReader]:
        """The connection ended: fail what was in flight, then connect again (unless closed or
        ``reconnect`` is off). Returns the new connection's reader, or ``None``."""
        if self._close_reason is not None and self._state != _CLOSED:
            reason, self._close_reason = self._close_reason, None
        give_up = self._state == _CLOSED or not self.reconnect
        self._state = _CLOSED if give_up else _RECONNECTING
        if self._connected is not None and not give_up:
            self._connected.clear()
        lost = in_flight_lost(reason, give_up)
        self._fail_pending(lost)
        self._owed.clear()  # the lost connection's slots went with it
        if self._writer is not None:
            self._writer.close()
        if give_up:
            self._fail_all(reason)
            return None
        logger.warning("holdfast: %s; reconnecting to %s", reason, self.socket_path)
        last = reason
        for delay in reconnect_delays(self.reconnect_attempts):
            await asyncio.sleep(delay)
            if self._state == _CLOSED:
                break
            try:
                reader, writer, hello = await self._open_again()
            except HoldfastError as e:
                last, final = hello_failed(e)
                if final:
                    break
                continue
            if self._state == _CLOSED:
                writer.close()
                return None
            self._writer = writer
            live, epoch = self._connection_up(hello)
            self._state = _CONNECTED
            if self._connected is not None:
                self._connected.set()
            self._resubscribe_all(live, epoch)
            return reader
        if self._close_reason is None:
            self._close_reason = could_not_reconnect(reason, self.socket_path, last)
        self._fail_all(self._close_reason)
        return None

    async def _open_again(
        self,
    ) -> Tuple[asyncio.StreamReader, asyncio.StreamWriter, Dict[str, Any]]:
        """Connect and say hello (the reader task, before it reads the new connection)."""
        reader, writer = await self._connect()
        try:
            rid = next(self._ids)
            writer.write(encode_request(rid, "hello", self._hello_params))
            await writer.drain()
            while True:
                line = await asyncio.wait_for(reader.readline(), self.timeout or 60.0)
                hello = hello_answer(line, rid)
                if hello is not None:
                    return reader, writer, hello
        except HoldfastError:
            # The daemon's own answer (a refused hello: Forbidden is a PermissionError and
            # InvalidParams a ValueError, so the clause below would hide it as a failed
            # connect and retry): its kind and message reach _reconnect as they are.
            writer.close()
            raise
        except (OSError, ValueError, asyncio.TimeoutError, asyncio.LimitOverrunError):
            writer.close()
            raise ConnectionClosed(message="hello on the new connection failed") from None
        except BaseException:
            writer.close()
            raise

    def _dispatch_response(self, msg: Dict[str, Any]) -> None:
        mid = msg.get("id")
        fut = self._pending.pop(mid, None) if isinstance(mid, int) else None
        on_answer = self._on_answer.pop(mid, None) if isinstance(mid, int) else None
        on_error = self._on_error.pop(mid, None) if isinstance(mid, int) else None
        if fut is None and on_answer is None and on_error is None:
            said = daemon_said(msg)
            if said is not None:
                self._close_reason = said
            return
        if "error" in msg:
            error = error_from_response(msg["error"])
            if on_error is not None:
                on_error(error)
            if fut is not None and not fut.done():
                fut.set_exception(error)
        elif "result" in msg:
            if on_answer is not None:
                on_answer[0](msg["result"], on_answer[1])
            if fut is not None and not fut.done():
                fut.set_result(msg["result"])
        elif fut is not None and not fut.done():
            fut.set_exception(StorageError(message="a response with neither result nor error"))
        self._owed.pop(("sub", mid), None)  # after on_answer: it owes the late unsubscribe

    def _fail_pending(self, reason: str) -> None:
        pending, self._pending = self._pending, {}
        self._on_answer.clear()
        self._on_error.clear()
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(ConnectionClosed(message=reason))

    def _fail_all(self, reason: str) -> None:
        self._state = _CLOSED
        if self._close_reason is None:
            self._close_reason = reason
        self._fail_pending(self._close_reason)
        if self._connected is not None:
            self._connected.set()
        self._end_subscriptions(self._close_reason)

    # -- calls ---------------------------------------------------------------------------------

    async def call(self, method: str, /, **params: Any) -> Any:
        """Call ``method`` with ``params`` and return its ``result``; raises
        ``HoldfastError``. Parameters whose value is ``None`` are left out. (Subscribe with
        ``subscribe_stream`` / ``subscribe_cred``.)"""
        if method in ("cred.watch", "stream.subscribe"):
            # Its events go nowhere (as before): subscribe_* gives an iterator over them.
            return (await self._subscribe(method, params, lambda _ev: None, None)).answer
        if method == "unsubscribe" and set(params) == {"subscription"}:
            return {"unsubscribed": await self.unsubscribe(params["subscription"])}
        return await self._call(method, params)

    async def _call(self, method: str, params: Dict[str, Any],
                    on_answer: Optional[Callable[[Any, int], None]] = None, *,
                    epoch: Optional[int] = None) -> Any:
        """Send a request and await its answer. Whatever ends the wait (an answer, an error,
        a timeout, the task's cancellation) leaves no entry behind, except ``on_answer`` of a
        request that was sent: the answer still reaches it (a subscription is unsubscribed
        rather than leaked). ``epoch``: only on that connection (``_Gone`` otherwise). A
        request the connection's loss kept from being sent at all waits for the next one."""
        loop = asyncio.get_running_loop()
        deadline = None if self.timeout is None else loop.time() + self.timeout
        while True:
            if self._state == _RECONNECTING and epoch is None and self._connected is not None:
                remaining = None if deadline is None else max(0.0, deadline - loop.time())
                try:
                    await asyncio.wait_for(self._connected.wait(), remaining)
                except asyncio.TimeoutError:
                    raise CallTimeout(message="no connection to the daemon for %s within %ss "
                                      "(reconnecting)" % (method, self.timeout)) from None
            try:
                return await self._call_once(method, params, on_answer, epoch, deadline)
            except _NotSent:
                if epoch is not None:
                    raise _Gone() from None
                if not self.reconnect:
                    raise ConnectionClosed(message="sending to the daemon failed") from None
                if self._state == _CONNECTED:
                    # The reader has not noticed the dead connection yet: let it, then wait
                    # for the new one as any call made while reconnecting does.
                    if deadline is not None and loop.time() >= deadline:
                        raise CallTimeout(message="no connection to the daemon for %s within "
                                          "%ss (reconnecting)" % (method, self.timeout)) \
                            from None
                    await asyncio.sleep(0.01)

    async def _call_once(self, method: str, params: Dict[str, Any],
                         on_answer: Optional[Callable[[Any, int], None]],
                         epoch: Optional[int], deadline: Optional[float]) -> Any:
        loop = asyncio.get_running_loop()
        if self._state == _CLOSED or self._writer is None or self._write_lock is None:
            raise ConnectionClosed(message=self._close_reason or "the connection is closed")
        if epoch is not None and (epoch != self._subs.epoch or self._state != _CONNECTED):
            raise _Gone()
        if self._state != _CONNECTED:
            raise _NotSent()
        rid = next(self._ids)
        line = encode_request(rid, method, params, max_frame_bytes(self.hello))
        fut: "asyncio.Future[Any]" = loop.create_future()
        writer = self._writer
        self._pending[rid] = fut
        if on_answer is not None:
            self._on_answer[rid] = (on_answer, self._subs.epoch)
        sent = False
        try:
            async with self._write_lock:
                if self._writer is not writer or self._state != _CONNECTED:
                    raise _NotSent()  # the connection went while this waited for its turn
                if writer.transport.is_closing():
                    # Dead before this write (the reader has not seen it yet): the line would
                    # go nowhere, and the daemon never sees it.
                    raise _NotSent()
                try:
                    writer.write(line)
                    if writer.transport.is_closing():
                        # The transport sends at once when nothing is queued before the line:
                        # that send failed (a dead peer), so none of the line went out.
                        raise _NotSent()
                    sent = True
                    await writer.drain()
                except (OSError, RuntimeError):
                    raise ConnectionClosed(message="sending to the daemon failed") from None
            line = b""
            remaining = None if deadline is None else max(0.0, deadline - loop.time())
            try:
                return await asyncio.wait_for(asyncio.shield(fut), remaining)
            except asyncio.TimeoutError:
                raise CallTimeout(message="no answer to %s within %ss" % (method, self.timeout)) \
                    from None
        except HoldfastError as err:
            scrub(err, params)
            raise
        finally:
            self._pending.pop(rid, None)
            if not sent:
                self._on_answer.pop(rid, None)
            elif rid in self._on_answer and self._on_answer[rid][1] == self._subs.epoch:
                # Given up on (cancelled, timed out) before its answer: a subscribe the
                # daemon may make anyway, or an unsubscribe, holds a daemon slot until then.
                self._owed[("sub", rid)] = self._subs.epoch
            if not fut.done():
                fut.cancel()
            elif not fut.cancelled():
                fut.exception()  # retrieved: no "Future exception was never retrieved"

    def _send_nowait(self, method: str, params: Dict[str, Any], epoch: int,
                     on_answer: Optional[Callable[[Any, int], None]] = None,
                     on_error: Optional[Callable[[HoldfastError], None]] = None) -> bool:
        """A request of the client's own on connection ``epoch`` only, whose answer nobody
        awaits (from the reader task or a finally: no await). A whole line goes into the
        transport's buffer at once, so it never interleaves with another request. Returns
        whether it was written."""
        writer = self._writer
        if self._state != _CONNECTED or epoch != self._subs.epoch or writer is None:
            return False  # that connection is gone, and what the request was about with it
        rid = next(self._ids)
        if on_answer is not None:
            self._on_answer[rid] = (on_answer, epoch)
        if on_error is not None:
            self._on_error[rid] = on_error
        try:
            writer.write(encode_request(rid, method, params))
        except (OSError, RuntimeError):
            self._on_answer.pop(rid, None)
            self._on_error.pop(rid, None)
            return False
        return True

    async def _wait_owed(self) -> bool:
        """Whether slots were owed on this connection; if so, wait (at most
        ``OWED_SLOTS_WAIT`` seconds, or the timeout) until they are free."""
        if not self._owed:
            return False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + owed_wait_bound(self.timeout)
        while self._owed and self._state == _CONNECTED and loop.time() < deadline:
            await asyncio.sleep(0.01)
        return True

    async def _subscribe(self, method: str, params: Dict[str, Any],
                         sink: Callable[[Event], None],
                         owner: Optional[AsyncSubscription]) -> SubRecord:
        rec = self._subs.add(method, params, sink, owner)
        owed = bool(self._owed)  # (they may be freed before the busy answer is read)
        try:
            try:
                result = await self._call(method, rec.resubscribe_params(), self._claim(rec))
            except Busy as e:
                # The connection's 16 slots are full, perhaps only with subscribes this
                # client gave up on whose answers are still on their way: once those are
                # unsubscribed, try once more.
                if isinstance(e, CallTimeout) or not (await self._wait_owed() or owed):
                    raise
                result = await self._call(method, rec.resubscribe_params(), self._claim(rec))
        except BaseException:  # an error, a timeout or a cancelled task
            self._abandon_sub(rec)
            raise
        rec.answer = dict(result, subscription=rec.local)
        return rec

    async def _close_sub(self, rec: SubRecord) -> bool:
        """Close ``rec`` (see ``Client._close_sub``): never sends a daemon id of a lost
        connection, and a cancelled close still unsubscribes."""
        was_open, epoch, d = self._closing(rec)
        if d is None:
            return was_open
        done = False
        try:
            # on_answer: an unsubscribe given up on stays owed until the daemon answers it.
            res = await self._call("unsubscribe", {"subscription": d}, lambda _r, _e: None,
                                   epoch=epoch)
            done = True
        except _Gone:
            return was_open
        finally:
            self._table.release(d)
            if not done:
                self._unsubscribe_owed(d, epoch)
        return bool(res["unsubscribed"])

    # -- subscriptions -------------------------------------------------------------------------

    async def subscribe_stream(self, run_id: str, after_seq: int = 0, *,
                               max_queued: int = 10000) -> AsyncSubscription:
        """``stream.subscribe``: an async iterator over the run's events with seq >
        ``after_seq``, each once and in order, ending with ``finish``."""
        sub = AsyncSubscription(self, "stream", {"run_id": run_id, "after_seq": after_seq},
                                max_queued)
        return await sub._start()

    async def subscribe_cred(self, store: Optional[str] = None, *,
                             max_queued: int = 10000) -> AsyncSubscription:
        """``cred.watch``: an async iterator over credential change events."""
        return await AsyncSubscription(self, "cred", {"store": store}, max_queued)._start()

    #: ``Client.watch`` and ``Client.stream_subscribe`` return a subscription id and feed
    #: ``events()``; here subscriptions are always iterators of their own.
    watch = subscribe_cred
    stream_subscribe = subscribe_stream

    async def unsubscribe(self, subscription: Any) -> bool:
        """``unsubscribe`` (an id of this client): once it returns, no event of
        ``subscription`` arrives."""
        rec = self._unsubscribing(subscription)
        if rec is None:
            return False
        return await self._close_sub(rec)


    # -- credentials (see ``Client`` for each method's contract) -------------------------------

    async def get(self, id: str, store: Optional[str] = None) -> CredentialRecord:
        return record(await self.call("cred.get", id=id, store=store))

    async def set(self, credential: Dict[str, Any], if_generation: Optional[int] = None,
                  store: Optional[str] = None, keep_updated_at: bool = False) -> SetResult:
        return set_result(await self.call("cred.set", credential=credential,
                                          if_generation=if_generation, store=store,
                                          keep_updated_at=keep_updated_at or None))

    async def set_value(self, id: str, value: str, if_generation: Optional[int] = None,
                        store: Optional[str] = None) -> SetResult:
        return set_result(await self.call("cred.set", id=id, value=value,
                                          if_generation=if_generation, store=store))

    async def delete(self, id: str, store: Optional[str] = None) -> bool:
        return bool((await self.call("cred.delete", id=id, store=store))["deleted"])

    async def list(self, store: Optional[str] = None) -> List[Dict[str, Any]]:
        return as_list((await self.call("cred.list", store=store))["credentials"])

    async def exists(self, id: str, store: Optional[str] = None) -> bool:
        return bool((await self.call("cred.exists", id=id, store=store))["exists"])

    async def refresh_lease(self, id: str, ttl_ms: int, store: Optional[str] = None) -> Lease:
        return lease(await self.call("cred.refresh_lease", id=id, ttl_ms=ttl_ms, store=store))

    async def release_lease(self, id: str, store: Optional[str] = None) -> bool:
        return bool((await self.call("cred.release_lease", id=id, store=store))["released"])

    async def status(self) -> Dict[str, Any]:
        return as_dict(await self.call("admin.status"))

    # -- streams -------------------------------------------------------------------------------

    async def stream_begin(self, run_id: str, thread_id: Optional[str] = None,
                           model: Optional[str] = None, takeover: bool = False
                           ) -> Dict[str, Any]:
        return as_dict(await self.call("stream.begin", run_id=run_id, thread_id=thread_id,
                                       model=model, takeover=takeover or None))

    async def stream_append(self, run_id: str, stream_id: str, seq: int,
                            events: List[Dict[str, Any]]) -> int:
        return as_int((await self.call("stream.append", run_id=run_id, stream_id=stream_id, seq=seq,
                                       events=events))["acked_seq"])

    async def stream_interrupt(self, run_id: str, stream_id: str, cause: Any,
                               continuation: Optional[str] = None) -> Dict[str, Any]:
        return as_dict(await self.call("stream.interrupt", run_id=run_id, stream_id=stream_id,
                                       cause=cause, continuation=continuation))

    async def stream_resume(self, run_id: str, model: Optional[str] = None,
                            thread_id: Optional[str] = None, fail_on_stale: bool = False,
                            continuation: Optional[str] = None) -> Dict[str, Any]:
        return as_dict(await self.call("stream.resume", run_id=run_id, model=model,
                                       thread_id=thread_id, fail_on_stale=fail_on_stale or None,
                                       continuation=continuation))

    async def stream_commit(self, run_id: str, stream_id: str, final_message: Any,
                            content_from_stream: bool = False) -> Dict[str, Any]:
        return as_dict(await self.call("stream.commit", run_id=run_id, stream_id=stream_id,
                                       final_message=final_message,
                                       content_from_stream=content_from_stream or None))

    async def stream_abort(self, run_id: str, stream_id: str,
                           reason: Optional[str] = None) -> Dict[str, Any]:
        return as_dict(await self.call("stream.abort", run_id=run_id, stream_id=stream_id,
                                       reason=reason))

    async def stream_get(self, run_id: str, reveal: bool = False) -> Dict[str, Any]:
        return as_dict(await self.call("stream.get", run_id=run_id, reveal=reveal or None))

    async def stream_list(self) -> List[Dict[str, Any]]:
        return as_list((await self.call("stream.list"))["runs"])

    async def checkpoint_put(self, run_id: str, snapshot: Dict[str, Any]) -> Dict[str, Any]:
        return as_dict(await self.call("checkpoint.put", run_id=run_id, snapshot=snapshot))

    async def checkpoint_get(self, run_id: str) -> Dict[str, Any]:
        return as_dict(await self.call("checkpoint.get", run_id=run_id))

    async def checkpoint_delete(self, run_id: str) -> bool:
        return bool((await self.call("checkpoint.delete", run_id=run_id))["deleted"])

    # -- run logs ------------------------------------------------------------------------------

    async def run_log_node(self, run_id: str, detail: Dict[str, Any]) -> Dict[str, Any]:
        return as_dict(await self.call("run.log_node", run_id=run_id, detail=detail))

    async def run_ensure_node(self, run_id: str, node_id: str,
                              detail: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        return as_dict(await self.call("run.ensure_node", run_id=run_id, node_id=node_id,
                                       detail=detail or {}))

    async def run_log_step(self, run_id: str, step: Dict[str, Any]) -> Dict[str, Any]:
        return as_dict(await self.call("run.log_step", run_id=run_id, step=step))

    async def run_tool_begin(self, run_id: str, tool_call_id: str, name: str,
                             input: Any = None) -> Dict[str, Any]:
        return as_dict(await self.call("run.tool_begin", run_id=run_id, tool_call_id=tool_call_id,
                                       name=name, input=input))

    async def run_tool_end(self, run_id: str, tool_call_id: str, result: Any = None,
                           is_error: bool = False) -> Dict[str, Any]:
        return as_dict(await self.call("run.tool_end", run_id=run_id, tool_call_id=tool_call_id,
                                       result=result, is_error=is_error))

    async def run_end(self, run_id: str, status: str, **fields: Any) -> Dict[str, Any]:
        return as_dict((await self.call("run.end", run_id=run_id, status=status,
                                        **fields))["summary"])

    async def run_get(self, run_id: str) -> Dict[str, Any]:
        return as_dict(await self.call("run.get", run_id=run_id))

    async def run_list(self, status: Optional[str] = None, since_ms: Optional[int] = None,
                       until_ms: Optional[int] = None) -> List[Dict[str, Any]]:
        return as_list((await self.call("run.list", status=status, since_ms=since_ms,
                                        until_ms=until_ms))["runs"])
