//! The PostgreSQL connection of the `postgres` backend: its settings, its own small runtime, a
//! pool, and the schema's migrations ([`schema`]). What is stored there is the streams'
//! (`streams/pg.rs`); this module knows connections, not records.
//!
//! The database's tasks run on a runtime of their own (two worker threads), so a blocking
//! caller (the daemon's blocking pool, the CLI) waits for a query with [`Db::run`] without ever
//! entering the daemon's runtime from inside it.

mod password;
pub mod schema;

use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::config::Host;

use crate::limits;

pub use schema::{SchemaStatus, SCHEMA_VERSION};

/// Why the database could not be used. Never carries the password: the settings print
/// without it, and errors from the server name what failed, not what was sent.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DbError {
    /// The `[backend]` section is wrong (what, in words).
    #[error("[backend]: {0}")]
    Config(String),
    /// The password file could not be read.
    #[error("[backend] password_file {}: {source}", path.display())]
    PasswordFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// No connection could be made.
    #[error("PostgreSQL at {at} is unreachable: {}", describe(source))]
    Connect {
        /// Where (host and database, no password).
        at: String,
        /// The client's error.
        #[source]
        source: Arc<tokio_postgres::Error>,
    },
    /// A statement or transaction failed.
    #[error("PostgreSQL: {}", describe(.0))]
    Query(#[source] Arc<tokio_postgres::Error>),
    /// The database's schema is newer than this binary knows.
    #[error("the database's schema is version {found}, newer than this holdfast's {known}: upgrade holdfast on this host (nothing was changed)")]
    SchemaNewer {
        /// What the database has.
        found: i32,
        /// What this binary knows.
        known: i32,
    },
    /// The schema is older than this binary and was not migrated (`holdfast db migrate`).
    #[error("the database's schema is version {found}, older than this holdfast's {known}: run `holdfast db migrate`")]
    SchemaOlder {
        /// What the database has.
        found: i32,
        /// What this binary knows.
        known: i32,
    },
    /// The runtime of the database tasks could not start, or stopped.
    #[error("PostgreSQL client runtime: {0}")]
    Runtime(String),
}

/// The client's error with the server's own message when there is one (the client's
/// `Display` says only "db error"). The server's messages name what failed (a relation, a
/// state), not the values a statement carried.
fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} {} ({})", db.severity(), db.message(), db.code().code()),
        None => match std::error::Error::source(e) {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        },
    }
}

impl From<tokio_postgres::Error> for DbError {
    fn from(e: tokio_postgres::Error) -> Self {
        DbError::Query(Arc::new(e))
    }
}

impl From<deadpool_postgres::PoolError> for DbError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        match e {
            deadpool_postgres::PoolError::Backend(e) => DbError::Query(Arc::new(e)),
            other => DbError::Runtime(other.to_string()),
        }
    }
}

/// `[backend]`: `kind = "file"` (default) or `kind = "postgres"` with a connection. The
/// password is never read from this file: a URL holding one is refused; it comes from
/// `password_file` (e.g. a systemd credential), else `PGPASSFILE` / `~/.pgpass`.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendSection {
    /// `file` or `postgres`.
    pub kind: Option<String>,
    /// A libpq URL (`postgresql://user@host:5432/db?sslmode=...`) or key=value string
    /// (`host=/run/postgresql dbname=holdfast`).
    pub url: Option<String>,
    /// A file holding only the password (trailing newline ignored); a relative name is looked
    /// up in `$CREDENTIALS_DIRECTORY` (systemd's `LoadCredential=`).
    pub password_file: Option<PathBuf>,
    /// How this daemon names itself in the database (default: the host name).
    pub host_name: Option<String>,
    /// Connections in the pool (default 8); one more is kept for commits, one for LISTEN.
    pub pool_size: Option<usize>,
    /// `auto` (default: TLS to any host that is not this one, none over a Unix socket or
    /// loopback), `require` (TLS even on loopback), `disable` (never; refused for a host that is
    /// not this one). TLS always verifies the server's certificate and name.
    pub tls: Option<String>,
    /// A PEM file of the CA certificates to trust for TLS, instead of the system's.
    pub ssl_root_cert: Option<PathBuf>,
}

