//! The reconciliation report: what a scan of a store found and what was done about it. `open`
//! produces one (and logs it when anything was repaired); `holdfast store fsck` prints it.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::PathBuf;

use super::index::IndexState;

/// A file moved (or, without `--repair`, to be moved) to quarantine.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Quarantined {
    /// File name in `credentials/`.
    pub file: String,
    /// Why it failed.
    pub reason: String,
    /// Where it was moved (`None` when only reported).
    pub moved_to: Option<PathBuf>,
}

/// What a scan found.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Report {
    /// Whether problems were repaired (false: report only).
    pub repaired: bool,
    /// Whether every file was decrypted (fsck) or only those the index does not vouch for.
    pub full: bool,
    /// `.enc` files found.
    pub files: usize,
    /// Files trusted by their stamp in the index (not decrypted).
    pub vouched: usize,
    /// Files decrypted.
    pub decrypted: usize,
    /// Credentials readable after the scan.
    pub readable: usize,
    /// Leftover temp files (removed when repaired).
    pub temp_files: Vec<String>,
    /// Index state as found.
    pub index: String,
    /// Whether the index could not be used and had to be rebuilt.
    pub index_rebuilt: bool,
    /// Credentials on disk but missing from the index (added).
    pub orphans: Vec<String>,
    /// Index entries with no file (dropped).
    pub ghosts: Vec<String>,
    /// Index entries whose metadata differed from the file (corrected).
    pub drift: Vec<String>,
    /// Files stamped in the future (clock skew): left alone, unreadable until the clock catches up.
    pub clock_skew: Vec<String>,
    /// Files that could not be read because of an I/O error (left alone; retry).
    pub io_errors: Vec<String>,
    /// Files still encrypted with a previous key (a rotation to finish).
    pub old_key: Vec<String>,
    /// Files no key of the store opens (wrong key, torn, empty, not a token), or that are not
    /// regular files: moved to quarantine when repaired.
    pub quarantined: Vec<Quarantined>,
    /// Files a key of the store opens but that are not usable as they are (another id's file,
    /// swapped or renamed; a document that is not a credential): left in place, never
    /// quarantined, so the key that opens them is never retired from under them.
    #[serde(default)]
    pub kept: Vec<String>,
    /// Files that did not read during the scan but changed, or read, a moment later: a writer
    /// in place (hive) was mid-write. Left alone for the next scan, not quarantined.
    #[serde(default)]
    pub unsettled: Vec<String>,
    /// Empty files: a writer in place (hive: truncate, then write) truncated one and has not
    /// written yet, or died before it did. Nothing in them to keep, and moving one aside would
    /// carry off the write still to come: left in place, never quarantined.
    #[serde(default)]
    pub empty: Vec<String>,
    /// Credentials whose id holdfast does not serve (another program, hive, made them: an id
    /// with a leading `-` or `.`, a control or invisible character, …; docs/security.md row 9):
    /// the file name (escaped) and the rule. Left alone and kept in the index for that program;
    /// not listed by `cred.list`. Rename one with the program that made it.
    #[serde(default)]
    pub refused_ids: Vec<String>,
    /// Other entries in `credentials/` that are not credential files (left alone).
    pub stray: Vec<String>,
    /// Files something other than holdfast wrote since holdfast last did, whose generation a
    /// repair recorded (`generations.rs`): not a problem.
    #[serde(default)]
    pub generations_recorded: usize,
    /// Whether index.json was rewritten.
    pub index_rewritten: bool,
}

impl Report {
    /// What a repair moved out of the store, for the audit log: the files quarantined (a
    /// credential no client can read any more), with the routine work done beside them
    /// (temp files removed, generations recorded, the index rewritten) as counts. File names
    /// and counts, never content. `None` if nothing was quarantined: the rest is derived or
    /// leftover data, done on most opens beside a writer such as hive.
    pub fn changes(&self) -> Option<serde_json::Value> {
        if !self.repaired || self.quarantined.is_empty() {
            return None;
        }
        let quarantined: Vec<&str> = self.quarantined.iter().map(|q| q.file.as_str()).collect();
        Some(serde_json::json!({
            "quarantined": quarantined,
            "index_rewritten": self.index_rewritten,
            "temp_files_removed": self.temp_files.len(),
            "generations_recorded": self.generations_recorded,
        }))
    }

