//! Routing: every request line parsed (or read as a `stream.append`) once, admitted (hello first,
//! a known method, the connection's grant), answered inline when that costs no waiting, else
//! handed to its family — `creds.rs`, `admin.rs`, `streams.rs`, `runs.rs` — plus `hello` and
//! `unsubscribe`, which concern only the connection.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Map, Value};
use zeroize::Zeroizing;

use super::protocol::{self, params, Request, RpcError, PROTOCOL_VERSION};
use super::server::Session;
use crate::config::PluginGrant;
use crate::error::ErrorKind;
use crate::service::Daemon;

pub use crate::api::METHODS;

/// Methods every connection may call whatever its plugin grant: they concern only the
/// connection itself.
const ALWAYS_ALLOWED: &[&str] = &["hello", "unsubscribe"];

/// What a connection's reader does with one request line.
pub enum Routed {
    /// Already answered: a parse error, `hello`, a refusal, or a read served right here.
    Done(Zeroizing<Vec<u8>>),
    /// Needs the async path (a write, a subscription, a store to open): run [`dispatch`].
    Async(Request, PluginGrant),
    /// An admitted `stream.append`: every one takes [`super::streams::append`].
    Append(super::streams::AppendRequest),
}

/// Parse a request line, admit it (hello first, method known, grant), and answer it at once
/// when that costs no waiting: everything before `hello`, refusals, and `cred.get` /
/// `cred.exists` of a credential whose file is in the store's file cache and unchanged (an
/// `lstat` and a decryption, ~4 µs, less than a trip to the blocking pool and back, ~13 µs).
/// Anything that could wait on the disk goes to the blocking pool; see docs/design.md.
pub fn route(daemon: &Daemon, session: &Session, line: &[u8]) -> Routed {
    if let Some(a) = super::streams::read_append_line(line) {
        daemon.note_request();
        return match admit(session, "stream.append") {
            Ok(_) => Routed::Append(a),
            Err(e) => Routed::Done(protocol::response_err(&a.id, &e)),
        };
    }
    let mut req = match protocol::parse_request(line) {
        Ok(r) => r,
        Err(bad) => return Routed::Done(protocol::response_err(&bad.0, &bad.1)),
    };
    let answer = |id: &protocol::Id, r: Result<Value, RpcError>| {
        Routed::Done(match r {
            Ok(v) => protocol::response_ok(id, v),
            Err(e) => protocol::response_err(id, &e),
        })
    };
    if req.method == "hello" {
        let params = std::mem::take(&mut req.params);
        return answer(&req.id, hello(daemon, session, params));
    }
    daemon.note_request();
    let grant = match admit(session, &req.method) {
        Ok(g) => g,
        Err(e) => return answer(&req.id, Err(e)),
    };
    if req.method == "stream.append" {
        return Routed::Append(super::streams::AppendRequest::from_request(req));
    }
    if matches!(req.method.as_str(), "cred.get" | "cred.exists") {
        let params = Value::Object(std::mem::take(&mut req.params));
        match super::creds::read_inline(daemon, &grant, &req.method, &params, &req.id) {
            Some(reply) => return Routed::Done(reply),
            None => {
                if let Value::Object(m) = params {
                    req.params = m;
                }
            }
        }
    }
    Routed::Async(req, grant)
}

/// Run an admitted request on the async path and produce its response line.
pub async fn respond(
    daemon: &Arc<Daemon>,
    session: &Arc<Session>,
    req: Request,
    grant: PluginGrant,
) -> Zeroizing<Vec<u8>> {
    let id = req.id.clone();
    match dispatch(daemon, session, req, grant).await {
        Ok(result) => protocol::response_ok(&id, result),
        Err(e) => protocol::response_err(&id, &e),
    }
}

/// May this connection call `method`? Its grant if so.
fn admit(session: &Session, method: &str) -> Result<PluginGrant, RpcError> {
    if !METHODS.contains(&method) || method == "hello" {
        return Err(RpcError::method_not_found(method));
    }
    let Some(grant) = session.grant() else {
        return Err(RpcError::invalid_request(
            "send `hello` first (it says which protocol you speak and binds a plugin grant)",
        ));
    };
    if !ALWAYS_ALLOWED.contains(&method) && !grant.allows_method(method) {
        return Err(RpcError::new(
            ErrorKind::Forbidden,
            format!("this connection's plugin grant does not include {method}"),
        ));
    }
    Ok(grant)
}

