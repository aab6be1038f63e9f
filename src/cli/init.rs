//! `holdfast init`: create a store and its key.

use clap::Args;

use super::{out, out_json, CliError, CliResult, Global};
use crate::durable::Faults;
use crate::store::{init_store_guarded, OpenMode};

/// Arguments of `holdfast init`.
#[derive(Args, Debug)]
pub struct InitArgs {}

/// Create the store and key, or report that both already exist.
pub fn run(g: &Global, _args: &InitArgs) -> CliResult {
    let config = g.store_config()?;
    // A key that exists already (a variable given with --key-env) is used as it is; only a
    // key to make needs a file.
    let key_exists = crate::crypto::keys::load(&config.key_sources)
        .ok()
        .flatten()
        .is_some();
    if config.key_dir.is_none()
        && !key_exists
        && !config
            .key_sources
            .iter()
            .any(|s| s.writable_file().is_some())
    {
        return Err(CliError::usage(
            "init needs a key file to create (the key source here is an environment variable); \
             pass --key-file FILE",
        ));
    }
    let new_dir = !config.base.join("credentials").is_dir();
    refuse_to_adopt(g, &config, new_dir)?;
    // Recorded like every change to a store (a durable `begun` first: no record, no key).
    let audit = super::audit::Recorder::open(g, &config.name)?;
    let begun = audit.as_ref().map(|a| a.begin("init", None)).transpose()?;
    // The key of the data dir's default store also seals its streams: never mint one over
    // streams it sealed before (the store lost its key or identity).
    let streams_of = super::key::seals_streams_of(g)?;
    let made = init_store_guarded(&config, &Faults::none(), streams_of.as_deref());
    if let (Some(a), Some(begun)) = (&audit, begun) {
        let result = made
            .as_ref()
            .map_or_else(|e| e.kind().as_str(), |_| crate::audit::OK);
        a.done("init", None, begun, result, None);
    }
    let (created, adopted) = match made {
        Ok(made) => {
            super::permission_note(&made.fixes);
            (true, false)
        }
        Err(crate::store::Error::Key(crate::crypto::KeyError::Exists(_))) => (false, new_dir),
        Err(e) => return Err(e.into()),
    };
    // Open it: proves the key works, and for an existing store checks it is not sealed (a
    // store an older holdfast made gets its own copy of the key it used here).
    let store = g.open(OpenMode::Repair).map_err(|e| {
        if created {
            e
        } else {
            CliError::with_code(
                format!(
                    "a key already exists, but the store does not open with it: {}",
                    e.message
                ),
                e.code,
            )
        }
    })?;
    if let Some(a) = &audit {
        a.repaired(store.open_report());
    }
    let repaired = store.open_report().changes().is_some();
    let fp = store
        .key_fingerprints()
        .first()
        .cloned()
        .unwrap_or_default();
    let source = store
        .key_source()
        .map(|s| s.to_string())
        .unwrap_or_default();
    let files = store.file_count()?;
    if g.json {
        out_json(&serde_json::json!({
            "created": created,
            "store": config.name,
            "path": config.base,
            "key_source": source,
            "key_fingerprint": fp,
            "credentials": files,
        }));
        return Ok(());
    }
    if created {
        out(format!(
            "created store {:?} at {}",
            config.name,
            config.base.display()
        ));
        out(format!("key: {source} (fingerprint {fp})"));
        out("Back up the key file: without it these credentials cannot be decrypted.");
    } else if adopted {
        let owner = store
            .key_source()
            .and_then(|s| s.writable_file().map(std::path::Path::to_path_buf))
            .and_then(|f| crate::store::claim::owner_dir(&f))
            .filter(|o| Some(o) != config.base.canonicalize().ok().as_ref());
        out(format!(
            "created store {:?} at {} with the key you gave, which already existed: {source} (fingerprint {fp}).{}",
            config.name,
            config.base.display(),
            match owner {
                Some(o) => format!(
                    " It belongs to the store at {}: rotate and prune it there (this store may not).",
                    o.display()
                ),
                None => String::new(),
            }
        ));
    } else {
        out(format!(
            "store {:?} at {} was already initialized: {files} credential file(s); key: {source} (fingerprint {fp}). {}",
            config.name,
            config.base.display(),
            if repaired {
                "Opening it repaired what is said above (recorded in the audit log); nothing else was changed."
            } else {
                "Nothing was changed."
            }
        ));
    }
    Ok(())
}

/// `init` of a store directory with no key named (`--store-dir` without `--key-file` or
/// `--key-env`: hive's key sources by default) never takes a key that already exists for a
/// new store, or one another store owns: it did not make that key for this store, and a
/// rotation here would re-key the other (hive reads no archive). Naming the key explicitly
/// shares it deliberately. Checked before anything is created.
fn refuse_to_adopt(g: &Global, config: &crate::store::StoreConfig, new_dir: bool) -> CliResult {
    if g.store_dir.is_none() || g.hive || g.key_file.is_some() || g.key_env.is_some() {
        return Ok(());
    }
    let Some(existing) = crate::crypto::keys::load(&config.key_sources).map_err(|e| {
        CliError::with_code(e.to_string(), crate::error::ErrorKind::Sealed.exit_code())
    })?
    else {
        return Ok(());
    };
    let owner = existing
        .source
        .writable_file()
        .and_then(crate::store::claim::owner_dir)
        .filter(|o| Some(o) != config.base.canonicalize().ok().as_ref());
    if !new_dir && owner.is_none() {
        return Ok(());
    }
    Err(CliError::with_code(
        format!(
            "refusing to initialize {} with the key that already exists at {}{}: holdfast did not \
             make it for this store, and rotating it here would re-key {}. Give the new store a \
             key of its own with --key-file NEW_FILE (or, to share that key deliberately, name it: \
             {}). Nothing was created.",
            config.base.display(),
            existing.source,
            match &owner {
                Some(o) => format!(" (the key of the store at {})", o.display()),
                None => " (hive's key, the default for --store-dir)".into(),
            },
            match &owner {
                Some(o) => format!("the store at {}", o.display()),
                None => "every store that reads it, hive's among them".into(),
            },
            match &existing.source {
                crate::crypto::KeySource::Env(v) => format!("--key-env {v}"),
                other => other.file().map_or_else(
                    || other.to_string(),
                    |f| format!("--key-file {}", f.display()),
                ),
            },
        ),
        crate::error::ErrorKind::Conflict.exit_code(),
    ))
}
