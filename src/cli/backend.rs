//! Where a CLI command's store operations go: to the daemon when one answers on the socket
//! (and serves the same data directory), else to the store opened directly with the same locks.

use serde_json::{json, Map, Value};

use super::{CliError, CliResult, Global};
use crate::client::Client;
use crate::error::ErrorKind;
use crate::store::{
    Credential, CredentialInfo, CredentialStore, Listing, OpenMode, Report, RotateOptions,
    RotateReport,
};

use crate::limits::CAS_RETRIES;

/// The daemon, or the store itself.
pub enum Backend {
    /// Through the socket.
    Daemon {
        /// The connection.
        client: Box<Client>,
        /// Store name.
        store: String,
        /// What the CLI refuses itself before a call reaches the daemon is recorded here.
        audit: Option<super::audit::Recorder>,
    },
    /// Directly, each operation recorded in the audit log (unless it is turned off).
    Local {
        /// The store.
        store: Box<CredentialStore>,
        /// Its recorder.
        audit: Option<super::audit::Recorder>,
    },
}

/// Whether this process has gone to a store or the daemon yet: a refusal before that is the
/// CLI's own (recorded by `cred.rs`), one after it was recorded by the store or the daemon.
pub(super) static REACHED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

fn from_json<T: serde::de::DeserializeOwned>(v: Value) -> CliResult<T> {
    serde_json::from_value(v)
        .map_err(|e| CliError::with_code(format!("unexpected answer from the daemon: {e}"), 1))
}

impl Backend {
    /// Connect to the daemon, or open the store in `mode`.
    pub fn open(g: &Global, mode: OpenMode) -> CliResult<Self> {
        Self::open_with(g, mode, true)
    }

    /// [`Backend::open`]; with `fix_permissions` false a store opened directly is only looked
    /// at: too-open permissions are reported, not tightened (`store fsck` without `--repair`).
    pub fn open_with(g: &Global, mode: OpenMode, fix_permissions: bool) -> CliResult<Self> {
        REACHED.store(true, std::sync::atomic::Ordering::SeqCst);
        match g.daemon()? {
            Some(client) => Ok(Backend::Daemon {
                client: Box::new(client),
                store: g.store.clone(),
                audit: super::audit::Recorder::open(g, &g.store)?,
            }),
            None => {
                let config = g.store_config()?;
                let audit = super::audit::Recorder::open(g, &config.name)?;
                let store = super::open_store(config, mode, fix_permissions)?;
                if let Some(a) = &audit {
                    a.repaired(store.open_report());
                }
                Ok(Backend::Local {
                    store: Box::new(store),
                    audit,
                })
            }
        }
    }

    fn call(&mut self, method: &str, mut params: Value) -> CliResult<Value> {
        match self {
            Backend::Daemon { client, store, .. } => {
                params["store"] = store.as_str().into();
                Ok(client.call(method, params)?)
            }
            Backend::Local { .. } => Err(CliError::with_code(
                "internal: daemon call on a local store",
                1,
            )),
        }
    }

    /// Read a credential.
    pub fn get(&mut self, id: &str) -> CliResult<Credential> {
        if let Backend::Local { store, audit } = self {
            return read(audit, "cred.get", Some(id), store.get(id));
        }
        let mut v = self.call("cred.get", json!({"id": id}))?;
        let doc = v
            .get_mut("credential")
            .map(Value::take)
            .unwrap_or(Value::Null);
        crate::store::credential::zeroize_json(&mut v);
        Credential::from_value(doc).map_err(|e| {
            CliError::with_code(format!("the daemon sent an invalid credential: {e}"), 1)
        })
    }

    /// Store a whole document.
    pub fn set(&mut self, cred: Credential, if_generation: Option<u64>) -> CliResult<u64> {
        if let Backend::Local { store, audit } = self {
            let id = cred.id().to_owned();
            return change(audit, "cred.set", Some(&id), || {
                store.set(cred, if_generation)
            });
        }
        if let Backend::Daemon { audit, .. } = self {
            too_large(&cred, audit.as_ref())?;
        }
        let mut params = json!({"credential": cred.expose_json()});
        // `Client::call` zeroizes the params it is given and its own buffers.
        if let Some(g) = if_generation {
            params["if_generation"] = g.into();
        }
        Ok(self.call("cred.set", params)?["generation"]
            .as_u64()
            .unwrap_or(0))
    }