/// Run a blocking store call on tokio's blocking pool.
pub(crate) async fn blocking<T: Send + 'static, E: Into<RpcError> + Send + 'static>(
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, RpcError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| RpcError::internal(&e))?
        .map_err(Into::into)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Hello {
    #[serde(default)]
    client: Option<String>,
    #[serde(default)]
    plugin: Option<String>,
    #[serde(default)]
    protocol: Option<u64>,
}

/// Run one admitted request (see [`route`]).
pub async fn dispatch(
    daemon: &Arc<Daemon>,
    session: &Arc<Session>,
    req: Request,
    grant: PluginGrant,
) -> Result<Value, RpcError> {
    if req.method.starts_with("stream.") || req.method.starts_with("checkpoint.") {
        return super::streams::dispatch(daemon, session, req).await;
    }
    if req.method.starts_with("run.") {
        return super::runs::dispatch(daemon, req).await;
    }
    match req.method.as_str() {
        m if m.starts_with("cred.") => super::creds::dispatch(daemon, session, req, grant).await,
        m if m.starts_with("admin.") => super::admin::dispatch(daemon, req, grant).await,
        "unsubscribe" => unsubscribe(session, req.params),
        other => Err(RpcError::method_not_found(other)),
    }
}

fn hello(daemon: &Daemon, session: &Session, p: Map<String, Value>) -> Result<Value, RpcError> {
    let p: Hello = params(p)?;
    if session.grant().is_some() {
        // A connection bound to a plugin's grant must not rebind itself to a wider one.
        return Err(RpcError::invalid_request(
            "hello was already sent on this connection; open a new connection to bind another plugin",
        ));
    }
    if let Some(v) = p.protocol {
        if v != PROTOCOL_VERSION {
            return Err(RpcError::new(
                ErrorKind::Unsupported,
                format!("this server speaks protocol {PROTOCOL_VERSION}, not {v}"),
            ));
        }
    }
    let grant = match &p.plugin {
Some(name) => daemon.config().plugins.get(name).cloned().ok_or_else(|| {
            // Not echoed: the name is the client's text.
            RpcError::new(
                ErrorKind::Forbidden,
                "no such plugin in the config file; ask the user to declare it under [plugins.NAME]",
            )
        })?,
        None if daemon.config().require_plugin => {
            return Err(RpcError::new(
                ErrorKind::Forbidden,
                "this daemon requires every client to name its plugin in hello {plugin}",
            ))
        }
        None => PluginGrant::all(),
    };
    let stores: Vec<String> = daemon
        .stores()
        .into_iter()
        .map(|(n, _)| n)
        .filter(|s| grant.allows_store(s))
        .collect();
    let methods: Vec<&str> = METHODS
        .iter()
        .copied()
        .filter(|m| ALWAYS_ALLOWED.contains(m) || grant.allows_method(m))
        .collect();
    *session
        .grant
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(grant);
    let shown = |s: &Option<String>| s.as_deref().map(|s| s.chars().take(64).collect::<String>());
    if p.client.as_deref() == Some(crate::limits::WATCHDOG_CLIENT) {
        // The daemon's own liveness probe, every few seconds: not worth a journal line each.
        tracing::debug!(conn = session.id, "hello from the watchdog probe");
    } else {
        tracing::info!(conn = session.id, client = ?shown(&p.client), plugin = ?shown(&p.plugin), "hello");
    }
    Ok(json!({
        "server": "holdfast",
        "version": env!("CARGO_PKG_VERSION"),
        "protocol": PROTOCOL_VERSION,
        "connection": session.id,
        "methods": methods,
        "grant": {"plugin": p.plugin, "stores": stores},
        "data_dir": daemon.data_dir(),
    }))
}

/// A new subscription of this connection, or `busy` at the cap.
pub fn open_subscription(
    session: &Session,
) -> Result<(u64, Arc<super::subscriptions::Gate>), RpcError> {
    session.subscriptions.open().ok_or_else(|| {
        RpcError::new(
            ErrorKind::Busy,
            format!(
                "this connection already has {} subscriptions (one per store or run shown is \
                 enough; `unsubscribe` frees one)",
                crate::limits::MAX_SUBSCRIPTIONS_PER_CONNECTION
            ),
        )
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Unsubscribe {
    subscription: u64,
}

/// `unsubscribe`: close one of this connection's subscriptions. Once answered, no event of it
/// follows (see `subscriptions.rs`). `unsubscribed: false`: there was no such open
/// subscription (a run's subscription ends by itself with `finish`).
fn unsubscribe(session: &Session, raw: Map<String, Value>) -> Result<Value, RpcError> {
    let p: Unsubscribe = params(raw)?;
    Ok(json!({"unsubscribed": session.subscriptions.close(p.subscription)}))
}
