//! `holdfast key rotate`.

use std::io::{IsTerminal, Write};

use clap::Subcommand;

use super::backend::Backend;
use super::{out, out_json, CliResult, Global};
use crate::store::OpenMode;

/// `holdfast key …`
#[derive(Subcommand, Debug)]
pub enum KeyCommand {
    /// Replace the store's key: the new key becomes primary, every file is re-encrypted one
    /// atomic write at a time, and the old key is removed only after a full scan shows nothing
    /// needs it. Interrupted? Run it again: it resumes and loses nothing.
    Rotate,
}

/// Run a key subcommand.
pub fn run(g: &Global, cmd: &KeyCommand) -> CliResult {
    match cmd {
        KeyCommand::Rotate => {
            let mut store = Backend::open(g, OpenMode::Repair)?;
            let tty = std::io::stderr().is_terminal() && !g.json;
            // The data dir's default store's key also seals the streams there.
            let named_default =
                g.store_dir.is_none() && !g.hive && g.store == crate::service::STREAMS_KEY_STORE;
            let streams_dir = if named_default {
                Some(g.data_dir()?)
            } else {
                None
            };
            let report = store.rotate(
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
            if report.resumed {
                out("resumed an interrupted rotation");
            }
            out(format!(
                "key rotated: new key {} ; retired {}",
                report.new_key,
                if report.retired.is_empty() {
                    "none".to_string()
                } else {
                    report.retired.join(", ")
                }
            ));
            out(format!(
                "{} file(s) re-encrypted, {} verified under the new key",
                report.reencrypted, report.verified
            ));
            if !report.undecryptable.is_empty() {
                out(format!(
                    "{} file(s) decrypt with no key and were left alone: run `holdfast store fsck`",
                    report.undecryptable.len()
                ));
            }
            out("Back up the new key file now.");
            Ok(())
        }
    }
}
