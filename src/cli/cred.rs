//! `holdfast cred set|get|list|delete|exists`.
//!
//! Secrets come from stdin or a no-echo tty prompt, never from argv (argv is world-readable in
//! `/proc/<pid>/cmdline`).

use std::ffi::{OsStr, OsString};
use std::io::{BufRead, IsTerminal, Read, Write};
use std::os::unix::ffi::OsStrExt;

use clap::Subcommand;
use serde_json::{json, Value};
use zeroize::Zeroizing;

use super::backend::Backend;
use super::{out, out_json, out_secret_json, CliError, CliResult, Global};
use crate::crypto::Secret;
use crate::error::ErrorKind;
use crate::limits::MAX_CREDENTIAL_FILE_BYTES;
use crate::store::credential::KNOWN_TYPES;
use crate::store::{id, Credential, OpenMode};

/// `holdfast cred …`
#[derive(Subcommand, Debug)]
pub enum CredCommand {
    /// Store a secret: read from stdin (one trailing newline dropped) or a no-echo prompt on a
    /// terminal. Updates one key of an existing credential and keeps everything else.
    Set {
        /// Credential id (e.g. `openai` or `team/github`).
        id: OsString,
        /// Which key of the credential to set.
        #[arg(long, default_value = "api_key", value_name = "NAME")]
        key: String,
        /// Credential type for a new credential (api_key, oauth2, basic_auth, bearer_token,
        /// custom); changes the type of an existing one.
        #[arg(long = "type", value_name = "TYPE")]
        credential_type: Option<String>,
        /// Description to store with the credential.
        #[arg(long)]
        description: Option<String>,
        /// Write only if the stored generation equals N (0: only if it does not exist yet).
        #[arg(long, value_name = "N")]
        if_generation: Option<u64>,
        /// stdin is a whole credential document (hive's JSON schema) instead of one secret;
        /// its "id" must equal ID. Fields holdfast does not know are kept.
        #[arg(long, conflicts_with_all = ["key", "credential_type", "description"])]
        document: bool,
    },
    /// Print a secret value (the only key, or --field), or the whole credential with --json.
    Get {
        /// Credential id.
        id: OsString,
        /// Which key's value to print.
        #[arg(long, value_name = "NAME")]
        field: Option<String>,
    },
    /// List credentials: ids and metadata, never secret values.
    List,
    /// Delete a credential (its file, then nothing is left to read).
    Delete {
        /// Credential id.
        id: OsString,
    },
    /// Exit 0 if the credential exists, 3 if not.
    Exists {
        /// Credential id.
        id: OsString,
    },
}

/// Run a cred subcommand. A call the CLI refuses itself before it reaches a store or the
/// daemon (a malformed id, input over the limit, a document that does not parse) is recorded
/// in the audit log as the daemon records the same refusal (`invalid_params`).
pub fn run(g: &Global, cmd: &CredCommand) -> CliResult {
    let r = run_command(g, cmd);
    if let Err(e) = &r {
        let reached = super::backend::REACHED.load(std::sync::atomic::Ordering::SeqCst);
        if e.code == ErrorKind::InvalidParams.exit_code() && !reached {
            record_refusal(g, cmd);
        }
    }
    r
}

fn record_refusal(g: &Global, cmd: &CredCommand) {
    let (op, id) = match cmd {
        CredCommand::Set { id, .. } => ("cred.set", Some(id)),
        CredCommand::Get { id, .. } => ("cred.get", Some(id)),
        CredCommand::Delete { id } => ("cred.delete", Some(id)),
        CredCommand::Exists { id } => ("cred.exists", Some(id)),
        CredCommand::List => ("cred.list", None),
    };
    let Ok(config) = g.store_config() else {
        return;
    };
    if let Ok(Some(a)) = super::audit::Recorder::open(g, &config.name) {
        let id = id.and_then(|i| i.to_str());
        a.refused(op, id, ErrorKind::InvalidParams.as_str());
    }
}