/// The backend's settings, read from `[backend]`.
#[derive(Clone)]
pub struct PgSettings {
    config: tokio_postgres::Config,
    /// TLS to the server (see [`BackendSection::tls`]), or none.
    tls: Option<tokio_postgres_rustls::MakeRustlsConnect>,
    /// How this daemon names itself in the database.
    pub host_name: String,
    pool_size: usize,
}

impl fmt::Debug for PgSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgSettings")
            .field("at", &self.at())
            .field("tls", &self.tls.is_some())
            .field("host_name", &self.host_name)
            .finish_non_exhaustive()
    }
}

impl PgSettings {
    /// From the config's `[backend]` (kind `postgres`): the URL or key=value string parsed,
    /// a password in it refused, the password taken from `password_file` or pgpass.
    pub fn from_section(b: &BackendSection) -> Result<PgSettings, DbError> {
        let url = b
            .url
            .as_deref()
            .ok_or_else(|| DbError::Config("kind = \"postgres\" needs url".into()))?;
        let mut config: tokio_postgres::Config = url
            .parse()
            // The parser's message may quote the string, which may hold a password: not shown.
            .map_err(|_| DbError::Config("url is not a libpq URL or key=value string".into()))?;
        if config.get_password().is_some() {
            return Err(DbError::Config(
                "url holds a password: keep it out of the config file (password_file, PGPASSFILE or ~/.pgpass)"
                    .into(),
            ));
        }
        if config.get_hosts().is_empty() {
            config.host("/run/postgresql");
        }
        if config.get_user().is_none() {
            config.user(whoami());
        }
        if config.get_dbname().is_none() {
            let user = config.get_user().unwrap_or_default().to_owned();
            config.dbname(&user);
        }
        let remote = config.get_hosts().iter().find_map(|h| match h {
            Host::Tcp(name) if !is_loopback(name) => Some(name.clone()),
            _ => None,
        });
        let tls = match (b.tls.as_deref().unwrap_or("auto"), &remote) {
            ("auto", None) | ("disable", None) => None,
            ("auto", Some(_)) | ("require", _) => Some(tls_connector(b.ssl_root_cert.as_deref())?),
            ("disable", Some(name)) => {
                return Err(DbError::Config(format!(
                    "tls = \"disable\" with host {name:?}, which is not this one: a password and stream text would cross the network in clear"
                )))
            }
            (other, _) => {
                return Err(DbError::Config(format!(
                    "tls = {other:?}: expected \"auto\", \"require\" or \"disable\""
                )))
            }
        };
        if tls.is_some() {
            // The server must speak TLS; a refusal is an error, never a fallback to clear text.
            config.ssl_mode(tokio_postgres::config::SslMode::Require);
        }
        if let Some(p) = password::lookup(b.password_file.as_deref(), &config)? {
            config.password(p.as_bytes());
        }
        config.application_name("holdfast");
        config.connect_timeout(limits::PG_CONNECT_TIMEOUT);
        config.keepalives_idle(Duration::from_secs(30));
        Ok(PgSettings {
            config,
            tls,
            host_name: b.host_name.clone().unwrap_or_else(host_name),
            pool_size: b.pool_size.unwrap_or(limits::PG_POOL_SIZE).max(1),
        })
    }

    /// A URL-like "where" for messages: hosts, port, database and user, never the password.
    pub fn at(&self) -> String {
        let hosts = host_names(&self.config);
        format!(
            "{} (database {:?}, user {:?})",
            hosts.join(","),
            self.config.get_dbname().unwrap_or_default(),
            self.config.get_user().unwrap_or_default()
        )
    }
}

