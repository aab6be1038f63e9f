//! `holdfast install-units`: write the systemd units (from `systemd/`, embedded in the binary)
//! with `ExecStart=` pointing at this binary, and say what to run next.

use std::path::{Path, PathBuf};

use clap::Args;

use super::{out, CliError, CliResult, Global};
use crate::durable::{self, Faults};

/// The units as shipped: (file name, user variant, system variant).
const UNITS: [(&str, &str, &str); 2] = [
    (
        "holdfast.socket",
        include_str!("../../systemd/holdfast.socket"),
        include_str!("../../systemd/system/holdfast.socket"),
    ),
    (
        "holdfast.service",
        include_str!("../../systemd/holdfast.service"),
        include_str!("../../systemd/system/holdfast.service"),
    ),
];

/// What the shipped units say before install-units points them at the binary.
const SHIPPED_EXEC: &str = "ExecStart=/usr/local/bin/holdfast daemon";
/// First line of every file install-units writes: it may replace its own files, not others.
const MARK: &str = "# Installed by `holdfast install-units`";

/// Arguments of `holdfast install-units`.
#[derive(Args, Debug)]
pub struct InstallUnitsArgs {
    /// User units, for `systemctl --user` (the default): into $XDG_CONFIG_HOME/systemd/user.
    #[arg(long, conflicts_with = "system")]
    user: bool,
    /// System units for a dedicated `holdfast` user, for `systemctl` (as root): into
    /// /etc/systemd/system.
    #[arg(long)]
    system: bool,
    /// Write into this directory instead (packaging, or to inspect the files first).
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// The holdfast binary ExecStart= runs (default: this one).
    #[arg(long, value_name = "PATH")]
    bin: Option<PathBuf>,
    /// Replace unit files of the same names that install-units did not write.
    #[arg(long)]
    force: bool,
}

fn user_unit_dir() -> Result<PathBuf, String> {
    if let Some(d) = std::env::var_os("XDG_CONFIG_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d).join("systemd/user"));
    }
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .ok_or("neither XDG_CONFIG_HOME nor HOME is set: pass --dir")?;
    Ok(PathBuf::from(home).join(".config/systemd/user"))
}

/// The unit text for `bin`.
pub fn render(template: &str, bin: &Path) -> Result<String, String> {
    let bin = bin
        .to_str()
        .filter(|b| {
            !b.contains(char::is_whitespace) && !b.contains(['%', '\\', '"', '\'', '$', ';'])
        })
        .ok_or_else(|| {
            format!(
                "{}: a path with spaces or any of % \\ \" ' $ ; would need escaping in \
                 ExecStart=; install the binary at a plain path",
                bin.display()
            )
        })?;
    if template.contains("ExecStart=") && !template.contains(SHIPPED_EXEC) {
        return Err("the embedded unit has no ExecStart= line to point at the binary".into());
    }
    Ok(format!(
        "{MARK} from holdfast {} (edit with a drop-in: systemctl edit).\n{}",
        env!("CARGO_PKG_VERSION"),
        template.replace(SHIPPED_EXEC, &format!("ExecStart={bin} daemon"))
    ))
}

/// Run `holdfast install-units`.
pub fn run(_g: &Global, a: &InstallUnitsArgs) -> CliResult {
    let system = a.system;
    let dir = match &a.dir {
        Some(d) => d.clone(),
        None if system => PathBuf::from("/etc/systemd/system"),
        None => user_unit_dir().map_err(CliError::usage)?,
    };
    let bin = match &a.bin {
        Some(b) => b.clone(),
        None => std::env::current_exe()
            .and_then(|p| p.canonicalize())
            .map_err(|e| {
                CliError::with_code(format!("cannot tell where this binary is: {e}"), 1)
            })?,
    };
    if !bin.is_absolute() || !bin.is_file() {
        return Err(CliError::usage(format!(
            "--bin {}: not an existing absolute path",
            bin.display()
        )));
    }
    if system
        && (bin.starts_with("/home") || bin.starts_with("/root") || bin.starts_with("/run/user"))
    {
        return Err(CliError::usage(format!(
            "{}: the system unit runs with ProtectHome=yes and could not execute a binary under \
             /home, /root or /run/user (203/EXEC); install it first, e.g. sudo install -m 0755 \
             {} /usr/local/bin/holdfast, then run /usr/local/bin/holdfast install-units --system",
            bin.display(),
            bin.display()
        )));
    }
    durable::create_shared_dirs(&dir).map_err(|e| CliError::with_code(e.to_string(), 7))?;
    // Decide for every file before writing any: a refusal leaves nothing half-installed.
    let mut plan = Vec::new();
    for (name, user, sys) in UNITS {
        let text = render(if system { sys } else { user }, &bin).map_err(CliError::usage)?;
        let path = dir.join(name);
        let unchanged = match std::fs::read(&path) {
            Ok(old) if old == text.as_bytes() => true,
            Ok(old) if old.starts_with(MARK.as_bytes()) || a.force => false,
            Ok(_) => {
                return Err(CliError::with_code(
                    format!(
                        "{} exists and was not written by install-units; nothing was written. \
                         Keep it, or pass --force to replace it (customize with a drop-in \
                         instead: systemctl{} edit {name})",
                        path.display(),
                        if system { "" } else { " --user" }
                    ),
                    4,
                ))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => {
                return Err(CliError::with_code(
                    format!("reading {}: {e}; nothing was written", path.display()),
                    7,
                ))
            }
        };
        plan.push((name, path, text, unchanged));
    }
    for (name, path, text, unchanged) in plan {
        if unchanged {
            out(format!("{}: unchanged", path.display()));
            continue;
        }
        durable::atomic_write(&dir, name, text.as_bytes(), &Faults::none())
            .map_err(|e| CliError::with_code(e.to_string(), 7))?;
        // Unit files are read by the service manager, not secret: 0644 like any unit.
        durable::set_mode(&path, 0o644).map_err(|e| CliError::with_code(e.to_string(), 7))?;
        if name.ends_with(".service") {
            out(format!(
                "{}: written (ExecStart={} daemon)",
                path.display(),
                bin.display()
            ));
        } else {
            out(format!("{}: written", path.display()));
        }
    }
    let ctl = if system {
        "systemctl"
    } else {
        "systemctl --user"
    };
    if a.dir.is_some() {
        out(format!(
            "next: copy them to the {} unit directory, then: {ctl} daemon-reload && {ctl} enable --now holdfast.socket",
            if system { "system" } else { "user" }
        ));
    } else {
        out(format!(
            "next: {ctl} daemon-reload && {ctl} enable --now holdfast.socket"
        ));
    }
    if system {
        out("the system units run as user \"holdfast\" and read /etc/holdfast/keys/default.key: docs/operations.md (\"System-wide\") has the setup");
    }
    Ok(())
}
