//! How an operation writes a run's log, whichever backend keeps it: [`Writer`] appends a
//! record, replaces a logical entry, writes or removes the summary — each updating the run's view. The
//! file backend ([`FileWriter`]) is `files.rs` on the run's directory; the PostgreSQL one is
//! `pg.rs`.

use serde_json::{Map, Value};

use super::error::RunLogError;
use super::files::RunFiles;
use super::view::{Entry, Kind, Loaded};

/// The writes an operation may make to one run's log, under the run's lock.
pub(super) trait Writer {
    /// Append a record of `kind` (its `seq` and `logged_at_ms` added).
    fn append(
        &mut self,
        view: &mut Loaded,
        kind: Kind,
        record: Map<String, Value>,
    ) -> Result<Entry, RunLogError>;
    /// Append a record as it is (its `seq` and `logged_at_ms` kept: a moved log).
    fn append_as_is(
        &mut self,
        view: &mut Loaded,
        kind: Kind,
        record: Map<String, Value>,
    ) -> Result<Entry, RunLogError>;
    /// Replace a logical entry at its place.
    fn replace(
        &mut self,
        view: &mut Loaded,
        kind: Kind,
        old: &Entry,
        record: Map<String, Value>,
    ) -> Result<Entry, RunLogError>;
    /// Write the summary (`run.end`).
    fn write_summary(&mut self, summary: &Value) -> Result<(), RunLogError>;
    /// Remove the summary (`run.start`): the run takes writes again.
    fn remove_summary(&mut self) -> Result<(), RunLogError>;
}

/// [`Writer`] on a run's directory.
pub(super) struct FileWriter<'a> {
    pub(super) files: &'a RunFiles,
    pub(super) dir: &'a crate::durable::Dir,
}

impl Writer for FileWriter<'_> {
    fn append(
        &mut self,
        view: &mut Loaded,
        kind: Kind,
        record: Map<String, Value>,
    ) -> Result<Entry, RunLogError> {
        self.files.append(self.dir, view, kind, record)
    }

    fn append_as_is(
        &mut self,
        view: &mut Loaded,
        kind: Kind,
        record: Map<String, Value>,
    ) -> Result<Entry, RunLogError> {
        self.files.append_as_is(self.dir, view, kind, record)
    }

    fn replace(
        &mut self,
        view: &mut Loaded,
        kind: Kind,
        old: &Entry,
        record: Map<String, Value>,
    ) -> Result<Entry, RunLogError> {
        self.files.replace(self.dir, view, kind, old, record)
    }

    fn write_summary(&mut self, summary: &Value) -> Result<(), RunLogError> {
        self.files.write_summary(self.dir, summary)
    }

    fn remove_summary(&mut self) -> Result<(), RunLogError> {
        self.files.remove_summary(self.dir)
    }
}
