"""LLM streams that survive a broken connection without showing the user a token twice.

The bug this ends: a provider answers 429 or drops the connection after K chunks were already
shown; the retry streams the answer again from its first token, and the user sees the partial
answer followed by the whole answer. ``RecoveringStream`` wraps a provider stream and a reopen
function and yields exactly what a UI should render::

    from holdfast_client import Client
    from holdfast_client.streaming import RecoveringStream

    def reopen(prefix):              # prefix: the assistant text so far (R1/R3), or None (R4)
        return client.chat.completions.create(..., messages=msgs + continue_from(prefix),
                                              stream=True)

    with Client(client="my-agent") as hf:
        rs = RecoveringStream(hf, "run-42", first_stream, reopen=reopen, model="gpt-x")
        for ev in rs:
            if ev.type == "text":
                print(ev.text, end="", flush=True)
            elif ev.type == "stream_reset":       # R4: the turn starts over; clear it
                ...
        rs.final_message                           # what was stored, exactly what was shown

What it renders comes from the run's own subscription — the daemon's published events, each
once, in order — so it is also exactly what a browser following the run sees, and nothing is
rendered before it is durable. Chunks are appended as they arrive without waiting for the
previous append: those that arrive while one is in flight go together in the next (one round
trip and one fsync for many tokens); ``appends`` counts the round trips. When the provider raises, the exception is reported as the
run's interruption (HTTP status and Retry-After taken from it when it has them), the plan is
waited for and followed: continue from the text so far (R1, R3: ``reopen(prefix)``), end the
turn with the completed tool calls (R2), start over (R4: ``reopen(None)``, after a
``stream_reset`` event), or give up (``StreamFailed``). A tool call that stalls again and again
raises ``SplitToolCall`` with the planner's message for the model instead of looping. The
stream ends with ``stream.commit``: the final message and the end of resumability in one step,
its content the text that was streamed.

``StreamProducer`` is the lower-level producer of one run, for code that drives the plans
itself.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import socket
import time
from typing import (
    Any,
    AsyncIterator,
    Callable,
    Dict,
    Iterator,
    List,
    Optional,
    Tuple,
    Union,
)

from ._errors import ConnectionClosed, HoldfastError
from ._protocol import as_dict

#: The event types a provider stream may hand over already in holdfast's form.
PRODUCER_EVENTS = ("text", "tool_call_delta", "tool_call_end")

#: Most characters of a provider's error message sent as the interruption's cause: enough for
#: the planner to recognize "prompt is too long" or a content filter, not a whole body.
MAX_CAUSE_MESSAGE = 1000

Cause = Union[str, Dict[str, Any]]

#: Seconds to wait for the run's subscription to show what was just acknowledged.
CATCH_UP_TIMEOUT = 30


# ---------------------------------------------------------------------------------------------
# Appends batched while one is in flight

#: The most events one ``stream.append`` carries (the daemon's cap is 1,024).
MAX_BATCH_EVENTS = 1024

#: The daemon's default cap on one request line, for a daemon whose ``hello`` does not say.
DEFAULT_MAX_FRAME_BYTES = 1024 * 1024

#: Room a ``stream.append`` line takes besides its events (the envelope, the ids, the seq).
_APPEND_ENVELOPE_BYTES = 512


def _event_bytes(event: Dict[str, Any]) -> int:
    return len(json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode("utf-8",
                                                                                  "replace"))


def _batch_len(client: Any, run_id: str, stream_id: str, queue: List[Dict[str, Any]]) -> int:
    """How many of ``queue``'s first events one append carries: at most
    ``MAX_BATCH_EVENTS``, and no more than fit in the daemon's request line
    (``hello.max_frame_bytes``): a longer line is answered by closing the connection, which
    would take every run held on it. At least one: an event that cannot fit alone is sent
    alone and refused unsent by the client (``FrameTooLarge``), failing this stream only."""
    hello = getattr(client, "hello", None) or {}
    limit = int(hello.get("max_frame_bytes") or DEFAULT_MAX_FRAME_BYTES)
    room = limit - _APPEND_ENVELOPE_BYTES - len(run_id.encode()) - len(stream_id.encode())
    n, used = 0, 0
    for event in queue[:MAX_BATCH_EVENTS]:
        used += _event_bytes(event) + 1
        if n > 0 and used > room:
            break
        n += 1
    return n


class _Appender:
    """The appends of one run from any number of threads: events handed over while an append
    is in flight wait and go together in the next one — one round trip and one fsync for many
    tokens (docs/protocol.md, "Batching"). Sent by the thread that hands over events when none
    is in flight (``append``: it returns once its events are durable), or by a sender thread
    (``put``: returns at once; ``flush`` waits). A failed append fails every event not yet
    acknowledged (they are dropped: the daemon has none of them): each waiting ``append``
    raises it, and so does the next ``put`` or ``flush``; ``reset`` takes the seq to go on from
    after an interruption."""

    class _Waiter:
        __slots__ = ("last", "done", "error")

        def __init__(self, last: int) -> None:
            self.last, self.done, self.error = last, False, None

    def __init__(self, client: Any, run_id: str, stream_id: str, next_seq: int) -> None:
        import threading

        self._client, self._run, self._stream = client, run_id, stream_id
        self._cv = threading.Condition(threading.Lock())
        self._queue: List[Dict[str, Any]] = []
        self._next = next_seq  # the seq of the first queued event
        self._acked = next_seq - 1
        self._sending = False
        self._waiters: List[Any] = []
        self._error: Optional[BaseException] = None  # for the next put or flush
        self._thread: Any = None
        self._closed = False
        #: Appends sent (round trips) and the events they carried.
        self.appends = 0
        self.events = 0

    @property
    def next_seq(self) -> int:
        with self._cv:
            return self._next + len(self._queue)

    def _take(self) -> Tuple[int, List[Dict[str, Any]]]:
        n = _batch_len(self._client, self._run, self._stream, self._queue)
        batch, self._queue = (self._queue[:n], self._queue[n:])
        seq = self._next
        self._next += len(batch)
        self._sending = True
        return seq, batch

    def _send(self, seq: int, batch: List[Dict[str, Any]]) -> None:
        try:
            acked = _append_surviving_reconnects(self._client, self._run, self._stream, seq,
                                                 batch)
        except BaseException as e:  # noqa: BLE001 - handed to every waiter
            with self._cv:
                self._error = e
                self._next = seq  # nothing from here on was acknowledged
                self._queue = []
                self._sending = False
                for w in self._waiters:
                    w.error = e
                self._waiters = []
                self._cv.notify_all()
            return
        with self._cv:
            self._acked = max(self._acked, acked)
            self.appends += 1
            self.events += len(batch)
            self._sending = False
            left = []
            for w in self._waiters:
                if w.last <= self._acked:
                    w.done = True
                else:
                    left.append(w)
            self._waiters = left
            self._cv.notify_all()

    def _raise(self) -> None:
        e, self._error = self._error, None
        if e is not None:
            raise e

    def append(self, events: List[Dict[str, Any]]) -> int:
        """Hand over ``events`` and return the last seq acknowledged once they are durable."""
        with self._cv:
            self._raise()
            self._queue.extend(events)
            me = self._Waiter(self._next + len(self._queue) - 1)
            if me.last <= self._acked:
                return self._acked
            self._waiters.append(me)
        while True:
            with self._cv:
                while True:
                    if me.done:
                        return self._acked
                    if me.error is not None:
                        self._error = None  # raised here; not again by put or flush
                        raise me.error
                    if not self._sending and self._queue:
                        seq, batch = self._take()
                        break
                    self._cv.wait()
            self._send(seq, batch)

    def put(self, events: List[Dict[str, Any]]) -> None:
        """Hand over ``events`` without waiting; the sender thread appends them."""
        import threading

        with self._cv:
            self._raise()
            self._queue.extend(events)
            if self._thread is None:
                self._thread = threading.Thread(target=self._sender, daemon=True,
                                                name="holdfast-appender")
                self._thread.start()
            self._cv.notify_all()

    def _sender(self) -> None:
        while True:
            with self._cv:
                while not self._closed and (self._sending or not self._queue):
                    self._cv.wait()
                if self._closed:
                    return
                seq, batch = self._take()
            self._send(seq, batch)

    def flush(self) -> int:
        """Wait until everything handed over is durable; the last seq acknowledged."""
        with self._cv:
            while self._error is None and (self._sending or self._queue):
                self._cv.wait()
            self._raise()
            return self._acked

    def reset(self, next_seq: int) -> None:
        """Go on from ``next_seq`` (after ``stream.interrupt``); call after ``flush``."""
        with self._cv:
            self._next, self._acked = next_seq, next_seq - 1

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()


#: How many times one append is sent again after the connection was lost under it.
APPEND_RESENDS = 10


def _append_surviving_reconnects(client: Any, run: str, stream: str, seq: int,
                                 batch: List[Dict[str, Any]]) -> int:
    """``stream.append``, sent again when the connection was lost while it was in flight and
    the client reconnects (a daemon restart: the ``stream_id`` still holds). Safe: a batch
    already taken is acknowledged again and dropped. Once the client gives up (``closed``),
    or the daemon refuses the batch, that error is raised."""
    for resend in range(APPEND_RESENDS + 1):
        try:
            return int(client.stream_append(run, stream, seq, batch))
        except ConnectionClosed:
            if getattr(client, "closed", True) or resend == APPEND_RESENDS:
                raise
    raise AssertionError("unreachable")


async def _aappend_surviving_reconnects(client: Any, run: str, stream: str, seq: int,
                                        batch: List[Dict[str, Any]]) -> int:
    """``_append_surviving_reconnects`` for an ``AsyncClient``."""
    for resend in range(APPEND_RESENDS + 1):
        try:
            return int(await client.stream_append(run, stream, seq, batch))
        except ConnectionClosed:
            if getattr(client, "closed", True) or resend == APPEND_RESENDS:
                raise
    raise AssertionError("unreachable")


class _AsyncAppender:
    """``_Appender`` for an ``AsyncClient``: ``put`` hands events over without waiting, a task
    sends whatever accumulated while the previous append was in flight, ``flush`` waits."""

    def __init__(self, client: Any, run_id: str, stream_id: str, next_seq: int) -> None:
        self._client, self._run, self._stream = client, run_id, stream_id
        self._queue: List[Dict[str, Any]] = []
        self._next = next_seq
        self._acked = next_seq - 1
        self._task: Optional["asyncio.Task[None]"] = None
        self._error: Optional[BaseException] = None
        self.appends = 0
        self.events = 0

    @property
    def next_seq(self) -> int:
        """The seq the next event handed over gets."""
        return self._next + len(self._queue)

    def put(self, events: List[Dict[str, Any]]) -> None:
        if self._error is not None:
            e, self._error = self._error, None
            raise e
        self._queue.extend(events)
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        while self._queue and self._error is None:
            n = _batch_len(self._client, self._run, self._stream, self._queue)
            batch = self._queue[:n]
            del self._queue[:n]
            seq = self._next
            self._next += len(batch)
            try:
                acked = await _aappend_surviving_reconnects(self._client, self._run,
                                                            self._stream, seq, batch)
            except BaseException as e:  # noqa: BLE001 - raised by the next put or flush
                self._error, self._next, self._queue = e, seq, []
                return
            self._acked = max(self._acked, acked)
            self.appends += 1
            self.events += len(batch)

    async def flush(self) -> int:
        if self._task is not None:
            await asyncio.shield(self._task)
        if self._error is not None:
            e, self._error = self._error, None
            raise e
        return self._acked

    def reset(self, next_seq: int) -> None:
        self._next, self._acked = next_seq, next_seq - 1

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            try:
                await self._task
            except BaseException:  # noqa: BLE001 - closing: the run's outcome was decided
                pass


# ---------------------------------------------------------------------------------------------
# The producer of one run


class StreamProducer:
    """The producer of one run: numbers its events, keeps the fencing token, follows the plans.

        p = StreamProducer(hf, "run-42", model="m")       # stream.begin
        p.text("Hello, ")                                 # durable when it returns
        plan = p.interrupt("connection_reset")            # the stream from the model broke
        time.sleep(plan["wait_ms"] / 1000)                # ... then continue per plan["plan"]
        p.text("world")
        p.commit({"role": "assistant", "content": "Hello, world"})

    ``StreamProducer(hf, run_id, resume=True)`` takes a run over from a process that died:
    ``.checkpoint`` is what was streamed, ``.plan`` what to do. After a takeover by someone
    else, every call raises ``Conflict``: stop producing. ``continuation``: how this producer
    continues the text after R1/R3 (``"exact"`` or ``"restated"``, see ``RecoveringStream``).
    """

    def __init__(self, client: Any, run_id: str, *, thread_id: Optional[str] = None,
                 model: Optional[str] = None, takeover: bool = False, resume: bool = False,
                 fail_on_stale: bool = False, continuation: str = "exact") -> None:
        self.client = client
        self.run_id = run_id
        self.continuation = _continuation(continuation)
        self.checkpoint: Optional[Dict[str, Any]] = None
        self.plan: Optional[Dict[str, Any]] = None
        if resume:
            r = client.stream_resume(run_id, model=model, thread_id=thread_id,
                                     fail_on_stale=fail_on_stale,
                                     continuation=self.continuation)
            self.checkpoint = r["checkpoint"]
            self.plan = r["plan"]
        else:
            r = client.stream_begin(run_id, thread_id=thread_id, model=model, takeover=takeover)
        self.stream_id: str = r["stream_id"]
        self.epoch: int = r["epoch"]
        self._appender = _Appender(client, run_id, self.stream_id, r["next_seq"])

    @property
    def next_seq(self) -> int:
        """The seq the next event handed over gets."""
        return self._appender.next_seq

    @property
    def appends(self) -> int:
        """``stream.append`` round trips so far (fewer than calls when threads share it)."""
        return self._appender.appends

    def append(self, events: List[Dict[str, Any]]) -> int:
        """Append events; returns the last seq acknowledged once they are durable. Safe to
        call from several threads: events handed over while an append is in flight go
        together in the next one."""
        return self._appender.append(events)

    def text(self, text: str) -> int:
        """Append assistant text."""
        return self.append([{"type": "text", "text": text}])

    def tool_delta(self, id: str, arguments_delta: str, name: Optional[str] = None) -> int:
        """Append part of a tool call's arguments (``name`` on its first delta)."""
        ev: Dict[str, Any] = {"type": "tool_call_delta", "id": id,
                              "arguments_delta": arguments_delta}
        if name is not None:
            ev["name"] = name
        return self.append([ev])

    def tool_end(self, id: str) -> int:
        """A tool call's arguments are complete."""
        return self.append([{"type": "tool_call_end", "id": id}])

    def interrupt(self, cause: Cause) -> Dict[str, Any]:
        """Report the break; returns the plan and moves ``next_seq`` past its events. An R1/R3
        plan's continuation is this producer's ``continuation``."""
        self._appender.flush()
        self.plan = _interrupt(self.client, self.run_id, self.stream_id, cause,
                               self.continuation)
        self._appender.reset(self.plan["next_seq"])
        return self.plan

    def commit(self, final_message: Any, content_from_stream: bool = False) -> Dict[str, Any]:
        """End the run with its final message (one atomic step). ``content_from_stream``: the
        message's ``content`` is the text the run streamed (what subscribers were shown)."""
        return as_dict(self.client.stream_commit(self.run_id, self.stream_id, final_message,
                                                 content_from_stream))

    def abort(self, reason: Optional[str] = None) -> Dict[str, Any]:
        """End the run without a final message."""
        return as_dict(self.client.stream_abort(self.run_id, self.stream_id, reason))


