//! The schema: versioned migrations, applied in order, each in its own transaction, all under
//! one advisory lock (two daemons starting at once: one migrates, the other waits and finds
//! nothing left to do). `holdfast_schema` records every version applied. A database whose
//! schema is newer than this binary is refused, with both versions, and left unchanged.
//!
//! The tables (docs/design.md "PostgreSQL backend" has the why):
//! - `hf_stream_runs`: one row per run: the fencing version (`version`, bumped by every record
//!   committed for the run; a write names the version it follows, so a stale holder's write
//!   changes nothing and fails with `conflict`), its holder, head fields for `stream.list`, and
//!   once ended the commit point's state (`ended`, `state`).
//! - `hf_stream_records`: a run's records in order (`version`), what a host loads to rebuild
//!   the run's accumulator; deleted when the run ends.
//! - `hf_stream_events`: the published events (`pos` in publication order, `seq`), what
//!   subscribers on any host read; kept a while after the run ends for followers still reading.
//! - `hf_checkpoints`: the `checkpoint.*` snapshots.
//! - (version 2) `hf_run_logs`: one row per run log: a version bumped by every write (a host's
//!   cached view is read again when it differs), the summary once `run.end` wrote it.
//!   `hf_run_log_lines`: the lines of its four files (`kind`), in file order (`pos`), each with
//!   its logical key (a node's `(node_id, attempt)`, a step's `(node_id, step_index)`, a tool
//!   call's `(tool_use_id, event)`), unique per run: a node is logged once across hosts even if
//!   two writers slipped past the per-run lock.
//!
//! Written for the append path, where every acknowledged delta is one group-commit statement:
//! no foreign keys (the commit statement writes records and events only for runs whose row it
//! just fenced, so a check per row would only cost), and no index on a column an append
//! changes, so the run's row is updated in place (a HOT update; `fillfactor = 50` leaves the
//! room) instead of adding index entries on every delta. Measured in docs/benchmarks.md.

use super::{Db, DbError};

/// The schema version this binary writes and reads.
pub const SCHEMA_VERSION: i32 = 2;

/// The advisory lock migrations run under ("holdfast" in ASCII).
const MIGRATION_LOCK: i64 = 0x686f_6c64_6661_7374;

/// Each version's statements, in order; index 0 is version 1.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE hf_stream_runs (
    run_id      text PRIMARY KEY,
    version     bigint NOT NULL,
    epoch       bigint NOT NULL,
    sid         text NOT NULL,
    status      text NOT NULL,
    next_seq    bigint NOT NULL,
    thread      text,
    model       text,
    host        text NOT NULL,
    created_ms  bigint NOT NULL,
    updated_ms  bigint NOT NULL,
    ended       boolean NOT NULL DEFAULT false,
    ended_ms    bigint,
    state       text
) WITH (fillfactor = 50);
CREATE INDEX hf_stream_runs_ended ON hf_stream_runs (ended_ms) WHERE ended;
CREATE TABLE hf_stream_records (
    run_id  text NOT NULL,
    version bigint NOT NULL,
    body    text NOT NULL,
    PRIMARY KEY (run_id, version)
);
CREATE TABLE hf_stream_events (
    run_id  text NOT NULL,
    pos     bigint NOT NULL,
    seq     bigint NOT NULL,
    finish  boolean NOT NULL DEFAULT false,
    body    text NOT NULL,
    PRIMARY KEY (run_id, pos)
);
CREATE TABLE hf_checkpoints (
    run_id     text PRIMARY KEY,
    body       text NOT NULL,
    updated_ms bigint NOT NULL
);
"#,
    r#"
CREATE TABLE hf_run_logs (
    run_id      text PRIMARY KEY,
    version     bigint NOT NULL,
    summary     text,
    created_ms  bigint NOT NULL,
    updated_ms  bigint NOT NULL
);
CREATE TABLE hf_run_log_lines (
    run_id  text NOT NULL,
    kind    smallint NOT NULL,
    pos     bigint NOT NULL,
    key     text,
    body    text NOT NULL,
    PRIMARY KEY (run_id, kind, pos)
);
CREATE UNIQUE INDEX hf_run_log_lines_key ON hf_run_log_lines (run_id, kind, key)
    WHERE key IS NOT NULL;
