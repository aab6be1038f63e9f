//! `holdfast daemon`: serve the stores over the socket until SIGTERM/SIGINT. The daemon itself
//! is the library's [`crate::daemon::run`]; this reads the flags and config for it.

use clap::Args;

use super::{CliError, CliResult, Global};
use crate::daemon::{self, BootOptions};
use crate::ipc::activation;

/// Arguments of `holdfast daemon`.
#[derive(Args, Debug)]
pub struct DaemonArgs {}

/// Start the daemon; returns when it has shut down.
pub fn run(g: &Global, _args: &DaemonArgs) -> CliResult {
    // First, while this is the only thread: a socket passed by systemd (the LISTEN_* variables
    // are removed from the environment as it is taken).
    let inherited = activation::take_listener().map_err(|e| CliError::with_code(e, 1))?;
    let mut config = g.config()?;
    serve_hive_flag(g, &mut config)?;
    // A backend that cannot be used as configured (a password in the URL, a missing password
    // file, a remote host) is refused now, not at the first stream. A server that is down is
    // not: the streams say so on each request and work once it is back.
    config.postgres().map_err(CliError::usage)?;
    let notes = crate::process::harden(config.limits().max_connections)
        .map_err(|e| CliError::with_code(e, 1))?;
    for note in notes.warnings {
        tracing::warn!("{note}");
    }
    for note in notes.info {
        tracing::info!("{note}");
    }
    let socket = match &inherited {
        Some(i) => i.path.clone(),
        None => g.socket_path()?,
    };
    daemon::run(BootOptions {
        socket,
        data_dir: g.data_dir()?,
        config,
        inherited,
    })
    .map_err(|e| CliError::with_code(e, 1))
}

/// `holdfast --hive daemon`: serve hive's store (`$HIVE_HOME/credentials`) as store `hive` too,
/// as a `[stores.hive]` entry would (key: --key-file / --key-env, else hive's own). A directory
/// given with --store-dir has no name to be served under: say how to give it one.
fn serve_hive_flag(g: &Global, config: &mut crate::config::Config) -> CliResult {
    if g.store_dir.is_some() {
        return Err(CliError::usage(
            "the daemon serves named stores: add [stores.NAME] with path = \"DIR\" to the config \
             file (or run `holdfast import --from-hive DIR`), or use --hive for hive's own store",
        ));
    }
    if !g.hive {
        return Ok(());
    }
    let path = crate::paths::hive_store_dir().map_err(CliError::usage)?;
    if let Some(existing) = config.stores.get("hive") {
        if existing.path != path {
            return Err(CliError::with_code(
                format!(
                    "--hive serves {} as store \"hive\", but the config's [stores.hive] is {}",
                    path.display(),
                    existing.path.display()
                ),
                crate::error::ErrorKind::Conflict.exit_code(),
            ));
        }
        return Ok(());
    }
    config.stores.insert(
        "hive".into(),
        crate::config::StoreEntry {
            path,
            key_file: g.key_file.clone(),
            key_env: g.key_env.clone(),
            hive: g.key_file.is_none() && g.key_env.is_none(),
        },
    );
    Ok(())
}
