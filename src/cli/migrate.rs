//! `holdfast migrate --to postgres | file`: move the streams, checkpoints and run logs of this
//! data directory between the file backend and the `[backend]` database, verified (see
//! `service::migrate`).

use clap::{Args, ValueEnum};
use serde_json::json;

use super::{out, out_json, CliError, CliResult, Global};
use crate::service::migrate::{self, MigrateError, Target};

/// Arguments of `holdfast migrate`.
#[derive(Args, Debug)]
pub struct MigrateArgs {
    /// Where the data set goes: `postgres` (from this data directory's files into the
    /// [backend] database) or `file` (back).
    #[arg(long, value_enum)]
    to: To,
    /// Print what was moved as JSON.
    #[arg(long)]
    json: bool,
}

/// A backend to move to.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum To {
    Postgres,
    File,
}

/// Run `holdfast migrate`.
pub fn run(g: &Global, a: &MigrateArgs) -> CliResult {
    let config = g.config()?;
    let data_dir = g.data_dir()?;
    let target = match a.to {
        To::Postgres => Target::Postgres,
        To::File => Target::File,
    };
    let progress = |line: &str| {
        tracing::info!("{line}");
        eprintln!("migrate: {line}");
    };
    let moved = migrate::migrate(&data_dir, &config, target, &progress).map_err(|e| {
        let code = match e {
            MigrateError::NoDatabase => 2,
            _ => 1,
        };
        CliError::with_code(e, code)
    })?;
    let kind = match target {
        Target::Postgres => "postgres",
        Target::File => "file",
    };
    if a.json {
        out_json(&json!({"to": kind, "moved": moved, "verified": true}));
    } else {
        out(format!(
            "moved and verified: {} active runs ({} events), {} ended runs, {} checkpoints, {} run logs ({} records)",
            moved.active_runs,
            moved.events,
            moved.ended_runs,
            moved.checkpoints,
            moved.run_logs,
            moved.run_log_records
        ));
        out(format!(
            "the source is unchanged; set [backend] kind = \"{kind}\" and start the daemon to serve the copy"
        ));
    }
    Ok(())
}
