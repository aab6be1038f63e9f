//! Where the database password comes from: never the config file. `password_file` (a file
//! holding only the password; a bare name is looked up in systemd's `$CREDENTIALS_DIRECTORY`),
//! else the first matching line of `PGPASSFILE` or `~/.pgpass`, read as libpq reads it
//! (`host:port:database:user:password`, `*` matches anything, `\:` and `\\` escaped; ignored
//! when group or others may read it).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use zeroize::Zeroizing;

use super::DbError;
use crate::limits;

/// The password for `config`, if one is configured or found.
pub(super) fn lookup(
    password_file: Option<&Path>,
    config: &tokio_postgres::Config,
) -> Result<Option<Zeroizing<String>>, DbError> {
    if let Some(f) = password_file {
        let path = resolve(f);
        let bytes = read_small(&path).map_err(|source| DbError::PasswordFile {
            path: path.clone(),
            source,
        })?;
        let text = String::from_utf8(bytes.to_vec()).map_err(|_| DbError::PasswordFile {
            path: path.clone(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8"),
        })?;
        let text = Zeroizing::new(text);
        return Ok(Some(Zeroizing::new(
            text.trim_end_matches(['\n', '\r']).to_owned(),
        )));
    }
    let pgpass = std::env::var_os("PGPASSFILE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".pgpass")));
    let Some(pgpass) = pgpass else {
        return Ok(None);
    };
    let Ok(meta) = std::fs::metadata(&pgpass) else {
        return Ok(None);
    };
    if meta.permissions().mode() & 0o077 != 0 {
        tracing::warn!(file = %pgpass.display(),
            "password file has group or world access and is ignored (chmod 0600 it), as libpq does");
        return Ok(None);
    }
    let Ok(bytes) = read_small(&pgpass) else {
        return Ok(None);
    };
    let text = Zeroizing::new(String::from_utf8_lossy(&bytes).into_owned());
    let hosts = super::host_names(config);
    let port = config
        .get_ports()
        .first()
        .copied()
        .unwrap_or(5432)
        .to_string();
    let db = config.get_dbname().unwrap_or_default();
    let user = config.get_user().unwrap_or_default();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let fields = split(line);
        if fields.len() != 5 {
            continue;
        }
        let is = |f: &str, v: &str| f == "*" || f == v;
        let host_ok = hosts
            .iter()
            .any(|h| is(&fields[0], h) || (h.starts_with('/') && is(&fields[0], "localhost")));
        if host_ok && is(&fields[1], &port) && is(&fields[2], db) && is(&fields[3], user) {
            return Ok(Some(Zeroizing::new(fields[4].clone())));
        }
    }
    Ok(None)
}

/// A bare name (no `/`) is a systemd credential when `$CREDENTIALS_DIRECTORY` is set.
fn resolve(f: &Path) -> PathBuf {
    let bare = f.components().count() == 1 && !f.is_absolute();
    match std::env::var_os("CREDENTIALS_DIRECTORY") {
        Some(dir) if bare => Path::new(&dir).join(f),
        _ => match (f.strip_prefix("~"), std::env::var_os("HOME")) {
            (Ok(rest), Some(home)) => Path::new(&home).join(rest),
            _ => f.to_path_buf(),
        },
    }
}

fn read_small(path: &Path) -> std::io::Result<Zeroizing<Vec<u8>>> {
    match crate::durable::read_capped(path, limits::MAX_PASSWORD_FILE_BYTES) {
        Ok(Some(b)) => Ok(Zeroizing::new(b)),
        Ok(None) => Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no such file",
        )),
        Err(e) => Err(e),
    }
}

/// One pgpass line's fields, `\:` and `\\` unescaped.
fn split(line: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(n) = chars.next() {
                    if let Some(s) = out.last_mut() {
                        s.push(n);
                    }
                }
            }
            ':' if out.len() < 5 => out.push(String::new()),
            c => {
                if let Some(s) = out.last_mut() {
                    s.push(c);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pgpass_lines_split_as_libpq_reads_them() {
        assert_eq!(
            split(r"db.internal:5432:holdfast:hf:pa\:ss\\w:rd"),
            vec!["db.internal", "5432", "holdfast", "hf", r"pa:ss\w:rd"]
        );
        assert_eq!(split("*:*:*:*:x").len(), 5);
        assert_eq!(split("too:few").len(), 2);
    }

    #[test]
    #[allow(clippy::disallowed_methods)] // the test writes its own fixture
    fn the_first_matching_pgpass_line_gives_the_password_and_an_open_file_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("pgpass");
        std::fs::write(
            &f,
            "# comment\nother:5432:*:*:wrong\n/tmp/sock:*:holdfast:hf:right\n*:*:*:*:later\n",
        )
        .unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        let config: tokio_postgres::Config =
            "host=/tmp/sock dbname=holdfast user=hf".parse().unwrap();
        // PGPASSFILE is read from the environment: set for this test's process only.
        std::env::set_var("PGPASSFILE", &f);
        let got = lookup(None, &config).unwrap().unwrap();
        assert_eq!(got.as_str(), "right");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(
            lookup(None, &config).unwrap().is_none(),
            "a readable pgpass is ignored"
        );
        let pw = dir.path().join("pw");
        std::fs::write(&pw, "s3cret\n").unwrap();
        let got = lookup(Some(&pw), &config).unwrap().unwrap();
        assert_eq!(
            got.as_str(),
            "s3cret",
            "the trailing newline is not the password's"
        );
        let err = lookup(Some(&dir.path().join("missing")), &config).unwrap_err();
        assert!(err.to_string().contains("password_file"), "{err}");
        std::env::remove_var("PGPASSFILE");
    }
}
