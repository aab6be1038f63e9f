//! The daemon's side of the audit log (`crate::audit`): what each call records, and when its
//! answer may leave.
//!
//! - A credential read (`cred.get`, `exists`, `list`, `watch`, the leases, `admin.fsck`
//!   without repair) records its outcome; its answer leaves once the record is written (or,
//!   with `durability = "always"`, synced). A `cred.get` served inline from the file cache is
//!   recorded inline too, in `batch` mode (one `write`, no waiting); otherwise it takes the
//!   async path, whose task holds the connection's in-flight slot until its answer left.
//! - A change (`cred.set`, `cred.delete`, `admin.rotate_key`, `admin.prune_keys`, `admin.fsck` with repair,
//!   `admin.reindex`) first writes a `begun` record and syncs it — refused if that fails,
//!   nothing changed — then records its outcome, which refers to it.
//! - A call refused at admission (`forbidden`: a method outside a plugin's grant, an unknown
//!   plugin in `hello`, a peer of another uid) is recorded without delaying its answer; a
//!   credential call refused by its own checks (a store outside the grant) is recorded as a
//!   read, before its answer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::oneshot;
use zeroize::Zeroizing;

use super::protocol::admin::AdminCall;
use super::protocol::creds::CredCall;
use super::protocol::{self, Call, Id, RpcError};
use super::session::Session;
use crate::audit::{AuditLog, OnFailure, Record, Via, Who, BEGUN, OK};
use crate::error::ErrorKind;
use crate::paths::DEFAULT_STORE;
use crate::service::Daemon;

/// What kind of record an operation makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Its outcome only; the answer waits for it.
    Read,
    /// A durable `begun` record before the change, then its outcome.
    Change,
    /// Nothing, unless it is refused (`forbidden`).
    RefusedOnly,
}

/// One operation being recorded: made when it is admitted, finished by its answer.
pub struct Pending {
    log: AuditLog,
    op: &'static str,
    store: Option<String>,
    id: Option<String>,
    kind: Kind,
    /// The `begun` record's number, once written.
    begun: Option<u64>,
    /// Dropped once the answer left (or was given up): the request's task waits for it.
    delivered: Option<oneshot::Sender<()>>,
}

/// The store and credential a call names (for its record).
fn target(call: &Call) -> (Option<&str>, Option<&str>) {
    match call {
        Call::Cred(c) => match c {
            CredCall::Get(p) | CredCall::Exists(p) | CredCall::Delete(p) => {
                (p.store.as_deref(), Some(p.id.as_str()))
            }
            CredCall::ReleaseLease(p) => (p.store.as_deref(), Some(p.id.as_str())),
            CredCall::RefreshLease(p) => (p.store.as_deref(), Some(p.id.as_str())),
            CredCall::Set(p) => (
                p.store.as_deref(),
                p.id.as_deref().or_else(|| {
                    p.credential
                        .as_ref()
                        .and_then(|d| d.get("id"))
                        .and_then(Value::as_str)
                }),
            ),
            CredCall::List(p) | CredCall::Watch(p) => (p.store.as_deref(), None),
        },
        Call::Admin(a) => match a {
            AdminCall::Fsck(p) => (p.store.as_deref(), None),
            AdminCall::RotateKey(p) => (p.store.as_deref(), None),
            AdminCall::Reindex(p) | AdminCall::PruneKeys(p) | AdminCall::Status(p) => {
                (p.store.as_deref(), None)
            }
        },
        _ => (None, None),
    }
}

fn kind_of(call: &Call) -> Kind {
    match call {
        Call::Cred(CredCall::Set(_) | CredCall::Delete(_)) => Kind::Change,
        Call::Cred(_) => Kind::Read,
        Call::Admin(AdminCall::RotateKey(_) | AdminCall::PruneKeys(_) | AdminCall::Reindex(_)) => {
            Kind::Change
        }
        Call::Admin(AdminCall::Fsck(p)) if p.repair => Kind::Change,
        Call::Admin(AdminCall::Fsck(_)) => Kind::Read,
        _ => Kind::RefusedOnly,
    }
}