# ---------------------------------------------------------------------------------------------
# Provider chunks → holdfast events


def _field(obj: Any, name: str) -> Any:
    """``obj[name]`` for a dict, ``obj.name`` otherwise; None if absent."""
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


class ChunkAdapter:
    """Turns one provider response's chunks into holdfast events.

    Accepted chunks: a ``str`` (assistant text); an event already in holdfast's form (``{"type":
    "text" | "tool_call_delta" | "tool_call_end", …}``); an OpenAI / LiteLLM chat-completion
    chunk, as an object or a dict: ``choices[0].delta.content`` is text,
    ``choices[0].delta.tool_calls[]`` are tool-call deltas (by ``index``; ``id`` and
    ``function.name`` on the first), and a ``finish_reason`` (or a new index) ends the calls
    still open. Anything else is a ``TypeError``. One adapter per response: a reopened stream
    numbers its calls from 0 again.
    """

    def __init__(self, attempt: int = 0) -> None:
        self._attempt = attempt
        self._ids: Dict[int, str] = {}
        self._open: List[str] = []

    def events(self, chunk: Any) -> List[Dict[str, Any]]:
        if isinstance(chunk, str):
            return [{"type": "text", "text": chunk}] if chunk else []
        if isinstance(chunk, dict) and chunk.get("type") in PRODUCER_EVENTS:
            given: Dict[str, Any] = dict(chunk)
            cid = given.get("id")
            if isinstance(cid, str):
                if given["type"] == "tool_call_delta" and cid not in self._open:
                    self._open.append(cid)
                elif given["type"] == "tool_call_end" and cid in self._open:
                    self._open.remove(cid)
            return [given]
        choices = _field(chunk, "choices")
        if not isinstance(choices, (list, tuple)):
            raise TypeError(
                "a provider chunk must be a str, a holdfast event or an OpenAI-shaped chunk "
                "(with choices[0].delta); got %s" % type(chunk).__name__
            )
        out: List[Dict[str, Any]] = []
        if not choices:
            return out  # usage-only chunks
        choice = choices[0]
        delta = _field(choice, "delta")
        content = _field(delta, "content") if delta is not None else None
        if isinstance(content, str) and content:
            out.append({"type": "text", "text": content})
        for tc in (_field(delta, "tool_calls") or []) if delta is not None else []:
            index = _field(tc, "index")
            index = index if isinstance(index, int) else len(self._ids)
            fn = _field(tc, "function")
            name = _field(fn, "name") if fn is not None else None
            args = _field(fn, "arguments") if fn is not None else None
            if index not in self._ids:
                # A new call: the ones before it are complete (calls stream one after another).
                out.extend(self._end_all())
                self._ids[index] = _field(tc, "id") or "call_%d_%d" % (self._attempt, index)
                self._open.append(self._ids[index])
            ev: Dict[str, Any] = {"type": "tool_call_delta", "id": self._ids[index],
                                  "arguments_delta": args if isinstance(args, str) else ""}
            if isinstance(name, str) and name:
                ev["name"] = name
            out.append(ev)
        if _field(choice, "finish_reason"):
            out.extend(self._end_all())
        return out

    def _end_all(self) -> List[Dict[str, Any]]:
        ended = [{"type": "tool_call_end", "id": i} for i in self._open]
        self._open = []
        return ended

    def finish(self) -> List[Dict[str, Any]]:
        """The response ended cleanly: end the calls still open."""
        return self._end_all()


