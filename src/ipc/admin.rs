//! `admin.*`: status, fsck and reindex, key rotation (re-sealing the streams when the default
//! store's key changes).

use std::sync::Arc;

use serde_json::{json, Value};

use super::creds::{store_of, writer_permit};
use super::protocol::admin::AdminCall;
use super::protocol::{RpcError, PROTOCOL_VERSION};
use super::reply::blocking;
use crate::config::PluginGrant;
use crate::service::Daemon;
use crate::store::RotateOptions;

/// Run an admitted `admin.*` call.
pub async fn dispatch(
    daemon: &Arc<Daemon>,
    call: AdminCall,
    grant: Arc<PluginGrant>,
) -> Result<Value, RpcError> {
    let (store_name, repair) = match call {
        AdminCall::Status(_) => {
            let d = Arc::clone(daemon);
            return blocking(move || Ok::<_, RpcError>(status(&d, &grant))).await;
        }
        AdminCall::RotateKey(p) => {
            let opts = RotateOptions {
                new_key: true,
                prune: p.prune,
            };
            return rotate_key(daemon, p.store, opts, grant).await;
        }
        AdminCall::PruneKeys(p) => {
            let opts = RotateOptions {
                new_key: false,
                prune: true,
            };
            return rotate_key(daemon, p.store, opts, grant).await;
        }
        AdminCall::Reindex(p) => (p.store, true),
        AdminCall::Fsck(p) => (p.store, p.repair),
    };
    let (name, store) = store_of(daemon, &grant, store_name.as_deref()).await?;
    let _permit = writer_permit(daemon, &name).await;
    let report = blocking(move || store.fsck(repair)).await?;
    let mut v = serde_json::to_value(&report).unwrap_or_default();
    v["store"] = name.into();
    Ok(v)
}

/// `admin.rotate_key` and `admin.prune_keys`.
async fn rotate_key(
    daemon: &Arc<Daemon>,
    store_name: Option<String>,
    opts: RotateOptions,
    grant: Arc<PluginGrant>,
) -> Result<Value, RpcError> {
    let (name, store) = store_of(daemon, &grant, store_name.as_deref()).await?;
    let _permit = writer_permit(daemon, &name).await;
    // The default store's key also seals the streams: re-seal them under the new key
    // before the old one is forgotten.
    let seals_streams = name == crate::service::STREAMS_KEY_STORE;
    if opts.prune && seals_streams {
        refuse_prune_for_others(&store.config().base, daemon.data_dir())?;
    }
    let d = Arc::clone(daemon);
    let report = blocking(move || {
        store.rotate_key_with(
            opts,
            |_, _| {},
            || {
                if !seals_streams {
                    return Ok(());
                }
                match d.streams() {
                    Ok(s) => s.reseal().map(|_| ()).map_err(Into::into),
                    // No streams data yet: nothing to re-seal.
                    Err(_) if !crate::streams::has_data(d.data_dir()) => Ok(()),
                    Err(e) => Err(ResealError::Open(e).into()),
                }
            },
        )
    })
    .await?;
    let mut v = serde_json::to_value(&report).unwrap_or_default();
    v["store"] = name.into();
    Ok(v)
}

/// A prune of the default store's key while another data dir sharing that store holds streams
/// sealed with it: refused (the keys stay), since only that data dir's daemon can re-seal them.
pub fn refuse_prune_for_others(
    store_base: &std::path::Path,
    data_dir: &std::path::Path,
) -> Result<(), RpcError> {
    match crate::streams::prune_held_back(store_base, data_dir) {
        None => Ok(()),
        Some(why) => Err(RpcError::new(crate::error::ErrorKind::Unsupported, why)),
    }
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
            Err(e) => json!({"name": name, "path": slot.config.base, "error": e.to_string()}),
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
        "lane_connections": daemon.lane_connections(),
        "stores": stores,
        "audit": daemon.audit().map(|a| json!({
            "dir": a.dir(),
            "durability": if a.strict() { "always" } else { "batch" },
            "refusing": a.poisoned(),
        })),
    })
}

/// The streams could not be re-sealed under a store's new key.
#[derive(Debug, thiserror::Error)]
enum ResealError {
    /// They did not open.
    #[error("the streams could not be opened: {0}")]
    Open(#[source] crate::streams::StreamError),
}