/// The record of `op` by this connection, with `result`.
fn record_of(
    session: &Session,
    op: &'static str,
    store: Option<&str>,
    id: Option<&str>,
    result: &'static str,
) -> Record {
    let mut rec = Record::new(op, result, session.audit_who());
    if let Some(s) = store {
        // A malformed name is the client's text, refused before any store is touched.
        if crate::paths::validate_store_name(s).is_ok() {
            rec = rec.store(s);
        }
    }
    if let Some(id) = id {
        rec = rec.id(id);
    }
    rec
}

fn result_of(r: &Result<Value, RpcError>) -> &'static str {
    match r {
        Ok(_) => OK,
        Err(e) => e.kind.as_str(),
    }
}

/// The pending record of an admitted `call`, and what the request's task waits on until its
/// answer left; `None` without an audit log.
pub fn pending(daemon: &Daemon, call: &Call) -> Option<(Pending, oneshot::Receiver<()>)> {
    let log = daemon.audit()?.clone();
    let (store, id) = target(call);
    let kind = kind_of(call);
    let store = match kind {
        Kind::RefusedOnly => store.map(str::to_owned),
        _ => Some(store.unwrap_or(DEFAULT_STORE).to_owned()),
    };
    let (tx, rx) = oneshot::channel();
    Some((
        Pending {
            log,
            op: call.method(),
            store,
            id: id.map(str::to_owned),
            kind,
            begun: None,
            delivered: Some(tx),
        },
        rx,
    ))
}

impl Pending {
    /// For a change: write its `begun` record and sync it, before the change is made
    /// (blocking: call from the blocking pool). An error: the change must not be made.
    pub fn begin(&mut self, session: &Session) -> Result<(), RpcError> {
        if self.kind != Kind::Change || self.begun.is_some() {
            return Ok(());
        }
        let rec = record_of(
            session,
            self.op,
            self.store.as_deref(),
            self.id.as_deref(),
            BEGUN,
        );
        match self.log.record(rec, true) {
            Ok(seq) => {
                self.begun = Some(seq);
                Ok(())
            }
            Err(e) => Err(RpcError::new(e.kind(), e.refusal())),
        }
    }

    /// Whether the operation is a change (its `begun` record comes first).
    pub fn is_change(&self) -> bool {
        self.kind == Kind::Change
    }

    /// Record the outcome `result` and send the answer once the record allows it.
    pub fn deliver(self, session: &Arc<Session>, id: Id, result: Result<Value, RpcError>) {
        let Pending {
            log,
            op,
            store,
            id: cred,
            kind,
            begun,
            delivered,
        } = self;
        let outcome = result_of(&result);
        if kind == Kind::RefusedOnly {
            if let Err(e) = &result {
                if e.kind == ErrorKind::Forbidden {
                    log.record_detached(record_of(
                        session,
                        op,
                        store.as_deref(),
                        cred.as_deref(),
                        outcome,
                    ));
                }
            }
            session.send_now(line_of(&id, result));
            drop(delivered);
            return;
        }
        let mut rec = record_of(session, op, store.as_deref(), cred.as_deref(), outcome);
        rec.refers = begun;
        let line = line_of(&id, result);
        let session = Arc::clone(session);
        let serve_reads = log.settings().on_failure == OnFailure::ServeReads;
        log.record_then(
            rec,
            false,
            Box::new(move |r| {
                match r {
                    Ok(_) => {}
                    // The change was attempted (its `begun` record is durable): its answer says
                    // what happened.
                    Err(e) if kind == Kind::Change && begun.is_some() => {
                        tracing::error!(op, error = %e, "a change was attempted but its outcome could not be recorded in the audit log");
                    }
                    // Refused before anything was attempted: the answer is that refusal.
                    Err(_) if kind == Kind::Change => {}
                    Err(e) if serve_reads => {
                        tracing::error!(op, error = %e, "served a read whose audit record could not be written (on_failure = \"serve-reads\")");
                    }
                    Err(e) => {
                        tracing::warn!(op, error = %e, "refused a read: its audit record could not be written");
                        session.send_now(protocol::response_err(
                            &id,
                            &RpcError::new(e.kind(), e.refusal()),
                        ));
                        drop(delivered);
                        return;
                    }
                }
                session.send_now(line);
                drop(delivered);
            }),
        );
    }
}