# ---------------------------------------------------------------------------------------------
# Provider exceptions → interruption causes


def _status_of(exc: BaseException) -> Optional[int]:
    for holder in (exc, _field(exc, "response")):
        if holder is None:
            continue
        for name in ("status_code", "status", "http_status"):
            v = _field(holder, name)
            if isinstance(v, int) and not isinstance(v, bool) and 100 <= v <= 599:
                return v
    return None


def _retry_after_of(exc: BaseException) -> Any:
    v = _field(exc, "retry_after")
    if isinstance(v, (int, float, str)) and not isinstance(v, bool):
        return v
    for holder in (_field(exc, "response"), exc):
        headers = _field(holder, "headers") if holder is not None else None
        if headers is None:
            continue
        try:
            for key in ("retry-after", "Retry-After"):
                got = headers.get(key)
                if got is not None:
                    return got
        except (AttributeError, TypeError):
            continue
    return None


def classify_error(exc: BaseException, mid_stream: bool) -> Optional[Cause]:
    """The interruption cause of a provider exception, or ``None`` when it is not a stream
    failure this module should recover from (a bug in the caller's code, say): then it
    propagates and the run stays resumable.

    An HTTP status (``status_code`` / ``status`` / ``http_status`` on the exception or its
    ``response``) becomes ``{"status", "message", "retry_after"}`` for the planner to classify
    (429 rate limited, 529 overloaded, 413 or "prompt is too long" context overflow, …), with
    Retry-After from ``retry_after`` or the response headers. A dropped connection
    (``ConnectionError``; httpx's ``RemoteProtocolError`` / ``ReadError``; openai's
    ``APIConnectionError``) is ``connection_reset``; a timeout is ``idle_stall`` once chunks
    were flowing (``mid_stream``), else ``timeout``."""
    status = _status_of(exc)
    if status is not None:
        cause: Dict[str, Any] = {"status": status, "message": str(exc)[:MAX_CAUSE_MESSAGE]}
        retry_after = _retry_after_of(exc)
        if retry_after is not None:
            cause["retry_after"] = retry_after
        return cause
    names = {c.__name__ for c in type(exc).__mro__}
    timeout_names = {"TimeoutError", "ReadTimeout", "TimeoutException", "APITimeoutError",
                     "timeout"}
    if isinstance(exc, (TimeoutError, socket.timeout)) or names & timeout_names:
        return "idle_stall" if mid_stream else "timeout"
    connection_names = {"APIConnectionError", "RemoteProtocolError", "ReadError",
                        "ConnectError", "ChunkedEncodingError", "IncompleteRead"}
    if isinstance(exc, ConnectionError) or names & connection_names:
        return "connection_reset"
    return None


