//! Fuzz targets: each reader of untrusted bytes, driven through the code the daemon runs and
//! checked against a model written apart from it. A target takes any bytes and returns
//! [`Fault::Broken`] (with what broke) only when an invariant does, [`Fault::Setup`] when the
//! machine fails it (a scratch directory it cannot write); a panic inside a reader is a finding
//! too, caught by the harness.
//!
//! The same functions are driven two ways: `tests/fuzz_targets.rs` replays each target's seed
//! corpus (`tests/corpus/<target>/`) and a deterministic mutation run in every `cargo test`,
//! and `fuzz/` (cargo-afl, coverage-guided, on the stable toolchain) runs them for as long as
//! one likes, its finds going back into the corpora (docs/security.md, "Fuzzing").
//!
//! | target | what reads the bytes | the model it is checked against |
//! |---|---|---|
//! | [`journal_segment`] | the journal's segment scan at replay | a frame walker: good frames back to back after the header, the tail kind from the bytes past the last one |
//! | [`journal_replay`] | record decoding and replay into runs | decode → encode → decode is stable; replayed runs' events numbered without gap or repeat, below `next_seq` |
//! | [`index_json`] | `index.json` parsing | serde_json's reading: ok exactly for a v2.0 object with a `credentials` object; a written index reads back the same |
//! | [`credential_plaintext`] | a decrypted credential's parsing | the schema by hand; written and read back, the same content; `Debug` never shows a key's value |
//! | [`recovery_input`] | the planner's JSON input, then the planner | RECOVERY-RULES.md's plans by hand: which plan, which calls cancelled, Retry-After honoured, deterministic |
//! | [`runlog_lines`] | a run log's file reader (torn tail cut, lines taken) | the file after the read is the input cut at its last newline; lines counted once each |
//!
//! | [`protocol_request`] | a request line's parser | accepted: JSON with `jsonrpc` "2.0", the method read, a rebuilt request reads the same; refused: one line of JSON with a known code and a short message |
//!
//! The request parser's full model, with the daemon's dispatch of every parsed line over a
//! real socket, is `tests/fuzz_protocol.rs` (its corpus, `tests/corpus/protocol/`, is this
//! target's too).

// A target's scratch directories are test fixtures, not store files: the rule that only
// `durable/` creates and writes files does not apply here.
#![allow(clippy::disallowed_methods)]

use std::fmt::Display;

/// Why a target stopped short of `Ok`.
#[derive(Debug)]
pub enum Fault {
    /// An invariant broke: the reader disagreed with its model. The finding (the harness keeps
    /// the input in the target's corpus).
    Broken(String),
    /// The target could not set itself up (a scratch file or directory): the machine's doing,
    /// not the reader's. Reported, the input not kept.
    Setup(String),
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Broken(m) => write!(f, "invariant broken: {m}"),
            Fault::Setup(m) => write!(f, "could not set up: {m}"),
        }
    }
}

/// A target's result: whether the input reached its deepest checks.
pub type Outcome = Result<bool, Fault>;

/// `Err(Fault::Broken(..))` out of the target unless `cond` holds.
macro_rules! check {
    ($cond:expr, $($fmt:tt)+) => {
        if !($cond) {
            return Err($crate::fuzz::Fault::Broken(format!($($fmt)+)));
        }
    };
}

/// [`check!`] that two values are equal, both shown when they are not.
macro_rules! check_eq {
    ($a:expr, $b:expr $(,)?) => {
        check_eq!($a, $b, "{} == {}", stringify!($a), stringify!($b))
    };
    ($a:expr, $b:expr, $($fmt:tt)+) => {
        match (&$a, &$b) {
            (a, b) => {
                if a != b {
                    return Err($crate::fuzz::Fault::Broken(format!(
                        "{}: {:?} != {:?}",
                        format_args!($($fmt)+),
                        a,
                        b
                    )));
                }
            }
        }
    };
}

/// `None` or `Err` as a [`Fault`]: [`OrFault::broken`] where the model says it cannot happen,
/// [`OrFault::setup`] where only the machine can make it happen.
pub(crate) trait OrFault<T> {
    fn broken(self, what: &str) -> Result<T, Fault>;
    fn setup(self, what: &str) -> Result<T, Fault>;
}

impl<T> OrFault<T> for Option<T> {
    fn broken(self, what: &str) -> Result<T, Fault> {
        self.ok_or_else(|| Fault::Broken(what.to_owned()))
    }
    fn setup(self, what: &str) -> Result<T, Fault> {
        self.ok_or_else(|| Fault::Setup(what.to_owned()))
    }
}

impl<T, E: Display> OrFault<T> for Result<T, E> {
    fn broken(self, what: &str) -> Result<T, Fault> {
        self.map_err(|e| Fault::Broken(format!("{what}: {e}")))
    }
    fn setup(self, what: &str) -> Result<T, Fault> {
        self.map_err(|e| Fault::Setup(format!("{what}: {e}")))
    }
}

mod journal;
mod protocol;
mod records;
mod runlog;
pub mod seeds;
mod store;

pub use journal::{journal_replay, journal_segment};
pub use protocol::protocol_request;
pub use records::recovery_input;
pub use runlog::runlog_lines;
pub use store::{credential_plaintext, index_json};

/// A target: any bytes in; `Ok(true)` when they reached its deepest checks (a segment with
/// frames, records that decode, a usable index or credential, a planned input, a run with
/// nodes) — how deep a corpus or a mutation run gets, reported beside its executions.
pub type Target = fn(&[u8]) -> Outcome;

/// Every target by name, as the corpus directories and the afl harness name them.
pub const TARGETS: [(&str, Target); 7] = [
    ("protocol", protocol_request),
    ("journal_segment", journal_segment),
    ("journal_replay", journal_replay),
    ("index_json", index_json),
    ("credential_plaintext", credential_plaintext),
    ("recovery_input", recovery_input),
    ("runlog_lines", runlog_lines),
];
