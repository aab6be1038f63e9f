//! `cred.*`: reads (inline from the file cache when possible), writes with their writer
//! permits, deletes, listings, watches and refresh leases — the store calls on the blocking pool.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use zeroize::Zeroizing;

use super::protocol::creds::{
    ById, ChangedEvent, CredCall, Deleted, Exists, Lease, LeaseEvent, Listing, Released,
    ResyncEvent, Set, StoreOnly, Subscribed, Written,
};
use super::protocol::{self, result, RpcError};
use super::reply::{blocking, open_subscription, Answer};
use super::session::Session;
use crate::config::PluginGrant;
use crate::crypto::Secret;
use crate::error::ErrorKind;
use crate::limits::MAX_LEASE;
use crate::paths::DEFAULT_STORE;
use crate::service::{CredEvent, Daemon};
use crate::store::{Change, Credential, CredentialStore};

/// Run an admitted `cred.*` call and send its answer: a write (`cred.set`, `cred.delete`) from
/// the pool thread that made it durable, anything else from this task.
pub async fn dispatch(
    daemon: &Arc<Daemon>,
    session: &Arc<Session>,
    call: CredCall,
    grant: Arc<PluginGrant>,
    answer: Answer,
) {
    let result = match call {
        CredCall::Set(p) => return cred_set(daemon, session, &grant, p, answer).await,
        CredCall::Delete(p) => return cred_delete(daemon, session, &grant, p, answer).await,
        CredCall::Get(p) => cred_get(daemon, &grant, p).await,
        CredCall::Exists(p) => cred_exists(daemon, &grant, p).await,
        CredCall::List(p) => cred_list(daemon, &grant, p).await,
        CredCall::Watch(p) => cred_watch(daemon, session, &grant, p.store).await,
        CredCall::RefreshLease(p) => refresh_lease(daemon, session, &grant, p).await,
        CredCall::ReleaseLease(p) => release_lease(daemon, session, &grant, p).await,
    };
    answer.send(result);
}

async fn cred_get(daemon: &Arc<Daemon>, grant: &PluginGrant, p: ById) -> Result<Value, RpcError> {
    let (_, store) = store_of(daemon, grant, p.store.as_deref()).await?;
    // A clean hit of the file cache costs no waiting (here when route() could not answer
    // inline: its audit record had to wait). Otherwise the read may wait on the disk.
    let cred = match store.get_cached(&p.id) {
        Some(Ok(cred)) => cred,
        _ => blocking(move || store.get(&p.id)).await?,
    };
    Ok(serde_json::json!({"credential": cred.expose_json(), "generation": cred.generation()}))
}

async fn cred_exists(
    daemon: &Arc<Daemon>,
    grant: &PluginGrant,
    p: ById,
) -> Result<Value, RpcError> {
    let (_, store) = store_of(daemon, grant, p.store.as_deref()).await?;
    let exists = blocking(move || store.exists(&p.id)).await?;
    result(&Exists { exists })
}

async fn cred_list(
    daemon: &Arc<Daemon>,
    grant: &PluginGrant,
    p: StoreOnly,
) -> Result<Value, RpcError> {
    let (_, store) = store_of(daemon, grant, p.store.as_deref()).await?;
    let listing = blocking(move || store.list()).await?;
    let credentials = listing
        .credentials
        .into_iter()
        .map(|c| {
            let mut item = serde_json::Map::new();
            item.insert("id".into(), c.id.into());
            item.insert("generation".into(), c.generation.into());
            if let Value::Object(meta) = c.metadata {
                for (k, v) in meta {
                    item.entry(k).or_insert(v);
                }
            }
            item
        })
        .collect();
    result(&Listing {
        credentials,
        unreadable: listing.unreadable,
        refused_ids: listing.refused_ids,
    })
}

async fn refresh_lease(
    daemon: &Arc<Daemon>,
    session: &Session,
    grant: &PluginGrant,
    p: Lease,
) -> Result<Value, RpcError> {
    crate::store::id::validate(&p.id).map_err(|e| RpcError::invalid_params(e.to_string()))?;
    let (name, _) = store_of(daemon, grant, p.store.as_deref()).await?;
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
    let mut v = result(&answer)?;
    if !answer.granted {
        v["hint"] = "another client is refreshing this credential: watch it (cred.watch) and read it again on its cred.changed event, or ask again on lease.released or after expires_in_ms".into();
    }
    Ok(v)
}

