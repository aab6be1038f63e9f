"""Drop-ins for hive (``aden-hive`` on PyPI, import path ``framework``): its credential storage
and its runtime logger, served by holdfast. Switching is one line each::

    from framework.credentials import CredentialStore
    from holdfast_client.hive import HoldfastCredentialStorage, HoldfastRuntimeLogger

    store = CredentialStore(storage=HoldfastCredentialStorage())        # was EncryptedFileStorage()
    orchestrator = Orchestrator(..., runtime_logger=HoldfastRuntimeLogger(agent_id="my-agent"))

``HoldfastCredentialStorage`` is hive's ``CredentialStorage`` (it subclasses hive's base class)
over ``cred.*``: hive's own ``CredentialObject`` in and out, secrets as ``SecretStr``; every save
atomic and durable, concurrent writers from any number of processes safe, the listing always
the files' truth (hive's ``EncryptedFileStorage`` loses index entries when two processes save
at once). ``HoldfastRuntimeLogger`` is hive's ``RuntimeLogger`` over ``run.*``: each visit of a
node logged exactly once however ``log_node_complete`` and ``ensure_node_logged`` race (hive's
check and append are separate steps, so a race logs a visit twice and doubles its tokens in the
summary), a resurrected run continued as hive continues it, the files where hive's
``RuntimeLogStore`` reads them, one connection per process.

This module imports hive when it is imported itself (``import holdfast_client`` never does);
without hive installed it still imports, and the classes say what to install when used.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, TypeVar

from ._client import Client
from ._errors import (
    Conflict,
    ConnectionClosed,
    Forbidden,
    IntegrityError,
    NotFound,
    StoreNotServed,
    Unsupported,
)

logger = logging.getLogger(__name__)

try:  # hive is optional: only these drop-ins need it.
    from framework.credentials.models import CredentialDecryptionError, CredentialObject
    from framework.credentials.storage import CredentialStorage as _StorageBase
    from pydantic import SecretStr

    HIVE_IMPORT_ERROR: Optional[BaseException] = None
except ImportError as _e:  # pragma: no cover - exercised by the no-hive test
    _StorageBase = object  # type: ignore[assignment,misc]
    HIVE_IMPORT_ERROR = _e

#: The field holdfast adds to a stored document (a write counter, not hive's).
GENERATION_FIELD = "holdfast_generation"


def _need_hive(what: str) -> None:
    if HIVE_IMPORT_ERROR is not None:
        raise ImportError(
            "%s needs hive's package (pip install aden-hive; import path `framework`): %s"
            % (what, HIVE_IMPORT_ERROR)
        )


class _Connection:
    """One ``Client`` per process, made on first use; a forked child makes its own (a
    connection must not be shared across ``fork()``)."""

    def __init__(self, client: Optional[Client], socket_path: Optional[str], name: str) -> None:
        self._given = client
        self._socket_path = socket_path
        self._name = name
        self._lock = threading.Lock()
        self._client: Optional[Client] = None
        self._pid = 0

    def get(self) -> Client:
        if self._given is not None:
            return self._given
        with self._lock:
            if self._client is None or self._pid != os.getpid() or self._client.closed:
                self._client = Client(self._socket_path, client=self._name)
                self._pid = os.getpid()
            return self._client

    def close(self) -> None:
        with self._lock:
            if self._client is not None and self._pid == os.getpid():
                self._client.close()
            self._client = None

    def call(self, what: Callable[[Client], "_T"]) -> "_T":
        """``what(client)``, sent again when the connection broke while it was in flight and
        the client reconnected (a daemon restart or upgrade: hive must not see it). Only for
        calls that are safe to send twice: every ``run.*`` call the logger makes is idempotent
        (an entry is kept once by its key; ``run.start`` and ``run.end`` again change nothing)
        and ``cred.get`` / ``exists`` / ``list`` are reads; ``save`` (a blind overwrite with
        the same document) and ``delete`` are resent too (see
        ``HoldfastCredentialStorage``). Once the client has given up reconnecting
        (``closed``), or after ``HIVE_RESENDS`` resends, ``ConnectionClosed`` is raised."""
        for resend in range(HIVE_RESENDS + 1):
            client = self.get()
            try:
                return what(client)
            except ConnectionClosed:
                if client.closed or resend == HIVE_RESENDS:
                    raise
                logger.info("holdfast: the connection broke under a call; sending it again")
        raise AssertionError("unreachable")


_T = TypeVar("_T")

#: How many times a hive drop-in's call is sent again after the connection was lost under it
#: (each waits for the client's reconnect, which is itself bounded).
HIVE_RESENDS = 10


# ---------------------------------------------------------------------------------------------
# Credentials


class HoldfastCredentialStorage(_StorageBase):  # type: ignore[misc,valid-type,unused-ignore]
    """hive's ``CredentialStorage``, served by the holdfast daemon.

    ``store``: the holdfast store (default ``"default"``; ``"hive"`` after ``holdfast import
    --from-hive`` serves hive's own directory). ``client``: a ``Client`` to use (default: one
    connection per process to ``socket_path`` or the default socket, made on first use).

    ``save`` and ``delete`` are durable when they return; ``load`` returns ``None`` for a
    credential that does not exist and raises hive's ``CredentialDecryptionError`` for one that
    cannot be decrypted, as ``EncryptedFileStorage`` does; a store the daemon does not serve
    raises ``holdfast_client.StoreNotServed`` (never ``None``). An id holdfast refuses (longer than
    251 bytes, a leading ``-`` or ``.``, a control or invisible character: docs/security.md row
    9) raises ``holdfast_client.InvalidParams`` (a ``ValueError``); ``list_all`` never lists one
    (credentials hive made with such ids are counted in a warning instead).

    A daemon restart is invisible to hive: a call the restart cut off is sent again once the
    client has reconnected (``HIVE_RESENDS`` times at most; ``ConnectionClosed`` once the
    client gives up). Reads are safe to send again; so is ``save``, a blind overwrite with the
    same document (at worst the credential's generation moves twice and watchers see two
    changes). ``delete`` is sent again too — the credential is gone either way — but if the lost
    attempt had already deleted it, the resend answers ``False``: after a restart, ``delete``'s
    "it existed" can be a false ``False``, never a false ``True``.
    """

    def __init__(self, store: Optional[str] = None, *, client: Optional[Client] = None,
                 socket_path: Optional[str] = None) -> None:
        _need_hive("HoldfastCredentialStorage")
        self.store = store
        self._conn = _Connection(client, socket_path, "hive-credentials")

    def _client(self) -> Client:
        return self._conn.get()

    def close(self) -> None:
        """Close the connection this storage made (not one it was given)."""
        self._conn.close()

    # -- hive's interface ----------------------------------------------------------------------

    def _not_served(self, missing: NotFound, what: str) -> StoreNotServed:
        """The error for a call the daemon answered ``not_found`` for the store itself."""
        store = self.store or "default"
        return StoreNotServed(
            message="the holdfast daemon at %s does not serve the store %r, so %s (%s). If the "
            "store was created or imported (holdfast import --from-hive) after the daemon "
            "started, restart it (systemctl --user restart holdfast); otherwise check the "
            "store name given to HoldfastCredentialStorage and the daemon's config"
            % (self._client().socket_path, store, what, missing.message),
            code=missing.code, data=dict(missing.data, store=store),
        )

    def _store_call(self, what: str, f: Any) -> Any:
        """``f`` on the connection, for a call whose ``not_found`` can only be the store's
        (``cred.set`` makes a missing credential, ``cred.delete`` and ``cred.exists`` answer
        false for one, ``cred.list`` lists none): that is ``StoreNotServed``."""
        try:
            return self._conn.call(f)
        except NotFound as missing:
            raise self._not_served(missing, what) from None

    def save(self, credential: "CredentialObject") -> None:
        """Store the credential (a whole document), its ``updated_at`` as given, as hive's
        ``EncryptedFileStorage`` keeps it."""
        doc = _document_of(credential)
        self._store_call("credential %r cannot be saved" % credential.id,
                         lambda c: c.set(doc, store=self.store, keep_updated_at=True))

    def load(self, credential_id: str) -> "Optional[CredentialObject]":
        """The credential, or ``None`` if it does not exist. ``StoreNotServed`` (naming the
        store and what to do) if the daemon serves no such store: that is not "no
        credential"."""
        try:
            rec = self._conn.call(lambda c: c.get(credential_id, store=self.store))
        except NotFound:
            # not_found is either the credential's or the store's; cred.exists answers a
            # missing credential with false, so its not_found can only be the store's.
            self._store_call("credential %r cannot be loaded" % credential_id,
                             lambda c: c.exists(credential_id, store=self.store))
            return None
        except IntegrityError as e:
            raise CredentialDecryptionError(
                "Failed to decrypt credential '%s': %s" % (credential_id, e.message)
            ) from None
        return _object_of(rec.credential)

    def delete(self, credential_id: str) -> bool:
        return bool(self._store_call("credential %r cannot be deleted" % credential_id,
                                     lambda c: c.delete(credential_id, store=self.store)))

    def list_all(self) -> List[str]:
        """The ids in hive's order: its index's (insertion order: an update keeps its place, a
        deleted and saved-again credential goes last). The daemon keeps that order in the
        index it writes and lists by it."""
        return [c["id"] for c in self._list()]

    def exists(self, credential_id: str) -> bool:
        return bool(self._store_call("whether credential %r exists is unknown" % credential_id,
                                     lambda c: c.exists(credential_id, store=self.store)))

    def _list(self) -> List[Dict[str, Any]]:
        answer: Dict[str, Any] = self._store_call(
            "its credentials cannot be listed", lambda c: c.call("cred.list", store=self.store))
        refused = answer.get("refused_ids") or 0
        if refused:
            # hive takes any id; holdfast serves none that could pass for another id or for an
            # option (docs/security.md row 9). Such credentials are not listed, so none listed
            # is out of reach of load(); they stay in hive's own index and files.
            logger.warning("holdfast: %d credential(s) in store %r not listed: hive made them "
                           "with ids holdfast does not serve (a leading '-' or '.', a control "
                           "or invisible character); `holdfast store fsck` names their files; "
                           "rename them with hive to reach them here", refused, self.store)
        listed: List[Dict[str, Any]] = answer["credentials"]
        return listed

    # -- what hive's CredentialStore uses when a storage has it ------------------------------------

    def load_all_for_provider(self, provider_name: str) -> "List[CredentialObject]":
        """Every credential whose ``_integration_type`` key is ``provider_name`` (hive's
        multi-account routing), found from the listing's metadata, then loaded."""
        out = []
        for entry in self._list():
            if entry.get("provider") == provider_name:
                cred = self.load(entry["id"])
                if cred is not None:
                    out.append(cred)
        return out

    def load_by_alias(self, provider_name: str, alias: str) -> "Optional[CredentialObject]":
        """The credential of ``provider_name`` whose ``_alias`` key is ``alias``."""
        for entry in self._list():
            if entry.get("provider") == provider_name and entry.get("alias") == alias:
                cred = self.load(entry["id"])
                if cred is not None:
                    return cred
        return None

    def __repr__(self) -> str:
        return "HoldfastCredentialStorage(store=%r)" % (self.store or "default")