# ---------------------------------------------------------------------------------------------
# What RecoveringStream yields, and how it can end


class StreamEvent:
    """One event of the run as its subscribers see it: ``seq``, ``type`` (``text``,
    ``tool_call_delta``, ``tool_call_end``, ``tool_call_cancel``, ``stream_reset``,
    ``interrupted``, ``finish``) and ``data`` (the event's fields). ``text`` is the text of a
    ``text`` event ("" otherwise)."""

    __slots__ = ("seq", "type", "data")

    def __init__(self, seq: int, data: Dict[str, Any]) -> None:
        self.seq = seq
        self.type: str = data.get("type", "")
        self.data = data

    @property
    def text(self) -> str:
        t = self.data.get("text") if self.type == "text" else None
        return t if isinstance(t, str) else ""

    def __repr__(self) -> str:
        return "StreamEvent(seq=%d, type=%r, chars=%d)" % (self.seq, self.type, len(self.text))


class StreamFailed(Exception):
    """The planner gave up (a permanent cause such as 401 or a context overflow, or a spent
    retry budget): the run was aborted. ``plan`` is the plan; the provider's exception is the
    ``__cause__``."""

    def __init__(self, plan: Dict[str, Any]) -> None:
        super().__init__("stream failed: %s (%s)" % (plan.get("cause"), plan.get("reason")))
        self.plan = plan


class SplitToolCall(Exception):
    """The same tool call stalled again and again while its arguments were being written
    (typically one huge ``write_file``): retrying would loop. The run was aborted; tell the
    model ``message`` (split the output into several smaller calls of ``tool``) and start a
    new turn."""

    def __init__(self, hint: Dict[str, Any], plan: Dict[str, Any]) -> None:
        self.hint = hint
        self.plan = plan
        self.tool: Optional[str] = hint.get("tool")
        self.message: str = hint.get("message") or "split the tool call into smaller calls"
        super().__init__(self.message)


# ---------------------------------------------------------------------------------------------
# The decisions, without I/O (shared by the sync and async drivers)


class _Core:
    """What the run shows (from its published events) and what to do with each plan."""

    def __init__(self) -> None:
        self.text = ""
        self.calls: Dict[str, Dict[str, Any]] = {}
        self.plans: List[Dict[str, Any]] = []
        self.attempt = 0
        self.last_seq = 0  # the last seq seen on the subscription

    def seen(self, params: Dict[str, Any]) -> StreamEvent:
        ev = StreamEvent(int(params.get("seq") or 0), params.get("event") or {})
        self.last_seq = max(self.last_seq, ev.seq)
        d = ev.data
        if ev.type == "text":
            self.text += ev.text
        elif ev.type == "stream_reset":
            self.text = ""
            self.calls.clear()
        elif ev.type == "tool_call_delta":
            cid = d.get("id")
            call = self.calls.setdefault(cid if isinstance(cid, str) else "",
                                         {"id": cid, "name": "", "arguments": ""})
            if d.get("name") and not call["name"]:
                call["name"] = d["name"]
            call["arguments"] += d.get("arguments_delta") or ""
        elif ev.type == "tool_call_cancel":
            cid = d.get("id")
            self.calls.pop(cid if isinstance(cid, str) else "", None)
        return ev

    def completed_calls(self) -> List[Dict[str, Any]]:
        """The calls whose name is set and whose arguments parse (the planner's rule)."""
        out = []
        for c in self.calls.values():
            try:
                args = json.loads(c["arguments"])
            except ValueError:
                continue
            if c["name"] and args is not None:
                out.append({"id": c["id"], "name": c["name"], "arguments": args})
        return out

    def decide(self, plan: Dict[str, Any]) -> Tuple[str, Any]:
        """``("fail", None)``, ``("split", hint)``, ``("tools", calls)`` (R2: end the turn with
        these calls) or ``("reopen", prefix)`` (``None`` for R4)."""
        self.plans.append(plan)
        kind = plan.get("plan")
        if kind == "fail":
            return "fail", None
        if kind == "R2":
            return "tools", [{"id": c["id"], "name": c["name"], "arguments": c["arguments"]}
                             for c in plan.get("completed") or []]
        for h in plan.get("hints") or []:
            if h.get("kind") == "split_tool_call":
                return "split", h
        self.attempt += 1
        return "reopen", (plan.get("assistant_prefix") if kind in ("R1", "R3") else None)

    @staticmethod
    def message(tool_calls: List[Dict[str, Any]]) -> Dict[str, Any]:
        """The final message (its content filled in by the daemon from the stream)."""
        msg: Dict[str, Any] = {"role": "assistant"}
        if tool_calls:
            msg["tool_calls"] = tool_calls
        return msg


# ---------------------------------------------------------------------------------------------
# RecoveringStream

#: The longest ``stall_timeout`` (24 days, what every platform's timers take; ``None`` waits
#: forever).
MAX_STALL_TIMEOUT = 24 * 86400

#: How a reopened stream continues the text so far (docs/recovery.md, "Continuation").
CONTINUATIONS = ("exact", "restated")


def _continuation(value: Any) -> str:
    if value not in CONTINUATIONS:
        raise ValueError("continuation must be 'exact' or 'restated', not %r" % (value,))
    return str(value)


class StreamStalled(TimeoutError):
    """No chunk came from the provider for ``stall_timeout`` seconds: reported as the
    interruption (cause ``stalled``) and planned like any other; the ``__cause__`` of a
    ``StreamFailed`` or ``SplitToolCall`` that followed it."""

    def __init__(self, seconds: float) -> None:
        super().__init__("no chunk from the provider for %g s" % seconds)
        self.seconds = seconds