    pub(crate) fn set_index_state(&mut self, state: &IndexState) {
        self.index = state.to_string();
        self.index_rebuilt = *state != IndexState::Ok;
    }

    /// Number of problems found (0 = clean). Old-key files and clock skew count: both need a
    /// person to act.
    pub fn problems(&self) -> usize {
        self.temp_files.len()
            + usize::from(self.index_rebuilt)
            + self.orphans.len()
            + self.ghosts.len()
            + self.drift.len()
            + self.clock_skew.len()
            + self.io_errors.len()
            + self.old_key.len()
            + self.quarantined.len()
            + self.kept.len()
            + self.empty.len()
            + self.refused_ids.len()
    }

    /// Problems a repair leaves for a person: clock skew, files under an archived key, files
    /// that could not be read, files a key opens that are not usable here, empty files.
    pub fn needs_a_person(&self) -> usize {
        self.clock_skew.len()
            + self.old_key.len()
            + self.io_errors.len()
            + self.kept.len()
            + self.empty.len()
            + self.refused_ids.len()
    }

    /// Whether the scan changed nothing on disk and found nothing to change.
    pub fn is_clean(&self) -> bool {
        self.problems() == 0
    }
}

fn list(f: &mut fmt::Formatter<'_>, label: &str, items: &[String], fix: &str) -> fmt::Result {
    if items.is_empty() {
        return Ok(());
    }
    writeln!(f, "  {label}: {}{fix}", items.len())?;
    for i in items.iter().take(20) {
        writeln!(f, "    {i}")?;
    }
    if items.len() > 20 {
        writeln!(f, "    … and {} more", items.len() - 20)?;
    }
    Ok(())
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let done = |fixed: &'static str| if self.repaired { fixed } else { "" };
        writeln!(
            f,
            "  files: {} ({} decrypted, {} vouched for by the index), {} readable",
            self.files, self.decrypted, self.vouched, self.readable
        )?;
        writeln!(
            f,
            "  index: {}{}",
            self.index,
            if self.index_rebuilt && self.repaired {
                " (rebuilt from the files)"
            } else {
                ""
            }
        )?;
        list(f, "temp files", &self.temp_files, done(" (removed)"))?;
        list(f, "missing from index", &self.orphans, done(" (added)"))?;
        list(f, "ghost index entries", &self.ghosts, done(" (dropped)"))?;
        list(f, "index drift", &self.drift, done(" (corrected)"))?;
        list(
            f,
            "stamped in the future (clock skew; left alone)",
            &self.clock_skew,
            "",
        )?;
        list(f, "unreadable (I/O error; left alone)", &self.io_errors, "")?;
        list(
            f,
            "ids holdfast does not serve (made by another program; rename them there)",
            &self.refused_ids,
            "",
        )?;
        list(
            f,
            "still under an archived key (run `holdfast key prune`, or `holdfast key rotate`, to move them to the primary key)",
            &self.old_key,
            "",
        )?;
        if !self.quarantined.is_empty() {
            writeln!(
                f,
                "  damaged: {}{}",
                self.quarantined.len(),
                done(" (moved to quarantine, not deleted)")
            )?;
            for q in &self.quarantined {
                match &q.moved_to {
                    Some(p) => writeln!(f, "    {}: {} -> {}", q.file, q.reason, p.display())?,
                    None => writeln!(f, "    {}: {}", q.file, q.reason)?,
                }
            }
        }
        list(
            f,
            "opened by a key of this store but not usable here (left in place: fix or remove by hand)",
            &self.kept,
            "",
        )?;
        list(
            f,
            "being written while read (left for the next scan)",
            &self.unsettled,
            "",
        )?;
        list(
            f,
            "empty (a writer truncated it and has not written yet, or died first): left in place",
            &self.empty,
            "; if one stays empty, restore that credential or remove the file",
        )?;
        list(
            f,
            "other files in credentials/ (left alone)",
            &self.stray,
            "",
        )?;
        if self.generations_recorded > 0 {
            writeln!(
                f,
                "  written by another program since holdfast last wrote them: {} (their generations recorded)",
                self.generations_recorded
            )?;
        }
        if self.index_rewritten {
            writeln!(f, "  index.json rewritten")?;
        }
        Ok(())
    }
}
