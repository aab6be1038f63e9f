"""Single-flight refresh of OAuth-style credentials over ``cred.refresh_lease``."""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Optional, Union

from ._client import Client
from ._errors import CallTimeout, Conflict, HoldfastError, InvalidParams
from ._protocol import CredentialRecord


def single_flight_refresh(
    client: Client,
    id: str,
    refresh_fn: Callable[[CredentialRecord], Union[str, Dict[str, Any]]],
    ttl_ms: int = 30000,
    *,
    store: Optional[str] = None,
    stale_generation: Optional[int] = None,
    timeout: Optional[float] = None,
    poll_ms: int = 500,
) -> CredentialRecord:
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

    def check_time() -> None:
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
