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
    RotateKey(StoreOnly),
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