"#,
];

/// What `holdfast db status` shows.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SchemaStatus {
    /// The version the database has (0: none).
    pub database: i32,
    /// The version this binary knows.
    pub binary: i32,
    /// Versions this binary would apply.
    pub pending: Vec<i32>,
    /// Where (no password).
    pub at: String,
}

async fn current(c: &tokio_postgres::Client) -> Result<i32, DbError> {
    let exists: bool = c
        .query_one("SELECT to_regclass('holdfast_schema') IS NOT NULL", &[])
        .await?
        .get(0);
    if !exists {
        return Ok(0);
    }
    let v: Option<i32> = c
        .query_one("SELECT max(version) FROM holdfast_schema", &[])
        .await?
        .get(0);
    Ok(v.unwrap_or(0))
}

impl Db {
    /// The schema's version here and in the binary.
    pub async fn schema_status(&self) -> Result<SchemaStatus, DbError> {
        let c = self.conn().await?;
        let database = current(&c).await?;
        Ok(SchemaStatus {
            database,
            binary: SCHEMA_VERSION,
            pending: (database + 1..=SCHEMA_VERSION).collect(),
            at: self.settings.at(),
        })
    }

    /// Apply every migration the database lacks, under the advisory lock; the versions applied.
    /// A newer schema is refused before anything is changed.
    pub async fn migrate(&self) -> Result<Vec<i32>, DbError> {
        let mut c = self.conn().await?;
        c.execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
            .await?;
        let res = self.migrate_locked(&mut c).await;
        // Released even after a failure (a dropped pooled connection keeps its session).
        let unlock = c
            .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
            .await;
        let applied = res?;
        unlock?;
        Ok(applied)
    }

    async fn migrate_locked(&self, c: &mut deadpool_postgres::Object) -> Result<Vec<i32>, DbError> {
        c.batch_execute(
            "CREATE TABLE IF NOT EXISTS holdfast_schema (
                 version     integer PRIMARY KEY,
                 applied_ms  bigint NOT NULL,
                 applied_by  text NOT NULL)",
        )
        .await?;
        let found = current(c).await?;
        if found > SCHEMA_VERSION {
            return Err(DbError::SchemaNewer {
                found,
                known: SCHEMA_VERSION,
            });
        }
        let mut applied = Vec::new();
        for v in found + 1..=SCHEMA_VERSION {
            let sql = MIGRATIONS[(v - 1) as usize];
            let tx = c.transaction().await?;
            tx.batch_execute(sql).await?;
            let by = format!(
                "holdfast {} on {}",
                env!("CARGO_PKG_VERSION"),
                self.settings.host_name
            );
            tx.execute(
                "INSERT INTO holdfast_schema (version, applied_ms, applied_by) VALUES ($1, $2, $3)",
                &[&v, &(crate::timefmt::now_ms() as i64), &by],
            )
            .await?;
            tx.commit().await?;
            tracing::info!(version = v, "database schema migrated");
            applied.push(v);
        }
        Ok(applied)
    }

    /// At open: migrate what is missing (`auto`) or refuse an older schema, and refuse a newer
    /// one either way.
    pub async fn ensure_schema(&self, auto: bool) -> Result<(), DbError> {
        if auto {
            self.migrate().await?;
            return Ok(());
        }
        let st = self.schema_status().await?;
        if st.database > SCHEMA_VERSION {
            return Err(DbError::SchemaNewer {
                found: st.database,
                known: SCHEMA_VERSION,
            });
        }
        if st.database < SCHEMA_VERSION {
            return Err(DbError::SchemaOlder {
                found: st.database,
                known: SCHEMA_VERSION,
            });
        }
        Ok(())
    }
}
