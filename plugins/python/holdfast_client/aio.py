"""The asyncio client: the same methods as ``Client``, awaitable; subscriptions as async
iterators. One ``AsyncClient`` is one connection, used from one event loop; any number of
tasks may call it at once (requests are pipelined)::

    from holdfast_client import AsyncClient

    async with AsyncClient(client="my-agent") as hf:
        await hf.set_value("openai", key)
        rec = await hf.get("openai")
        async for ev in await hf.subscribe_stream("run-42"):
            print(ev["seq"], ev["event"])
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from typing import Any, AsyncIterator, Callable, Dict, List, Optional

from ._errors import CallTimeout, ConnectionClosed, HoldfastError, error_from_response, scrub
from ._paths import default_socket_path
from ._protocol import (
    CLOSED,
    PROTOCOL_VERSION,
    CredentialRecord,
    Lease,
    SetResult,
    SubQueue,
    SubscriptionTable,
    check_peer,
    encode_request,
    lease,
    record,
    set_result,
)

Event = Dict[str, Any]

#: Longest line read from the daemon (a `run.get` of a long run is one line).
MAX_LINE_BYTES = 256 * 1024 * 1024


class AsyncSubscription:
    """The events of one subscription, in order, from a queue of its own: ``async for ev in
    sub`` (a stream subscription ends after ``finish``), or ``await sub.next(timeout)``. Like
    ``Subscription``: a stream subscription drops nothing however slowly it is read;
    ``await sub.close()`` unsubscribes."""

    def __init__(self, client: "AsyncClient", kind: str, params: Dict[str, Any],
                 max_queued: int) -> None:
        self._client = client
        self._params = dict(params)
        self._q = SubQueue(kind, max_queued, int(params.get("after_seq") or 0))
        self._wake = asyncio.Event()
        self.id: Any = None

    @property
    def kind(self) -> str:
        return self._q.kind

    @property
    def last_seq(self) -> int:
        """The seq of the last stream event taken (``after_seq`` to resume from)."""
        return self._q.last_seq

    async def _start(self) -> "AsyncSubscription":
        method = "stream.subscribe" if self.kind == "stream" else "cred.watch"
        result = await self._client._subscribe(method, self._params, self._push, self)
        self.id = result["subscription"]
        return self

    def _push(self, params: Event) -> None:  # the reader task
        self._q.push(params)
        self._wake.set()

    async def next(self, timeout: Optional[float] = None) -> Optional[Event]:
        """The next event, or ``None`` after ``timeout`` seconds or once the subscription has
        ended. ``ConnectionClosed`` if the connection is gone and the queue is drained."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            what, ev = self._q.take(self.id)
            if what == "event":
                if self._q.done:
                    self._client._forget(self.id)
                return ev
            if what == "done":
                return None
            if what == "closed":
                raise ConnectionClosed(
                    message=self._client._close_reason or "the connection is closed"
                )
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
        if self._q.close() and not self._client.closed:
            try:
                await self._client.unsubscribe(self.id)
            except ConnectionClosed:
                pass

    async def __aenter__(self) -> "AsyncSubscription":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def __repr__(self) -> str:
        return "AsyncSubscription(kind=%r, id=%r, last_seq=%r)" % (
            self.kind, self.id, self.last_seq)


