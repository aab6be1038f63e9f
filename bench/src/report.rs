//! Output and errors of `holdfast-bench`: figures on stdout (a table, or one JSON object with
//! `--json`), progress on stderr, and an exit code (2 for a usage error, 1 for a failed run).

use std::cell::RefCell;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// What every bench needs from the command line.
pub struct Global {
    /// Print one JSON object instead of tables.
    pub json: bool,
    /// The holdfast binary started as the daemon.
    pub holdfast: PathBuf,
    /// Under `--report`: each bench's JSON object is kept here for the report instead of
    /// printed.
    pub collected: Option<RefCell<Vec<serde_json::Value>>>,
}

impl Global {
    /// Whether a bench should produce its JSON object rather than print tables.
    pub fn structured(&self) -> bool {
        self.json || self.collected.is_some()
    }

    /// A bench's figures: kept for the report, else printed as one JSON object.
    pub fn emit(&self, v: serde_json::Value) {
        match &self.collected {
            Some(c) => c.borrow_mut().push(v),
            None => out_json(&v),
        }
    }
}

/// A failed bench: a message for stderr and the exit code.
#[derive(Debug)]
pub struct CliError {
    message: String,
    code: u8,
}

impl CliError {
    /// A usage error (exit 2, as holdfast's CLI).
    pub fn usage(message: impl Into<String>) -> Self {
        CliError {
            message: message.into(),
            code: 2,
        }
    }

    /// An error with its exit code.
    pub fn with_code(message: impl Into<String>, code: u8) -> Self {
        CliError {
            message: message.into(),
            code,
        }
    }

    /// Print it and give its exit code.
    pub fn report(&self) -> ExitCode {
        let _ = writeln!(std::io::stderr().lock(), "holdfast-bench: {}", self.message);
        ExitCode::from(self.code)
    }
}

impl From<holdfast::client::ClientError> for CliError {
    fn from(e: holdfast::client::ClientError) -> Self {
        CliError {
            message: e.to_string(),
            code: e.kind().exit_code(),
        }
    }
}

/// A bench's result.
pub type CliResult<T = ()> = Result<T, CliError>;

/// One line of output.
pub fn out(line: impl std::fmt::Display) {
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

/// The figures as one JSON object.
pub fn out_json(v: &serde_json::Value) {
    out(serde_json::to_string_pretty(v).unwrap_or_default());
}
