//! Where the streams' records and files live: the stream journal, and per run its state file
//! (the commit point) and checkpoint, all sealed.

use std::fs;
use std::path::{Path, PathBuf};

use zeroize::Zeroizing;

/// Seals and opens records (the default store's Fernet keys in the daemon).
pub trait Sealer: Send + Sync {
    /// Encrypt.
    fn seal(&self, plaintext: &[u8]) -> Result<Vec<u8>, String>;
    /// Decrypt (any key of the ring).
    fn open(&self, sealed: &[u8]) -> Result<Zeroizing<Vec<u8>>, String>;
}

/// Whether a data directory holds any streams data (journal segments or run files).
pub fn has_data(data_dir: &Path) -> bool {
    let (streams, runs) = dirs(data_dir);
    let nonempty = |d: &Path, pred: &dyn Fn(&str) -> bool| {
        fs::read_dir(d).is_ok_and(|rd| rd.flatten().any(|e| pred(&e.file_name().to_string_lossy())))
    };
    nonempty(&streams, &|n| n.starts_with("journal-")) || nonempty(&runs, &|_| true)
}

/// Where a data directory keeps streams: (`streams/`, `runs/`).
pub fn dirs(data_dir: &Path) -> (PathBuf, PathBuf) {
    (data_dir.join("streams"), data_dir.join("runs"))
}