fn line_of(id: &Id, result: Result<Value, RpcError>) -> Zeroizing<Vec<u8>> {
    match result {
        Ok(v) => protocol::response_ok(id, v),
        Err(e) => protocol::response_err(id, &e),
    }
}

/// Whether a `cred.get` / `cred.exists` may be answered on the connection's task: no audit log,
/// or one whose records need no sync before the answer.
pub fn inline_ok(daemon: &Daemon) -> bool {
    daemon.audit().is_none_or(|a| !a.strict())
}

/// Answer a `cred.get` / `cred.exists` read on the connection's task (`reply`: its answer, or
/// its refusal), recording it first if that costs no waiting. `Err(call)`: it could not be
/// recorded without waiting — take the async path.
pub fn answer_inline(
    daemon: &Daemon,
    session: &Session,
    call: &CredCall,
    id: &Id,
    reply: Result<Zeroizing<Vec<u8>>, RpcError>,
) -> Option<Zeroizing<Vec<u8>>> {
    let line = |r: Result<Zeroizing<Vec<u8>>, RpcError>| match r {
        Ok(l) => l,
        Err(e) => protocol::response_err(id, &e),
    };
    let Some(log) = daemon.audit() else {
        return Some(line(reply));
    };
    let (op, p) = match call {
        CredCall::Get(p) => ("cred.get", p),
        CredCall::Exists(p) => ("cred.exists", p),
        _ => return Some(line(reply)),
    };
    let result = match &reply {
        Ok(_) => OK,
        Err(e) => e.kind.as_str(),
    };
    let store = Some(p.store.as_deref().unwrap_or(DEFAULT_STORE));
    let rec = record_of(session, op, store, Some(&p.id), result);
    match log.try_record_now(&rec)? {
        Ok(_) => Some(line(reply)),
        Err(e) if log.settings().on_failure == OnFailure::ServeReads => {
            tracing::error!(op, error = %e, "served a read whose audit record could not be written (on_failure = \"serve-reads\")");
            Some(line(reply))
        }
        Err(e) => {
            tracing::warn!(op, error = %e, "refused a read: its audit record could not be written");
            Some(protocol::response_err(
                id,
                &RpcError::new(e.kind(), e.refusal()),
            ))
        }
    }
}

/// A credential or admin call whose params do not read (an unknown or missing field, a wrong
/// type): refused before any store is touched, and recorded like the calls refused for a bad
/// id, naming the store and id it gave where those are valid. Its answer does not wait.
pub fn unparsed(
    daemon: &Daemon,
    session: &Session,
    method: &str,
    params: Option<&serde_json::value::RawValue>,
    e: &RpcError,
) {
    let Some(log) = daemon.audit() else { return };
    let Some(op) = crate::api::METHODS
        .iter()
        .copied()
        .find(|m| *m == method && (m.starts_with("cred.") || m.starts_with("admin.")))
    else {
        return;
    };
    let loose: Option<serde_json::Value> = params.and_then(|p| serde_json::from_str(p.get()).ok());
    let field = |k: &str| {
        loose
            .as_ref()
            .and_then(|v| v.get(k))
            .and_then(|v| v.as_str())
    };
    let store = field("store").unwrap_or(DEFAULT_STORE);
    log.record_detached(record_of(
        session,
        op,
        Some(store),
        field("id"),
        e.kind.as_str(),
    ));
}

/// A call refused at admission (`forbidden`: outside the grant): record it, naming what it
/// asked for when its params read. Its answer does not wait.
pub fn refused(
    daemon: &Daemon,
    session: &Session,
    method: &str,
    params: Option<&serde_json::value::RawValue>,
    e: &RpcError,
) {
    refused_naming(daemon, session, method, params, None, e);
}