/// A TLS connector that verifies the server's certificate chain and name against `roots`
/// (a PEM file) or the system's CA certificates.
fn tls_connector(
    roots: Option<&std::path::Path>,
) -> Result<tokio_postgres_rustls::MakeRustlsConnect, DbError> {
    use rustls::pki_types::{pem::PemObject, CertificateDer};
    let mut store = rustls::RootCertStore::empty();
    match roots {
        Some(path) => {
            let bad =
                |what: String| DbError::Config(format!("ssl_root_cert {}: {what}", path.display()));
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                .map_err(|e| bad(e.to_string()))?
                .collect::<Result<_, _>>()
                .map_err(|e| bad(e.to_string()))?;
            if certs.is_empty() {
                return Err(bad("no certificate in it".into()));
            }
            for c in certs {
                store.add(c).map_err(|e| bad(e.to_string()))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for c in found.certs {
                let _ = store.add(c);
            }
            if store.is_empty() {
                return Err(DbError::Config(
                    "TLS needs CA certificates: none found on this system (install ca-certificates) and no ssl_root_cert given".into(),
                ));
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| DbError::Config(format!("TLS: {e}")))?
        .with_root_certificates(store)
        .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

/// The config's hosts as written: names, addresses, socket directories.
fn host_names(config: &tokio_postgres::Config) -> Vec<String> {
    config
        .get_hosts()
        .iter()
        .map(|h| match h {
            Host::Tcp(n) => n.clone(),
            Host::Unix(p) => p.display().to_string(),
        })
        .collect()
}

fn is_loopback(name: &str) -> bool {
    name == "localhost"
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn whoami() -> String {
    std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| rustix::process::getuid().as_raw().to_string())
}

fn host_name() -> String {
    rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned()
}

impl Drop for Db {
    fn drop(&mut self) {
        // Without waiting for its tasks (the committer, followers): dropping may happen on an
        // async thread, where a blocking shutdown would panic.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// A database: its runtime, a pool, and how to make more connections.
pub struct Db {
    /// Always `Some` until dropped (taken to shut down without blocking).
    rt: Option<tokio::runtime::Runtime>,
    pool: deadpool_postgres::Pool,
    settings: PgSettings,
}

impl fmt::Debug for Db {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Db")
            .field("at", &self.settings.at())
            .finish_non_exhaustive()
    }
}

impl Db {
    /// Start the runtime and the pool. No connection is made yet (the first query makes one):
    /// a server that is down is reported by the first use, not here.
    pub fn new(settings: PgSettings) -> Result<Arc<Db>, DbError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("holdfast-pg")
            .enable_all()
            .build()
            .map_err(|e| DbError::Runtime(e.to_string()))?;
        let mc = || deadpool_postgres::ManagerConfig {
            recycling_method: deadpool_postgres::RecyclingMethod::Fast,
        };
        let mgr = match &settings.tls {
            Some(tls) => {
                deadpool_postgres::Manager::from_config(settings.config.clone(), tls.clone(), mc())
            }
            None => deadpool_postgres::Manager::from_config(
                settings.config.clone(),
                tokio_postgres::NoTls,
                mc(),
            ),
        };
        let pool = {
            let _guard = rt.enter();
            deadpool_postgres::Pool::builder(mgr)
                .max_size(settings.pool_size)
                .runtime(deadpool_postgres::Runtime::Tokio1)
                .wait_timeout(Some(limits::PG_CONNECT_TIMEOUT))
                .create_timeout(Some(limits::PG_CONNECT_TIMEOUT))
                .build()
                .map_err(|e| DbError::Runtime(e.to_string()))?
        };
        Ok(Arc::new(Db {
            rt: Some(rt),
            pool,
            settings,
        }))
    }

    /// The settings.
    pub fn settings(&self) -> &PgSettings {
        &self.settings
    }

    /// Run `fut` on the database's runtime and wait for it (from a blocking thread: the
    /// daemon's blocking pool, the CLI, tests).
    pub fn run<T: Send + 'static>(
        &self,
        fut: impl Future<Output = T> + Send + 'static,
    ) -> Result<T, DbError> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.spawn(async move {
            let _ = tx.send(fut.await);
        });
        rx.recv()
            .map_err(|_| DbError::Runtime("the query's task ended without an answer".into()))
    }

    /// Start a task on the database's runtime.
    pub fn spawn(&self, fut: impl Future<Output = ()> + Send + 'static) {
        if let Some(rt) = &self.rt {
            rt.spawn(fut);
        }
    }

    /// A pooled connection.
    pub async fn conn(&self) -> Result<deadpool_postgres::Object, DbError> {
        self.pool.get().await.map_err(|e| match e {
            deadpool_postgres::PoolError::Backend(e) => DbError::Connect {
                at: self.settings.at(),
                source: Arc::new(e),
            },
            deadpool_postgres::PoolError::Timeout(_) => DbError::Runtime(format!(
                "no connection to PostgreSQL at {} within {} s",
                self.settings.at(),
                limits::PG_CONNECT_TIMEOUT.as_secs()
            )),
            other => DbError::Runtime(other.to_string()),
        })
    }

    /// A connection of its own (the committer's, the listener's), driven by a task on the
    /// database's runtime that hands asynchronous messages (notifications) to `on_message`.
    pub async fn dedicated(
        &self,
        on_message: impl Fn(tokio_postgres::AsyncMessage) + Send + 'static,
    ) -> Result<tokio_postgres::Client, DbError> {
        let err = |e| DbError::Connect {
            at: self.settings.at(),
            source: Arc::new(e),
        };
        let config = &self.settings.config;
        let client = match &self.settings.tls {
            Some(tls) => {
                let (client, conn) = config.connect(tls.clone()).await.map_err(err)?;
                tokio::spawn(drive(conn, on_message));
                client
            }
            None => {
                let (client, conn) = config.connect(tokio_postgres::NoTls).await.map_err(err)?;
                tokio::spawn(drive(conn, on_message));
                client
            }
        };
        Ok(client)
    }
}

/// Drive a dedicated connection, handing its asynchronous messages to `on_message`.
async fn drive<S, T>(
    mut conn: tokio_postgres::Connection<S, T>,
    on_message: impl Fn(tokio_postgres::AsyncMessage) + Send + 'static,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    loop {
        match std::future::poll_fn(|cx| conn.poll_message(cx)).await {
            Some(Ok(m)) => on_message(m),
            Some(Err(e)) => {
                tracing::warn!(error = %e, "PostgreSQL connection ended");
                break;
            }
            None => break,
        }
    }
}

/// A statement parameter that can cross to the database's runtime.
pub type Param = Box<dyn tokio_postgres::types::ToSql + Sync + Send>;

/// One pooled connection driven from a blocking thread, statement by statement (a transaction
/// that decides between its statements in synchronous code: the run logs). If it is dropped
/// inside a transaction, or a statement failed in a way that may have broken it, the connection
/// is discarded rather than returned to the pool.
pub struct Session {
    db: Arc<Db>,
    obj: Option<deadpool_postgres::Object>,
    in_tx: bool,
}

impl Session {
    /// A connection from the pool (blocking).
    pub fn open(db: &Arc<Db>) -> Result<Session, DbError> {
        let d = Arc::clone(db);
        let obj = db.run(async move { d.conn().await })??;
        Ok(Session {
            db: Arc::clone(db),
            obj: Some(obj),
            in_tx: false,
        })
    }

    /// Run one statement (prepared once per connection) and return its rows (blocking).
    pub fn query(
        &mut self,
        sql: &'static str,
        params: Vec<Param>,
    ) -> Result<Vec<tokio_postgres::Row>, DbError> {
        let obj = self
            .obj
            .take()
            .ok_or_else(|| DbError::Runtime("the session's connection was lost".into()))?;
        let (obj, res) = self.db.run(async move {
            let res = async {
                let stmt = obj.prepare_cached(sql).await?;
                let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = params
                    .iter()
                    .map(|p| p.as_ref() as &(dyn tokio_postgres::types::ToSql + Sync))
                    .collect();
                obj.query(&stmt, &refs).await
            }
            .await;
            (obj, res)
        })?;
        self.obj = Some(obj);
        Ok(res?)
    }

    /// `BEGIN`.
    pub fn begin(&mut self) -> Result<(), DbError> {
        self.query("BEGIN", Vec::new())?;
        self.in_tx = true;
        Ok(())
    }

    /// `COMMIT`.
    pub fn commit(&mut self) -> Result<(), DbError> {
        self.query("COMMIT", Vec::new())?;
        self.in_tx = false;
        Ok(())
    }

    /// `ROLLBACK`; a connection that cannot is discarded.
    pub fn rollback(&mut self) {
        if self.query("ROLLBACK", Vec::new()).is_ok() {
            self.in_tx = false;
        } else {
            self.discard();
        }
    }

    fn discard(&mut self) {
        if let Some(obj) = self.obj.take() {
            // Detached from the pool: the client (and its connection) closes when dropped.
            drop(deadpool_postgres::Object::take(obj));
        }
        self.in_tx = false;
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.in_tx {
            self.discard();
        }
    }
}
