//! The credential store: hive's layout, made safe (see `docs/design.md`).
//!
//! ```text
//! <base>/credentials/<safe_id>.enc   one Fernet token per credential (the truth)
//! <base>/metadata/index.json         hive's v2.0 index (a derived cache, rewritten atomically)
//! <base>/metadata/index.lock         flock taken by every writer (hive's patched writers too)
//! <base>/quarantine/                 files that failed decryption or id binding, never deleted
//! ```

pub mod claim;
pub mod credential;
mod credentials;
pub mod fsck;
pub mod id;
pub mod identity;
pub mod index;
mod private;
mod rotate;

pub use credential::Credential;
pub use credentials::{
    init_store, init_store_guarded, Change, CredentialInfo, CredentialStore, IndexFlush,
    Initialized, Listing, OpenMode, StoreConfig, StoreOptions,
};
pub use fsck::Report;
pub use private::PermFixes;
pub use rotate::{KeyInfo, KeyReport, RotateOptions, RotateReport};

use std::path::PathBuf;

use crate::crypto::{DecryptError, KeyError};
use crate::durable::{IoError, LockError, PermError};
use crate::error::ErrorKind;
use credential::SchemaError;
use id::IdError;

/// Why a store is sealed (it has data but no usable key, or no key at all). A sealed store
/// answers every credential operation with `sealed` and modifies nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SealedReason {
    /// No key source has a key.
    NoKey {
        /// Encrypted files present.
        files: usize,
        /// Where keys were looked for.
        looked_in: String,
    },
    /// A key was found but decrypts none of the files tried.
    WrongKey {
        /// Files tried.
        tried: usize,
        /// Which key.
        source: String,
    },
    /// The key source holds something that is not a key.
    BadKey(String),
    /// Encrypted files, and no identity to say which key file in holdfast's key directory is
    /// this store's (`metadata/holdfast-store.json` was lost).
    NoIdentity {
        /// Encrypted files present.
        files: usize,
        /// Key files in the key directory for stores of this name: one of them may be its own.
        candidates: Vec<PathBuf>,
    },
    /// The store has no key, and its key would also seal a data directory's streams and run
    /// logs, which hold data sealed by the key it lost: a new key would leave them unreadable.
    SealsStreams {
        /// The data directory whose streams the lost key sealed.
        data_dir: PathBuf,
        /// Key files in the key directory for stores of this name: one of them may be the one.
        candidates: Vec<PathBuf>,
    },
}

impl std::error::Error for SealedReason {}

/// `paths` for a message: joined with commas, or "none".
fn path_list(paths: &[PathBuf]) -> String {
    if paths.is_empty() {
        return "none".to_string();
    }
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

impl std::fmt::Display for SealedReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SealedReason::NoKey { files: 0, looked_in } => write!(
                f,
                "no key (looked in: {looked_in}); run `holdfast init` to create one for this empty store"
            ),
            SealedReason::NoKey { files, looked_in } => write!(
                f,
                "it holds {files} encrypted credential file(s) but no key was found (looked in: {looked_in}). \
                 Restore the key that encrypted them; holdfast never creates a new key for a store that has data"
            ),
            SealedReason::WrongKey { tried, source } => write!(
                f,
                "the key from {source} decrypts none of the {tried} credential file(s) tried: it is not the key \
                 these files were encrypted with. Restore the right key; nothing was modified"
            ),
            SealedReason::BadKey(msg) => write!(f, "{msg}"),
            SealedReason::NoIdentity { files, candidates } => write!(
                f,
                "it holds {files} encrypted credential file(s) but no identity \
                 (metadata/holdfast-store.json), which names its key file: restore that file from \
                 a backup; key files for stores of this name: {}. holdfast never creates a new key \
                 for a store that has data",
                path_list(candidates)
            ),
            SealedReason::SealsStreams {
                data_dir,
                candidates,
            } => write!(
                f,
                "it has no key, and its key also seals the streams and run logs in {} (they hold \
                 data): a new key would leave them unreadable. Restore the key, or \
                 metadata/holdfast-store.json which names it (key files for stores of this name: \
                 {}); or, to give up that data, move {}/streams and {}/runs aside first",
                data_dir.display(),
                path_list(candidates),
                data_dir.display(),
                data_dir.display(),
            ),
        }
    }
}

