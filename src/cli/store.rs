//! `holdfast store fsck [--repair]`.

use clap::Subcommand;

use super::backend::Backend;
use super::{out, out_json, CliError, CliResult, Global};
use crate::store::OpenMode;

/// `holdfast store …`
#[derive(Subcommand, Debug)]
pub enum StoreCommand {
    /// Check every credential file and the index; report temp files, orphans, ghost entries,
    /// index drift, damaged files and clock skew. Exit 0 if clean, 1 if problems remain.
    Fsck {
        /// Fix what is found: remove temp files, rebuild or correct the index, move damaged
        /// files to quarantine/ (never deleted). Without it nothing is modified.
        #[arg(long)]
        repair: bool,
    },
}

/// Run a store subcommand.
pub fn run(g: &Global, cmd: &StoreCommand) -> CliResult {
    match cmd {
        StoreCommand::Fsck { repair } => {
            let mut store = if *repair {
                Backend::open(g, OpenMode::Deferred)?
            } else {
                Backend::open_with(g, OpenMode::ReadOnly, false)?
            };
            let report = store.fsck(*repair)?;
            let remaining = if *repair {
                report.needs_a_person()
            } else {
                report.problems()
            };
            if g.json {
                out_json(&serde_json::to_value(&report).unwrap_or_default());
            } else {
                out(store.describe());
                out(format!("{report}").trim_end());
                if report.is_clean() {
                    out("clean: no problems found");
                } else if *repair {
                    out(format!(
                        "repaired; {remaining} problem(s) need you (see above)"
                    ));
                } else {
                    out(format!(
                        "{} problem(s) found; run `holdfast store fsck --repair` to fix them (nothing was modified)",
                        report.problems()
                    ));
                }
            }
            if remaining > 0 {
                return Err(CliError::with_code(
                    format!("fsck: {remaining} problem(s) remain"),
                    1,
                ));
            }
            Ok(())
        }
    }
}
