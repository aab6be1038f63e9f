//! `admin.*` on the wire: each method's params.

use serde::Deserialize;

pub use super::creds::StoreOnly;

/// An `admin.*` call with its typed params.
#[derive(Debug)]
pub enum AdminCall {
    /// `admin.status`.
    Status(StoreOnly),
    /// `admin.fsck`.
    Fsck(Fsck),
    /// `admin.reindex`: an fsck that repairs.
    Reindex(StoreOnly),
    /// `admin.rotate_key`.
    RotateKey(RotateKey),
    /// `admin.prune_keys`.
    PruneKeys(StoreOnly),
}

/// `admin.rotate_key`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RotateKey {
    /// The store's name (absent: the default store).
    #[serde(default)]
    pub store: Option<String>,
    /// Also remove the archived keys the final scan proves no file needs (as
    /// `admin.prune_keys`). Default: the retired key stays in the archive.
    #[serde(default)]
    pub prune: bool,
}

/// `admin.fsck`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fsck {
    /// The store's name (absent: the default store).
    #[serde(default)]
    pub store: Option<String>,
    /// Rewrite the index from the files (as `admin.reindex`).
    #[serde(default)]
    pub repair: bool,
}