async fn release_lease(
    daemon: &Arc<Daemon>,
    session: &Session,
    grant: &PluginGrant,
    p: ById,
) -> Result<Value, RpcError> {
    let (name, _) = store_of(daemon, grant, p.store.as_deref()).await?;
    result(&Released {
        released: daemon.release_lease(&name, &p.id, session.id, false),
    })
}

/// `cred.get` / `cred.exists` on the connection's task, if the store is open and the file
/// cache has the credential (`None`: take the async path): its answer, or its refusal.
pub(super) fn read_inline(
    daemon: &Daemon,
    grant: &PluginGrant,
    call: &CredCall,
    id: &protocol::Id,
) -> Option<Result<Zeroizing<Vec<u8>>, RpcError>> {
    let (p, exists) = match call {
        CredCall::Get(p) => (p, false),
        CredCall::Exists(p) => (p, true),
        _ => return None,
    };
    let name = p.store.as_deref().unwrap_or(DEFAULT_STORE);
    if let Err(e) = check_store_name(grant, name) {
        return Some(Err(e));
    }
    let slot = daemon.open_store(name)?;
    let store = match &slot.store {
        Ok(s) => s,
        Err(_) => return None,
    };
    // Only a clean hit of the file cache (an lstat and a decryption, no file opened): anything
    // that could wait on the disk (a miss, a key reload, an error path) goes to the pool.
    let cred = store.get_cached(&p.id)?.ok()?;
    Some(Ok(if exists {
        protocol::response_ok(id, serde_json::json!({"exists": true}))
    } else {
        protocol::response_credential(id, &cred, cred.generation())
    }))
}

/// A well-formed store name this connection's grant includes.
fn check_store_name(grant: &PluginGrant, name: &str) -> Result<(), RpcError> {
    // The name is the client's text: refuse a malformed one without echoing it.
    crate::paths::validate_store_name(name).map_err(|e| RpcError::invalid_params(e.to_string()))?;
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
pub(super) async fn writer_permit(
    daemon: &Daemon,
    name: &str,
) -> Option<tokio::sync::OwnedSemaphorePermit> {
    let slot = daemon.open_store(name)?;
    Arc::clone(&slot.writers).acquire_owned().await.ok()
}

pub(super) async fn store_of(
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
        let known = if known.is_empty() {
            "none".into()
        } else {
            known.join(", ")
        };
        // "hive" is the name `import --from-hive` serves hive's own store under: an `init`
        // there would make a second, empty store beside it.
        let advice = if name == "hive" {
            "to serve hive's own store under this name, run `holdfast import --from-hive`, \
             then restart the daemon"
                .to_owned()
        } else {
            format!(
                "create it with `holdfast --store {name} init`, or serve an existing hive store \
                 under this name with `holdfast import --from-hive DIR --name {name}` and a \
                 daemon restart"
            )
        };
        return Err(RpcError::new(
            ErrorKind::NotFound,
            format!("no store {name:?} (stores: {known}); {advice}"),
        ));
    };
    match &slot.store {
        Ok(s) => Ok((name, Arc::clone(s))),
        // The kind is the open's own (a symlinked store is `forbidden`, as offline): the same
        // store answers the same way through the daemon and without it.
        Err(e) => Err(RpcError::new(
            e.kind(),
            format!("store {name:?} did not open: {e}"),
        )),
    }
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
    session: &Session,
    grant: &PluginGrant,
    p: Set,
    answer: Answer,
) {
    let Set {
        store,
        credential,
        id,
        value,
        if_generation,
        keep_updated_at,
    } = p;
    let target = async {
        let mut cred = credential_of(credential, id, value)?;
        if keep_updated_at {
            cred.keep_updated_at();
        }
        let (name, store) = store_of(daemon, grant, store.as_deref()).await?;
        Ok::<_, RpcError>((cred, name, store))
    };
    let (cred, name, store) = match target.await {
        Ok(t) => t,
        Err(e) => return answer.send(Err(e)),
    };
    let (d, conn) = (Arc::clone(daemon), session.id);
    let permit = writer_permit(daemon, &name).await;
    write_and_answer(permit, answer, move || {
        let id = cred.id().to_owned();
        let generation = store.set(cred, if_generation)?;
        // Release first: a waiter woken by the event may ask for the lease at once.
        d.release_lease(&name, &id, conn, true);
        let change = Change {
            id: id.clone(),
            generation: Some(generation),
        };
        d.publish(&name, &change, "daemon");
        result(&Written { id, generation })
    })
    .await;
}