def _without_retry_after(cause: Cause) -> Optional[Cause]:
    """The cause without a Retry-After, if it had one (a provider's header the daemon could
    not read — "soon", "" — must not stop the recovery: the plan's own backoff applies)."""
    if isinstance(cause, dict) and "retry_after" in cause:
        return {k: v for k, v in cause.items() if k != "retry_after"}
    return None


def _interrupt(client: Any, run: str, sid: str, cause: Cause, continuation: str
               ) -> Dict[str, Any]:
    from ._errors import InvalidParams

    try:
        return as_dict(client.stream_interrupt(run, sid, cause, continuation=continuation))
    except InvalidParams:
        plain = _without_retry_after(cause)
        if plain is None:
            raise
        return as_dict(client.stream_interrupt(run, sid, plain, continuation=continuation))


async def _ainterrupt(client: Any, run: str, sid: str, cause: Cause, continuation: str
                      ) -> Dict[str, Any]:
    from ._errors import InvalidParams

    try:
        return as_dict(await client.stream_interrupt(run, sid, cause, continuation=continuation))
    except InvalidParams:
        plain = _without_retry_after(cause)
        if plain is None:
            raise
        return as_dict(await client.stream_interrupt(run, sid, plain, continuation=continuation))


def _ended_elsewhere() -> HoldfastError:
    from ._errors import Conflict

    return Conflict(message="the run ended while this producer was streaming it (taken over, "
                            "aborted or expired elsewhere): stop producing")


def _last_published(plan: Dict[str, Any]) -> int:
    """The seq of a plan's last published event (its ``interrupted``), 0 if it says none."""
    seqs = [s for s in plan.get("events_published") or [] if isinstance(s, int)]
    return max(seqs, default=0)


def _no_subscription(e: BaseException) -> str:
    return "could not subscribe to the run (%s): nothing was streamed" % type(e).__name__


def _close_quietly(source: Any) -> None:
    """Close an abandoned provider stream if it can be (an httpx / OpenAI stream, a generator
    not running): its connection is freed; whatever it still yields is dropped."""
    close = getattr(source, "close", None)
    if callable(close):
        try:
            close()
        except Exception:  # noqa: BLE001 - abandoned: nothing to report
            pass


class _Pump:
    """One provider response read on a thread of its own, into ``mux``: ``("chunk", c)``…,
    then ``("end", None)`` or ``("error", exc)``. The reader waits on the subscription and the
    pump together, with a deadline for the next chunk; an abandoned pump (stalled) drops
    whatever its provider still sends."""

    def __init__(self, open_source: Callable[[], Any], mux: Any) -> None:
        import collections
        import threading

        self._mux = mux
        self.items: Any = collections.deque()
        self.abandoned = False
        self._source: Any = None
        self._open = open_source
        threading.Thread(target=self._run, daemon=True, name="holdfast-provider").start()

    def _put(self, item: Tuple[str, Any]) -> bool:
        with self._mux:
            if self.abandoned:
                return False
            self.items.append(item)
            self._mux.notify_all()
            return True

    def _run(self) -> None:
        try:
            source = self._open()
            with self._mux:
                late = self.abandoned
                self._source = source
            if late:
                # Opened after the stall was declared: nobody reads it; let it go.
                _close_quietly(source)
                return
            for chunk in self._source:
                if not self._put(("chunk", chunk)):
                    # Abandoned while the provider was busy: closed here, by the thread that
                    # runs it (a generator cannot be closed by another while it executes).
                    _close_quietly(self._source)
                    return
            self._put(("end", None))
        except BaseException as e:  # noqa: BLE001 - handed to the reader
            self._put(("error", e))

    def abandon(self) -> None:
        import threading

        with self._mux:
            self.abandoned = True
            self.items.clear()
            source = self._source
        if source is not None:
            # Closing may block (or fail on a generator still running): not on the reader.
            threading.Thread(target=_close_quietly, args=(source,), daemon=True).start()


