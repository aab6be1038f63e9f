"""A client for the holdfast daemon's Unix-socket API (protocol v1), for Python agent processes.

Standard library only (``socket``, ``json``, ``threading``); Python 3.8 or later.

    from holdfast_client import Client, NotFound

    with Client(client="my-agent") as hf:
        hf.set_value("openai", api_key)           # -> SetResult(id='openai', generation=1)
        rec = hf.get("openai")                    # -> CredentialRecord (repr hides values)
        key = rec.value()                         # the "api_key" key's value
        try:
            hf.get("missing")
        except NotFound as e:
            print(e.kind)                         # "not_found"

One ``Client`` is one connection. It is thread-safe: any number of threads may call it at once;
requests are pipelined on the socket and a reader thread hands each response to the caller
waiting for its ``id``, and each event notification (after ``watch``) to ``events()`` and to
the optional ``on_event`` callback.

Errors are ``HoldfastError`` (``.kind``, ``.message``, ``.code``, ``.data``), one subclass per
stable kind of the protocol. Neither an error's message nor its ``repr`` contains a secret: the
daemon never puts one in a message, and this module never puts request parameters in one.

``single_flight_refresh`` implements the refresh-lease protocol for OAuth-style credentials:
among every process that finds the same token stale at the same time, one refreshes it and the
others wait for its write and read the new token.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import queue
import re
import socket
import struct
import threading
import time

__all__ = [
    "Client",
    "CredentialRecord",
    "SetResult",
    "Lease",
    "HoldfastError",
    "InvalidParams",
    "NotFound",
    "Conflict",
    "Forbidden",
    "Sealed",
    "IntegrityError",
    "StorageError",
    "Busy",
    "Unsupported",
    "ConnectionClosed",
    "CallTimeout",
    "KINDS",
    "PROTOCOL_VERSION",
    "default_socket_path",
    "single_flight_refresh",
    "StreamProducer",
]

PROTOCOL_VERSION = 1

#: The stable error kinds (``error.data.kind``).
KINDS = (
    "invalid_params",
    "not_found",
    "conflict",
    "forbidden",
    "sealed",
    "integrity",
    "storage",
    "busy",
    "unsupported",
)

# The JSON-RPC code of each kind, for a daemon answer that lacks data.kind (src/ipc/protocol.rs).
_KIND_OF_CODE = {
    -32700: "invalid_params",
    -32600: "invalid_params",
    -32602: "invalid_params",
    -32601: "unsupported",
    -32008: "unsupported",
    -32001: "not_found",
    -32002: "conflict",
    -32003: "forbidden",
    -32004: "sealed",
    -32005: "integrity",
    -32006: "storage",
    -32603: "storage",
    -32007: "busy",
}


# ---------------------------------------------------------------------------------------------
# Errors


class HoldfastError(Exception):
    """An error from the daemon (or the connection to it): ``HoldfastError(kind, message, code,
    data)``. A subclass given ``kind=None`` keeps its own kind.

    ``kind`` is one of ``KINDS``; ``code`` the JSON-RPC code (0 for client-side errors);
    ``message`` a human-readable text that never holds a secret; ``data`` the error's ``data``
    object (``kind`` plus machine-readable detail such as ``generation`` on a conflict).
    """

    kind = "storage"

    def __init__(self, kind=None, message="", code=0, data=None):
        # Only the message goes into args: that is all that str(), repr() and tracebacks show.
        super().__init__(message)
        if kind is not None:
            self.kind = kind
        self.message = message
        self.code = code
        self.data = dict(data) if data else {"kind": self.kind}

    def __str__(self):
        return "%s: %s" % (self.kind, self.message)

    def __repr__(self):
        return "%s(kind=%r, code=%r, message=%r)" % (
            type(self).__name__,
            self.kind,
            self.code,
            self.message,
        )

    def __reduce__(self):
        # Picklable (multiprocessing) with its fields.
        return (_rebuild_error, (type(self), self.kind, self.message, self.code, self.data))


def _rebuild_error(cls, kind, message, code, data):
    e = cls.__new__(cls)
    HoldfastError.__init__(e, kind, message, code, data)
    return e


class InvalidParams(HoldfastError, ValueError):
    """``invalid_params``: bad parameters, a bad credential id or document, or bad JSON-RPC."""

    kind = "invalid_params"


class NotFound(HoldfastError, KeyError):
    """``not_found``: no such credential (or store)."""

    kind = "not_found"

    def __str__(self):  # KeyError's str() would quote the args.
        return HoldfastError.__str__(self)


class Conflict(HoldfastError):
    """``conflict``: ``if_generation`` did not match; ``data["generation"]`` is the current one."""

    kind = "conflict"


class Forbidden(HoldfastError, PermissionError):
    """``forbidden``: outside this connection's plugin grant (or an unknown plugin)."""

    kind = "forbidden"