fn run_command(g: &Global, cmd: &CredCommand) -> CliResult {
    match cmd {
        CredCommand::Set {
            id,
            key,
            credential_type,
            description,
            if_generation,
            document,
        } => {
            let id = valid_id(id)?;
            if let Some(t) = credential_type {
                if !KNOWN_TYPES.contains(&t.as_str()) {
                    return Err(CliError::usage(format!(
                        "unknown credential type {t:?}; use one of {}",
                        KNOWN_TYPES.join(", ")
                    )));
                }
            }
            // The input is read and checked before the store or the daemon is reached: a
            // refusal here is the CLI's own (recorded as such, see `run`).
            let whole = if *document {
                let text = read_secret_input(None)?;
                let value: Value = serde_json::from_str(text.expose())
                    .map_err(|e| CliError::usage(format!("stdin is not JSON: {e}")))?;
                let cred = Credential::from_value(value)
                    .map_err(|e| CliError::usage(format!("invalid credential document: {e}")))?;
                if cred.id() != id {
                    return Err(CliError::usage("the document's \"id\" differs from ID"));
                }
                Ok(cred)
            } else {
                Err(read_secret_input(Some(&format!(
                    "secret for {id} (key {key}): "
                )))?)
            };
            let mut store = Backend::open(g, OpenMode::Repair)?;
            let generation = match whole {
                Ok(cred) => store.set(cred, *if_generation)?,
                Err(secret) => store.update(id, *if_generation, |existing| {
                    let mut c = existing.unwrap_or_else(|| {
                        Credential::new(id, credential_type.as_deref().unwrap_or("api_key"))
                    });
                    if let Some(t) = credential_type {
                        c.set_field("credential_type", t.as_str().into());
                    }
                    if let Some(d) = description {
                        c.set_field("description", d.as_str().into());
                    }
                    // A fresh copy per attempt: through the daemon, a lost race retries.
                    c.set_key(key, Secret::new(secret.expose().to_owned()));
                    c
                })?,
            };
            if g.json {
                out_json(&json!({"id": id, "generation": generation}));
            } else {
                out(format!("stored {id} (generation {generation})"));
            }
            Ok(())
        }
        CredCommand::Get { id, field } => {
            let id = valid_id(id)?;
            // Not read-only: a read that meets content another program wrote records its
            // generation before answering with it (docs/design.md, "Generation").
            let mut store = Backend::open(g, OpenMode::Deferred)?;
            let cred = store.get(id)?;
            if g.json {
                let doc = match field {
                    Some(f) => {
                        let v = cred.key_value(f).ok_or_else(|| no_field(&cred, f))?;
                        json!({"id": id, "field": f, "value": v, "generation": cred.generation()})
                    }
                    None => cred.expose_json(),
                };
                out_secret_json(json!({"credential": doc, "generation": cred.generation()}));
                return Ok(());
            }
            let name = match field {
                Some(f) => f.clone(),
                None => {
                    let names: Vec<&str> = cred
                        .key_names()
                        .into_iter()
                        .filter(|n| !n.starts_with('_'))
                        .collect();
                    match names.as_slice() {
                        [one] => (*one).to_owned(),
                        [] => {
                            return Err(CliError::with_code(
                                format!("credential {id:?} has no keys"),
                                ErrorKind::NotFound.exit_code(),
                            ))
                        }
                        many => {
                            return Err(CliError::usage(format!(
                                "credential {id:?} has keys {}; choose one with --field",
                                many.join(", ")
                            )))
                        }
                    }
                }
            };
            let value = cred
                .key_value(&name)
                .ok_or_else(|| no_field(&cred, &name))?;
            out(value);
            Ok(())
        }
        CredCommand::List => {
            // Not read-only: a read that meets content another program wrote records its
            // generation before answering with it (docs/design.md, "Generation").
            let mut store = Backend::open(g, OpenMode::Deferred)?;
            let listing = store.list()?;
            if g.json {
                out_json(&serde_json::to_value(&listing).unwrap_or_default());
            } else if listing.credentials.is_empty() {
                out("no credentials");
            } else {
                let w = listing
                    .credentials
                    .iter()
                    .map(|c| c.id.chars().count())
                    .max()
                    .unwrap_or(2)
                    .max(2);
                out(format!(
                    "{:<w$}  {:<12}  {:>3}  {:<19}  KEYS",
                    "ID", "TYPE", "GEN", "UPDATED"
                ));
                for c in &listing.credentials {
                    let m = &c.metadata;
                    let s = |k: &str| m.get(k).and_then(Value::as_str).unwrap_or("-").to_owned();
                    let keys = m
                        .get("key_names")
                        .and_then(Value::as_array)
                        .map(|a| {
                            a.iter()
                                .filter_map(Value::as_str)
                                .collect::<Vec<_>>()
                                .join(",")
                        })
                        .unwrap_or_default();
                    out(format!(
                        "{:<w$}  {:<12}  {:>3}  {:<19}  {}",
                        super::shown(&c.id),
                        super::shown(&s("credential_type")),
                        c.generation,
                        super::shown(s("updated_at").get(..19).unwrap_or("-")).replace('T', " "),
                        super::shown(&keys)
                    ));
                }
            }
            if listing.refused_ids > 0 {
                let _ = writeln!(
                    std::io::stderr(),
                    "holdfast: warning: {} credential(s) not listed: their ids are ones holdfast does not serve (made by another program: a leading '-' or '.', a control or invisible character); `holdfast store fsck` names their files",
                    listing.refused_ids
                );
            }
            if listing.unreadable > 0 {
                let _ = writeln!(
                    std::io::stderr(),
                    "holdfast: warning: {} credential file(s) could not be read; run `holdfast store fsck`",
                    listing.unreadable
                );
            }
            Ok(())
        }
        CredCommand::Delete { id } => {
            let id = valid_id(id)?;
            let mut store = Backend::open(g, OpenMode::Repair)?;
            let deleted = store.delete(id)?;
            if g.json {
                out_json(&json!({"id": id, "deleted": deleted}));
            } else if deleted {
                out(format!("deleted {id}"));
            }
            if deleted {
                Ok(())
            } else {
                Err(CliError::with_code(
                    format!("no credential {id:?}"),
                    ErrorKind::NotFound.exit_code(),
                ))
            }
        }
        CredCommand::Exists { id } => {
            let id = valid_id(id)?;
            // Not read-only: a read that meets content another program wrote records its
            // generation before answering with it (docs/design.md, "Generation").
            let mut store = Backend::open(g, OpenMode::Deferred)?;
            let exists = store.exists(id)?;
            if g.json {
                out_json(&json!({"id": id, "exists": exists}));
            }
            if exists {
                Ok(())
            } else {
                Err(CliError::with_code(
                    format!("no credential {id:?}"),
                    ErrorKind::NotFound.exit_code(),
                ))
            }
        }
    }
}

