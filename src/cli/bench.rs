//! `holdfast bench`: runs the benchmark binary, `holdfast-bench`, installed beside this one.
//!
//! The benchmark harness (floors, Redis and SQLite drivers, load generators) is a separate
//! binary (`bench/` in the workspace) so none of it ships in the admin CLI; this subcommand
//! keeps the documented command working by executing it with the same arguments.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::Command;

use clap::Args;

use super::{CliError, CliResult, Global};

/// Arguments of `holdfast bench`: passed on to `holdfast-bench` (`holdfast-bench --help`).
#[derive(Args, Debug)]
#[command(disable_help_flag = true)]
pub struct BenchArgs {
    /// Arguments for holdfast-bench (--quick, --streams, --runs, --report FILE, --json, --help, …).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "ARGS"
    )]
    args: Vec<OsString>,
}

/// Replace this process with `holdfast-bench ARGS` (the daemon it starts is this binary).
pub fn run(g: &Global, a: &BenchArgs) -> CliResult {
    let this = std::env::current_exe()
        .map_err(|e| CliError::with_code(format!("finding this binary: {e}"), 1))?;
    let bench = this.with_file_name("holdfast-bench");
    if !bench.is_file() {
        return Err(CliError::with_code(
            format!(
                "the benchmark is a separate binary, {}, which is not there; build it with \
                 cargo build --release (it is a member of holdfast's workspace), or run it as \
                 cargo run --release -p holdfast-bench -- ARGS",
                bench.display()
            ),
            1,
        ));
    }
    let mut c = Command::new(&bench);
    if g.json {
        c.arg("--json");
    }
    c.args(&a.args).env("HOLDFAST_BIN", &this);
    let e = c.exec();
    Err(CliError::with_code(
        format!("running {}: {e}", bench.display()),
        1,
    ))
}
