//! holdfast: a local daemon that keeps the state AI-agent processes must not lose or leak.
//!
//! Layers, data flowing down only (see `docs/design.md`):
//! - [`cli`]: the admin command line, one file per subcommand; [`client`]: a blocking client.
//! - [`api`]: the plugin API's contract (version, methods, error codes).
//! - [`audit`]: the audit log (who did what to which credential), a hash chain.
//! - [`daemon`]: the daemon's life (boot, background jobs, systemd, shutdown).
//! - [`ipc`]: the socket server; [`service`]: the daemon's state.
//! - [`recovery`]: the streaming recovery planner (R1–R4), a pure function.
//! - [`streams`]: durable stream state on the journal, recovery wired in, exactly-once events.
//! - [`runlog`]: idempotent per-run logs in hive's layout (nodes, steps, tool calls, summary).
//! - [`store`]: the hive-compatible credential store (files, index, reconciliation, fsck).
//! - [`crypto`]: keys, their sources and rotation, Fernet, and the [`crypto::Secret`] type.
//! - [`durable`]: the only code that writes, renames, fsyncs or locks files.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod api;
pub mod audit;
pub mod cli;
pub mod client;
pub mod config;
pub mod crypto;
pub mod daemon;
pub mod durable;
pub mod error;
#[cfg(feature = "fuzz")]
#[doc(hidden)]
pub mod fuzz;
pub mod ipc;
pub mod limits;
pub mod paths;
pub mod pg;
pub mod process;
pub mod recovery;
pub mod runlog;
pub mod service;
pub mod store;
pub mod streams;
pub mod timefmt;