class Sealed(HoldfastError):
    """``sealed``: the store has no usable key."""

    kind = "sealed"


class IntegrityError(HoldfastError):
    """``integrity``: a credential file is tampered with or undecryptable."""

    kind = "integrity"


class StorageError(HoldfastError):
    """``storage``: an I/O error; nothing was changed."""

    kind = "storage"


class Busy(HoldfastError):
    """``busy``: a lock could not be had in time; retry later."""

    kind = "busy"


class Unsupported(HoldfastError):
    """``unsupported``: an unknown method, or one this daemon cannot do."""

    kind = "unsupported"


class ConnectionClosed(StorageError, ConnectionError):
    """The connection to the daemon failed or closed (kind ``storage``, code 0). A call that was
    in flight may or may not have been carried out."""


class CallTimeout(Busy, TimeoutError):
    """No response within the client's timeout (kind ``busy``, code 0). The request may still
    be carried out by the daemon."""


_ERROR_CLASSES = {
    "invalid_params": InvalidParams,
    "not_found": NotFound,
    "conflict": Conflict,
    "forbidden": Forbidden,
    "sealed": Sealed,
    "integrity": IntegrityError,
    "storage": StorageError,
    "busy": Busy,
    "unsupported": Unsupported,
}


def _error_from_response(err):
    """Build the exception for a JSON-RPC ``error`` object."""
    if not isinstance(err, dict):
        return StorageError(message="malformed error response from the daemon")
    code = err.get("code") if isinstance(err.get("code"), int) else 0
    data = err.get("data") if isinstance(err.get("data"), dict) else {}
    kind = data.get("kind")
    if kind not in _ERROR_CLASSES:
        kind = _KIND_OF_CODE.get(code, "storage")
    message = err.get("message")
    if not isinstance(message, str):
        message = "error"
    data = dict(data)
    data.setdefault("kind", kind)
    return _ERROR_CLASSES[kind](kind, message, code, data)


# Names that may appear in a request's params and are never secret: they stay in messages.
_FIELD_NAMES = frozenset(
    """store id value credential if_generation ttl_ms repair client plugin protocol
    credential_type keys name expires_at metadata provider_id last_refreshed auto_refresh
    last_used use_count description tags created_at updated_at holdfast_generation""".split()
)
_MIN_SCRUBBED = 6  # shorter strings are not worth mangling a message for


def _sensitive_strings(params):
    """Strings of a request that may be secret: every string value and unknown field name,
    except the (non-secret) credential id, store, client and plugin names."""
    found = set()
    plain = {params.get(k) for k in ("id", "store", "client", "plugin")}
    cred = params.get("credential")
    if isinstance(cred, dict):
        plain.add(cred.get("id"))
    stack = [params]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            for k, item in v.items():
                if isinstance(k, str) and k not in _FIELD_NAMES:
                    found.add(k)
                stack.append(item)
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, str):
            found.add(v)
    return sorted(
        (x for x in found if len(x) >= _MIN_SCRUBBED and x not in plain), key=len, reverse=True
    )