def _document_of(credential: "CredentialObject") -> Dict[str, Any]:
    """hive's own serialization (``EncryptedFileStorage._serialize_credential``): the model's
    JSON form with the real secret values in place of ``SecretStr``'s mask."""
    data = credential.model_dump(mode="json")
    for name, key_data in (data.get("keys") or {}).items():
        key = credential.keys.get(name)
        if key is not None and "value" in key_data:
            key_data["value"] = key.get_secret_value()
    data.pop(GENERATION_FIELD, None)
    return data


def _object_of(doc: Dict[str, Any]) -> "CredentialObject":
    """hive's own deserialization: values wrapped in ``SecretStr``, then validated."""
    data = dict(doc)
    data.pop(GENERATION_FIELD, None)
    keys = {}
    for name, key_data in (data.get("keys") or {}).items():
        key_data = dict(key_data)
        if isinstance(key_data.get("value"), str):
            key_data["value"] = SecretStr(key_data["value"])
        keys[name] = key_data
    data["keys"] = keys
    return CredentialObject.model_validate(data)


# ---------------------------------------------------------------------------------------------
# Runtime logs


def _trace_context() -> Dict[str, str]:
    try:
        from framework.observability import get_trace_context
    except ImportError:
        return {}
    try:
        ctx = get_trace_context()
    except Exception:  # a tracing problem must not stop logging
        return {}
    return ctx if isinstance(ctx, dict) else {}