class RecoveringStream:
    """A provider stream made recoverable through holdfast (see the module docs).

    ``client``: a ``Client`` (iterate with ``for``) or an ``AsyncClient`` (``async for``).
    ``stream``: the first provider response — an iterable (or async iterable) of chunks, or a
    callable returning one; not needed with ``resume``. ``reopen(prefix)``: a new provider
    response continuing after ``prefix`` (R1/R3: the assistant text so far, to send as an
    assistant prefill or a "continue" turn) or from scratch (R4: ``None``); may return an
    iterable, an async iterable, or (async) a coroutine giving one.

    ``continuation``: how ``reopen(prefix)`` continues the text — ``"exact"`` (the default:
    the provider continues the prefix, e.g. an assistant prefill; every character it sends is
    new text and nothing is removed) or ``"restated"`` (a "continue" turn: the model may begin
    by restating the end of the prefix, and the daemon removes the longest restatement its
    start can be; docs/recovery.md says exactly what). ``stall_timeout``: seconds without a
    chunk (from the request on) after which the provider stream counts as broken, cause
    ``stalled``: abandoned (closed if it can be) and planned like any other interruption — a
    stalled tool call is cancelled (R3) or the turn ends with the completed ones (R2), and the
    same call stalling again and again raises ``SplitToolCall``. ``None``: wait forever.

    Each event is yielded as soon as the daemon has it durable and published — not when the
    provider's next chunk comes.

    ``resume=True`` takes over a run whose producer died (another process): the plan for the
    checkpoint is followed with ``reopen``. ``after_seq``: the last seq this UI already
    rendered (0: render the run from its start). ``classify(exc, mid_stream)``: your own cause
    for an exception (``None`` falls back to ``classify_error``). ``sleep``: how to wait a
    plan's ``wait_ms`` (tests pass a fake).

    After iterating: ``final_message`` (as stored by the commit), ``text`` (what was
    rendered: equal to the final content), ``tool_calls`` (the completed calls of a tool-use
    turn, with ``execution`` for R2 plans), ``plans`` (every plan followed), ``stream_id``.
    """

    def __init__(
        self,
        client: Any,
        run_id: str,
        stream: Any = None,
        *,
        reopen: Callable[[Optional[str]], Any],
        model: Optional[str] = None,
        thread_id: Optional[str] = None,
        resume: bool = False,
        takeover: bool = False,
        after_seq: int = 0,
        classify: Optional[Callable[[BaseException, bool], Optional[Cause]]] = None,
        sleep: Optional[Callable[[float], Any]] = None,
        continuation: str = "exact",
        stall_timeout: Optional[float] = None,
    ) -> None:
        self._continuation = _continuation(continuation)
        if stall_timeout is not None and not (
            isinstance(stall_timeout, (int, float)) and not isinstance(stall_timeout, bool)
            and 0 < stall_timeout <= MAX_STALL_TIMEOUT
        ):
            raise ValueError("stall_timeout must be a number of seconds in (0, %d] (or None: "
                             "wait forever)" % MAX_STALL_TIMEOUT)
        self._stall = None if stall_timeout is None else float(stall_timeout)
        if stream is None and not resume:
            raise TypeError("RecoveringStream needs the provider stream (or resume=True)")
        if not callable(reopen):
            raise TypeError("reopen must be a function of the assistant prefix")
        self.client = client
        self.run_id = run_id
        self._stream = stream
        self._reopen = reopen
        self._model = model
        self._thread_id = thread_id
        self._resume = resume
        self._takeover = takeover
        self._after_seq = after_seq
        self._classify = classify
        self._sleep = sleep
        self._core = _Core()
        self._core.last_seq = after_seq
        self.stream_id: Optional[str] = None
        self.final_message: Optional[Dict[str, Any]] = None
        self.tool_calls: List[Dict[str, Any]] = []
        self.stop_reason: Optional[str] = None
        self._appender: Any = None
        self._last_call_seq = 0

    @property
    def appends(self) -> int:
        """``stream.append`` round trips this stream made (chunks that arrived while one was
        in flight share the next)."""
        return self._appender.appends if self._appender is not None else 0

    @property
    def text(self) -> str:
        """The text rendered so far (since the last ``stream_reset``)."""
        return self._core.text

    @property
    def plans(self) -> List[Dict[str, Any]]:
        return self._core.plans

    def _cause(self, exc: BaseException, mid_stream: bool) -> Optional[Cause]:
        if isinstance(exc, HoldfastError):
            return None  # the daemon's answer (fenced, sealed, …), not the provider's
        if self._classify is not None:
            c = self._classify(exc, mid_stream)
            if c is not None:
                return c
        return classify_error(exc, mid_stream)

    def _put(self, app: Any, evs: List[Dict[str, Any]]) -> None:
        """Hand events to the appender, remembering the seq of the last tool-call event: the
        turn's calls are read from the subscription once it has shown that far. (Not every
        acknowledged seq: text of a ``restated`` continuation may be held by the daemon until
        the commit decides on it, and tool-call events are never held.)"""
        base = app.next_seq
        for i, ev in enumerate(evs):
            if ev.get("type") != "text":
                self._last_call_seq = base + i
        app.put(evs)

    def _source(self, prefix: Any, first: bool) -> Any:
        if first:
            s = self._stream
            return s() if callable(s) else s
        return self._reopen(prefix)

    # -- sync ----------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[StreamEvent]:
        if inspect.iscoroutinefunction(getattr(self.client, "call", None)):
            raise TypeError("an AsyncClient's stream is iterated with `async for`")
        return self._run()

    def _run(self) -> Iterator[StreamEvent]:
        import threading

        c, run = self.client, self.run_id
        sleep = self._sleep or time.sleep
        if self._resume:
            # Subscribed first: a subscription refused (the connection's cap) takes nothing over.
            sub = c.subscribe_stream(run, self._after_seq)
            try:
                r = c.stream_resume(run, model=self._model, thread_id=self._thread_id,
                                    continuation=self._continuation)
            except BaseException:
                sub.close()
                raise
            plan: Optional[Dict[str, Any]] = r["plan"]
        else:
            r = c.stream_begin(run, thread_id=self._thread_id, model=self._model,
                               takeover=self._takeover)
            plan = None
            sub = self._subscribe_begun(r["stream_id"])
        self.stream_id = r["stream_id"]
        app = self._appender = _Appender(c, run, self.stream_id, r["next_seq"])
        # One condition for both sources: the provider's pump and the run's subscription (its
        # reader thread notifies it after queueing an event).
        mux = threading.Condition(threading.Lock())

        def wake() -> None:
            with mux:
                mux.notify_all()

        sub._listen(wake)
        pump: Optional[_Pump] = None
        try:
            pending: Tuple[bool, Any] = (True, None)  # (first response?, prefix)
            cause_exc: Optional[BaseException] = None
            while True:
                if plan is not None:
                    # The plan's events (its `interrupted` says how long the wait is) are shown
                    # before the wait, not after it.
                    yield from self._catch_up_sync(sub, _last_published(plan))
                    what, arg = self._core.decide(plan)
                    plan = None
                    if what == "reopen":
                        sleep(self._wait(self._core.plans[-1]))
                        pending = (False, arg)
                    else:
                        yield from self._finish_sync(what, arg, sub, cause_exc)
                        return
                adapter = ChunkAdapter(self._core.attempt)
                first, prefix = pending
                pump = _Pump(lambda: self._source(prefix, first), mux)
                mid = False
                last_chunk = time.monotonic()
                broke: Optional[BaseException] = None
                while True:
                    ev: Optional[Dict[str, Any]] = None
                    item: Optional[Tuple[str, Any]] = None
                    with mux:
                        while True:
                            ev = sub.next(0)
                            if ev is not None:
                                break
                            if sub.finished:
                                item = ("ended", None)
                                break
                            if pump.items:
                                item = pump.items.popleft()
                                break
                            wait = None
                            if self._stall is not None:
                                wait = self._stall - (time.monotonic() - last_chunk)
                                if wait <= 0:
                                    item = ("stall", None)
                                    break
                            mux.wait(wait)
                    if ev is not None:
                        yield self._core.seen(ev)  # rendered as soon as it is durable
                        continue
                    assert item is not None
                    kind, val = item
                    if kind == "ended":
                        # Outside the condition's lock: abandoning takes it.
                        pump.abandon()
                        raise _ended_elsewhere()
                    if kind == "chunk":
                        mid = True
                        last_chunk = time.monotonic()
                        evs = adapter.events(val)
                        if evs:
                            self._put(app, evs)
                        continue
                    if kind == "end":
                        evs = adapter.finish()
                        if evs:
                            self._put(app, evs)
                        break
                    if kind == "stall":
                        pump.abandon()
                        broke = StreamStalled(self._stall or 0)
                    else:
                        broke = val
                    break
                if broke is not None:
                    cause: Optional[Cause] = (
                        "stalled" if isinstance(broke, StreamStalled)
                        else self._cause(broke, mid) if isinstance(broke, Exception) else None
                    )
                    if cause is None:
                        raise broke
                    app.flush()  # what the model sent before the break is kept
                    plan = _interrupt(c, run, self.stream_id, cause, self._continuation)
                    app.reset(plan["next_seq"])
                    cause_exc = broke
                    continue
                app.flush()
                # The turn's tool calls are read from what the subscription showed: up to the
                # last of them (text after it may be held until the commit decides on it).
                yield from self._catch_up_sync(sub, self._last_call_seq)
                yield from self._finish_sync("done", self._core.completed_calls(), sub, None)
                return
        finally:
            if pump is not None:
                pump.abandon()
            sub._listen(None)
            app.close()
            sub.close()

    def _subscribe_begun(self, stream_id: str) -> Any:
        """Subscribe to the run just begun; if that is refused (the connection's cap of
        subscriptions), the run — nothing streamed yet — is ended rather than left held."""
        try:
            return self.client.subscribe_stream(self.run_id, self._after_seq)
        except BaseException as e:
            try:
                self.client.stream_abort(self.run_id, stream_id, _no_subscription(e))
            except Exception:  # noqa: BLE001 - the subscription's error is the one to raise
                pass
            raise

    def _catch_up_sync(self, sub: Any, seq: int) -> Iterator[StreamEvent]:
        while self._core.last_seq < seq:
            ev = sub.next(CATCH_UP_TIMEOUT)
            if ev is None:
                raise TimeoutError("the run's subscription did not deliver seq %d within %d s"
                                   % (seq, CATCH_UP_TIMEOUT))
            yield self._core.seen(ev)

    def _drain_sync(self, sub: Any) -> Iterator[StreamEvent]:
        while True:
            ev = sub.next(0)
            if ev is None:
                return
            yield self._core.seen(ev)

    def _finish_sync(self, what: str, arg: Any, sub: Any,
                     exc: Optional[BaseException]) -> Iterator[StreamEvent]:
        c, run = self.client, self.run_id
        if what in ("done", "tools"):
            c.stream_commit(run, self.stream_id, _Core.message(arg), True)
        else:
            c.stream_abort(run, self.stream_id, self._abort_reason(what, arg))
        for ev in sub:  # to finish
            yield self._core.seen(ev)
        self._ended(what, arg)
        if what in ("done", "tools"):
            self.final_message = c.stream_get(run, reveal=True).get("final_message")
        else:
            raise self._error(what, arg) from exc

    # -- async ---------------------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[StreamEvent]:
        if not inspect.iscoroutinefunction(getattr(self.client, "call", None)):
            raise TypeError("a Client's stream is iterated with `for`; use an AsyncClient for "
                            "`async for`")
        return self._arun()

    async def _arun(self) -> AsyncIterator[StreamEvent]:
        c, run = self.client, self.run_id
        if self._resume:
            # Subscribed first: a subscription refused (the connection's cap) takes nothing over.
            sub = await c.subscribe_stream(run, self._after_seq)
            try:
                r = await c.stream_resume(run, model=self._model, thread_id=self._thread_id,
                                          continuation=self._continuation)
            except BaseException:
                await sub.close()
                raise
            plan: Optional[Dict[str, Any]] = r["plan"]
        else:
            r = await c.stream_begin(run, thread_id=self._thread_id, model=self._model,
                                     takeover=self._takeover)
            plan = None
            try:
                sub = await c.subscribe_stream(run, self._after_seq)
            except BaseException as e:
                # Nothing was streamed: the run just begun is ended, not left held.
                try:
                    await c.stream_abort(run, r["stream_id"], _no_subscription(e))
                except Exception:  # noqa: BLE001 - the subscription's error is the one to raise
                    pass
                raise
        self.stream_id = r["stream_id"]
        app = self._appender = _AsyncAppender(c, run, self.stream_id, r["next_seq"])
        # The subscription's next event and the provider's next chunk, awaited together.
        sub_next: Optional["asyncio.Task[Any]"] = None
        chunk_next: Optional["asyncio.Task[Any]"] = None
        source: Any = None
        try:
            pending: Tuple[bool, Any] = (True, None)
            cause_exc: Optional[BaseException] = None
            while True:
                if plan is not None:
                    # The plan's events are shown before the wait, not after it.
                    async for ev in self._catch_up_async(sub, sub_next, _last_published(plan)):
                        yield ev
                    sub_next = None
                    what, arg = self._core.decide(plan)
                    plan = None
                    if what == "reopen":
                        await self._asleep(self._wait(self._core.plans[-1]))
                        pending = (False, arg)
                    else:
                        async for ev in self._finish_async(what, arg, sub, cause_exc):
                            yield ev
                        return
                adapter = ChunkAdapter(self._core.attempt)
                mid = False
                loop = asyncio.get_running_loop()
                last_chunk = loop.time()
                broke: Optional[BaseException] = None
                first, prefix = pending
                chunk_next = asyncio.ensure_future(self._open_async(prefix, first))
                opened = False
                it: Any = None
                while True:
                    if sub_next is None:
                        sub_next = asyncio.ensure_future(sub.next())
                    wait = None
                    if self._stall is not None:
                        wait = max(0.0, self._stall - (loop.time() - last_chunk))
                    done, _ = await asyncio.wait({sub_next, chunk_next}, timeout=wait,
                                                 return_when=asyncio.FIRST_COMPLETED)
                    if sub_next in done:
                        got = sub_next.result()
                        sub_next = None
                        if got is None:
                            # The subscription ended: the run was ended (or taken over and
                            # ended) under this producer.
                            raise _ended_elsewhere()
                        yield self._core.seen(got)  # rendered as soon as it is durable
                        continue
                    if chunk_next not in done:
                        chunk_next.cancel()
                        broke = StreamStalled(self._stall or 0)
                        break
                    try:
                        value = chunk_next.result()
                    except Exception as exc:  # noqa: BLE001 - classified below
                        broke = exc
                        break
                    if not opened:
                        # The stall clock runs from the request on: not restarted here.
                        opened, source = True, value
                        it = _async_chunks(source)
                        chunk_next = asyncio.ensure_future(it.__anext__())
                        continue
                    if value is _END:
                        evs = adapter.finish()
                        if evs:
                            self._put(app, evs)
                        chunk_next = None
                        break
                    mid = True
                    last_chunk = loop.time()
                    evs = adapter.events(value)
                    if evs:
                        self._put(app, evs)
                    chunk_next = asyncio.ensure_future(it.__anext__())
                if broke is not None:
                    chunk_next = None
                    if source is not None:
                        await _aclose_quietly(source)
                    source = None
                    cause: Optional[Cause] = (
                        "stalled" if isinstance(broke, StreamStalled)
                        else self._cause(broke, mid)
                    )
                    if cause is None:
                        raise broke
                    await app.flush()  # what the model sent before the break is kept
                    plan = await _ainterrupt(c, run, self.stream_id, cause, self._continuation)
                    app.reset(plan["next_seq"])
                    cause_exc = broke
                    continue
                await app.flush()
                # Up to the last tool-call event (text after it may be held until the commit);
                # the finish reads the subscription from there.
                async for ev in self._catch_up_async(sub, sub_next, self._last_call_seq):
                    yield ev
                sub_next = None
                async for ev in self._finish_async("done", self._core.completed_calls(), sub,
                                                   None):
                    yield ev
                return
        finally:
            for t in (sub_next, chunk_next):
                if t is not None and not t.done():
                    t.cancel()
            if source is not None:
                await _aclose_quietly(source)
            await app.close()
            await sub.close()

    async def _catch_up_async(self, sub: Any, pending: Any, seq: int
                              ) -> AsyncIterator[StreamEvent]:
        """Render the subscription's events up to ``seq``. ``pending``, a ``sub.next()`` task
        in flight (or None), is taken over first — an event it took is rendered, never
        dropped — and nothing is left in flight after: the caller reads on from here."""
        got = await _take_pending(pending)
        if got is not None:
            yield self._core.seen(got)
        while self._core.last_seq < seq:
            task = asyncio.ensure_future(sub.next())
            done, _ = await asyncio.wait({task}, timeout=CATCH_UP_TIMEOUT)
            got = task.result() if done else None
            if not done:
                task.cancel()
            if got is None:
                raise TimeoutError("the run's subscription did not deliver seq %d within %d s"
                                   % (seq, CATCH_UP_TIMEOUT))
            yield self._core.seen(got)

    async def _open_async(self, prefix: Any, first: bool) -> Any:
        fn = self._stream if first else self._reopen
        if first and not callable(fn):
            source = fn
        elif inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
            source = self._source(prefix, first)
        else:
            # A plain function may block making its request: on a thread, so the stall timer
            # and the subscription go on meanwhile.
            source = await _on_thread(lambda: self._source(prefix, first))
        if inspect.isawaitable(source):
            source = await source
        return source

    async def _finish_async(self, what: str, arg: Any, sub: Any,
                            exc: Optional[BaseException]) -> AsyncIterator[StreamEvent]:
        c, run = self.client, self.run_id
        if what in ("done", "tools"):
            await c.stream_commit(run, self.stream_id, _Core.message(arg), True)
        else:
            await c.stream_abort(run, self.stream_id, self._abort_reason(what, arg))
        async for ev in sub:
            yield self._core.seen(ev)
        self._ended(what, arg)
        if what in ("done", "tools"):
            self.final_message = (await c.stream_get(run, reveal=True)).get("final_message")
        else:
            raise self._error(what, arg) from exc

    async def _asleep(self, seconds: float) -> None:
        if self._sleep is None:
            await asyncio.sleep(seconds)
        else:
            r = self._sleep(seconds)
            if inspect.isawaitable(r):
                await r

    # -- shared --------------------------------------------------------------------------------

    @staticmethod
    def _wait(plan: Dict[str, Any]) -> float:
        return max(0, int(plan.get("wait_ms") or 0)) / 1000.0

    def _abort_reason(self, what: str, arg: Any) -> str:
        plan = self._core.plans[-1] if self._core.plans else {}
        if what == "split":
            return "split_tool_call: %s" % (arg.get("tool") or "?")
        return "recovery failed: %s (%s)" % (plan.get("cause"), plan.get("reason"))

    def _ended(self, what: str, arg: Any) -> None:
        if what in ("done", "tools"):
            self.tool_calls = list(arg or [])
            if what == "tools":
                # The R2 plan's calls carry their execution state from the run log.
                self.tool_calls = list(self._core.plans[-1].get("completed") or [])
            self.stop_reason = "tool_use" if self.tool_calls else "end_turn"
        else:
            self.stop_reason = what

    def _error(self, what: str, arg: Any) -> Exception:
        plan = self._core.plans[-1] if self._core.plans else {}
        if what == "split":
            return SplitToolCall(arg, plan)
        return StreamFailed(plan)


