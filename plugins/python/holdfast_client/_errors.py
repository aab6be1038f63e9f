"""Errors: one class per stable kind of the protocol, and the scrubbing that keeps a request's
strings out of them."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple, Type

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


class HoldfastError(Exception):
    """An error from the daemon (or the connection to it): ``HoldfastError(kind, message, code,
    data)``. A subclass given ``kind=None`` keeps its own kind.

    ``kind`` is one of ``KINDS``; ``code`` the JSON-RPC code (0 for client-side errors);
    ``message`` a human-readable text that never holds a secret; ``data`` the error's ``data``
    object (``kind`` plus machine-readable detail such as ``generation`` on a conflict).
    """

    kind = "storage"

    def __init__(
        self,
        kind: Optional[str] = None,
        message: str = "",
        code: int = 0,
        data: Optional[Mapping[str, Any]] = None,
    ) -> None:
        # Only the message goes into args: that is all that str(), repr() and tracebacks show.
        super().__init__(message)
        if kind is not None:
            self.kind = kind
        self.message = message
        self.code = code
        self.data: Dict[str, Any] = dict(data) if data else {"kind": self.kind}

    def __str__(self) -> str:
        return "%s: %s" % (self.kind, self.message)

    def __repr__(self) -> str:
        return "%s(kind=%r, code=%r, message=%r)" % (
            type(self).__name__,
            self.kind,
            self.code,
            self.message,
        )

    def __reduce__(self) -> Tuple[Any, ...]:
        # Picklable (multiprocessing) with its fields.
        return (_rebuild_error, (type(self), self.kind, self.message, self.code, self.data))


def _rebuild_error(
    cls: Type[HoldfastError], kind: str, message: str, code: int, data: Dict[str, Any]
) -> HoldfastError:
    e = cls.__new__(cls)
    HoldfastError.__init__(e, kind, message, code, data)
    return e


class InvalidParams(HoldfastError, ValueError):
    """``invalid_params``: bad parameters, a bad credential id or document, or bad JSON-RPC."""

    kind = "invalid_params"


class NotFound(HoldfastError, KeyError):
    """``not_found``: no such credential (or store)."""

    kind = "not_found"

    def __str__(self) -> str:  # KeyError's str() would quote the args.
        return HoldfastError.__str__(self)


class StoreNotServed(NotFound):
    """``not_found`` for a whole store: the daemon serves no store of that name (a typo, or a
    store created or imported — ``holdfast import --from-hive`` — since the daemon started:
    restart it). Raised where a missing credential would otherwise read as "no credential"
    (``HoldfastCredentialStorage.load``); ``store`` names it."""

    @property
    def store(self) -> Optional[str]:
        """The store's name (``data["store"]``)."""
        store = self.data.get("store")
        return store if isinstance(store, str) else None


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


_ERROR_CLASSES: Dict[str, Type[HoldfastError]] = {
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


def error_from_response(err: Any) -> HoldfastError:
    """Build the exception for a JSON-RPC ``error`` object."""
    if not isinstance(err, dict):
        return StorageError(message="malformed error response from the daemon")
    raw_code = err.get("code")
    code = raw_code if isinstance(raw_code, int) else 0
    raw_data = err.get("data")
    data: Dict[str, Any] = dict(raw_data) if isinstance(raw_data, dict) else {}
    kind = data.get("kind")
    if not isinstance(kind, str) or kind not in _ERROR_CLASSES:
        kind = _KIND_OF_CODE.get(code, "storage")
    message = err.get("message")
    if not isinstance(message, str):
        message = "error"
    data.setdefault("kind", kind)
    return _ERROR_CLASSES[kind](kind, message, code, data)


# Names that may appear in a request's params and are never secret: they stay in messages
# ("run_id must be 1-128 characters" is useless as "<redacted> must be …"). Every parameter
# and event field of the protocol (docs/protocol.md), and hive's credential fields.
_FIELD_NAMES = frozenset(
    """store id value credential if_generation ttl_ms repair client plugin protocol
    credential_type keys name expires_at metadata provider_id last_refreshed auto_refresh
    last_used use_count description tags created_at updated_at holdfast_generation
    run_id stream_id thread_id model takeover seq events type text arguments_delta
    tool_call_delta tool_call_end cause status message retry_after continuation
    fail_on_stale final_message content_from_stream reason after_seq reveal snapshot
    partial_text completed_tool_calls in_flight_tool upstream_model subscription
    node_id detail step tool_call_id input result is_error since_ms until_ms
    older_than_days dry_run attempt success""".split()
)
_MIN_SCRUBBED = 6  # shorter strings are not worth mangling a message for


def _sensitive_strings(params: Mapping[str, Any]) -> List[str]:
    """Strings of a request that may be secret: every string value and unknown field name,
    except the (non-secret) credential id, store, client and plugin names, and the caller's
    own run, stream, thread and model names."""
    found = set()
    plain = {params.get(k) for k in ("id", "store", "client", "plugin", "run_id", "stream_id",
                                     "thread_id", "model")}
    cred = params.get("credential")
    if isinstance(cred, dict):
        plain.add(cred.get("id"))
    stack: List[Any] = [params]
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


def scrub(err: HoldfastError, params: Mapping[str, Any]) -> None:
    """Defence in depth: the daemon's messages never hold a secret, but should one ever echo a
    string this request carried (a value, or a field name), it is cut out here."""
    secrets = _sensitive_strings(params)
    if not secrets:
        return

    def clean(text: str) -> str:
        for sec in secrets:
            if sec in text:
                text = text.replace(sec, "<redacted>")
        return text

    message = clean(err.message)
    if message != err.message:
        err.message = message
        err.args = (message,)

    def walk(v: Any) -> Any:
        if isinstance(v, str):
            return clean(v)
        if isinstance(v, dict):
            return {clean(k) if isinstance(k, str) else k: walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    err.data = walk(err.data)
