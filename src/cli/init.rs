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
    if config.key_dir.is_none()
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
    let created = match made {
        Ok(made) => {
            super::permission_note(&made.fixes);
            true
        }
        Err(crate::store::Error::Key(crate::crypto::KeyError::Exists(_))) => false,
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
