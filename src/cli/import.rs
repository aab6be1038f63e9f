//! `holdfast import --from-hive [DIR]`: bring an existing hive credential store to holdfast,
//! either served in place (a `[stores.NAME]` entry in the config file, so the daemon serves and
//! repairs hive's own files and hive keeps working on them) or copied into a holdfast store
//! (re-encrypted with that store's key; hive's store is left as it is).

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use clap::Args;
use serde_json::{json, Value};

use super::backend::Backend;
use super::{out, out_json, CliError, CliResult, Global};
use crate::crypto::KeySource;
use crate::durable::{self, Faults};
use crate::error::ErrorKind;
use crate::paths;
use crate::store::{CredentialStore, OpenMode, StoreConfig};

/// Arguments of `holdfast import`.
#[derive(Args, Debug)]
#[command(after_help = "\
Serving in place (the default) adds to the config file:

  [stores.hive]
  path = \"/home/me/.hive/credentials\"
  hive = true                      # hive's key (see below)

The daemon then serves hive's store as store \"hive\" (after a restart), repairing it on open;
hive keeps reading and writing the same files. --copy instead re-encrypts every credential
into a holdfast store with that store's key and leaves hive's store as it is; each copy is a
write, so its updated_at is the time of the copy (created_at is kept). A credential the target
already holds with the same content is left alone; with other content it is kept unless
--overwrite.

The hive store's key: --key-file or --key-env, else hive's own (HIVE_CREDENTIAL_KEY, then
$HIVE_HOME/secrets/credential_key).")]
pub struct ImportArgs {
    /// hive's credential store (a directory holding credentials/ and metadata/); default
    /// $HIVE_HOME/credentials, else ~/.hive/credentials.
    #[arg(long = "from-hive", value_name = "DIR", num_args = 0..=1, required = true)]
    from_hive: Option<Option<PathBuf>>,
    /// Serve it in place under this store name (the default mode).
    #[arg(
        long,
        value_name = "NAME",
        default_value = "hive",
        conflicts_with = "copy"
    )]
    name: String,
    /// Copy the credentials into a holdfast store instead, re-encrypted with its key.
    #[arg(long)]
    copy: bool,
    /// With --copy: the store to copy into (created by `holdfast init` first).
    #[arg(
        long,
        value_name = "NAME",
        default_value = crate::paths::DEFAULT_STORE,
        requires = "copy"
    )]
    into: String,
    /// With --copy: replace a credential the target holds with different content (default:
    /// keep the target's and report it).
    #[arg(long, requires = "copy")]
    overwrite: bool,
    /// Say what would be done; change nothing (not the config, not a store, not hive's
    /// permissions).
    #[arg(long)]
    dry_run: bool,
}

/// Run `holdfast import`.
pub fn run(g: &Global, a: &ImportArgs) -> CliResult {
    if g.store_dir.is_some() || g.hive {
        return Err(CliError::usage(
            "import takes the hive store as --from-hive DIR, not --store-dir or --hive",
        ));
    }
    let dir = match &a.from_hive {
        Some(Some(p)) => p.clone(),
        _ => paths::hive_store_dir().map_err(CliError::usage)?,
    };
    let dir = absolute(&dir)?;
    if !dir.join("credentials").is_dir() {
        return Err(CliError::with_code(
            format!(
                "{} is not a hive credential store (it has no credentials/ directory)",
                dir.display()
            ),
            ErrorKind::NotFound.exit_code(),
        ));
    }
    let key_sources = match (&g.key_file, &g.key_env) {
        (Some(f), _) => vec![KeySource::File(absolute(f)?)],
        (None, Some(v)) => vec![KeySource::Env(v.clone())],
        (None, None) => paths::hive_key_sources().map_err(CliError::usage)?,
    };
    let source = super::open_store(
        StoreConfig {
            name: dir.display().to_string(),
            base: dir.clone(),
            key_sources,
            key_dir: None,
        },
        OpenMode::ReadOnly,
        !a.dry_run,
    )?;
    if a.copy {
        copy(g, a, &source)
    } else {
        serve(g, a, &source)
    }
}

fn absolute(p: &Path) -> CliResult<PathBuf> {
    std::path::absolute(p)
        .map_err(|e| CliError::usage(format!("cannot resolve {}: {e}", p.display())))
}

