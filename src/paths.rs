//! Default locations (XDG, systemd, hive), each overridable by flag or environment.

use std::path::PathBuf;

use crate::crypto::KeySource;
use crate::limits::MAX_STORE_NAME_BYTES;

fn env_path(var: &str) -> Option<PathBuf> {
    std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
}

/// A default location that cannot be worked out, or a name that cannot become one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PathError {
    /// `HOME` is unset or relative, and nothing else says where to look.
    #[error("HOME is not set (or not absolute); pass --data-dir or set HOLDFAST_DATA_DIR")]
    NoHome,
    /// A store name that cannot name a directory.
    #[error(
        "invalid store name: use 1-{MAX_STORE_NAME_BYTES} letters, digits, '_' or '-' (not \
         starting with '-')"
    )]
    StoreName,
}

fn home() -> Result<PathBuf, PathError> {
    env_path("HOME").ok_or(PathError::NoHome)
}

/// The store a request, a command or a plugin grant means when it names none; its key also
/// seals the streams (`service::STREAMS_KEY_STORE`).
pub const DEFAULT_STORE: &str = "default";

/// The data directory: `$STATE_DIRECTORY` under systemd, else `$XDG_STATE_HOME/holdfast`,
/// else `~/.local/state/holdfast`. (`--data-dir` / `HOLDFAST_DATA_DIR` override it earlier.)
pub fn default_data_dir() -> Result<PathBuf, PathError> {
    if let Some(p) = env_path("STATE_DIRECTORY") {
        return Ok(p);
    }
    if let Some(p) = env_path("XDG_STATE_HOME") {
        return Ok(p.join("holdfast"));
    }
    Ok(home()?.join(".local/state/holdfast"))
}

/// `$XDG_CONFIG_HOME/holdfast`, else `~/.config/holdfast`.
pub fn config_dir() -> Result<PathBuf, PathError> {
    if let Some(p) = env_path("XDG_CONFIG_HOME") {
        return Ok(p.join("holdfast"));
    }
    Ok(home()?.join(".config/holdfast"))
}

/// holdfast's key directory, `<config>/keys`: a store holdfast keeps the key of has its own
/// file there, `<store>.<store id>.key` (`store::identity`).
pub fn keys_dir() -> Result<PathBuf, PathError> {
    Ok(config_dir()?.join("keys"))
}

/// The key sources a named store tries before its own key file: systemd's
/// `$CREDENTIALS_DIRECTORY/holdfast-<store>.key` (`LoadCredential=`), when systemd passed a
/// credentials directory.
pub fn systemd_key_sources(store: &str) -> Vec<KeySource> {
    env_path("CREDENTIALS_DIRECTORY")
        .map(|dir| KeySource::SystemdCredential(dir.join(format!("holdfast-{store}.key"))))
        .into_iter()
        .collect()
}

/// The daemon's socket: `$XDG_RUNTIME_DIR/holdfast/holdfast.sock`, else
/// `/tmp/holdfast-$UID/holdfast.sock` (the directory's owner and mode are checked before use).
/// `--socket`, `HOLDFAST_SOCKET` and the config file's `socket` override it earlier.
pub fn default_socket() -> PathBuf {
    match env_path("XDG_RUNTIME_DIR") {
        Some(dir) => dir.join("holdfast/holdfast.sock"),
        None => PathBuf::from(format!(
            "/tmp/holdfast-{}/holdfast.sock",
            crate::durable::perms::euid()
        )),
    }
}

/// hive's home: `$HIVE_HOME`, else `~/.hive` — read as hive reads it
/// (`Path(os.environ["HIVE_HOME"]).expanduser()`): a leading `~` is the home directory, and a
/// relative path is relative to the working directory (holdfast makes it absolute). An
/// independent tester's `HIVE_HOME='~/hh'` made holdfast open `~/.hive` while hive used
/// `~/hh`.
pub fn hive_home() -> Result<PathBuf, PathError> {
    let Some(raw) = std::env::var_os("HIVE_HOME").filter(|v| !v.is_empty()) else {
        return Ok(home()?.join(".hive"));
    };
    let raw = PathBuf::from(raw);
    let expanded = match raw.strip_prefix("~") {
        Ok(rest) => home()?.join(rest),
        Err(_) => raw,
    };
    if expanded.is_absolute() {
        return Ok(expanded);
    }
    std::env::current_dir()
        .map(|d| d.join(&expanded))
        .map_err(|_| PathError::NoHome)
}

/// hive's credential store: `$HIVE_HOME/credentials` (`~/.hive/credentials`).
pub fn hive_store_dir() -> Result<PathBuf, PathError> {
    Ok(hive_home()?.join("credentials"))
}

/// hive's key sources, in hive's order: `HIVE_CREDENTIAL_KEY`, then
/// `$HIVE_HOME/secrets/credential_key`.
pub fn hive_key_sources() -> Result<Vec<KeySource>, PathError> {
    Ok(vec![
        KeySource::Env("HIVE_CREDENTIAL_KEY".into()),
        KeySource::File(hive_home()?.join("secrets/credential_key")),
    ])
}

/// Store names become directory and file names: 1–64 of `[A-Za-z0-9_-]`, not starting with `-`.
pub fn validate_store_name(name: &str) -> Result<(), PathError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_STORE_NAME_BYTES
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(PathError::StoreName)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_names() {
        assert!(validate_store_name("default").is_ok());
        assert!(validate_store_name("team-a_2").is_ok());
        for bad in ["", "-x", "a/b", "..", "a b", &"x".repeat(65)] {
            assert!(validate_store_name(bad).is_err(), "{bad}");
        }
    }
}
