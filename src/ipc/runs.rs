//! `run.*`: thin handlers over [`crate::runlog::RunLog`] (file work on the blocking pool).

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::protocol::runs::{Listing, Pruned, RunCall};
use super::protocol::{result, RpcError};
use super::reply::blocking;
use crate::config::PluginGrant;
use crate::service::Daemon;

/// Run an admitted `run.*` call: its run already checked against `grant`'s runs
/// (`run_scope::admit`); `run.list` shows and `run.prune` deletes only runs the grant covers.
pub async fn dispatch(
    daemon: &Arc<Daemon>,
    call: RunCall,
    grant: &PluginGrant,
) -> Result<Value, RpcError> {
    let log = daemon.run_log().map_err(RpcError::from)?;
    match call {
        RunCall::LogNode(p) => blocking(move || log.log_node(&p.run_id, p.detail)).await,
        RunCall::EnsureNode(p) => {
            blocking(move || log.ensure_node(&p.run_id, &p.node_id, p.detail)).await
        }
        RunCall::LogStep(p) => blocking(move || log.log_step(&p.run_id, p.step)).await,
        RunCall::ToolBegin(p) => {
            blocking(move || log.tool_begin(&p.run_id, &p.tool_call_id, &p.name, p.input)).await
        }
        RunCall::ToolEnd(p) => {
            blocking(move || log.tool_end(&p.run_id, &p.tool_call_id, p.result, p.is_error)).await
        }
        RunCall::End(p) => {
            let (run_id, status, given) = p.into_parts();
            blocking(move || log.end(&run_id, &status, &given)).await
        }
        RunCall::Start(p) => blocking(move || log.start(&p.run_id)).await,
        RunCall::Get(p) => blocking(move || log.get(&p.run_id)).await,
        RunCall::List(p) => {
            let mut runs =
                blocking(move || log.list(p.status.as_deref(), p.since_ms, p.until_ms)).await?;
            super::run_scope::retain(grant, &mut runs);
            result(&Listing { runs })
        }
        RunCall::Prune(p) => {
            let age = Duration::try_from_secs_f64(p.older_than_days * 86_400.0).map_err(|_| {
                RpcError::invalid_params(
                    "older_than_days must be a non-negative number of days (at most ~5e14)",
                )
            })?;
            let (d, grant) = (Arc::clone(daemon), grant.clone());
            let dry_run = p.dry_run;
            let pruned = blocking(move || {
                // Runs with a live stream are never pruned, however old their last event; nor
                // are runs outside the grant (neither deleted nor named).
                let live = d.live_streams().map_err(RpcError::from)?;
                let keep = |id: &str| live(id) || !grant.allows_run(id);
                log.prune(age, &keep, dry_run).map_err(RpcError::from)
            })
            .await?;
            result(&Pruned { pruned, dry_run })
        }
    }
}