    /// [`Self::set`] through the daemon, its error as the daemon said it (with `data`).
    fn set_raw(
        &mut self,
        cred: Credential,
        if_generation: Option<u64>,
    ) -> Result<u64, crate::client::ClientError> {
        let Backend::Daemon {
            client,
            store,
            audit,
        } = self
        else {
            return Err(crate::client::ClientError::Protocol(
                "internal: daemon call on a local store".into(),
            ));
        };
        too_large(&cred, audit.as_ref()).map_err(|e| crate::client::ClientError::Rpc {
            code: crate::api::codes::INVALID_PARAMS,
            kind: crate::error::ErrorKind::InvalidParams,
            data: json!({"kind": "invalid_params"}),
            message: e.message,
        })?;
        let mut params = json!({"credential": cred.expose_json(), "store": store.as_str()});
        if let Some(g) = if_generation {
            params["if_generation"] = g.into();
        }
        Ok(client.call("cred.set", params)?["generation"]
            .as_u64()
            .unwrap_or(0))
    }

    /// Read-modify-write. Locally under the store lock; through the daemon as a
    /// compare-and-swap on the generation, retried when another writer wins (unless the caller
    /// gave `if_generation`, which is then the condition).
    pub fn update(
        &mut self,
        id: &str,
        if_generation: Option<u64>,
        mut f: impl FnMut(Option<Credential>) -> Credential,
    ) -> CliResult<u64> {
        if let Backend::Local { store, audit } = self {
            return change(audit, "cred.set", Some(id), || {
                store.update(id, if_generation, |c| Ok(f(c)))
            });
        }
        for _ in 0..CAS_RETRIES {
            let existing = match self.get(id) {
                Ok(c) => Some(c),
                Err(e) if e.code == ErrorKind::NotFound.exit_code() => None,
                Err(e) => return Err(e),
            };
            let current = existing.as_ref().map_or(0, Credential::generation);
            if let Some(want) = if_generation {
                if want != current {
                    return Err(CliError::with_code(
                        format!("credential {id:?} is at generation {current}, not {want}: someone else wrote it first (read it again, then retry)"),
                        ErrorKind::Conflict.exit_code(),
                    ));
                }
            }
            // Only a lost compare-and-swap is retried: another conflict (an id whose file
            // holds another id's credential) is the answer.
            match self.set_raw(f(existing), Some(current)) {
                Err(crate::client::ClientError::Rpc { kind, data, .. })
                    if kind == ErrorKind::Conflict
                        && data["reason"] == "generation_mismatch"
                        && if_generation.is_none() =>
                {
                    continue
                }
                other => return Ok(other?),
            }
        }
        Err(CliError::with_code(
            format!("credential {id:?} kept changing under us ({CAS_RETRIES} tries); retry"),
            ErrorKind::Busy.exit_code(),
        ))
    }

    /// Delete; whether it existed.
    pub fn delete(&mut self, id: &str) -> CliResult<bool> {
        if let Backend::Local { store, audit } = self {
            return change(audit, "cred.delete", Some(id), || store.delete(id));
        }
        Ok(self.call("cred.delete", json!({"id": id}))?["deleted"].as_bool() == Some(true))
    }

    /// Whether it exists.
    pub fn exists(&mut self, id: &str) -> CliResult<bool> {
        if let Backend::Local { store, audit } = self {
            return read(audit, "cred.exists", Some(id), store.exists(id));
        }
        Ok(self.call("cred.exists", json!({"id": id}))?["exists"].as_bool() == Some(true))
    }

    /// Metadata of every credential.
    pub fn list(&mut self) -> CliResult<Listing> {
        if let Backend::Local { store, audit } = self {
            return read(audit, "cred.list", None, store.list());
        }
        let v = self.call("cred.list", json!({}))?;
        let credentials = v["credentials"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|item| {
                let mut meta: Map<String, Value> = item.as_object().cloned().unwrap_or_default();
                let id = meta
                    .shift_remove("id")
                    .and_then(|v| v.as_str().map(str::to_owned));
                let generation = meta.shift_remove("generation").and_then(|v| v.as_u64());
                CredentialInfo {
                    id: id.unwrap_or_default(),
                    generation: generation.unwrap_or(0),
                    metadata: Value::Object(meta),
                }
            })
            .collect();
        Ok(Listing {
            credentials,
            unreadable: v["unreadable"].as_u64().unwrap_or(0) as usize,
            refused_ids: v["refused_ids"].as_u64().unwrap_or(0) as usize,
        })
    }