/// A credential-store error. Each maps to exactly one [`ErrorKind`] in [`Error::kind`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The id breaks a rule.
    #[error(transparent)]
    InvalidId(#[from] IdError),
    /// The document is not a valid credential.
    #[error("invalid credential: {0}")]
    InvalidCredential(SchemaError),
    /// No credential with this id.
    #[error("no credential {id:?}")]
    NotFound {
        /// The id.
        id: String,
    },
    /// `if_generation` did not match.
    #[error("credential {id:?} is at generation {actual}, not {expected}: someone else wrote it first (read it again, then retry)")]
    GenerationMismatch {
        /// The id.
        id: String,
        /// The generation the caller expected.
        expected: u64,
        /// The generation on disk.
        actual: u64,
    },
    /// The credential would not read back: its file would be larger than holdfast serves.
    #[error("credential {id:?} is too large to store: its encrypted file would be {bytes} bytes, over the {limit}-byte limit (a document of up to about {max_doc} bytes of JSON fits); nothing was written")]
    ValueTooLarge {
        /// The id.
        id: String,
        /// The size its file would have.
        bytes: u64,
        /// The largest file holdfast writes and serves.
        limit: u64,
        /// About the largest document that fits.
        max_doc: u64,
    },
    /// A file another program wrote is larger than holdfast serves.
    #[error("credential {id:?}: its file {file} is larger than the {limit} bytes holdfast serves (another program wrote it); it is left untouched: read it with that program, or store a smaller value")]
    FileTooLarge {
        /// The id.
        id: String,
        /// The file name.
        file: String,
        /// The largest file holdfast serves.
        limit: u64,
    },
    /// The id maps to a file that holds another id (hive maps `a/b` and `a_b` to one file).
    #[error("credential {id:?} would be stored in {file}, which already holds credential {other:?} (hive maps both ids to one file name); choose another id")]
    IdCollision {
        /// The id asked for.
        id: String,
        /// The file.
        file: String,
        /// The id in the file.
        other: String,
    },
    /// Other writers changed the credential every time it was read.
    #[error(
        "credential {id:?} kept changing while it was read ({} tries): retry",
        crate::limits::GENERATION_READ_RETRIES
    )]
    KeepsChanging {
        /// The id.
        id: String,
    },
    /// The store is sealed.
    #[error("store {store:?} is sealed: {reason}")]
    Sealed {
        /// Store name.
        store: String,
        /// Why.
        reason: SealedReason,
    },
    /// A file failed an integrity check.
    #[error("{what}: {reason}; run `holdfast store fsck` to see every damaged file, `--repair` to quarantine them")]
    Integrity {
        /// Which credential or file.
        what: String,
        /// What is wrong.
        reason: String,
    },
    /// A token is stamped in the future.
    #[error("credential {id:?}: {source}")]
    ClockSkew {
        /// The id.
        id: String,
        /// The skew.
        source: DecryptError,
    },
    /// A file-system step failed.
    #[error("{0}")]
    Io(#[from] IoError),
    /// A read failed.
    #[error("reading {}: {source}", path.display())]
    Read {
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// An earlier fsync failed; writes are refused until the store is reopened.
    #[error("store refuses writes until it is reopened, because an earlier write failed to reach the disk ({0})")]
    Poisoned(String),
    /// A lock could not be taken.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// Unsafe permissions or ownership.
    #[error(transparent)]
    Unsafe(#[from] PermError),
    /// A key problem other than "no key".
    #[error(transparent)]
    Key(#[from] KeyError),
    /// The store's identity (which names its key file) cannot be read or written.
    #[error(transparent)]
    Identity(#[from] identity::IdentityError),
    /// There is no store at the path.
    #[error("no store at {}: `holdfast init` makes a new, empty one there; to serve hive's own store instead, run `holdfast import --from-hive` (or pass --store-dir for another existing store)", .0.display())]
    NoStore(PathBuf),
    /// The operation needs a mode or source the store was not opened with.
    #[error("{0}")]
    Unsupported(String),
    /// A rotation or a prune re-encrypted what it could but kept the archived keys, because
    /// these files may still need one.
    #[error("{}", blocked_message(.blockers, .prune_only))]
    RotationBlocked {
        /// Why, file by file.
        blockers: Vec<String>,
        /// It was a prune (no new key): run the prune again, not a rotation.
        prune_only: bool,
    },
}

impl Error {
    /// The stable kind of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidId(_) | Error::InvalidCredential(_) | Error::ValueTooLarge { .. } => {
                ErrorKind::InvalidParams
            }
            Error::FileTooLarge { .. } => ErrorKind::Unsupported,
            Error::NotFound { .. } | Error::NoStore(_) => ErrorKind::NotFound,
            Error::GenerationMismatch { .. } | Error::IdCollision { .. } => ErrorKind::Conflict,
            Error::Sealed { .. } => ErrorKind::Sealed,
            Error::Integrity { .. } | Error::ClockSkew { .. } | Error::RotationBlocked { .. } => {
                ErrorKind::Integrity
            }
            Error::Io(_) | Error::Read { .. } | Error::Poisoned(_) => ErrorKind::Storage,
            Error::Lock(LockError::Timeout { .. }) | Error::KeepsChanging { .. } => ErrorKind::Busy,
            Error::Lock(LockError::Io { .. }) => ErrorKind::Storage,
            Error::Unsafe(_) | Error::Key(KeyError::Unsafe(_)) => ErrorKind::Forbidden,
            Error::Key(KeyError::Exists(_)) => ErrorKind::Conflict,
            Error::Key(KeyError::ArchiveFull { .. }) => ErrorKind::Unsupported,
            Error::Key(KeyError::Malformed { .. }) => ErrorKind::Sealed,
            Error::Key(_) => ErrorKind::Storage,
            Error::Identity(identity::IdentityError::Damaged { .. }) => ErrorKind::Integrity,
            Error::Identity(identity::IdentityError::NotAFile { .. }) => ErrorKind::Forbidden,
            Error::Identity(identity::IdentityError::Read { source, .. })
                if source.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) =>
            {
                ErrorKind::Forbidden
            }
            Error::Identity(_) => ErrorKind::Storage,
            Error::Unsupported(_) => ErrorKind::Unsupported,
        }
    }

    /// A clock-skew error (distinct from damage even though both are `integrity` on the wire).
    pub fn is_clock_skew(&self) -> bool {
        matches!(self, Error::ClockSkew { .. })
    }
}

fn blocked_message(blockers: &[String], prune_only: &bool) -> String {
    let (what, again) = match prune_only {
        true => ("key prune", "`holdfast key prune`"),
        false => (
            "key rotation",
            "`holdfast key rotate` (it resumes the rotation, making no other key)",
        ),
    };
    format!(
        "{what} kept the archived keys ({} reason(s) one may still be needed): {}; nothing is \
         lost: fix the cause (the clock, an I/O error, a damaged archive line) and run {again} \
         again to finish",
        blockers.len(),
        blockers.join("; ")
    )
}

/// Result alias for store operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;
