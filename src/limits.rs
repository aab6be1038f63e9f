//! Every numeric limit in holdfast, in one place, each with the reason for its value.

use std::time::Duration;

/// Largest credential file (`.enc`) holdfast will read. A Fernet token for a credential with a
/// few keys is well under 4 KiB; 1 MiB leaves room for large certificates while keeping a
/// hostile or corrupt file from making a reader allocate without bound.
pub const MAX_CREDENTIAL_FILE_BYTES: u64 = 1024 * 1024;

/// Largest `index.json` holdfast will parse. At ~300 bytes per entry this is ~100,000
/// credentials; anything bigger is treated as corrupt and rebuilt from the directory scan.
pub const MAX_INDEX_FILE_BYTES: u64 = 64 * 1024 * 1024;

/// Largest key file. A Fernet key is 44 characters; a `.prev` file holds a handful of them.
/// Anything larger is not a key file.
pub const MAX_KEY_FILE_BYTES: u64 = 64 * 1024;

/// Longest credential id, in bytes. hive puts no limit, but the id becomes a file name
/// (`<safe_id>.enc`, plus a temp-file prefix and suffix during writes) and must stay under the
/// 255-byte NAME_MAX of Linux file systems.
pub const MAX_ID_BYTES: usize = 200;

/// Longest store name (`--store NAME`); it becomes a directory and a key-file name.
pub const MAX_STORE_NAME_BYTES: usize = 64;

/// How long a writer waits for `metadata/index.lock` before answering `busy`. Writes hold the
/// lock for one file write plus fsyncs (milliseconds); ten seconds means something is stuck,
/// and the caller should hear about it rather than hang.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// Seconds a Fernet token may be stamped in the future before it is refused. This is the
/// `MAX_CLOCK_SKEW` of the Fernet spec (and of Python's `cryptography`), so holdfast and hive
/// agree on which tokens are readable.
pub const FERNET_MAX_CLOCK_SKEW_SECS: u64 = 60;

/// How many files the open-time key check tries to decrypt before it concludes that the key is
/// wrong (and seals the store) rather than that a few files are corrupt.
pub const KEY_CHECK_SAMPLE: usize = 8;