#: What ``_async_chunks`` yields last (a provider's end, not a chunk).
_END = object()


async def _take_pending(task: Any) -> Any:
    """Stop a pending ``sub.next()`` task and return the event it took, if it took one."""
    if task is None:
        return None
    if not task.done():
        task.cancel()
        try:
            return await task
        except asyncio.CancelledError:
            return None
    return task.result()


def _to_loop(loop: Any, fn: Callable[..., Any], *args: Any) -> bool:
    """``fn(*args)`` on ``loop`` from another thread; False once the loop is closed."""
    try:
        loop.call_soon_threadsafe(fn, *args)
        return True
    except RuntimeError:
        return False


async def _async_chunks(source: Any) -> AsyncIterator[Any]:
    """A sync or async iterable's items from async code, then ``_END``. A sync iterable is read
    on a thread of its own (not the loop's shared executor: a provider that hangs ties up only
    its own thread), so the event loop — the run's subscription, the stall timer — keeps going
    while the provider blocks; once this generator is closed (abandoned) the thread stops
    handing items over."""
    if hasattr(source, "__aiter__"):
        async for x in source:
            yield x
        yield _END
        return
    import threading

    loop = asyncio.get_running_loop()
    q: "asyncio.Queue[Tuple[str, Any]]" = asyncio.Queue()
    stop = threading.Event()

    def pump() -> None:
        try:
            for x in source:
                if stop.is_set() or not _to_loop(loop, q.put_nowait, ("item", x)):
                    _close_quietly(source)  # let go: closed by the thread that runs it
                    return
            _to_loop(loop, q.put_nowait, ("end", None))
        except BaseException as e:  # noqa: BLE001 - handed to the reader
            if not stop.is_set():
                _to_loop(loop, q.put_nowait, ("error", e))

    threading.Thread(target=pump, daemon=True, name="holdfast-provider").start()
    try:
        while True:
            kind, x = await q.get()
            if kind == "end":
                break
            if kind == "error":
                raise x
            yield x
    finally:
        stop.set()
    yield _END


