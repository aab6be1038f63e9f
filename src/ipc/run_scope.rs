//! A plugin grant's `runs` (`[plugins.NAME] runs` in config.toml) on the wire: a call that
//! names a run outside them is refused before any handler sees it, on every path a request
//! takes (`handlers::route`, which the tokio connections and the append lane both call), and
//! the methods that enumerate runs show only the runs inside them.
//!
//! Both are decided on the run id and the patterns alone, before anything is read: a refusal
//! is the same whether the run exists or not, and a listing drops what is outside the grant
//! before it is answered, so a plugin learns nothing of other runs — not their ids, not how
//! many there are.

use serde_json::Value;

use super::protocol::{Call, RpcError};
use crate::config::PluginGrant;
use crate::error::ErrorKind;

/// Refuse `call` if it names a run `grant` does not cover.
pub fn admit(grant: &PluginGrant, call: &Call) -> Result<(), RpcError> {
    match call.run_id() {
        Some(run_id) => admit_run(grant, call.method(), run_id),
        None => Ok(()),
    }
}

/// Refuse `method` on `run_id` if `grant` does not cover the run. The message names the
/// plugin and its patterns (both from the config file), never the client's run id.
pub fn admit_run(grant: &PluginGrant, method: &str, run_id: &str) -> Result<(), RpcError> {
    if grant.allows_run(run_id) {
        return Ok(());
    }
    // Only a plugin's grant limits runs (a connection naming none has every run); the name is
    // the config file's key it was bound by.
    let plugin = grant.plugin.as_deref().unwrap_or_default();
    Err(RpcError::new(
        ErrorKind::Forbidden,
        format!(
            "this connection's plugin grant ([plugins.{plugin}]) covers only runs {:?}; \
             {method} of a run outside them is refused",
            grant.run_patterns()
        ),
    ))
}

/// Keep, of a listing's runs (each an object with its `run_id`), only those `grant` covers.
/// An entry without a readable `run_id` is dropped under a grant that limits runs: what
/// cannot be matched is not shown.
pub fn retain(grant: &PluginGrant, runs: &mut Vec<Value>) {
    if grant.covers_every_run() {
        return;
    }
    runs.retain(|r| {
        r.get("run_id")
            .and_then(Value::as_str)
            .is_some_and(|id| grant.allows_run(id))
    });
}
