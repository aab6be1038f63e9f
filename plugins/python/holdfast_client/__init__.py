"""A client for the holdfast daemon's Unix-socket API (protocol v1), for Python agent processes.

Standard library only; Python 3.8 or later.

    from holdfast_client import Client, NotFound

    with Client(client="my-agent") as hf:
        hf.set_value("openai", api_key)           # -> SetResult(id='openai', generation=1)
        rec = hf.get("openai")                    # -> CredentialRecord (repr hides values)
        key = rec.value()                         # the "api_key" key's value
        try:
            hf.get("missing")
        except NotFound as e:
            print(e.kind)                         # "not_found"

One ``Client`` is one connection at a time: after a daemon restart it reconnects, says hello
again and re-makes its subscriptions (a call in flight at that moment raises
``ConnectionClosed``). It is thread-safe: any number of threads may call it at once; requests
are pipelined on the socket and a reader thread hands each response to the caller waiting for
its ``id``, and each event to its subscription. ``AsyncClient`` is the same for
asyncio code (awaitable methods, subscriptions as async iterators).

Errors are ``HoldfastError`` (``.kind``, ``.message``, ``.code``, ``.data``), one subclass per
stable kind of the protocol. Neither an error's message nor its ``repr`` contains a secret: the
daemon never puts one in a message, and this module never puts request parameters in one.

More: ``holdfast_client.streaming`` (``RecoveringStream``: LLM streams that never show a token
twice), ``holdfast_client.hive`` (drop-ins for hive's credential storage and runtime logger),
``single_flight_refresh`` (one refresh of an OAuth token among every process that finds it
stale).
"""

from ._client import Client, Subscription
from . import _errors
from ._errors import (
    KINDS,
    Busy,
    CallTimeout,
    Conflict,
    ConnectionClosed,
    Forbidden,
    HoldfastError,
    IntegrityError,
    InvalidParams,
    NotFound,
    Sealed,
    StorageError,
    StoreNotServed,
    Unsupported,
)
from ._paths import default_socket_path
from ._protocol import PROTOCOL_VERSION, CredentialRecord, Lease, SetResult
from ._refresh import single_flight_refresh
from .aio import AsyncClient, AsyncSubscription
from .streaming import StreamProducer

__version__ = "0.2.0"

# Kept importable for code that reached into the single-file module of earlier versions.
_ERROR_CLASSES = _errors._ERROR_CLASSES

__all__ = [
    "AsyncClient",
    "AsyncSubscription",
    "Busy",
    "CallTimeout",
    "Client",
    "Conflict",
    "ConnectionClosed",
    "CredentialRecord",
    "Forbidden",
    "HoldfastError",
    "IntegrityError",
    "InvalidParams",
    "KINDS",
    "Lease",
    "NotFound",
    "PROTOCOL_VERSION",
    "Sealed",
    "SetResult",
    "StorageError",
    "StoreNotServed",
    "StreamProducer",
    "Subscription",
    "Unsupported",
    "default_socket_path",
    "single_flight_refresh",
]