/// [`refused`] for an append refused on its fast path, whose params were read apart: the run
/// it named.
pub fn refused_append(daemon: &Daemon, session: &Session, run_id: &str, e: &RpcError) {
    refused_naming(daemon, session, "stream.append", None, Some(run_id), e);
}

fn refused_naming(
    daemon: &Daemon,
    session: &Session,
    method: &str,
    params: Option<&serde_json::value::RawValue>,
    run_id: Option<&str>,
    e: &RpcError,
) {
    if e.kind != ErrorKind::Forbidden {
        return;
    }
    let Some(log) = daemon.audit() else { return };
    let Some(op) = crate::api::METHODS.iter().copied().find(|m| *m == method) else {
        return;
    };
    let call = Call::parse(op, params).ok();
    let (store, id) = call.as_ref().map_or((None, None), target);
    // A credential or admin call names the default store by leaving it out.
    let store = match store {
        None if op.starts_with("cred.") || op.starts_with("admin.") => Some(DEFAULT_STORE),
        s => s,
    };
    let mut rec = record_of(session, op, store, id, e.kind.as_str());
    // A call refused by a grant's runs: which run it named (a valid run id only).
    if let Some(run) = run_id.or_else(|| call.as_ref().and_then(Call::run_id)) {
        if crate::streams::validate_run_id(run).is_ok() {
            rec.detail = Some(serde_json::json!({ "run_id": run }));
        }
    }
    log.record_detached(rec);
}

/// `hello` refused (an unknown plugin, or none where one is required). Not the daemon's own
/// watchdog probe (refused every few seconds under `require_plugin`): a connection from this
/// very process (`SO_PEERCRED`'s pid, which a client cannot choose) naming itself the probe.
pub fn hello_refused(
    daemon: &Daemon,
    session: &Session,
    client: Option<&str>,
    plugin: Option<&str>,
    e: &RpcError,
) {
    if e.kind != ErrorKind::Forbidden {
        return;
    }
    let Some(log) = daemon.audit() else { return };
    let who = session.audit_who();
    if client == Some(crate::limits::WATCHDOG_CLIENT) && who.pid == Some(std::process::id()) {
        return;
    }
    let mut rec = record_of(session, "hello", None, None, e.kind.as_str());
    rec.who.plugin = plugin.map(|p| crate::audit::record::cut_chars(p, 64).into());
    log.record_detached(rec);
}

/// Per peer uid: when its last refusal was recorded, and how many since were not.
type RefusedByUid = HashMap<Option<u32>, (Instant, u64)>;

/// Whether a refused connection of peer `uid` is to be told (logged and recorded): at most one
/// per uid a second, `Some(n)` with the `n` refused since the last one told, the rest `None`.
/// A process that cannot talk to the daemon must not be able to flood its log, nor push the
/// audit log's older records out through retention.
pub fn refusal_due(uid: Option<u32>) -> Option<u64> {
    static SEEN: OnceLock<Mutex<RefusedByUid>> = OnceLock::new();
    let suppressed = {
        let mut seen = SEEN
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if seen.len() > 1024 {
            seen.clear();
        }
        let now = Instant::now();
        let e = seen.entry(uid).or_insert((now - Duration::from_secs(2), 0));
        if now.duration_since(e.0) < Duration::from_secs(1) {
            e.1 += 1;
            return None;
        }
        let n = e.1;
        *e = (now, 0);
        n
    };
    Some(suppressed)
}

/// A peer of another uid, closed before a byte was read (one [`refusal_due`] said to tell):
/// recorded with how many were refused since the last record.
pub fn connection_refused(daemon: &Daemon, uid: Option<u32>, pid: Option<u32>, suppressed: u64) {
    let Some(log) = daemon.audit() else { return };
    let who = Who {
        via: Via::Daemon,
        pid,
        uid,
        ..Who::default()
    };
    let mut rec = Record::new("connect", ErrorKind::Forbidden.as_str(), who);
    rec.detail = Some(serde_json::json!({
        "why": "the peer's uid is not the daemon's",
        "refused_since_last_record": suppressed,
    }));
    log.record_detached(rec);
}