def node_attention(node_id: str, success: bool, error: Optional[str], retry_count: int,
                   escalate_count: int, latency_ms: int, tokens_used: int,
                   total_steps: int) -> "tuple[bool, List[str]]":
    """hive's verdict for a node (``RuntimeLogger.log_node_complete``), in hive's words."""
    needs = not success
    reasons: List[str] = []
    if not success and error:
        reasons.append("Node %s failed: %s" % (node_id, error))
    for cond, text in (
        (retry_count > 3, "Excessive retries: %s" % retry_count),
        (escalate_count > 2, "Excessive escalations: %s" % escalate_count),
        (latency_ms > 60000, "High latency: %sms" % latency_ms),
        (tokens_used > 100000, "High token usage: %s" % tokens_used),
        (total_steps > 20, "Many iterations: %s" % total_steps),
    ):
        if cond:
            needs = True
            reasons.append(text)
    return needs, reasons


#: The name the runtime loggers' shared connection gives in ``hello``.
_LOGGER_CLIENT_NAME = "hive-runtime-logger"
_shared_lock = threading.Lock()
_shared: Dict[Optional[str], _Connection] = {}


def _shared_connection(socket_path: Optional[str]) -> _Connection:
    """The process's one connection for runtime loggers to ``socket_path`` (``None``: the
    default socket). hive makes a ``RuntimeLogger`` per execution; a connection each would
    leave a socket and a reader thread behind per execution, forever."""
    key = os.fspath(socket_path) if socket_path else None
    with _shared_lock:
        conn = _shared.get(key)
        if conn is None:
            conn = _shared[key] = _Connection(None, key, _LOGGER_CLIENT_NAME)
        return conn