class AsyncClient:
    """One connection to the daemon for asyncio code. ``async with AsyncClient(...) as hf``
    connects and says hello (or ``hf = await AsyncClient.connect(...)``); the arguments are
    ``Client``'s. Errors are the same classes. ``hf.hello`` is the daemon's hello answer."""

    def __init__(
        self,
        socket_path: Optional[str] = None,
        client: str = "python",
        plugin: Optional[str] = None,
        *,
        timeout: Optional[float] = 60.0,
    ) -> None:
        self.socket_path = os.fspath(socket_path) if socket_path else default_socket_path()
        self.timeout = timeout
        self._name = client
        self._plugin = plugin
        self._ids = itertools.count(1)
        self._pending: Dict[int, "asyncio.Future[Any]"] = {}
        self._on_answer: Dict[int, Callable[[Any], None]] = {}
        self._table = SubscriptionTable()
        self._own: Dict[Any, AsyncSubscription] = {}
        self._closed = True
        self._close_reason: Optional[str] = None
        self._writer: Optional[asyncio.StreamWriter] = None
        self._reader_task: Optional["asyncio.Task[None]"] = None
        self._write_lock: Optional[asyncio.Lock] = None
        self.hello: Dict[str, Any] = {}

    @classmethod
    async def connect(cls, *args: Any, **kwargs: Any) -> "AsyncClient":
        """A connected client (the arguments are the constructor's)."""
        c = cls(*args, **kwargs)
        await c._open()
        return c

    async def _open(self) -> None:
        try:
            reader, writer = await asyncio.open_unix_connection(
                self.socket_path, limit=MAX_LINE_BYTES
            )
        except OSError as e:
            raise ConnectionClosed(
                message="cannot connect to the holdfast daemon at %s: %s"
                % (self.socket_path, e.strerror or type(e).__name__)
            ) from None
        try:
            check_peer(writer.get_extra_info("socket"))
        except BaseException:
            writer.close()
            raise
        self._writer = writer
        self._write_lock = asyncio.Lock()
        self._closed = False
        self._close_reason = None
        self._reader_task = asyncio.get_running_loop().create_task(self._read_loop(reader))
        params: Dict[str, Any] = {"client": self._name, "protocol": PROTOCOL_VERSION}
        if self._plugin is not None:
            params["plugin"] = self._plugin
        try:
            self.hello = await self.call("hello", **params)
        except BaseException:
            await self.close()
            raise

    async def __aenter__(self) -> "AsyncClient":
        if self._closed:
            await self._open()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return "AsyncClient(socket_path=%r, closed=%r)" % (self.socket_path, self._closed)

    async def close(self) -> None:
        """Close the connection; calls in flight fail with ``ConnectionClosed``."""
        if self._close_reason is None:
            self._close_reason = "the client closed the connection"
        self._closed = True
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except OSError:
                pass
        task = self._reader_task
        if task is not None and task is not asyncio.current_task():
            try:
                await asyncio.wait_for(task, 5)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                task.cancel()
        self._fail_all(self._close_reason or "closed")

    # -- reader task ---------------------------------------------------------------------------

    async def _read_loop(self, reader: asyncio.StreamReader) -> None:
        reason = "the daemon closed the connection"
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
                    reason = "the daemon sent a line that is not JSON"
                    break
                if not isinstance(msg, dict):
                    continue
                if msg.get("method") == "event" and "id" not in msg:
                    if isinstance(msg.get("params"), dict):
                        self._table.route(msg["params"])
                    continue
                self._dispatch_response(msg)
        except (OSError, ValueError, asyncio.LimitOverrunError):
            reason = "the connection to the daemon failed"
        if self._close_reason is None:
            self._close_reason = reason
        self._fail_all(self._close_reason)

    def _dispatch_response(self, msg: Dict[str, Any]) -> None:
        mid = msg.get("id")
        fut = self._pending.pop(mid, None) if isinstance(mid, int) else None
        on_answer = self._on_answer.pop(mid, None) if isinstance(mid, int) else None
        if fut is None:
            err = msg.get("error")
            if isinstance(err, dict) and isinstance(err.get("message"), str):
                self._close_reason = "the daemon said: %s" % err["message"]
            return
        if fut.done():
            return  # timed out or cancelled: nobody waits for it
        if "error" in msg:
            fut.set_exception(error_from_response(msg["error"]))
        elif "result" in msg:
            if on_answer is not None:
                on_answer(msg["result"])
            fut.set_result(msg["result"])
        else:
            fut.set_exception(
                ConnectionClosed(message="a response with neither result nor error")
            )

    def _fail_all(self, reason: str) -> None:
        self._closed = True
        pending, self._pending = self._pending, {}
        self._on_answer.clear()
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(ConnectionClosed(message=reason))
        for sub in list(self._own.values()):
            sub._push(CLOSED)

    # -- calls ---------------------------------------------------------------------------------

    async def call(self, method: str, /, **params: Any) -> Any:
        """Call ``method`` with ``params`` and return its ``result``; raises
        ``HoldfastError``. Parameters whose value is ``None`` are left out."""
        return await self._call(method, params)

    async def _call(self, method: str, params: Dict[str, Any],
                    on_answer: Optional[Callable[[Any], None]] = None) -> Any:
        if self._closed or self._writer is None or self._write_lock is None:
            raise ConnectionClosed(message=self._close_reason or "the connection is closed")
        rid = next(self._ids)
        line = encode_request(rid, method, params)
        fut: "asyncio.Future[Any]" = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        if on_answer is not None:
            self._on_answer[rid] = on_answer
        try:
            async with self._write_lock:
                self._writer.write(line)
                await self._writer.drain()
        except (OSError, RuntimeError):
            self._pending.pop(rid, None)
            self._on_answer.pop(rid, None)
            raise ConnectionClosed(message="sending to the daemon failed") from None
        finally:
            line = b""
        try:
            return await asyncio.wait_for(asyncio.shield(fut), self.timeout)
        except asyncio.TimeoutError:
            self._abandon(rid, fut)
            raise CallTimeout(message="no answer to %s within %ss" % (method, self.timeout)) \
                from None
        except asyncio.CancelledError:
            self._abandon(rid, fut)
            raise
        except HoldfastError as err:
            scrub(err, params)
            raise

    def _abandon(self, rid: int, fut: "asyncio.Future[Any]") -> None:
        """Nobody waits for this answer any more (a timeout or a cancelled task)."""
        self._pending.pop(rid, None)
        self._on_answer.pop(rid, None)
        fut.cancel()

    async def _subscribe(self, method: str, params: Dict[str, Any],
                         sink: Callable[[Event], None], owner: AsyncSubscription) -> Any:
        def claim(result: Any) -> None:
            if isinstance(result, dict):
                sub = result.get("subscription")
                self._own[sub] = owner
                self._table.claim(sub, sink)

        return await self._call(method, params, claim)

    def _forget(self, sub: Any) -> None:
        self._own.pop(sub, None)
        self._table.release(sub)

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
        """``unsubscribe``: once it returns, no event of ``subscription`` arrives."""
        done = bool((await self._call("unsubscribe", {"subscription": subscription}))
                    ["unsubscribed"])
        self._forget(subscription)
        return done

    # -- credentials (see ``Client`` for each method's contract) -------------------------------

    async def get(self, id: str, store: Optional[str] = None) -> CredentialRecord:
        return record(await self.call("cred.get", id=id, store=store))

    async def set(self, credential: Dict[str, Any], if_generation: Optional[int] = None,
                  store: Optional[str] = None) -> SetResult:
        return set_result(await self.call("cred.set", credential=credential,
                                          if_generation=if_generation, store=store))

    async def set_value(self, id: str, value: str, if_generation: Optional[int] = None,
                        store: Optional[str] = None) -> SetResult:
        return set_result(await self.call("cred.set", id=id, value=value,
                                          if_generation=if_generation, store=store))

    async def delete(self, id: str, store: Optional[str] = None) -> bool:
        return bool((await self.call("cred.delete", id=id, store=store))["deleted"])

    async def list(self, store: Optional[str] = None) -> List[Dict[str, Any]]:
        return (await self.call("cred.list", store=store))["credentials"]

    async def exists(self, id: str, store: Optional[str] = None) -> bool:
        return bool((await self.call("cred.exists", id=id, store=store))["exists"])

    async def refresh_lease(self, id: str, ttl_ms: int, store: Optional[str] = None) -> Lease:
        return lease(await self.call("cred.refresh_lease", id=id, ttl_ms=ttl_ms, store=store))

    async def release_lease(self, id: str, store: Optional[str] = None) -> bool:
        return bool((await self.call("cred.release_lease", id=id, store=store))["released"])

    async def status(self) -> Dict[str, Any]:
        return await self.call("admin.status")

    # -- streams -------------------------------------------------------------------------------

    async def stream_begin(self, run_id: str, thread_id: Optional[str] = None,
                           model: Optional[str] = None, takeover: bool = False
                           ) -> Dict[str, Any]:
        return await self.call("stream.begin", run_id=run_id, thread_id=thread_id, model=model,
                               takeover=takeover or None)

    async def stream_append(self, run_id: str, stream_id: str, seq: int,
                            events: List[Dict[str, Any]]) -> int:
        return (await self.call("stream.append", run_id=run_id, stream_id=stream_id, seq=seq,
                                events=events))["acked_seq"]

    async def stream_interrupt(self, run_id: str, stream_id: str, cause: Any,
                               continuation: Optional[str] = None) -> Dict[str, Any]:
        return await self.call("stream.interrupt", run_id=run_id, stream_id=stream_id,
                               cause=cause, continuation=continuation)

    async def stream_resume(self, run_id: str, model: Optional[str] = None,
                            thread_id: Optional[str] = None, fail_on_stale: bool = False,
                            continuation: Optional[str] = None) -> Dict[str, Any]:
        return await self.call("stream.resume", run_id=run_id, model=model, thread_id=thread_id,
                               fail_on_stale=fail_on_stale or None, continuation=continuation)

    async def stream_commit(self, run_id: str, stream_id: str, final_message: Any,
                            content_from_stream: bool = False) -> Dict[str, Any]:
        return await self.call("stream.commit", run_id=run_id, stream_id=stream_id,
                               final_message=final_message,
                               content_from_stream=content_from_stream or None)

    async def stream_abort(self, run_id: str, stream_id: str,
                           reason: Optional[str] = None) -> Dict[str, Any]:
        return await self.call("stream.abort", run_id=run_id, stream_id=stream_id,
                               reason=reason)

    async def stream_get(self, run_id: str, reveal: bool = False) -> Dict[str, Any]:
        return await self.call("stream.get", run_id=run_id, reveal=reveal or None)

    async def stream_list(self) -> List[Dict[str, Any]]:
        return (await self.call("stream.list"))["runs"]

    async def checkpoint_put(self, run_id: str, snapshot: Dict[str, Any]) -> Dict[str, Any]:
        return await self.call("checkpoint.put", run_id=run_id, snapshot=snapshot)

    async def checkpoint_get(self, run_id: str) -> Dict[str, Any]:
        return await self.call("checkpoint.get", run_id=run_id)

    async def checkpoint_delete(self, run_id: str) -> bool:
        return bool((await self.call("checkpoint.delete", run_id=run_id))["deleted"])

    # -- run logs ------------------------------------------------------------------------------

    async def run_log_node(self, run_id: str, detail: Dict[str, Any]) -> Dict[str, Any]:
        return await self.call("run.log_node", run_id=run_id, detail=detail)

    async def run_ensure_node(self, run_id: str, node_id: str,
                              detail: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        return await self.call("run.ensure_node", run_id=run_id, node_id=node_id,
                               detail=detail or {})

    async def run_log_step(self, run_id: str, step: Dict[str, Any]) -> Dict[str, Any]:
        return await self.call("run.log_step", run_id=run_id, step=step)

    async def run_tool_begin(self, run_id: str, tool_call_id: str, name: str,
                             input: Any = None) -> Dict[str, Any]:
        return await self.call("run.tool_begin", run_id=run_id, tool_call_id=tool_call_id,
                               name=name, input=input)

    async def run_tool_end(self, run_id: str, tool_call_id: str, result: Any = None,
                           is_error: bool = False) -> Dict[str, Any]:
        return await self.call("run.tool_end", run_id=run_id, tool_call_id=tool_call_id,
                               result=result, is_error=is_error)

    async def run_end(self, run_id: str, status: str, **fields: Any) -> Dict[str, Any]:
        return (await self.call("run.end", run_id=run_id, status=status, **fields))["summary"]

    async def run_get(self, run_id: str) -> Dict[str, Any]:
        return await self.call("run.get", run_id=run_id)

    async def run_list(self, status: Optional[str] = None, since_ms: Optional[int] = None,
                       until_ms: Optional[int] = None) -> List[Dict[str, Any]]:
        return (await self.call("run.list", status=status, since_ms=since_ms,
                                until_ms=until_ms))["runs"]
