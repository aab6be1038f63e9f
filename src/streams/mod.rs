//! Streams: the durable state of in-flight LLM streams, the recovery engine wired to it, and
//! exactly-once delivery of their events.
//!
//! Every change to a run is a record in the shared stream journal ([`crate::durable::journal`]),
//! sealed (Fernet) with the default store's key; the journal acknowledges a record only once it
//! is durable, and only then are the run's new events published to subscribers. The run state
//! file `runs/<run_id>/state` (sealed, replaced atomically) is the single commit point: a run is
//! committed (or aborted) exactly when that file says so. At start-up the journal is replayed
//! through the same code that applies live appends, so every active run's accumulator (text so
//! far across attempts, tool calls, attempt counters, stall history) comes back as it was.
//!
//! Sequence numbers are per run and shared by the producer's events and the daemon's own
//! (`tool_call_cancel`, `stream_reset`, `interrupted`, `finish`): a subscriber that reconnects
//! with the last seq it saw gets every later event once, in order.

mod accum;
#[cfg(test)]
mod continuation_props;
mod error;
mod feed;
mod pg;
pub mod record;
mod run;
mod service;
mod store;
pub mod tool_log;

pub use accum::{Accumulator, Event, EventIn, Str, MIN_OVERLAP_CHARS};
pub use error::StreamError;
pub use feed::{Feed, Next};
pub use pg::PgStore;
pub use run::{EventJson, Status};
pub use service::{Answer, Export, ReplayedRun, Streams, StreamsConfig, Ticket, ABANDONED};
pub use store::{
    dirs, has_data, other_sealed_data_dirs, prune_held_back, register_sealed_data_dir,
    sealed_data_dirs_file, FileStore, Head, KeyringSealer, Loaded, RunTail, SealError, Sealer,
    SharedStore, StreamStore,
};
pub use tool_log::ToolLog;

use crate::limits;

/// Run ids: what a file name can safely carry.
pub fn validate_run_id(id: &str) -> Result<(), StreamError> {
    let ok = !id.is_empty()
        && id.len() <= limits::MAX_RUN_ID_BYTES
        && id != "."
        && id != ".."
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(StreamError::BadRunId {
            max: limits::MAX_RUN_ID_BYTES,
        })
    }
}

#[cfg(test)]
mod protocol_faults;
#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests make their fixtures (torn files) directly
mod tests;
