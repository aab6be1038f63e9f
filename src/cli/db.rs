//! `holdfast db status | migrate`: the PostgreSQL backend's schema (`[backend] kind =
//! "postgres"` in the config file). The daemon migrates at start-up too, under the same
//! advisory lock; these let an operator see and do it beforehand (e.g. before rolling a new
//! version out to several hosts).

use clap::Subcommand;
use serde_json::json;

use super::{out, out_json, CliError, CliResult, Global};
use crate::pg::{Db, DbError};

/// `holdfast db …`
#[derive(Subcommand, Debug)]
pub enum DbCommand {
    /// The schema version of the database and of this binary, and what `migrate` would apply.
    /// Exit 0 when they agree, 3 when migrations are pending, 4 when the database is newer.
    Status {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Apply the pending migrations (each in a transaction, under an advisory lock: safe while
    /// daemons run). A database newer than this binary is refused and left unchanged.
    Migrate,
}

fn db(g: &Global) -> CliResult<std::sync::Arc<Db>> {
    let config = g.config()?;
    let settings = config.postgres().map_err(CliError::usage)?.ok_or_else(|| {
        CliError::usage(
            "no PostgreSQL backend configured: set [backend] kind = \"postgres\" and url in the config file (docs/operations.md, \"Several hosts\")",
        )
    })?;
    Db::new(settings).map_err(fail)
}

fn fail(e: DbError) -> CliError {
    let code = match e {
        DbError::SchemaNewer { .. } => 4,
        DbError::Config(_) | DbError::PasswordFile { .. } => 2,
        _ => 1,
    };
    CliError::with_code(e, code)
}

/// Run `holdfast db …`.
pub fn run(g: &Global, c: &DbCommand) -> CliResult {
    let db = db(g)?;
    match c {
        DbCommand::Status { json } => {
            let d = std::sync::Arc::clone(&db);
            let st = db
                .run(async move { d.schema_status().await })
                .map_err(fail)?
                .map_err(fail)?;
            if *json {
                out_json(&json!(st));
            } else {
                out(format!("database: {}", st.at));
                out(format!(
                    "schema:   version {} (this holdfast: {})",
                    st.database, st.binary
                ));
                if st.database > st.binary {
                    out("          newer than this binary: upgrade holdfast here");
                } else if !st.pending.is_empty() {
                    out(format!("pending:  {:?} (holdfast db migrate)", st.pending));
                } else {
                    out("          up to date");
                }
            }
            if st.database > st.binary {
                return Err(CliError::with_code(
                    "the database's schema is newer than this binary",
                    4,
                ));
            }
            if !st.pending.is_empty() {
                return Err(CliError::with_code("migrations are pending", 3));
            }
            Ok(())
        }
        DbCommand::Migrate => {
            let d = std::sync::Arc::clone(&db);
            let applied = db
                .run(async move { d.migrate().await })
                .map_err(fail)?
                .map_err(fail)?;
            if applied.is_empty() {
                out(format!(
                    "schema already at version {}",
                    crate::pg::SCHEMA_VERSION
                ));
            } else {
                out(format!(
                    "applied: {applied:?}; schema now at version {}",
                    crate::pg::SCHEMA_VERSION
                ));
            }
            Ok(())
        }
    }
}