/// What `--copy` did (or would do) with one credential.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Outcome {
    New,
    Same,
    Differs,
    Replaced,
    /// The hive store's file could not be read.
    Unreadable,
    /// The write into the target failed (a conflict with another writer, an I/O error).
    Failed,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::New => "new",
            Outcome::Same => "same",
            Outcome::Differs => "differs",
            Outcome::Replaced => "replaced",
            Outcome::Unreadable => "unreadable",
            Outcome::Failed => "failed",
        }
    }
}

fn copy(g: &Global, a: &ImportArgs, source: &CredentialStore) -> CliResult {
    paths::validate_store_name(&a.into).map_err(CliError::usage)?;
    let mut tg = g.clone();
    tg.store = a.into.clone();
    tg.key_file = None;
    tg.key_env = None;
    let mut target = Backend::open(&tg, OpenMode::Repair).map_err(|e| {
        if e.code == ErrorKind::NotFound.exit_code() {
            CliError::with_code(
                format!(
                    "{} (create it first: holdfast --store {} init)",
                    e.message, a.into
                ),
                e.code,
            )
        } else {
            e
        }
    })?;
    let listing = source.list()?;
    // Each credential read out of hive's store is recorded (as `import`, on that store).
    let recorder = super::audit::Recorder::open(g, &source.config().name)?;
    let total = listing.credentials.len();
    let progress = total > 50 && std::io::stderr().is_terminal();
    let mut rows: Vec<(String, Outcome, String)> = Vec::new();
    let mut first_error: Option<CliError> = None;
    for (i, info) in listing.credentials.iter().enumerate() {
        if progress {
            let _ = write!(std::io::stderr(), "\rholdfast: import {}/{total}", i + 1);
        }
        let got = match &recorder {
            Some(r) => r.read("import", Some(&info.id), source.get(&info.id)),
            None => source.get(&info.id).map_err(CliError::from),
        };
        let cred = match got {
            Ok(c) => c,
            Err(e) => {
                let msg = e.message.clone();
                first_error.get_or_insert(e);
                rows.push((info.id.clone(), Outcome::Unreadable, msg));
                continue;
            }
        };
        let existing = match target.get(&info.id) {
            Ok(c) => Some(c),
            Err(e) if e.code == ErrorKind::NotFound.exit_code() => None,
            Err(e) => return Err(e),
        };
        let outcome = match &existing {
            None => Outcome::New,
            Some(t) if t.same_content(&cred) => Outcome::Same,
            Some(_) if a.overwrite => Outcome::Replaced,
            Some(_) => Outcome::Differs,
        };
        if !a.dry_run && matches!(outcome, Outcome::New | Outcome::Replaced) {
            // A create only creates; a replace only replaces what was compared: a writer that
            // got in between is a conflict, reported, never overwritten unseen.
            let expect = existing.as_ref().map_or(0, |c| c.generation());
            if let Err(e) = target.set(cred, Some(expect)) {
                rows.push((info.id.clone(), Outcome::Failed, e.message.clone()));
                first_error.get_or_insert(e);
                continue;
            }
        }
        rows.push((info.id.clone(), outcome, String::new()));
    }
    if progress {
        let _ = writeln!(std::io::stderr());
    }
    let count = |o: Outcome| rows.iter().filter(|r| r.1 == o).count();
    if g.json {
        out_json(&json!({
            "from": source.config().base,
            "into": a.into,
            "dry_run": a.dry_run,
            "credentials": rows.iter().map(|(id, o, why)| {
                let mut v = json!({"id": id, "outcome": o.label()});
                if !why.is_empty() { v["error"] = Value::String(why.clone()); }
                v
            }).collect::<Vec<_>>(),
            "unreadable_files": listing.unreadable,
        }));
    } else {
        out(format!(
            "hive store {} ({total} credential(s)) → {}",
            source.config().base.display(),
            target.describe()
        ));
        for (id, o, why) in &rows {
            let note = match o {
                Outcome::Same => "already there, identical".to_string(),
                Outcome::Differs => "the target's is kept; --overwrite replaces it".to_string(),
                Outcome::Unreadable | Outcome::Failed => why.clone(),
                _ => String::new(),
            };
            out(format!("  {:<10} {id}  {note}", o.label()).trim_end());
        }
        let (new, replaced) = (count(Outcome::New), count(Outcome::Replaced));
        out(if a.dry_run {
            format!(
                "dry run: nothing was written; {} would be copied ({new} new, {replaced} replaced), {} identical, {} kept",
                new + replaced,
                count(Outcome::Same),
                count(Outcome::Differs)
            )
        } else {
            // Opening hive's store may have tightened its modes (said above, on stderr): then
            // its contents are unchanged, not the store.
            let hive_side = if source.permission_fixes().is_empty() {
                "hive's store is unchanged"
            } else {
                "hive's credentials are unchanged (only the modes named above were tightened)"
            };
            format!(
                "copied {} ({new} new, {replaced} replaced); {} identical, {} kept as they were; {hive_side}",
                new + replaced,
                count(Outcome::Same),
                count(Outcome::Differs)
            )
        });
    }
    if listing.unreadable > 0 && first_error.is_none() {
        // Their ids are inside what cannot be read: they cannot be listed, only counted.
        let msg = format!(
            "{} file(s) of the hive store could not be read and were not copied (see `holdfast \
             --store-dir {} store fsck`)",
            listing.unreadable,
            source.config().base.display()
        );
        if !g.json {
            out(&msg);
        }
        return Err(CliError::with_code(msg, ErrorKind::Integrity.exit_code()));
    }
    match first_error {
        Some(e) => Err(CliError::with_code(
            format!(
                "{} credential(s) could not be copied (first: {})",
                count(Outcome::Unreadable) + count(Outcome::Failed),
                e.message
            ),
            e.code,
        )),
        None => Ok(()),
    }
}

