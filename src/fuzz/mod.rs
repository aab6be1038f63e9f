//! Fuzz targets: each reader of untrusted bytes, driven through the code the daemon runs and
//! checked against a model written apart from it. A target takes any bytes and panics (with
//! what broke) only when an invariant does; it must never panic otherwise, whatever the bytes.
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

// A target's job is to panic when an invariant breaks (that is the finding), and its scratch
// directories are test fixtures, not store files: the crate's rules against panicking and
// against creating directories outside `durable/` do not apply here.
#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::panic,
    clippy::disallowed_methods
)]

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

/// A target: any bytes in; `true` when they reached its deepest checks (a segment with
/// frames, records that decode, a usable index or credential, a planned input, a run with
/// nodes) — how deep a corpus or a mutation run gets, reported beside its executions.
pub type Target = fn(&[u8]) -> bool;

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