def _scrub(err, params):
    """Defence in depth: the daemon's messages never hold a secret, but should one ever echo a
    string this request carried (a value, or a field name), it is cut out here."""
    secrets = _sensitive_strings(params)
    if not secrets:
        return

    def clean(text):
        for sec in secrets:
            if sec in text:
                text = text.replace(sec, "<redacted>")
        return text

    message = clean(err.message)
    if message != err.message:
        err.message = message
        err.args = (message,)

    def walk(v):
        if isinstance(v, str):
            return clean(v)
        if isinstance(v, dict):
            return {clean(k) if isinstance(k, str) else k: walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    err.data = walk(err.data)


# ---------------------------------------------------------------------------------------------
# Results


class CredentialRecord:
    """A credential as ``cred.get`` returns it: ``credential`` (the whole document, secrets
    included) and ``generation``. Its ``repr`` shows the id, type, generation and key names,
    never a value."""

    __slots__ = ("credential", "generation")

    def __init__(self, credential, generation):
        self.credential = credential
        self.generation = generation

    @property
    def id(self):
        return self.credential.get("id")

    @property
    def credential_type(self):
        return self.credential.get("credential_type")

    @property
    def keys(self):
        """The key names."""
        keys = self.credential.get("keys") or {}
        return sorted(keys)

    def value(self, key="api_key"):
        """The value of key ``key`` (``KeyError`` naming only the key if there is none)."""
        keys = self.credential.get("keys") or {}
        if key not in keys:
            raise KeyError(key)
        return keys[key]["value"]

    def __eq__(self, other):
        if not isinstance(other, CredentialRecord):
            return NotImplemented
        return self.generation == other.generation and self.credential == other.credential

    __hash__ = None

    def __repr__(self):
        return "CredentialRecord(id=%r, credential_type=%r, generation=%r, keys=%r)" % (
            self.id,
            self.credential_type,
            self.generation,
            self.keys,
        )


SetResult = collections.namedtuple("SetResult", "id generation")
SetResult.__doc__ = "What ``cred.set`` answers: the credential id and its new generation."


class Lease(collections.namedtuple("Lease", "granted lease_id expires_in_ms")):
    """What ``cred.refresh_lease`` answers. ``granted``: this connection holds the lease for
    ``expires_in_ms``; otherwise another does, for ``expires_in_ms`` more at most."""

    __slots__ = ()

    def __bool__(self):
        return bool(self.granted)


# ---------------------------------------------------------------------------------------------
# Finding the socket


def _env_path(var):
    v = os.environ.get(var)
    if v and os.path.isabs(v):
        return v
    return None


def _expand_home(p):
    if p == "~" or p.startswith("~/"):
        home = _env_path("HOME")
        if home:
            return os.path.join(home, p[2:]) if p != "~" else home
    return p


def _config_path():
    explicit = os.environ.get("HOLDFAST_CONFIG")
    if explicit:
        return explicit
    cfg = _env_path("XDG_CONFIG_HOME")
    if cfg:
        return os.path.join(cfg, "holdfast", "config.toml")
    home = _env_path("HOME")
    if home:
        return os.path.join(home, ".config", "holdfast", "config.toml")
    return None


_TOP_SOCKET = re.compile(r"""^\s*socket\s*=\s*(?:"((?:[^"\\]|\\.)*)"|'([^']*)')\s*(?:#.*)?$""")


def _socket_from_config(path):
    """The top-level ``socket`` of the config file, or None (no file, or no such key)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    except OSError:
        return None
    try:
        import tomllib  # Python 3.11+

        value = tomllib.loads(raw.decode("utf-8")).get("socket")
    except ImportError:
        value = None
        for line in raw.decode("utf-8", "replace").splitlines():
            if line.lstrip().startswith("["):
                break  # top-level keys come before the first table
            m = _TOP_SOCKET.match(line)
            if m:
                value = m.group(1) if m.group(1) is not None else m.group(2)
                if m.group(1) is not None:
                    value = json.loads('"%s"' % value)
                break
    except Exception:  # a broken config: the daemon refuses it too; fall back to the default
        value = None
    if isinstance(value, str) and value:
        return _expand_home(value)
    return None


def default_socket_path():
    """The daemon's socket, found as the ``holdfast`` CLI finds it: ``$HOLDFAST_SOCKET``, then
    the config file's ``socket`` (``$HOLDFAST_CONFIG``, else
    ``$XDG_CONFIG_HOME/holdfast/config.toml``), then ``$XDG_RUNTIME_DIR/holdfast/holdfast.sock``,
    else ``/tmp/holdfast-$UID/holdfast.sock``."""
    explicit = os.environ.get("HOLDFAST_SOCKET")
    if explicit:
        return explicit
    cfg = _config_path()
    if cfg:
        s = _socket_from_config(cfg)
        if s:
            return s
    runtime = _env_path("XDG_RUNTIME_DIR")
    if runtime:
        return os.path.join(runtime, "holdfast", "holdfast.sock")
    return "/tmp/holdfast-%d/holdfast.sock" % os.geteuid()


# ---------------------------------------------------------------------------------------------
# The client


class _Pending:
    __slots__ = ("event", "result", "error", "subscribe")

    def __init__(self, subscribe=None):
        self.event = threading.Event()
        self.result = None
        self.error = None
        # For cred.watch: "user" or "internal", recorded by the reader thread when the answer
        # arrives, before it reads the next line (so no event of the subscription is misfiled).
        self.subscribe = subscribe


_CLOSED = object()  # end-of-events marker in the event queue
_DEFAULT_STORE = "default"  # the store a request without "store" means
_MAX_UNCLAIMED = 1000  # events of a subscription whose cred.watch answer is not read yet


class Client:
    """One connection to the daemon, said hello to.

    ``socket_path``: default ``default_socket_path()``. ``client``: a name for the daemon's
    logs. ``plugin``: bind this connection to a plugin grant from the daemon's config file
    (``Forbidden`` if there is no such plugin). ``timeout``: seconds to wait for each response
    (``None``: forever). ``on_event``: called with each event's ``params`` from the reader
    thread (keep it short; it must not call this client and wait). ``max_queued_events``: events
    kept for ``events()``; past that the oldest are dropped and a ``{"type": "resync"}`` event
    says how many.

    The daemon's answer to ``hello`` is in ``.hello`` (its version, the methods it serves, and
    this connection's grant).
    """

    def __init__(
        self,
        socket_path=None,
        client="python",
        plugin=None,
        *,
        timeout=60.0,
        on_event=None,
        max_queued_events=10000,
    ):
        self.socket_path = os.fspath(socket_path) if socket_path else default_socket_path()
        self.timeout = timeout
        self.on_event = on_event
        self.max_pending = 0  # the most requests this client has had in flight at once
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # pending map, closed flag, subscriptions
        self._send_lock = threading.Lock()
        self._pending = {}
        self._closed = False
        self._close_reason = None
        self._events = collections.deque()
        self._events_cv = threading.Condition(threading.Lock())
        self._max_events = max(1, int(max_queued_events))
        self._dropped_events = 0
        # Subscriptions (reader thread only): "user" ones feed events(), "internal" ones (made
        # by single_flight_refresh) only the generation table below.
        self._subs = {}  # subscription id -> "user" | "internal"
        self._unclaimed = {}  # subscription id -> events that came before its cred.watch answer
        self._internal_watches = {}  # store name -> internal subscription id
        self._changes = {}  # (store, id) -> latest generation seen in an event (None: deleted)
        self._changes_cv = threading.Condition(threading.Lock())

        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.socket_path)
        except OSError as e:
            sock.close()
            raise ConnectionClosed(
                message="cannot connect to the holdfast daemon at %s: %s"
                % (self.socket_path, e.strerror or type(e).__name__)
            ) from None
        try:
            self._check_peer(sock)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._rfile = sock.makefile("rb")
        self._reader = threading.Thread(
            target=self._read_loop, name="holdfast-client-reader", daemon=True
        )
        self._reader.start()
        params = {"client": client, "protocol": PROTOCOL_VERSION}
        if plugin is not None:
            params["plugin"] = plugin
        try:
            self.hello = self.call("hello", **params)
        except BaseException:
            self.close()
            raise

    # -- connection ----------------------------------------------------------------------------

    @staticmethod
    def _check_peer(sock):
        """The peer must run as our uid (the daemon checks the same of us): never hand a
        credential to a process that took over the socket path."""
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

    def close(self):
        """Close the connection; calls in flight fail with ``ConnectionClosed``."""
        with self._lock:
            already = self._closed
            self._closed = True
            if self._close_reason is None:
                self._close_reason = "the client closed the connection"
        if not already:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._reader is not threading.current_thread():
            self._reader.join(timeout=5)
        try:
            self._rfile.close()
        except OSError:
            pass
        self._sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "Client(socket_path=%r, closed=%r)" % (self.socket_path, self._closed)

    @property
    def closed(self):
        return self._closed

    # -- reader thread -------------------------------------------------------------------------

    def _read_loop(self):
        reason = "the daemon closed the connection"
        try:
            for line in self._rfile:
                if not line.strip():
                    continue
                try:
                    msg = json.loads(line)
                except ValueError:
                    reason = "the daemon sent a line that is not JSON"
                    break
                finally:
                    line = None
                if not isinstance(msg, dict):
                    continue
                if msg.get("method") == "event" and "id" not in msg:
                    self._dispatch_event(msg.get("params"))
                    continue
                self._dispatch_response(msg)
        except (OSError, ValueError):
            reason = "the connection to the daemon failed"
        self._fail_all(reason)

    def _dispatch_response(self, msg):
        mid = msg.get("id")
        with self._lock:
            waiter = self._pending.pop(mid, None) if isinstance(mid, int) else None
            if waiter is None:
                # An answer to no request of ours: the daemon's refusal of the connection or of
                # a line it could not attribute (id null). Keep its message for the callers that
                # will see the connection close.
                err = msg.get("error")
                if isinstance(err, dict) and isinstance(err.get("message"), str):
                    self._close_reason = "the daemon said: %s" % err["message"]
                return
        if "error" in msg:
            waiter.error = _error_from_response(msg["error"])
        elif "result" in msg:
            waiter.result = msg["result"]
            if waiter.subscribe is not None and isinstance(waiter.result, dict):
                sub = waiter.result.get("subscription")
                self._subs[sub] = waiter.subscribe
                early = self._unclaimed.pop(sub, [])
                if waiter.subscribe == "user":
                    for ev in early:
                        self._deliver(ev)
        else:
            waiter.error = StorageError(message="a response with neither result nor error")
        waiter.event.set()

    def _dispatch_event(self, params):
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
        sub = params.get("subscription")
        owner = self._subs.get(sub)
        if owner == "user":
            self._deliver(params)
        elif owner is None and sub is not None:
            # Its cred.watch answer has not been read yet: keep it until it is.
            held = self._unclaimed.setdefault(sub, [])
            if len(held) < _MAX_UNCLAIMED:
                held.append(params)

    def _deliver(self, params):
        with self._events_cv:
            if len(self._events) >= self._max_events:
                self._events.popleft()
                self._dropped_events += 1
            self._events.append(params)
            self._events_cv.notify_all()
        cb = self.on_event
        if cb is not None:
            try:
                cb(params)
            except Exception:  # a callback's bug must not kill the reader
                pass

    def _fail_all(self, reason):
        with self._lock:
            self._closed = True
            if self._close_reason is None:
                self._close_reason = reason
            reason = self._close_reason
            pending, self._pending = self._pending, {}
        for w in pending.values():
            w.error = ConnectionClosed(message=reason)
            w.event.set()
        with self._events_cv:
            self._events.append(_CLOSED)
            self._events_cv.notify_all()
        with self._changes_cv:
            self._changes_cv.notify_all()

    # -- calls ---------------------------------------------------------------------------------

    def call(self, method, /, **params):
        """Call ``method`` with ``params`` and return its ``result``; raises ``HoldfastError``.
        Parameters whose value is ``None`` are left out. (For ``cred.watch`` use ``watch()``,
        which routes the subscription's events to ``events()``.)"""
        return self._call(method, params, "user" if method == "cred.watch" else None)

    def _call(self, method, params, subscribe=None):
        params = {k: v for k, v in params.items() if v is not None}
        rid = next(self._ids)
        try:
            line = json.dumps(
                {"jsonrpc": "2.0", "id": rid, "method": method, "params": params},
                separators=(",", ":"),
                ensure_ascii=False,
            ).encode("utf-8")
        except (TypeError, ValueError):
            # json's message names the type only; still, never pass it on.
            raise InvalidParams(
                message="parameters of %s are not JSON-serializable" % method
            ) from None
        line += b"\n"
        waiter = _Pending(subscribe)
        with self._lock:
            if self._closed:
                raise ConnectionClosed(message=self._close_reason or "the connection is closed")
            self._pending[rid] = waiter
            if len(self._pending) > self.max_pending:
                self.max_pending = len(self._pending)
        try:
            with self._send_lock:
                self._sock.sendall(line)
        except OSError:
            with self._lock:
                self._pending.pop(rid, None)
            raise ConnectionClosed(message="sending to the daemon failed") from None
        finally:
            line = None
        if not waiter.event.wait(self.timeout):
            with self._lock:
                self._pending.pop(rid, None)
            raise CallTimeout(message="no answer to %s within %ss" % (method, self.timeout))
        if waiter.error is not None:
            err, waiter.error = waiter.error, None
            _scrub(err, params)
            raise err
        return waiter.result

    # -- typed helpers -------------------------------------------------------------------------

    def get(self, id, store=None):
        """``cred.get`` -> ``CredentialRecord``."""
        r = self.call("cred.get", id=id, store=store)
        return CredentialRecord(r["credential"], r["generation"])

    def set(self, credential, if_generation=None, store=None):
        """``cred.set`` with a whole credential document (``{"id", "credential_type"?, "keys":
        {name: {"value", …}}, …}``); with ``if_generation``, only if the stored generation is
        that (``Conflict`` otherwise; 0: only if it does not exist). -> ``SetResult``."""
        r = self.call("cred.set", credential=credential, if_generation=if_generation, store=store)
        return SetResult(r["id"], r["generation"])

    def set_value(self, id, value, if_generation=None, store=None):
        """``cred.set`` shorthand: an ``api_key`` credential with one key ``api_key``."""
        r = self.call("cred.set", id=id, value=value, if_generation=if_generation, store=store)
        return SetResult(r["id"], r["generation"])

    def delete(self, id, store=None):
        """``cred.delete`` -> whether it existed."""
        return bool(self.call("cred.delete", id=id, store=store)["deleted"])

    def list(self, store=None):
        """``cred.list`` -> a list of ``{id, generation, …metadata}`` (no secret values)."""
        return self.call("cred.list", store=store)["credentials"]

    def exists(self, id, store=None):
        """``cred.exists`` -> bool."""
        return bool(self.call("cred.exists", id=id, store=store)["exists"])

    def watch(self, store=None):
        """``cred.watch``: subscribe to change events of ``store`` (default: every store this
        connection may touch). Returns the subscription id; events arrive through
        ``events()`` / ``next_event()`` / ``on_event``."""
        return self._call("cred.watch", {"store": store}, "user")["subscription"]

    def refresh_lease(self, id, ttl_ms, store=None):
        """``cred.refresh_lease`` -> ``Lease``. Granted: refresh the credential and write it
        (with ``if_generation``) within ``ttl_ms``; the write releases the lease."""
        r = self.call("cred.refresh_lease", id=id, ttl_ms=ttl_ms, store=store)
        return Lease(bool(r.get("granted")), r.get("lease_id"), r.get("expires_in_ms", 0))

    def release_lease(self, id, store=None):
        """``cred.release_lease`` -> whether this connection held it."""
        return bool(self.call("cred.release_lease", id=id, store=store)["released"])

    def status(self):
        """``admin.status`` -> dict (uptime, stores, sealed state, counts, connections)."""
        return self.call("admin.status")

    # -- streams (docs/protocol.md "Streams") --------------------------------------------------

    def stream_begin(self, run_id, thread_id=None, model=None, takeover=False):
        """``stream.begin`` -> ``{stream_id, epoch, next_seq}``. ``Conflict`` if the run is
        streaming and ``takeover`` is false, or if it already ended."""
        return self.call(
            "stream.begin", run_id=run_id, thread_id=thread_id, model=model,
            takeover=takeover or None,
        )

    def stream_append(self, run_id, stream_id, seq, events):
        """``stream.append`` -> the last seq acknowledged (durable). A batch already taken is
        acknowledged again and dropped, so retrying after a lost answer is safe."""
        return self.call(
            "stream.append", run_id=run_id, stream_id=stream_id, seq=seq, events=events
        )["acked_seq"]

    def stream_interrupt(self, run_id, stream_id, cause):
        """``stream.interrupt`` -> the recovery plan (``plan``, ``wait_ms``, ``next_seq``, …).
        ``cause``: a cause name, or ``{"status", "message", "retry_after"}``."""
        return self.call("stream.interrupt", run_id=run_id, stream_id=stream_id, cause=cause)

    def stream_resume(self, run_id, model=None, thread_id=None, fail_on_stale=False):
        """``stream.resume`` -> ``{stream_id, epoch, next_seq, checkpoint, plan}``."""
        return self.call(
            "stream.resume", run_id=run_id, model=model, thread_id=thread_id,
            fail_on_stale=fail_on_stale or None,
        )

    def stream_commit(self, run_id, stream_id, final_message):
        """``stream.commit``: the final message durable and the run ended, in one step."""
        return self.call(
            "stream.commit", run_id=run_id, stream_id=stream_id, final_message=final_message
        )

    def stream_abort(self, run_id, stream_id, reason=None):
        """``stream.abort``."""
        return self.call("stream.abort", run_id=run_id, stream_id=stream_id, reason=reason)

    def stream_subscribe(self, run_id, after_seq=0):
        """``stream.subscribe``: the run's events with seq > ``after_seq`` arrive through
        ``events()`` / ``next_event()`` as ``{"subscription", "run_id", "seq", "event"}``,
        ending with an event of type ``finish``. Returns the subscription id. If this client's
        event queue overflows (a ``resync``), subscribe again from the last seq seen."""
        return self._call(
            "stream.subscribe", {"run_id": run_id, "after_seq": after_seq}, "user"
        )["subscription"]

    def stream_get(self, run_id, reveal=False):
        """``stream.get``."""
        return self.call("stream.get", run_id=run_id, reveal=reveal or None)

    def stream_list(self):
        """``stream.list`` -> the active runs."""
        return self.call("stream.list")["runs"]

    def checkpoint_put(self, run_id, snapshot):
        """``checkpoint.put``: an idempotent upsert of a runtime's own snapshot."""
        return self.call("checkpoint.put", run_id=run_id, snapshot=snapshot)

    def checkpoint_get(self, run_id):
        """``checkpoint.get`` -> the snapshot (``NotFound`` if none)."""
        return self.call("checkpoint.get", run_id=run_id)

    def checkpoint_delete(self, run_id):
        """``checkpoint.delete`` -> whether there was one."""
        return bool(self.call("checkpoint.delete", run_id=run_id)["deleted"])

    # -- run logs (docs/protocol.md "Run logs") ------------------------------------------------

    def run_log_node(self, run_id, detail):
        """``run.log_node``: a node completion (hive's NodeDetail fields). The same
        ``(node_id, attempt)`` again keeps one entry: the same content writes nothing, other
        content replaces it. -> ``{seq, written, replaced}``."""
        return self.call("run.log_node", run_id=run_id, detail=detail)

    def run_ensure_node(self, run_id, node_id, detail=None):
        """``run.ensure_node``: log ``detail`` only if the log has no entry for ``node_id``;
        atomic against every other writer (threads, processes, restarts). -> ``{seq, written}``."""
        return self.call("run.ensure_node", run_id=run_id, node_id=node_id, detail=detail or {})

    def run_log_step(self, run_id, step):
        """``run.log_step``: a step (hive's NodeStepLog), idempotent by
        ``(node_id, step_index)``."""
        return self.call("run.log_step", run_id=run_id, step=step)

    def run_tool_begin(self, run_id, tool_call_id, name, input=None):
        """``run.tool_begin``: call it before running a tool, so a resumed stream's R2 plan
        knows the call began."""
        return self.call(
            "run.tool_begin", run_id=run_id, tool_call_id=tool_call_id, name=name, input=input
        )

    def run_tool_end(self, run_id, tool_call_id, result=None, is_error=False):
        """``run.tool_end``: the tool finished (the first end is kept)."""
        return self.call(
            "run.tool_end", run_id=run_id, tool_call_id=tool_call_id, result=result,
            is_error=is_error,
        )

    def run_end(self, run_id, status, **fields):
        """``run.end`` -> the summary (hive's summary.json). Idempotent: a second end returns
        the same summary. ``fields``: agent_id, goal_id, execution_quality, trace_id,
        execution_id."""
        return self.call("run.end", run_id=run_id, status=status, **fields)["summary"]

    def run_get(self, run_id):
        """``run.get`` -> the run's entries, summary (so far) and load report."""
        return self.call("run.get", run_id=run_id)

    def run_list(self, status=None, since_ms=None, until_ms=None):
        """``run.list`` -> runs, newest activity first."""
        return self.call("run.list", status=status, since_ms=since_ms, until_ms=until_ms)["runs"]

    # -- events --------------------------------------------------------------------------------

    def next_event(self, timeout=None):
        """The next event's ``params`` (``{"subscription", "type": "cred.changed", "store",
        "id", "generation", "deleted", "source"}`` or a ``resync``), or ``None`` if none comes
        within ``timeout`` seconds. ``ConnectionClosed`` once the connection is gone and every
        queued event has been taken."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._events_cv:
            while True:
                if self._dropped_events:
                    n, self._dropped_events = self._dropped_events, 0
                    return {
                        "subscription": None,
                        "type": "resync",
                        "missed": n,
                        "hint": "the client's event queue overflowed: list again",
                    }
                if self._events:
                    ev = self._events[0]
                    if ev is _CLOSED:
                        raise ConnectionClosed(
                            message=self._close_reason or "the connection is closed"
                        )
                    return self._events.popleft()
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._events_cv.wait(remaining)

    def events(self, timeout=None):
        """Iterate over event ``params`` as they arrive; stop when none arrives for ``timeout``
        seconds (``None``: never; the iteration then ends only by ``ConnectionClosed``)."""
        while True:
            ev = self.next_event(timeout)
            if ev is None:
                return
            yield ev

    # -- for single_flight_refresh -------------------------------------------------------------

    def _internal_watch(self, store):
        """A subscription whose events feed only the generation table (not ``events()``)."""
        key = store or _DEFAULT_STORE
        with self._lock:
            sub = self._internal_watches.get(key)
        if sub is None:
            sub = self._call("cred.watch", {"store": store}, "internal")["subscription"]
            with self._lock:
                self._internal_watches.setdefault(key, sub)
        return sub

    def _wait_for_change(self, store, id, newer_than, timeout):
        """Wait up to ``timeout`` seconds for an event saying ``(store, id)`` is past
        generation ``newer_than`` (or deleted). Returns whether one came."""
        deadline = time.monotonic() + timeout
        key = (store or _DEFAULT_STORE, id)
        with self._changes_cv:
            while True:
                if key in self._changes:
                    gen = self._changes[key]
                    if gen is None or gen > newer_than:
                        return True
                if self._closed:
                    return False
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changes_cv.wait(remaining)


# ---------------------------------------------------------------------------------------------
# Single-flight refresh


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
    else, every call raises ``Conflict``: stop producing.
    """

    def __init__(self, client, run_id, *, thread_id=None, model=None, takeover=False,
                 resume=False, fail_on_stale=False):
        self.client = client
        self.run_id = run_id
        self.checkpoint = None
        self.plan = None
        if resume:
            r = client.stream_resume(run_id, model=model, thread_id=thread_id,
                                     fail_on_stale=fail_on_stale)
            self.checkpoint = r["checkpoint"]
            self.plan = r["plan"]
        else:
            r = client.stream_begin(run_id, thread_id=thread_id, model=model, takeover=takeover)
        self.stream_id = r["stream_id"]
        self.epoch = r["epoch"]
        self.next_seq = r["next_seq"]

    def append(self, events):
        """Append a batch of events; returns the last seq acknowledged."""
        acked = self.client.stream_append(self.run_id, self.stream_id, self.next_seq, events)
        self.next_seq = acked + 1
        return acked

    def text(self, text):
        """Append assistant text."""
        return self.append([{"type": "text", "text": text}])

    def tool_delta(self, id, arguments_delta, name=None):
        """Append part of a tool call's arguments (``name`` on its first delta)."""
        ev = {"type": "tool_call_delta", "id": id, "arguments_delta": arguments_delta}
        if name is not None:
            ev["name"] = name
        return self.append([ev])

    def tool_end(self, id):
        """A tool call's arguments are complete."""
        return self.append([{"type": "tool_call_end", "id": id}])

    def interrupt(self, cause):
        """Report the break; returns the plan and moves ``next_seq`` past its events."""
        self.plan = self.client.stream_interrupt(self.run_id, self.stream_id, cause)
        self.next_seq = self.plan["next_seq"]
        return self.plan

    def commit(self, final_message):
        """End the run with its final message (one atomic step)."""
        return self.client.stream_commit(self.run_id, self.stream_id, final_message)

    def abort(self, reason=None):
        """End the run without a final message."""
        return self.client.stream_abort(self.run_id, self.stream_id, reason)


def single_flight_refresh(
    client,
    id,
    refresh_fn,
    ttl_ms=30000,
    *,
    store=None,
    stale_generation=None,
    timeout=None,
    poll_ms=500,
):
    """Refresh credential ``id`` once among every client that asks at the same time.

    ``stale_generation``: the generation of the token the caller found stale (expired, or
    refused with a 401). Pass it: then whoever comes late, after another client already wrote a
    newer token, just reads that one. Default: the generation stored now.

    The protocol (``cred.refresh_lease``):

    1. Watch the store (so the holder's write is seen as a ``cred.changed`` event).
    2. Ask for the lease on ``id`` for ``ttl_ms``.
    3. Granted: read the credential again; if its generation is past ``stale_generation``,
       someone refreshed it already: release the lease and return it. Otherwise call
       ``refresh_fn(record)`` (``record``: a ``CredentialRecord`` of the stale credential) and
       write what it returns with ``if_generation`` = the generation it was computed from. The
       write releases the lease. ``refresh_fn`` returns a whole credential document (a dict; its
       ``id`` defaults to ``id``) or a string (written as the shorthand ``{id, value}``: an
       ``api_key`` credential). If ``refresh_fn`` raises, the lease is released and the
       exception propagates. A ``Conflict`` on the write (another writer got in first) goes
       back to step 2, where the newer generation is found.
    4. Not granted: wait for the ``cred.changed`` event past ``stale_generation``, or for the
       holder's lease to expire (checking every ``poll_ms`` too, in case the holder released
       without writing), then read again: newer → return it; else back to step 2.

    Returns the fresh ``CredentialRecord``. ``timeout`` (seconds, default: none) bounds the whole
    wait: ``CallTimeout`` after it. ``NotFound`` if the credential does not exist (or is deleted
    meanwhile).
    """
    start = time.monotonic()
    client._internal_watch(store)
    if stale_generation is None:
        stale_generation = client.get(id, store=store).generation

    def check_time():
        if timeout is not None and time.monotonic() - start > timeout:
            raise CallTimeout(
                message="credential %r was not refreshed within %ss" % (id, timeout)
            )

    while True:
        check_time()
        lease = client.refresh_lease(id, ttl_ms, store=store)
        if lease.granted:
            try:
                current = client.get(id, store=store)
                if current.generation > stale_generation:
                    client.release_lease(id, store=store)
                    return current
                new = refresh_fn(current)
                if isinstance(new, str):
                    client.set_value(
                        id, new, if_generation=current.generation, store=store
                    )
                elif isinstance(new, dict):
                    doc = dict(new)
                    doc.setdefault("id", id)
                    if doc["id"] != id:
                        raise InvalidParams(
                            message="refresh_fn returned a credential with another id"
                        )
                    doc.pop("holdfast_generation", None)
                    client.set(doc, if_generation=current.generation, store=store)
                else:
                    raise InvalidParams(
                        message="refresh_fn must return a credential document (dict) "
                        "or a value (str)"
                    )
                return client.get(id, store=store)
            except Conflict:
                continue  # someone else wrote: step 2 finds the newer generation
            except BaseException:
                try:
                    client.release_lease(id, store=store)
                except HoldfastError:
                    pass
                raise
        # Not granted: someone else is refreshing.
        current = client.get(id, store=store)
        if current.generation > stale_generation:
            return current
        wait_s = max(0.01, min(lease.expires_in_ms, poll_ms) / 1000.0)
        if timeout is not None:
            wait_s = max(0.0, min(wait_s, timeout - (time.monotonic() - start)))
        if client._wait_for_change(store, id, stale_generation, wait_s):
            current = client.get(id, store=store)
            if current.generation > stale_generation:
                return current