/// Check an id from argv before anything touches the file system. argv may hold bytes that
/// are not UTF-8; clap's `String` parsing would reject those without saying "invalid id".
fn valid_id(id: &OsStr) -> CliResult<&str> {
    id::validate_bytes(id.as_bytes()).map_err(|e| CliError::usage(e.to_string()))
}

fn no_field(cred: &Credential, field: &str) -> CliError {
    CliError::with_code(
        format!(
            "credential {:?} has no key {field:?} (keys: {})",
            cred.id(),
            cred.key_names().join(", ")
        ),
        ErrorKind::NotFound.exit_code(),
    )
}

/// Read a secret from a no-echo tty prompt (when stdin is a terminal and `prompt` is given)
/// or from all of stdin, dropping one trailing newline.
fn read_secret_input(prompt: Option<&str>) -> CliResult<Secret> {
    let stdin = std::io::stdin();
    // Every buffer that holds the secret is zeroized when dropped, on error paths too, and is
    // allocated once at full size so no reallocation leaves a partial copy behind.
    let buf: Zeroizing<Vec<u8>> = if stdin.is_terminal() {
        let Some(prompt) = prompt else {
            return Err(CliError::usage("pipe the document on stdin"));
        };
        prompt_no_echo(prompt)?
    } else {
        let cap = MAX_CREDENTIAL_FILE_BYTES as usize;
        let mut buf = Zeroizing::new(vec![0u8; cap + 1]);
        let mut n = 0;
        let mut input = stdin.lock();
        while n < buf.len() {
            match input.read(&mut buf[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(CliError::with_code(
                        format!("reading stdin: {e}"),
                        ErrorKind::Storage.exit_code(),
                    ))
                }
            }
        }
        if n > cap {
            return Err(CliError::usage("stdin is larger than the 1 MiB limit"));
        }
        buf.truncate(n);
        buf
    };
    let mut text = std::str::from_utf8(&buf).map_err(|_| CliError::usage("stdin is not UTF-8"))?;
    text = text.strip_suffix('\n').unwrap_or(text);
    text = text.strip_suffix('\r').unwrap_or(text);
    if text.is_empty() {
        return Err(CliError::usage("empty secret: nothing stored"));
    }
    Ok(Secret::new(text.to_owned()))
}

use crate::limits::PROMPT_MAX;

fn prompt_no_echo(prompt: &str) -> CliResult<Zeroizing<Vec<u8>>> {
    use rustix::termios::{self, LocalModes, OptionalActions};
    let fd = std::io::stdin();
    let original = termios::tcgetattr(&fd)
        .map_err(|e| CliError::with_code(format!("cannot read terminal settings: {e}"), 1))?;
    let mut quiet = original.clone();
    quiet.local_modes.remove(LocalModes::ECHO);
    quiet.local_modes.insert(LocalModes::ECHONL);
    // Echo off before the prompt shows: whatever is typed (or pasted) the moment the prompt
    // appears must not reach the screen (getpass's order).
    termios::tcsetattr(&fd, OptionalActions::Now, &quiet)
        .map_err(|e| CliError::with_code(format!("cannot turn off echo: {e}"), 1))?;
    let _ = write!(std::io::stderr(), "{prompt}");
    let _ = std::io::stderr().flush();
    let mut line = Zeroizing::new(Vec::with_capacity(PROMPT_MAX));
    let read = (&mut fd.lock())
        .take(PROMPT_MAX as u64)
        .read_until(b'\n', &mut line);
    let _ = termios::tcsetattr(&fd, OptionalActions::Now, &original);
    read.map_err(|e| CliError::with_code(format!("reading the secret: {e}"), 1))?;
    Ok(line)
}