async def _on_thread(fn: Callable[[], Any]) -> Any:
    """``fn()`` on a thread of its own, awaited: a blocking call (a sync ``reopen`` making
    its request) does not stop the event loop, and a hung one ties up only its thread."""
    import threading

    loop = asyncio.get_running_loop()
    fut: "asyncio.Future[Any]" = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not fut.done():
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)
        elif ok:
            # Came after the wait was given up (a stall): nobody reads it; let it go.
            if inspect.iscoroutine(value):
                value.close()
            else:
                asyncio.ensure_future(_aclose_quietly(value))

    def run() -> None:
        try:
            r = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting task
            _to_loop(loop, settle, False, e)
        else:
            _to_loop(loop, settle, True, r)

    threading.Thread(target=run, daemon=True, name="holdfast-reopen").start()
    return await fut


async def _aclose_quietly(source: Any) -> None:
    """Close an abandoned provider stream if it can be: an async one's ``aclose()`` awaited
    (at most 1 s), a sync one's ``close()`` on a thread of its own (it may block while a read
    is in progress, and must not stop the event loop)."""
    aclose = getattr(source, "aclose", None)
    if callable(aclose):
        try:
            await asyncio.wait_for(aclose(), 1.0)
        except Exception:  # noqa: BLE001 - abandoned: nothing to report
            pass
        return
    if callable(getattr(source, "close", None)):
        import threading

        threading.Thread(target=_close_quietly, args=(source,), daemon=True,
                         name="holdfast-close").start()


__all__ = [
    "CONTINUATIONS",
    "ChunkAdapter",
    "RecoveringStream",
    "SplitToolCall",
    "StreamEvent",
    "StreamFailed",
    "StreamProducer",
    "StreamStalled",
    "classify_error",
]