    /// fsck.
    pub fn fsck(&mut self, repair: bool) -> CliResult<Report> {
        if let Backend::Local { store, audit } = self {
            if repair {
                return change(audit, "admin.fsck", None, || store.fsck(true));
            }
            return read(audit, "admin.fsck", None, store.fsck(false));
        }
        from_json(self.call("admin.fsck", json!({"repair": repair}))?)
    }

    /// Key rotation (progress is only reported locally). `streams_data_dir`: the data
    /// directory whose streams this store's key also seals (the default store's), if any.
    pub fn rotate(
        &mut self,
        opts: RotateOptions,
        progress: impl FnMut(usize, usize),
        streams_data_dir: Option<&std::path::Path>,
    ) -> CliResult<RotateReport> {
        if let Backend::Local { store, audit } = self {
            if let Some(dir) = streams_data_dir.filter(|d| crate::streams::has_data(d)) {
                return Err(CliError::with_code(
                    format!(
                        "this store's key also seals the daemon's streams in {}; run this through \
                         the daemon (start `holdfast daemon`), as the data dir's default store \
                         (`holdfast key …` without --store-dir or --key-file), which re-seals them \
                         under the primary key first",
                        dir.display()
                    ),
                    ErrorKind::Unsupported.exit_code(),
                ));
            }
            let op = if opts.new_key {
                "admin.rotate_key"
            } else {
                "admin.prune_keys"
            };
            return change(audit, op, None, || {
                store.rotate_key_with(opts, progress, || Ok(()))
            });
        }
        match opts.new_key {
            true => from_json(self.call("admin.rotate_key", json!({"prune": opts.prune}))?),
            false => from_json(self.call("admin.prune_keys", json!({}))?),
        }
    }

    /// A label for messages: the store's name and where it lives.
    pub fn describe(&self) -> String {
        match self {
            Backend::Daemon { store, .. } => format!("store {store:?} (via the daemon)"),
            Backend::Local { store, .. } => format!(
                "store {:?} ({})",
                store.config().name,
                store.config().base.display()
            ),
        }
    }
}

/// A read on a store opened here: its outcome recorded (if the log is kept) before it is used.
fn read<T>(
    audit: &Option<super::audit::Recorder>,
    op: &'static str,
    id: Option<&str>,
    r: Result<T, crate::store::Error>,
) -> CliResult<T> {
    match audit {
        Some(a) => a.read(op, id, r),
        None => Ok(r?),
    }
}

/// A change to a store opened here: a durable `begun` record first (refused if it cannot be
/// written), then the change, then its outcome.
fn change<T>(
    audit: &Option<super::audit::Recorder>,
    op: &'static str,
    id: Option<&str>,
    f: impl FnOnce() -> Result<T, crate::store::Error>,
) -> CliResult<T> {
    match audit {
        Some(a) => a.change(op, id, f),
        None => Ok(f()?),
    }
}

/// The store's own size check, made before a document is sent to the daemon: one too large to
/// store gets the store's message ("too large to store … nothing was written"), not the
/// protocol's about an overlong request line (a value of control characters, escaped six-fold
/// in JSON, reached that first).
/// The refusal is recorded in the audit log, as the store records it when it refuses itself.
fn too_large(cred: &Credential, audit: Option<&super::audit::Recorder>) -> CliResult {
    let limit = crate::limits::MAX_CREDENTIAL_FILE_BYTES;
    let bytes = crate::crypto::token_len(cred.to_bytes().len()) as u64;
    if bytes <= limit {
        return Ok(());
    }
    if let Some(a) = audit {
        a.refused(
            "cred.set",
            Some(cred.id()),
            crate::error::ErrorKind::InvalidParams.as_str(),
        );
    }
    Err(crate::store::Error::ValueTooLarge {
        id: cred.id().to_owned(),
        bytes,
        limit,
        max_doc: crate::crypto::max_plaintext_for(limit as usize) as u64,
    }
    .into())
}
