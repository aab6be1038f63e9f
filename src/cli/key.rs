//! `holdfast key`: show a store's keys, rotate, prune the archive.

use std::io::{IsTerminal, Write};

use clap::{Args, Subcommand};

use super::backend::Backend;
use super::{out, out_json, CliError, CliResult, Global};
use crate::store::{KeyReport, OpenMode, RotateOptions, RotateReport};

/// `holdfast key [SUBCOMMAND]`
#[derive(Args, Debug)]
pub struct KeyArgs {
    #[command(subcommand)]
    cmd: Option<KeyCommand>,
    /// With no subcommand: list the files each key opens, not only how many.
    #[arg(long)]
    files: bool,
}

/// `holdfast key …`
#[derive(Subcommand, Debug)]
pub enum KeyCommand {
    /// Which keys the store has (the primary, then the archive of retired keys) and which
    /// files each opens. Reads every file; changes nothing. The same as `holdfast key`.
    Show {
        /// List the files each key opens, not only how many.
        #[arg(long)]
        files: bool,
    },
    /// Replace the store's key: the new key becomes primary, every file is re-encrypted one
    /// atomic write at a time, and the old key is kept in the store's archive of retired keys
    /// (still accepted for decryption: a backup made before the rotation still opens).
    /// Interrupted? Run it again: it resumes and loses nothing.
    Rotate {
        /// Then remove the archived keys the final scan proves no file needs (as `key prune`).
        #[arg(long)]
        prune: bool,
    },
    /// Move every file still under an archived key to the primary key, then remove from the
    /// archive every key that no credential file, quarantined file or stream record needs.
    /// Keep the archive while you may restore a backup made before the last rotation: that
    /// backup needs the key it was made with.
    Prune,
}

/// Run a key subcommand.
pub fn run(g: &Global, args: &KeyArgs) -> CliResult {
    let opts = match &args.cmd {
        None => return show(g, args.files),
        Some(KeyCommand::Show { files }) => return show(g, *files || args.files),
        Some(KeyCommand::Rotate { prune }) => RotateOptions {
            new_key: true,
            prune: *prune,
        },
        Some(KeyCommand::Prune) => RotateOptions {
            new_key: false,
            prune: true,
        },
    };
    if opts.prune {
        if let Some(why) = crate::streams::prune_held_back(&g.store_config()?.base, &g.data_dir()?)
        {
            return Err(CliError::with_code(
                why,
                crate::error::ErrorKind::Unsupported.exit_code(),
            ));
        }
    }
    let mut store = Backend::open(g, OpenMode::Repair)?;
    let tty = std::io::stderr().is_terminal() && !g.json;
    let streams_dir = seals_streams_of(g)?;
    let report = store.rotate(
        opts,
        |done, total| {
            if tty && (done % 16 == 0 || done == total) {
                let _ = write!(std::io::stderr(), "\rre-encrypting {done}/{total}");
                if done == total {
                    let _ = writeln!(std::io::stderr());
                }
            }
        },
        streams_dir.as_deref(),
    )?;
    if g.json {
        out_json(&serde_json::to_value(&report).unwrap_or_default());
        return Ok(());
    }
    print_rotation(&report, opts);
    Ok(())
}

/// The data dir whose streams this invocation's store's key also seals, if it does: the data
/// dir's default store — named, reached with `--store-dir`, or another directory opened with
/// the default store's key file (`--key-file`). Rotating or pruning that key must re-seal the
/// streams, which only the daemon can.
pub(super) fn seals_streams_of(g: &Global) -> CliResult<Option<std::path::PathBuf>> {
    use std::path::{Path, PathBuf};
    let data = g.data_dir()?;
    let name = crate::service::STREAMS_KEY_STORE;
    let keys_dir = crate::paths::keys_dir().map_err(CliError::usage)?;
    // The daemon's default store: `[stores.default]` if config.toml has one (its path and
    // key), else `stores/default` under the data dir with its own key.
    let default_cfg = match g.config()?.stores.get(name) {
        Some(e) => crate::service::configured_store(name, e).map_err(CliError::usage)?,
        None => crate::store::StoreConfig::owned(
            name,
            data.join("stores").join(name),
            keys_dir.clone(),
            Vec::new(),
        ),
    };
    let default_base = default_cfg.base.clone();
    let config = g.store_config()?;
    let canon = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    if canon(&config.base) == canon(&default_base) {
        return Ok(Some(data));
    }
    let default_keys: Vec<PathBuf> = default_cfg
        .key_sources
        .iter()
        .filter_map(|s| s.file().map(Path::to_path_buf))
        .chain(
            crate::store::identity::own_key_file(&keys_dir, name, &default_base)
                .ok()
                .flatten(),
        )
        .chain(Some(crate::store::identity::shared_key_path(
            &keys_dir, name,
        )))
        .map(|p| canon(&p))
        .collect();
    let files: Vec<PathBuf> = config
        .key_sources
        .iter()
        .filter_map(|s| s.file().map(Path::to_path_buf))
        .chain(
            crate::store::identity::own_key_file(&keys_dir, &config.name, &config.base)
                .ok()
                .flatten(),
        )
        .collect();
    if files.iter().any(|f| default_keys.contains(&canon(f))) {
        return Ok(Some(data));
    }
    // A key file another data dir's default store owns (`store::claim`): its streams.
    for f in &files {
        let Some(owner) = crate::store::claim::owner_dir(f) else {
            continue;
        };
        if owner.file_name().and_then(|n| n.to_str()) == Some(crate::service::STREAMS_KEY_STORE)
            && owner.parent().and_then(Path::file_name) == Some("stores".as_ref())
        {
            if let Some(other) = owner.parent().and_then(Path::parent) {
                return Ok(Some(other.to_path_buf()));
            }
        }
    }
    Ok(None)
}