def close_shared_connections() -> None:
    """Close the connections the runtime loggers of this process share (the next use opens
    one again). For tests and orderly shutdowns; the reader thread is a daemon thread, so an
    exiting process need not call it."""
    with _shared_lock:
        conns = list(_shared.values())
    for conn in conns:
        conn.close()


def _hive_session_logs_dir(store: Any, run_id: str) -> "Optional[Path]":
    """Where hive's ``RuntimeLogStore`` ``store`` reads run ``run_id`` in its current layout
    (``<root>/sessions/<run_id>/logs/``, hive's ``_session_logs_dir``), or ``None`` for a store
    that is not hive's."""
    where = getattr(store, "_session_logs_dir", None)
    if not callable(where):
        return None
    try:
        return Path(where(run_id))
    except Exception:  # another version's store: no link, the logs are still holdfast's
        return None


class HoldfastRuntimeLogger:
    """hive's ``RuntimeLogger``, writing to holdfast's run log (``run.*``).

    The same methods, arguments and return values: ``start_run(goal_id, session_id) ->
    run_id``, ``log_step(...)``, ``log_node_complete(...)``, ``ensure_node_logged(...)``,
    ``await end_run(status, duration_ms, node_path, execution_quality)``, and hive's behaviour
    where it matters to hive:

    - **The entries hive's logger writes**: each ``log_node_complete`` is an entry (a retried
      node, a node a feedback loop visits again, a node of a resurrected run: their tokens and
      attention in the summary); ``ensure_node_logged`` (the executor's fallback after a node
      returns) writes only for a node this logger has not logged since ``start_run`` — as
      hive's, whose later fallback-only visits of a node are not logged either. One difference,
      where hive's result is a race artefact: the fallback check and the completion of one
      visit racing on two threads are one entry (the completion's, whichever came first), where
      hive's separate check and append log the visit twice and double its tokens. So a
      completion claims a fallback entry another thread wrote that no completion has claimed;
      after a fallback on the same thread (the executor checks after the node returned) it is
      a new visit, as in hive. (Two *different* visits of a node on two threads, the first
      never logging itself, its fallback followed by the second's completion, are thus one
      entry; hive writes two.) The entry's ``attempt`` is the visit's number for the node in
      the run (1, 2, 3 ...; hive's callers never pass one, and hive writes 1 each time): the
      daemon keeps one entry per ``(node_id, writer, attempt)`` — ``writer`` a token each logger
      picks, so another process logging the same session (its own visit count) adds its
      entries beside this one's, as hive's appends do — and a retried call never adds a line.
    - **Resurrection**: ``start_run`` with a ``session_id`` continues that run (``run.start``
      reopens it if it ended) and numbers visits after the ones in its log, so hive's
      ``ExecutionManager`` running a failed execution again with the same logger and session
      appends to the same log and its next ``end_run`` summarizes every attempt, as hive's own
      logger does. Likewise a run another logger ended (another process on the same session)
      is reopened by this logger's next write, and its ``end_run`` writes the summary of the
      whole log, as hive's appends and last ``summary.json`` do.
    - **hive's layout**: given hive's ``RuntimeLogStore`` as ``store`` (as hive's
      ``ExecutionManager`` gives it), ``start_run`` links the store's current session layout,
      ``<root>/sessions/<run_id>/logs``, to the run's directory in the daemon
      (``<data dir>/runs/<run_id>/``), so hive's tooling reading that store finds the run where
      it looks, with no deprecation warning. Without a store (or with the daemon's PostgreSQL
      backend, which keeps no files) nothing is linked; ``holdfast runs show RUN_ID`` and
      ``run.get`` read the log.
    - **One connection per process**: every logger without a ``client`` of its own shares the
      process's connection to the socket, so a logger per execution leaves no socket or thread
      behind (``close_shared_connections()`` closes it).

    Every line is fsynced before the call returns. Like hive's, ``end_run`` never raises (a
    failure is logged); the other methods raise when the daemon cannot be reached, as hive's
    raise when its disk cannot be written — but not because the daemon restarted: every call
    the logger makes is idempotent (``run.start``, an entry kept once by its key, ``run.end``),
    so one the restart cut off is sent again once the client has reconnected (as
    ``HoldfastCredentialStorage``'s). ``client`` / ``socket_path``: as for
    ``HoldfastCredentialStorage``.
    """

    def __init__(self, store: Any = None, agent_id: str = "", *, client: Optional[Client] = None,
                 socket_path: Optional[str] = None) -> None:
        self._store = store
        if client is not None:
            self._conn = _Connection(client, socket_path, _LOGGER_CLIENT_NAME)
        else:
            self._conn = _shared_connection(socket_path)
        self._agent_id = agent_id
        # This logger's name in its entries (``writer``): the daemon keys entries by
        # ``(node_id, writer, attempt)``, so another process logging the same run, numbering
        # its visits from its own count, never replaces this one's entries (nor its retries
        # add any).
        self._writer = uuid.uuid4().hex
        self._run_id = ""
        self._goal_id = ""
        self._started_at = ""
        # Per node of the current run: the last visit's number; whether this logger has logged
        # the node since start_run (hive's _logged_node_ids: ensure_node_logged writes nothing
        # for a node in it); and a fallback entry another thread's completion may still claim
        # (visit number, the fallback's thread: the object, as a dead thread's id is reused).
        self._lock = threading.Lock()
        self._node_locks: Dict[str, threading.Lock] = {}
        self._visits: Dict[str, int] = {}
        self._logged: Set[str] = set()
        self._open_fallback: Dict[str, Tuple[int, threading.Thread]] = {}

    @property
    def run_id(self) -> str:
        return self._run_id

    def close(self) -> None:
        """Nothing to close: the connection is the process's shared one (see
        ``close_shared_connections``) or the caller's."""

    def _write(self, call: Callable[[Client], Any]) -> Any:
        """A write to the run's log. A run another logger ended meanwhile (another process on
        the same session called ``end_run``) is reopened and the write made: hive's logger goes
        on appending to such a run, and its own ``end_run`` then summarizes everything."""
        try:
            return self._conn.call(call)
        except Conflict:
            run_id = self._run_id
            self._conn.call(lambda c: c.call("run.start", run_id=run_id))
            return self._conn.call(call)

    def start_run(self, goal_id: str = "", session_id: str = "") -> str:
        """Start a run: ``session_id`` is its id when given (a run of that id continues: a
        resurrected execution), else hive's ``<ts>_<8 hex>``."""
        if session_id:
            run_id = session_id
        else:
            ts = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
            run_id = "%s_%s" % (ts, uuid.uuid4().hex[:8])
        try:
            self._conn.call(lambda c: c.call("run.start", run_id=run_id))
        except (Unsupported, Forbidden) as e:
            # A daemon older than run.start, or a plugin grant listing its methods from before
            # it existed: the run is logged as before, and an ended run stays ended. (A run
            # outside the grant is refused again by the first write.)
            logger.warning("holdfast: run.start refused (%s): run %s cannot be continued "
                           "after it ended (update the daemon, or grant run.start)",
                           e.kind, run_id)
        visits: Dict[str, int] = {}
        if session_id:  # the visits already in the log (a resurrection's earlier attempts)
            try:
                details = self._conn.call(lambda c: c.run_get(run_id)).get("details") or []
            except NotFound:
                details = []
            for d in details:
                node, attempt = d.get("node_id"), d.get("attempt", 1)
                if isinstance(node, str) and isinstance(attempt, int):
                    visits[node] = max(visits.get(node, 0), attempt)
        with self._lock:
            self._run_id = run_id
            self._goal_id = goal_id
            self._started_at = datetime.now(timezone.utc).isoformat()
            self._visits = visits
            self._logged = set()  # as hive's start_run: a resurrection's fallbacks write again
            self._open_fallback = {}
            self._node_locks = {}
        self._link_hive_layout(self._conn.get(), run_id)
        return run_id

    def _link_hive_layout(self, client: Client, run_id: str) -> None:
        """Make hive's store find the run: ``sessions/<run_id>/logs`` in it, a link to the
        run's directory in the daemon. Never fails the run: a problem is logged."""
        link = _hive_session_logs_dir(self._store, run_id)
        data_dir = (getattr(client, "hello", None) or {}).get("data_dir")
        if link is None or not data_dir:
            return
        target = Path(data_dir) / "runs" / run_id
        try:
            if not target.is_dir():  # logs kept in PostgreSQL, or on another machine
                return
            if link.is_symlink():
                if os.readlink(link) == str(target):
                    return
                link.unlink()  # a link to another daemon's run of this id
            elif link.is_dir():
                if any(link.iterdir()):
                    logger.warning("runtime logs: %s holds hive's own files; run %s is in "
                                   "holdfast (%s), not linked there", link, run_id, target)
                    return
                link.rmdir()
            link.parent.mkdir(parents=True, exist_ok=True)  # hive's modes (umask applies)
            try:
                os.symlink(target, link, target_is_directory=True)
            except FileExistsError:  # another logger of this run linked it first
                pass
        except OSError as e:
            logger.warning("runtime logs: cannot link %s to %s: %s", link, target, e)

    def log_step(
        self,
        node_id: str,
        node_type: str,
        step_index: int,
        llm_text: str = "",
        tool_calls: Optional[List[Dict[str, Any]]] = None,
        input_tokens: int = 0,
        output_tokens: int = 0,
        latency_ms: int = 0,
        verdict: str = "",
        verdict_feedback: str = "",
        error: str = "",
        stacktrace: str = "",
        is_partial: bool = False,
    ) -> None:
        """One step within a node's visit (idempotent by ``(node_id, step_index)`` within the
        visit: hive numbers steps from 0 on each visit, so the steps of a node's later visits
        carry ``attempt``, the visit's number, and are kept apart from the first visit's)."""
        calls = []
        for tc in tool_calls or []:
            calls.append({
                "tool_use_id": tc.get("tool_use_id", ""),
                "tool_name": tc.get("tool_name", ""),
                "tool_input": tc.get("tool_input", {}),
                "result": tc.get("content", ""),
                "is_error": tc.get("is_error", False),
                "start_timestamp": tc.get("start_timestamp", ""),
                "duration_s": tc.get("duration_s", 0.0),
            })
        ctx = _trace_context()
        step = {
            "node_id": node_id,
            "node_type": node_type,
            "step_index": step_index,
            "llm_text": llm_text,
            "tool_calls": calls,
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "latency_ms": latency_ms,
            "verdict": verdict,
            "verdict_feedback": verdict_feedback,
            "error": error,
            "stacktrace": stacktrace,
            "is_partial": is_partial,
            "trace_id": ctx.get("trace_id", ""),
            "span_id": uuid.uuid4().hex[:16],
            "parent_span_id": "",
            "execution_id": ctx.get("execution_id", ""),
        }
        with self._lock:  # the visit in progress (see _visit_of_completion)
            visit = self._visit_of_completion(node_id)
        if visit > 1:  # first visits' lines are hive's (plus ``writer``)
            step["attempt"] = visit
        step["writer"] = self._writer
        run_id = self._run_id
        self._write(lambda c: c.run_log_step(run_id, step))

    @staticmethod
    def _detail(node_id: str, node_name: str, node_type: str, success: bool,
                error: Optional[str] = None, stacktrace: str = "", total_steps: int = 0,
                tokens_used: int = 0, input_tokens: int = 0, output_tokens: int = 0,
                latency_ms: int = 0, attempt: int = 1, exit_status: str = "",
                accept_count: int = 0, retry_count: int = 0, escalate_count: int = 0,
                continue_count: int = 0) -> Dict[str, Any]:
        """hive's ``NodeDetail`` as its logger fills it in (defaults are hive's)."""
        needs, reasons = node_attention(node_id, success, error, retry_count, escalate_count,
                                        latency_ms, tokens_used, total_steps)
        return {
            "node_id": node_id,
            "node_name": node_name,
            "node_type": node_type,
            "success": success,
            "error": error,
            "stacktrace": stacktrace,
            "total_steps": total_steps,
            "tokens_used": tokens_used,
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "latency_ms": latency_ms,
            "attempt": attempt,
            "exit_status": exit_status,
            "accept_count": accept_count,
            "retry_count": retry_count,
            "escalate_count": escalate_count,
            "continue_count": continue_count,
            "needs_attention": needs,
            "attention_reasons": reasons,
            "trace_id": _trace_context().get("trace_id", ""),
            "span_id": uuid.uuid4().hex[:16],
        }

    def _visit_of_completion(self, node_id: str) -> int:
        """The visit a completion (or step) of ``node_id`` from this thread belongs to; called
        with ``self._lock`` held. A new one, unless another thread wrote a fallback entry for
        the node that no completion has claimed: then that visit (the node's completion and the
        executor's fallback check racing). A fallback this thread wrote ended its visit: hive's
        executor checks after the node returned, so the node's next completion on the same
        thread is a retry or a revisit, an entry of its own as in hive."""
        fallback = self._open_fallback.get(node_id)
        if fallback is not None and fallback[1] is not threading.current_thread():
            return fallback[0]
        return self._visits.get(node_id, 0) + 1

    def _node_lock(self, node_id: str) -> threading.Lock:
        """One lock per node: a visit's completion and its fallback are decided and written in
        the order they are decided (other nodes go on in parallel)."""
        with self._lock:
            lock = self._node_locks.get(node_id)
            if lock is None:
                lock = self._node_locks[node_id] = threading.Lock()
            return lock

    def log_node_complete(
        self,
        node_id: str,
        node_name: str,
        node_type: str,
        success: bool,
        error: Optional[str] = None,
        stacktrace: str = "",
        total_steps: int = 0,
        tokens_used: int = 0,
        input_tokens: int = 0,
        output_tokens: int = 0,
        latency_ms: int = 0,
        attempt: int = 1,
        exit_status: str = "",
        accept_count: int = 0,
        retry_count: int = 0,
        escalate_count: int = 0,
        continue_count: int = 0,
    ) -> None:
        """A visit of a node completed: a new entry, as hive's, or, racing the fallback check
        of its visit on another thread, the entry that fallback wrote replaced (see
        ``_visit_of_completion``). ``attempt`` is not used: the entry's is the visit's
        number."""
        with self._node_lock(node_id):
            with self._lock:
                visit = self._visit_of_completion(node_id)
            detail = self._detail(
                node_id, node_name, node_type, success, error=error, stacktrace=stacktrace,
                total_steps=total_steps, tokens_used=tokens_used, input_tokens=input_tokens,
                output_tokens=output_tokens, latency_ms=latency_ms, attempt=visit,
                exit_status=exit_status, accept_count=accept_count, retry_count=retry_count,
                escalate_count=escalate_count, continue_count=continue_count)
            detail["writer"] = self._writer
            run_id = self._run_id
            self._write(lambda c: c.run_log_node(run_id, detail))
            with self._lock:
                self._visits[node_id] = max(visit, self._visits.get(node_id, 0))
                self._logged.add(node_id)
                self._open_fallback.pop(node_id, None)

    def ensure_node_logged(
        self,
        node_id: str,
        node_name: str,
        node_type: str,
        success: bool,
        error: Optional[str] = None,
        stacktrace: str = "",
        tokens_used: int = 0,
        latency_ms: int = 0,
    ) -> None:
        """The fallback after a node returns: a basic entry only if the node has none from this
        logger since ``start_run``, as hive's (a node's later visits that do not log themselves
        are not logged by hive either). Decided under the node's lock, so a completion being
        written makes it write nothing (hive's check and append are separate steps: racing a
        completion, it logs the visit twice). The first visit's is one atomic check-and-write in
        the daemon (``run.ensure_node``: nothing if the log has an entry for the node, whoever
        wrote it)."""
        with self._node_lock(node_id):
            with self._lock:
                if node_id in self._logged:
                    return
                visit = self._visits.get(node_id, 0) + 1
            detail = self._detail(node_id, node_name, node_type, success, error=error,
                                  stacktrace=stacktrace, tokens_used=tokens_used,
                                  latency_ms=latency_ms, attempt=visit)
            detail["writer"] = self._writer
            run_id = self._run_id
            if visit == 1:
                self._write(lambda c: c.run_ensure_node(run_id, node_id, detail))
            else:
                self._write(lambda c: c.run_log_node(run_id, detail))
            with self._lock:
                self._visits[node_id] = visit
                self._logged.add(node_id)
                self._open_fallback[node_id] = (visit, threading.current_thread())

    async def end_run(
        self,
        status: str,
        duration_ms: int,
        node_path: Optional[List[str]] = None,
        execution_quality: str = "",
    ) -> None:
        """Write the summary (hive's ``summary.json``) of the whole log, every attempt of a
        resurrected run included. Never raises: a failure is logged."""
        ctx = _trace_context()
        fields = {
            "agent_id": self._agent_id,
            "goal_id": self._goal_id,
            "started_at": self._started_at or None,
            "duration_ms": int(duration_ms),
            "node_path": list(node_path or []),
            "execution_quality": execution_quality,
            "trace_id": ctx.get("trace_id", ""),
            "execution_id": ctx.get("execution_id", ""),
        }
        try:
            loop = asyncio.get_running_loop()
            run_id = self._run_id
            summary = await loop.run_in_executor(None, lambda: self._end(run_id, status, fields))
            logger.info(
                "Runtime logs saved: run_id=%s status=%s nodes=%d",
                self._run_id, status, summary.get("total_nodes_executed", 0),
            )
        except Exception:
            logger.exception("Failed to save runtime logs for run_id=%s (non-fatal)",
                             self._run_id)

    def _end(self, run_id: str, status: str, fields: Dict[str, Any]) -> Dict[str, Any]:
        """``run.end``; if another logger ended the run first (another process on the same
        session), the run is reopened and ended again, so this logger's summary — of the whole
        log, with its status and path — is the one kept, as hive's last ``end_run`` writes
        ``summary.json`` last. (A retried end of this logger's own makes the same summary.)"""
        answer: Dict[str, Any] = self._conn.call(lambda c: c.call("run.end", run_id=run_id,
                                                                  status=status, **fields))
        if answer.get("written") is False:
            self._conn.call(lambda c: c.call("run.start", run_id=run_id))
            answer = self._conn.call(lambda c: c.call("run.end", run_id=run_id, status=status,
                                                      **fields))
        summary: Dict[str, Any] = answer.get("summary") or {}
        return summary

    def __repr__(self) -> str:
        return "HoldfastRuntimeLogger(run_id=%r, agent_id=%r)" % (self._run_id, self._agent_id)


__all__ = [
    "HIVE_IMPORT_ERROR",
    "HoldfastCredentialStorage",
    "HoldfastRuntimeLogger",
    "close_shared_connections",
    "node_attention",
]