/// The credential a `cred.set` gives: a full document, or the shorthand `{id, value}`.
fn credential_of(
    doc: Option<Value>,
    id: Option<String>,
    value: Option<Value>,
) -> Result<Credential, RpcError> {
    match (doc, id, value) {
        (Some(doc), None, None) => credential_from_params(doc),
        (None, Some(id), Some(Value::String(value))) => {
            crate::store::id::validate(&id).map_err(|e| RpcError::invalid_params(e.to_string()))?;
            Ok(Credential::api_key(&id, Secret::new(value)))
        }
        (None, Some(_), Some(_)) => Err(RpcError::invalid_params("\"value\" must be a string")),
        _ => Err(RpcError::invalid_params(
            "give either {credential: {id, keys, …}} or the shorthand {id, value}",
        )),
    }
}

async fn cred_delete(
    daemon: &Arc<Daemon>,
    session: &Session,
    grant: &PluginGrant,
    p: ById,
    answer: Answer,
) {
    let (name, store) = match store_of(daemon, grant, p.store.as_deref()).await {
        Ok(t) => t,
        Err(e) => return answer.send(Err(e)),
    };
    let (d, conn) = (Arc::clone(daemon), session.id);
    let permit = writer_permit(daemon, &name).await;
    write_and_answer(permit, answer, move || {
        let deleted = store.delete(&p.id)?;
        if deleted {
            let change = Change {
                id: p.id.clone(),
                generation: None,
            };
            d.publish(&name, &change, "daemon");
            d.release_lease(&name, &p.id, conn, true);
        }
        result(&Deleted { deleted })
    })
    .await;
}

/// Run credential write `work` on the blocking pool, holding `permit` (its store's writer
/// permit) until it is done, and send its answer from there. `work` makes the write durable and does what must come before
/// the answer (release the writer's lease, publish the change). Sending from the pool thread
/// saves handing the result back to a runtime worker: that wake-up of an idle worker cost
/// ~25 µs of a ~700 µs set on this machine kind (docs/benchmarks.md, issue 15, eleventh
/// session). If `work` panics, the answer is dropped unsent and says so ([`Answer`]).
async fn write_and_answer(
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
    answer: Answer,
    work: impl FnOnce() -> Result<Value, RpcError> + Send + 'static,
) {
    // The JoinHandle's error is a panic in `work`; the answer went out as `Answer`'s drop.
    let _ = tokio::task::spawn_blocking(move || {
        let mut answer = answer;
        // Its `begun` audit record is durable before the write starts, or it does not start.
        let result = answer.begin().and_then(|()| work());
        answer.send(result);
        drop(permit);
    })
    .await;
}

async fn cred_watch(
    daemon: &Arc<Daemon>,
    session: &Arc<Session>,
    grant: &PluginGrant,
    store: Option<String>,
) -> Result<Value, RpcError> {
    // Watch one store, or every store the grant covers.
    let only = match store.as_deref() {
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
                    let line = protocol::notification_of(&ResyncEvent {
                        subscription: sub,
                        kind: "resync",
                        missed: n,
                        hint: "events were dropped because this client fell behind: list again",
                    });
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
            let line = if ev.kind == "cred.changed" {
                protocol::notification_of(&ChangedEvent {
                    subscription: sub,
                    kind: ev.kind,
                    store: &ev.store,
                    id: &ev.id,
                    generation: ev.generation,
                    deleted: ev.generation.is_none(),
                    source: ev.source,
                })
            } else {
                protocol::notification_of(&LeaseEvent {
                    subscription: sub,
                    kind: ev.kind,
                    store: &ev.store,
                    id: &ev.id,
                    reason: ev.source,
                })
            };
            if !gate.send(&session_f.outbox, line) {
                break;
            }
        }
        session_f.subscriptions.ended(sub);
    });
    result(&Subscribed { subscription: sub })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn serde_errors_lose_their_quoted_values() {
        let e = serde_json::from_value::<super::super::protocol::creds::Lease>(
            json!({"id": "x", "ttl_ms": "sk-secret"}),
        )
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
        let e = serde_json::from_value::<super::super::protocol::creds::ById>(
            json!({"id": "x", "sk-secret-name": 1}),
        )
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