fn serve(g: &Global, a: &ImportArgs, source: &CredentialStore) -> CliResult {
    paths::validate_store_name(&a.name).map_err(CliError::usage)?;
    let dir = source.config().base.clone();
    let config_path = match &g.config {
        Some(p) => absolute(p)?,
        None => crate::config::default_path().ok_or_else(|| {
            CliError::usage("no config file location (set HOME or XDG_CONFIG_HOME, or --config)")
        })?,
    };
    let config = crate::config::load(Some(&config_path)).or_else(|e| {
        if config_path.exists() {
            Err(CliError::usage(e))
        } else {
            Ok(crate::config::Config::default())
        }
    })?;
    let count = source.list()?.credentials.len();
    let key = source
        .key_source()
        .map(|k| k.to_string())
        .unwrap_or_default();
    if let Some(existing) = config.stores.get(&a.name) {
        if existing.path == dir {
            out(format!(
                "{} is already served as store {:?} ({})",
                dir.display(),
                a.name,
                config_path.display()
            ));
            return Ok(());
        }
        return Err(CliError::with_code(
            format!(
                "{} already has [stores.{}] for {}; choose another --name",
                config_path.display(),
                a.name,
                existing.path.display()
            ),
            ErrorKind::Conflict.exit_code(),
        ));
    }
    if g.data_dir()?.join("stores").join(&a.name).exists() {
        return Err(CliError::with_code(
            format!(
                "the data directory already has a store named {:?}; choose another --name",
                a.name
            ),
            ErrorKind::Conflict.exit_code(),
        ));
    }
    let mut entry = format!(
        "\n# Added by `holdfast import --from-hive`: hive's own store, served in place.\n\
         [stores.{}]\npath = {}\n",
        a.name,
        toml_string(&dir.display().to_string())
    );
    match (&g.key_file, &g.key_env) {
        (Some(f), _) => {
            entry.push_str(&format!(
                "key_file = {}\n",
                toml_string(&absolute(f)?.display().to_string())
            ));
        }
        (None, Some(v)) => entry.push_str(&format!("key_env = {}\n", toml_string(v))),
        (None, None) => entry.push_str(
            "hive = true                      # key: HIVE_CREDENTIAL_KEY, then $HIVE_HOME/secrets/credential_key\n",
        ),
    }
    let old = match std::fs::read_to_string(&config_path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => {
            return Err(CliError::with_code(
                format!("cannot read {}: {e}", config_path.display()),
                ErrorKind::Storage.exit_code(),
            ))
        }
    };
    let mut new = old.clone();
    if !new.is_empty() && !new.ends_with('\n') {
        new.push('\n');
    }
    new.push_str(&entry);
    // What the daemon will read must parse, and must say what was meant.
    let parsed: crate::config::Config = toml::from_str(&new).map_err(|e| {
        CliError::with_code(
            format!(
                "the config with the new entry would not parse ({e}); {} was not changed",
                config_path.display()
            ),
            1,
        )
    })?;
    if !parsed.stores.contains_key(&a.name) {
        return Err(CliError::with_code(
            format!(
                "the new [stores.{}] would not be read from {} (is the file's last table an array?); \
                 it was not changed",
                a.name,
                config_path.display()
            ),
            1,
        ));
    }
    // A daemon started by systemd does not see the shell's environment: say so when the key
    // it will look for lives only there.
    let env_warning = match (&g.key_env, source.key_source()) {
        (Some(v), _) => Some(format!(
            "the daemon reads the key from ${v}: a daemon started by systemd needs it in its own \
             environment (an Environment= drop-in), not just in your shell's"
        )),
        (None, Some(KeySource::Env(v)))
            if g.key_file.is_none()
                && !paths::hive_key_sources()
                    .map_err(CliError::usage)?
                    .iter()
                    .any(|k| k.writable_file().is_some_and(Path::is_file)) =>
        {
            Some(format!(
                "the key came from ${v} only; a daemon started by systemd does not see your \
                 shell's environment. Save it where hive itself looks \
                 ($HIVE_HOME/secrets/credential_key, 0600), or run import again with --key-file"
            ))
        }
        _ => None,
    };
    if g.json {
        out_json(&json!({
            "store": a.name, "path": dir, "credentials": count, "key_source": key,
            "config": config_path, "entry": entry.trim(), "dry_run": a.dry_run,
            "warning": env_warning,
        }));
    }
    if a.dry_run {
        if !g.json {
            out(format!(
                "dry run: would add to {}:{}",
                config_path.display(),
                entry.trim_end()
            ));
            out(format!(
                "(the store opens: {count} credential(s), key from {key}; nothing was changed)"
            ));
        }
        return Ok(());
    }
    let parent = config_path
        .parent()
        .ok_or_else(|| CliError::usage("the config file has no parent directory"))?;
    let name = config_path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| CliError::usage("the config file name is not UTF-8"))?;
    // Serving a store is a change the audit log records: begun before the config is written.
    let recorder = super::audit::Recorder::open(g, &a.name)?;
    let begun = recorder
        .as_ref()
        .map(|r| r.begin("import", None))
        .transpose()?;
    let faults = Faults::none();
    let written = durable::create_private_dir(parent, &faults)
        .and_then(|()| durable::atomic_write(parent, name, new.as_bytes(), &faults).map(|_| ()))
        .map_err(|e| CliError::with_code(e.to_string(), ErrorKind::Storage.exit_code()));
    if let (Some(r), Some(begun)) = (&recorder, begun) {
        let result = match &written {
            Ok(()) => crate::audit::OK,
            Err(_) => ErrorKind::Storage.as_str(),
        };
        r.done(
            "import",
            None,
            begun,
            result,
            Some(super::audit::import_detail(&dir, "serve")),
        );
    }
    written?;
    if !g.json {
        out(format!(
            "{} is now store {:?} ({count} credential(s), key from {key}): added to {}",
            dir.display(),
            a.name,
            config_path.display()
        ));
        out(
            "Restart the daemon to serve it (systemctl --user restart holdfast, or stop and \
             start `holdfast daemon`); hive keeps using the same files.",
        );
        out(format!(
            "Agents reach it as store {:?}; the CLI with --store {} (through the daemon).",
            a.name, a.name
        ));
    }
    if let Some(w) = env_warning {
        let _ = writeln!(std::io::stderr(), "holdfast: warning: {w}");
    }
    Ok(())
}

/// A TOML basic string: quoted, with `"`, `\` and control characters escaped.
fn toml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\u{:04x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::toml_string;

    #[test]
    fn toml_strings_round_trip() {
        for s in [
            "/home/me/.hive/credentials",
            "a \"quoted\" \\ path",
            "tab\there\nnewline",
        ] {
            let doc = format!("v = {}", toml_string(s));
            let parsed: toml::Table = toml::from_str(&doc).unwrap();
            assert_eq!(parsed["v"].as_str(), Some(s), "{doc}");
        }
    }
}