fn print_rotation(report: &RotateReport, opts: RotateOptions) {
    if opts.new_key {
        if report.resumed {
            out("resumed an interrupted rotation");
        }
        out(format!("key rotated: new key {}", report.new_key));
    } else {
        out(format!("primary key {}", report.new_key));
    }
    out(format!(
        "{} file(s) re-encrypted, {} verified under the primary key",
        report.reencrypted, report.verified
    ));
    if !report.pruned.is_empty() {
        out(format!(
            "removed from the archive (no file needs them): {}",
            report.pruned.join(", ")
        ));
    }
    for kept in &report.kept {
        out(format!("kept in the archive, still needed: {kept}"));
    }
    if report.retired.is_empty() {
        out("archive: empty");
    } else {
        out(format!(
            "archive (retired keys, still accepted for decryption): {}",
            report.retired.join(", ")
        ));
        if !opts.prune {
            out("They stay until you run `holdfast key prune` (keep them while you may restore a backup made with them).");
        }
    }
    if !report.undecryptable.is_empty() {
        out(format!(
            "{} file(s) decrypt with no key and were left alone: run `holdfast store fsck`",
            report.undecryptable.len()
        ));
    }
    if opts.new_key {
        out("Back up the key file now (and its archive, <key>.prev).");
    }
}

/// `holdfast key` / `key show`.
fn show(g: &Global, files: bool) -> CliResult {
    let store = super::open_store(g.store_config()?, OpenMode::ReadOnly, false)?;
    let report: KeyReport = store.key_report()?;
    let streams = seals_streams_of(g)?.filter(|d| crate::streams::has_data(d));
    if g.json {
        let mut v = serde_json::to_value(&report).unwrap_or_default();
        v["store"] = store.config().name.clone().into();
        out_json(&v);
        return Ok(());
    }
    out(format!(
        "store {:?} at {}",
        store.config().name,
        store.config().base.display()
    ));
    out(format!("keys from: {}", report.source));
    if let Some(a) = &report.archive {
        out(format!("archive: {a}"));
    }
    if report.archive_damaged > 0 {
        out(format!(
            "the archive has {} line(s) that are not keys: kept as they are, and no key is pruned \
             until they are fixed or removed by hand (one may have been a key a file needs)",
            report.archive_damaged
        ));
    }
    if report.rotating {
        out("a rotation was interrupted: run `holdfast key rotate` to finish it");
    }
    out(format!(
        "{:<10} {:<9} {:>6} {:>12}",
        "KEY", "ROLE", "FILES", "QUARANTINED"
    ));
    for k in &report.keys {
        out(format!(
            "{:<10} {:<9} {:>6} {:>12}",
            k.fingerprint,
            k.role,
            k.files.len(),
            k.quarantined.len()
        ));
        if files {
            for f in k.files.iter().chain(&k.quarantined) {
                out(format!("  {f}"));
            }
        }
    }
    let idle: Vec<&str> = report
        .keys
        .iter()
        .skip(1)
        .filter(|k| k.files.is_empty() && k.quarantined.is_empty())
        .map(|k| k.fingerprint.as_str())
        .collect();
    if let Some(d) = &streams {
        out(format!(
            "this key also seals the daemon's streams in {}: archived keys may still open stream \
             records there; `holdfast key prune` with the daemon running re-seals them first",
            d.display()
        ));
    } else if !idle.is_empty() && report.unreadable.is_empty() {
        out(format!(
            "no file needs archived key(s) {}: `holdfast key prune` removes them (keep them while you may restore a backup made with them)",
            idle.join(", ")
        ));
    }
    if !report.undecryptable.is_empty() {
        out(format!(
            "{} file(s) open with no key: run `holdfast store fsck`",
            report.undecryptable.len()
        ));
        if files {
            for f in &report.undecryptable {
                out(format!("  {f}"));
            }
        }
    }
    for u in &report.unreadable {
        out(format!(
            "unreadable (may need any key; nothing is pruned): {u}"
        ));
    }
    Ok(())
}
