//! Method → service. Thin: parse params (unknown fields refused), check the connection's
//! grant, run the store call on the blocking pool, shape the result.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Map, Value};
use zeroize::Zeroizing;

use super::protocol::{self, params, params_ref, Request, RpcError, PROTOCOL_VERSION};
use super::server::Session;
use crate::config::PluginGrant;
use crate::crypto::Secret;
use crate::error::ErrorKind;
use crate::limits::MAX_LEASE;
use crate::service::{CredEvent, Daemon};
use crate::store::{Change, Credential, CredentialStore};

pub use crate::api::METHODS;

use crate::paths::DEFAULT_STORE;

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
        match read_inline(daemon, &grant, &req.method, &params, &req.id) {
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

/// `cred.get` / `cred.exists` on the connection's task, if the store is open and the file
/// cache has the credential (`None`: take the async path). Bad params and refusals are
/// answered here too.
fn read_inline(
    daemon: &Daemon,
    grant: &PluginGrant,
    method: &str,
    params: &Value,
    id: &protocol::Id,
) -> Option<Zeroizing<Vec<u8>>> {
    let err = |e: RpcError| Some(protocol::response_err(id, &e));
    let p: ById = match params_ref(params) {
        Ok(p) => p,
        Err(e) => return err(e),
    };
    let name = p.store.as_deref().unwrap_or(DEFAULT_STORE);
    if let Err(e) = check_store_name(grant, name) {
        return err(e);
    }
    let slot = daemon.open_store(name)?;
    let store = match &slot.store {
        Ok(s) => s,
        Err(_) => return None,
    };
    // Only a clean hit of the file cache (an lstat and a decryption, no file opened): anything
    // that could wait on the disk (a miss, a key reload, an error path) goes to the pool.
    let cred = store.get_cached(&p.id)?.ok()?;
    Some(if method == "cred.exists" {
        protocol::response_ok(id, json!({"exists": true}))
    } else {
        protocol::response_credential(id, &cred, cred.generation())
    })
}

/// A well-formed store name this connection's grant includes.
fn check_store_name(grant: &PluginGrant, name: &str) -> Result<(), RpcError> {
    // The name is the client's text: refuse a malformed one without echoing it.
    crate::paths::validate_store_name(name).map_err(RpcError::invalid_params)?;
    if !grant.allows_store(name) {
        return Err(RpcError::new(
            ErrorKind::Forbidden,
            format!("this connection's plugin grant does not include store {name:?}"),
        ));
    }
    Ok(())
}

/// A permit to send a write for store `name` to the blocking pool (at most
/// `MAX_WRITERS_PER_STORE` at once: writes serialize on the store lock anyway, and parked
/// writers would take blocking-pool threads that reads need). Waits asynchronously.
async fn writer_permit(daemon: &Daemon, name: &str) -> Option<tokio::sync::OwnedSemaphorePermit> {
    let slot = daemon.open_store(name)?;
    Arc::clone(&slot.writers).acquire_owned().await.ok()
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

async fn store_of(
    daemon: &Arc<Daemon>,
    grant: &PluginGrant,
    name: Option<&str>,
) -> Result<(String, Arc<CredentialStore>), RpcError> {
    let name = name.unwrap_or(DEFAULT_STORE).to_owned();
    check_store_name(grant, &name)?;
    // An open store is a map lookup. Opening one created after start reads its files: that
    // goes to the blocking pool.
    let slot = match daemon.open_store(&name) {
        Some(slot) => Some(slot),
        None => {
            let (d, n) = (Arc::clone(daemon), name.clone());
            tokio::task::spawn_blocking(move || d.store(&n))
                .await
                .map_err(|e| RpcError::internal(&e))?
        }
    };
    let Some(slot) = slot else {
        let known: Vec<String> = daemon.stores().into_iter().map(|(n, _)| n).collect();
        return Err(RpcError::new(
            ErrorKind::NotFound,
            format!(
                "no store {name:?} (stores: {}); create it with `holdfast --store {name} init`",
                if known.is_empty() {
                    "none".into()
                } else {
                    known.join(", ")
                }
            ),
        ));
    };
    match &slot.store {
        Ok(s) => Ok((name, Arc::clone(s))),
        Err(e) => Err(RpcError::new(
            ErrorKind::Storage,
            format!("store {name:?} did not open: {e}"),
        )),
    }
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ById {
    #[serde(default)]
    store: Option<String>,
    id: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StoreOnly {
    #[serde(default)]
    store: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SetParams {
    #[serde(default)]
    store: Option<String>,
    #[serde(default)]
    credential: Option<Value>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    value: Option<Value>,
    #[serde(default)]
    if_generation: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FsckParams {
    #[serde(default)]
    store: Option<String>,
    #[serde(default)]
    repair: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LeaseParams {
    #[serde(default)]
    store: Option<String>,
    id: String,
    ttl_ms: u64,
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
        "cred.get" => {
            let p: ById = params(req.params)?;
            let (_, store) = store_of(daemon, &grant, p.store.as_deref()).await?;
            // Here when route() could not answer from the file cache (a miss, a changed or
            // racy file, an error, a store not open yet): the read may wait on the disk.
            let cred = blocking(move || store.get(&p.id)).await?;
            Ok(json!({"credential": cred.expose_json(), "generation": cred.generation()}))
        }
        "cred.exists" => {
            let p: ById = params(req.params)?;
            let (_, store) = store_of(daemon, &grant, p.store.as_deref()).await?;
            let exists = blocking(move || store.exists(&p.id)).await?;
            Ok(json!({"exists": exists}))
        }
        "cred.set" => cred_set(daemon, session, &grant, req.params).await,
        "cred.delete" => {
            let p: ById = params(req.params)?;
            let (name, store) = store_of(daemon, &grant, p.store.as_deref()).await?;
            let id = p.id.clone();
            let _permit = writer_permit(daemon, &name).await;
            let deleted = blocking(move || store.delete(&p.id)).await?;
            if deleted {
                let change = Change {
                    id: id.clone(),
                    generation: None,
                };
                daemon.publish(&name, &change, "daemon");
                daemon.release_lease(&name, &id, session.id, true);
            }
            Ok(json!({"deleted": deleted}))
        }
        "cred.list" => {
            let p: StoreOnly = params(req.params)?;
            let (_, store) = store_of(daemon, &grant, p.store.as_deref()).await?;
            let listing = blocking(move || store.list()).await?;
            let credentials: Vec<Value> = listing
                .credentials
                .into_iter()
                .map(|c| {
                    let mut item = Map::new();
                    item.insert("id".into(), c.id.into());
                    item.insert("generation".into(), c.generation.into());
                    if let Value::Object(meta) = c.metadata {
                        for (k, v) in meta {
                            item.entry(k).or_insert(v);
                        }
                    }
                    Value::Object(item)
                })
                .collect();
            Ok(json!({"credentials": credentials, "unreadable": listing.unreadable}))
        }
        "cred.watch" => cred_watch(daemon, session, &grant, req.params).await,
        "unsubscribe" => unsubscribe(session, req.params),
        "cred.refresh_lease" => {
            let p: LeaseParams = params(req.params)?;
            crate::store::id::validate(&p.id)
                .map_err(|e| RpcError::invalid_params(e.to_string()))?;
            let (name, _) = store_of(daemon, &grant, p.store.as_deref()).await?;
            if p.ttl_ms == 0 || Duration::from_millis(p.ttl_ms) > MAX_LEASE {
                return Err(RpcError::invalid_params(format!(
                    "ttl_ms must be 1..={}",
                    MAX_LEASE.as_millis()
                )));
            }
            let Some(answer) =
                daemon.refresh_lease(&name, &p.id, session.id, Duration::from_millis(p.ttl_ms))
            else {
                return Err(RpcError::new(
                    ErrorKind::Busy,
                    format!(
                        "this connection already holds {} refresh leases; release some first",
                        crate::service::MAX_LEASES_PER_CONNECTION
                    ),
                ));
            };
            let mut v = serde_json::to_value(&answer).unwrap_or_default();
            if !answer.granted {
                v["hint"] = "another client is refreshing this credential: watch it (cred.watch) and read it again on its cred.changed event, or ask again on lease.released or after expires_in_ms".into();
            }
            Ok(v)
        }
        "cred.release_lease" => {
            let p: ById = params(req.params)?;
            let (name, _) = store_of(daemon, &grant, p.store.as_deref()).await?;
            Ok(json!({"released": daemon.release_lease(&name, &p.id, session.id, false)}))
        }
        "admin.status" => {
            let _: StoreOnly = params(req.params)?;
            let d = Arc::clone(daemon);
            blocking(move || Ok::<_, RpcError>(status(&d, &grant))).await
        }
        "admin.fsck" | "admin.reindex" => {
            let (store_name, repair) = if req.method == "admin.reindex" {
                let p: StoreOnly = params(req.params)?;
                (p.store, true)
            } else {
                let p: FsckParams = params(req.params)?;
                (p.store, p.repair)
            };
            let (name, store) = store_of(daemon, &grant, store_name.as_deref()).await?;
            let _permit = writer_permit(daemon, &name).await;
            let report = blocking(move || store.fsck(repair)).await?;
            let mut v = serde_json::to_value(&report).unwrap_or_default();
            v["store"] = name.into();
            Ok(v)
        }
        "admin.rotate_key" => {
            let p: StoreOnly = params(req.params)?;
            let (name, store) = store_of(daemon, &grant, p.store.as_deref()).await?;
            let _permit = writer_permit(daemon, &name).await;
            // The default store's key also seals the streams: re-seal them under the new key
            // before the old one is forgotten.
            let seals_streams = name == crate::service::STREAMS_KEY_STORE;
            let d = Arc::clone(daemon);
            let report = blocking(move || {
                store.rotate_key_with(
                    |_, _| {},
                    || {
                        if !seals_streams {
                            return Ok(());
                        }
                        match d.streams() {
                            Ok(s) => s.reseal().map(|_| ()).map_err(|e| e.to_string()),
                            // No streams data yet: nothing to re-seal.
                            Err(_) if !crate::streams::has_data(d.data_dir()) => Ok(()),
                            Err(e) => Err(format!("the streams could not be opened: {e}")),
                        }
                    },
                )
            })
            .await?;
            let mut v = serde_json::to_value(&report).unwrap_or_default();
            v["store"] = name.into();
            Ok(v)
        }
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

/// Normalize a `cred.set` credential document: each key may omit its `name` (the map key
/// names it); then check it against the schema.
fn credential_from_params(doc: Value) -> Result<Credential, RpcError> {
    let mut doc = doc;
    if let Some(Value::Object(keys)) = doc.get_mut("keys") {
        for (name, k) in keys.iter_mut() {
            if let Value::Object(k) = k {
                k.entry("name")
                    .or_insert_with(|| Value::String(name.clone()));
            }
        }
    }
    Credential::from_value(doc)
        .map_err(|e| RpcError::invalid_params(format!("invalid credential: {e}")))
}

async fn cred_set(
    daemon: &Arc<Daemon>,
    session: &Arc<Session>,
    grant: &PluginGrant,
    raw: Map<String, Value>,
) -> Result<Value, RpcError> {
    let p: SetParams = params(raw)?;
    let cred = match (p.credential, p.id, p.value) {
        (Some(doc), None, None) => credential_from_params(doc)?,
        (None, Some(id), Some(Value::String(value))) => {
            crate::store::id::validate(&id).map_err(|e| RpcError::invalid_params(e.to_string()))?;
            Credential::api_key(&id, Secret::new(value))
        }
        (None, Some(_), Some(_)) => {
            return Err(RpcError::invalid_params("\"value\" must be a string"))
        }
        _ => {
            return Err(RpcError::invalid_params(
                "give either {credential: {id, keys, …}} or the shorthand {id, value}",
            ))
        }
    };
    let (name, store) = store_of(daemon, grant, p.store.as_deref()).await?;
    let id = cred.id().to_owned();
    let if_generation = p.if_generation;
    let permit = writer_permit(daemon, &name).await;
    let generation = blocking(move || store.set(cred, if_generation)).await?;
    drop(permit);
    // Release first: a waiter woken by the event may ask for the lease at once.
    daemon.release_lease(&name, &id, session.id, true);
    daemon.publish(
        &name,
        &Change {
            id: id.clone(),
            generation: Some(generation),
        },
        "daemon",
    );
    Ok(json!({"id": id, "generation": generation}))
}

async fn cred_watch(
    daemon: &Arc<Daemon>,
    session: &Arc<Session>,
    grant: &PluginGrant,
    raw: Map<String, Value>,
) -> Result<Value, RpcError> {
    let p: StoreOnly = params(raw)?;
    // Watch one store, or every store the grant covers.
    let only = match p.store.as_deref() {
        Some(s) => Some(store_of(daemon, grant, Some(s)).await?.0),
        None => None,
    };
    let (sub, gate) = open_subscription(session)?;
    let mut rx = daemon.subscribe_events();
    let (session_f, grant_f) = (Arc::clone(session), grant.clone());
    tokio::spawn(async move {
        loop {
            let next = session_f.unless_ended(gate.until_closed(rx.recv())).await;
            let Some(received) = next.flatten() else {
                break;
            };
            let ev: CredEvent = match received {
                Ok(ev) => ev,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    let line = protocol::notification(json!({
                        "subscription": sub, "type": "resync", "missed": n,
                        "hint": "events were dropped because this client fell behind: list again",
                    }));
                    if !gate.send(&session_f.outbox, line) {
                        break;
                    }
                    continue;
                }
                Err(_) => break,
            };
            if only.as_ref().is_some_and(|s| *s != ev.store) || !grant_f.allows_store(&ev.store) {
                continue;
            }
            let params = if ev.kind == "cred.changed" {
                json!({
                    "subscription": sub,
                    "type": ev.kind,
                    "store": ev.store,
                    "id": ev.id,
                    "generation": ev.generation,
                    "deleted": ev.generation.is_none(),
                    "source": ev.source,
                })
            } else {
                json!({
                    "subscription": sub,
                    "type": ev.kind,
                    "store": ev.store,
                    "id": ev.id,
                    "reason": ev.source,
                })
            };
            let line = protocol::notification(params);
            if !gate.send(&session_f.outbox, line) {
                break;
            }
        }
        session_f.subscriptions.ended(sub);
    });
    Ok(json!({"subscription": sub}))
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

/// `admin.status`: only the stores `grant` covers.
pub fn status(daemon: &Daemon, grant: &PluginGrant) -> Value {
    let stores: Vec<Value> = daemon
        .stores()
        .iter()
        .filter(|(name, _)| grant.allows_store(name))
        .map(|(name, slot)| match &slot.store {
            Ok(s) => {
                let sealed = s.sealed_reason();
                json!({
                    "name": name,
                    "path": slot.config.base,
                    "sealed": sealed.is_some(),
                    "sealed_reason": sealed.map(|r| r.to_string()),
                    "credentials": s.file_count().ok(),
                    "key_fingerprints": s.key_fingerprints(),
                    "key_source": s.key_source().map(|k| k.to_string()),
                })
            }
            Err(e) => json!({"name": name, "path": slot.config.base, "error": e}),
        })
        .collect();
    json!({
        "server": "holdfast",
        "version": env!("CARGO_PKG_VERSION"),
        "protocol": PROTOCOL_VERSION,
        "pid": std::process::id(),
        "uptime_ms": u64::try_from(daemon.started().elapsed().as_millis()).unwrap_or(u64::MAX),
        "socket": daemon.socket(),
        "data_dir": daemon.data_dir(),
        "connections": daemon.connections(),
        "stores": stores,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serde_errors_lose_their_quoted_values() {
        let e = serde_json::from_value::<LeaseParams>(json!({"id": "x", "ttl_ms": "sk-secret"}))
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("sk-secret"),
            "premise: serde quotes the value: {e}"
        );
        let r = super::super::protocol::redact_quoted(&e);
        assert!(!r.contains("sk-secret"), "{r}");
        assert!(r.contains("invalid type"), "{r}");
        let e = serde_json::from_value::<ById>(json!({"id": "x", "sk-secret-name": 1}))
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("sk-secret-name"),
            "premise: serde names the field: {e}"
        );
        let r = super::super::protocol::redact_quoted(&e);
        assert!(!r.contains("sk-secret-name"), "{r}");
        assert!(
            r.contains("unknown field `…`") && r.contains("`store`"),
            "{r}"
        );
    }
}
