//! The rule "after a failed fsync, refuse writes until reopened", kept here for every store.
//!
//! After `fsync` fails the kernel may have dropped the dirty pages it could not write
//! (PostgreSQL's fsyncgate): a retry that succeeds proves nothing about the earlier data. So the
//! first failed fsync of a store poisons it: every later write is refused until the store is
//! opened again (the daemon restarted), which re-reads what is really on disk. The stream
//! journal has the same rule on its committer thread (`journal.rs`).

use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use super::{IoError, Op};

/// One store's poison flag; clones share it.
#[derive(Clone, Debug, Default)]
pub struct Poison(Arc<Mutex<Option<String>>>);

impl Poison {
    /// Why the store is poisoned, if it is.
    pub fn reason(&self) -> Option<String> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Note a failed step: an fsync failure poisons (the first one's message is kept).
    pub fn note(&self, err: &IoError) {
        if err.is_fsync() {
            let mut p = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            if p.is_none() {
                tracing::error!(error = %err, "fsync failed; refusing writes until reopened");
                *p = Some(err.to_string());
            }
        }
    }

    /// `r`, after noting its error.
    pub fn watch<T>(&self, r: Result<T, IoError>) -> Result<T, IoError> {
        if let Err(e) = &r {
            self.note(e);
        }
        r
    }

    /// `Ok` unless poisoned; then an error naming the refused write (`path`).
    pub fn check(&self, path: &Path) -> Result<(), IoError> {
        match self.reason() {
            None => Ok(()),
            Some(why) => Err(IoError::new(
                Op::Refused,
                path,
                io::Error::other(format!(
                    "an earlier fsync failed ({why}); writes are refused until the daemon \
                     restarts"
                )),
            )),
        }
    }
}
