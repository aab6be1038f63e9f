//! The audit directory's files: segments `audit-<first seq, 20 digits>.jsonl` in sequence
//! order, the lock, the space reserve, and reading a segment's first and last lines.

use std::fs;
use std::io::{self, Read};
use std::path::Path;

use super::record::{check_line, Entry, LineError};

/// The lock every writer takes (exclusive) around an append; readers take it shared while
/// they note each segment's length.
pub const LOCK_FILE: &str = "audit.lock";

/// Preallocated space released when the disk fills, so the records of the operations that
/// still succeed on a full disk (reads) can be written (docs/design.md, "The audit log").
pub const RESERVE_FILE: &str = "reserve";

/// Where the writer moves a segment whose last line is not a record (it is kept, never
/// deleted).
pub const DAMAGED_DIR: &str = "damaged";

/// The name of the segment whose first record is number `first`.
pub fn segment_name(first: u64) -> String {
    format!("audit-{first:020}.jsonl")
}

/// The first sequence number of segment `name`, if it is one.
pub fn segment_first(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("audit-")?.strip_suffix(".jsonl")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// One segment file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Its first record's sequence number (from its name).
    pub first: u64,
    /// Its file name.
    pub name: String,
    /// Its length when listed.
    pub len: u64,
    /// Its modification time (its last append), in seconds since the epoch.
    pub mtime: i64,
}

/// The segments in `dir`, in sequence order; none if `dir` does not exist.
pub fn list(dir: &Path) -> io::Result<Vec<Segment>> {
    use std::os::unix::fs::MetadataExt;
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut segs = Vec::new();
    for e in rd {
        let e = e?;
        let Some(name) = e.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        let Some(first) = segment_first(&name) else {
            continue;
        };
        let meta = match fs::symlink_metadata(e.path()) {
            Ok(m) if m.is_file() => m,
            // Something else under a segment's name (a link, a FIFO, a directory): never
            // followed, and said as such (a writer would otherwise fail to create the name).
            Ok(m) => {
                let what = if m.file_type().is_symlink() {
                    "a symbolic link"
                } else if m.is_dir() {
                    "a directory"
                } else {
                    "a special file"
                };
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{} is {what} where the audit log keeps a segment; refusing to follow or replace it (fix: remove it)",
                        e.path().display()
                    ),
                ));
            }
            // Dropped by a writer's retention since the listing.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        segs.push(Segment {
            first,
            name,
            len: meta.len(),
            mtime: meta.mtime(),
        });
    }
    segs.sort_by_key(|s| s.first);
    Ok(segs)
}

/// How a segment's bytes end.
#[derive(Debug, PartialEq)]
pub enum Tail {
    /// No bytes.
    Empty,
    /// The last line is whole; its bytes without the newline, and where it starts.
    Line {
        /// The line, without its newline.
        line: Vec<u8>,
        /// Its offset in the file.
        at: u64,
    },
    /// The bytes after the last newline are a line cut off (a writer died mid-append): the
    /// file's sound length is `keep`.
    Torn {
        /// Bytes up to and including the last newline.
        keep: u64,
    },
}

/// Records are much shorter than this; a last line longer is read as damage.
pub const MAX_LINE: usize = 64 * 1024;

/// How the `len` bytes of a file end, given a reader of its bytes at an offset.
pub fn tail_of(
    len: u64,
    mut read_at: impl FnMut(u64, &mut [u8]) -> io::Result<usize>,
) -> io::Result<Tail> {
    if len == 0 {
        return Ok(Tail::Empty);
    }
    let window = (len as usize).min(MAX_LINE + 1);
    let from = len - window as u64;
    let mut buf = vec![0u8; window];
    let n = read_at(from, &mut buf)?;
    buf.truncate(n);
    if buf.len() < window {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the file shrank while its tail was read",
        ));
    }
    if buf.last() != Some(&b'\n') {
        let keep = match memchr::memrchr(b'\n', &buf) {
            Some(i) => from + i as u64 + 1,
            None if from == 0 => 0,
            // A torn line longer than any record: cut it all the same, to the last newline.
            None => return last_newline_before(from, &mut read_at).map(|keep| Tail::Torn { keep }),
        };
        return Ok(Tail::Torn { keep });
    }
    let body = &buf[..buf.len() - 1];
    let start = memchr::memrchr(b'\n', body).map_or(0, |i| i + 1);
    if start == 0 && from > 0 {
        // A last line longer than MAX_LINE: hand back its last MAX_LINE bytes, which are no
        // record (the caller treats the segment as damaged).
        return Ok(Tail::Line {
            line: body.to_vec(),
            at: from,
        });
    }
    Ok(Tail::Line {
        line: body[start..].to_vec(),
        at: from + start as u64,
    })
}

/// Where the bytes after the last newline before `end` start (0 if there is none).
fn last_newline_before(
    mut end: u64,
    read_at: &mut impl FnMut(u64, &mut [u8]) -> io::Result<usize>,
) -> io::Result<u64> {
    let mut buf = vec![0u8; MAX_LINE];
    while end > 0 {
        let from = end.saturating_sub(MAX_LINE as u64);
        let chunk = &mut buf[..(end - from) as usize];
        let n = read_at(from, chunk)?;
        if let Some(i) = memchr::memrchr(b'\n', &chunk[..n]) {
            return Ok(from + i as u64 + 1);
        }
        end = from;
    }
    Ok(0)
}

/// The first line of `path` (up to `len` bytes of it), checked, if it has a whole one.
pub fn first_entry(path: &Path, len: u64) -> io::Result<Option<Result<Entry, LineError>>> {
    let f = fs::File::open(path)?;
    let mut buf = Vec::new();
    f.take(len.min(MAX_LINE as u64 + 1)).read_to_end(&mut buf)?;
    Ok(memchr::memchr(b'\n', &buf).map(|i| check_line(&buf[..i])))
}

/// The audit directory `dir` is safe to create files in: absent (it will be made 0700), or a
/// directory of ours that is not a symlink. A link planted there must not make the log's lock,
/// reserve or segments land outside the data directory.
pub fn check_dir(dir: &std::path::Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
        Ok(_) => crate::durable::perms::is_too_open(dir, true)
            .map(|_| ())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::PermissionDenied, e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A link (or a directory) under a segment's name is refused by name, never skipped: a
    /// writer skipping it failed to create the name with a bare "File exists".
    #[test]
    #[allow(clippy::disallowed_methods)] // fixtures made directly
    fn something_else_under_a_segments_name_is_refused_by_name() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("target"), b"").unwrap();
        std::os::unix::fs::symlink(d.path().join("target"), d.path().join(segment_name(1)))
            .unwrap();
        let e = list(d.path()).unwrap_err();
        assert!(e.to_string().contains("is a symbolic link"), "{e}");
        std::fs::remove_file(d.path().join(segment_name(1))).unwrap();
        std::fs::create_dir(d.path().join(segment_name(2))).unwrap();
        let e = list(d.path()).unwrap_err();
        assert!(e.to_string().contains("is a directory"), "{e}");
    }

    fn tail(bytes: &[u8]) -> Tail {
        tail_of(bytes.len() as u64, |at, buf| {
            let at = at as usize;
            let n = buf.len().min(bytes.len() - at);
            buf[..n].copy_from_slice(&bytes[at..at + n]);
            Ok(n)
        })
        .unwrap()
    }

    #[test]
    fn names_sort_by_sequence_and_tails_are_read() {
        assert_eq!(segment_name(1), "audit-00000000000000000001.jsonl");
        assert_eq!(segment_first(&segment_name(123_456)), Some(123_456));
        for bad in [
            "audit-1.jsonl",
            "audit-0000000000000000000x.jsonl",
            "x.jsonl",
        ] {
            assert_eq!(segment_first(bad), None, "{bad}");
        }
        assert_eq!(tail(b""), Tail::Empty);
        assert_eq!(
            tail(b"a\nbc\n"),
            Tail::Line {
                line: b"bc".to_vec(),
                at: 2
            }
        );
        assert_eq!(
            tail(b"only\n"),
            Tail::Line {
                line: b"only".to_vec(),
                at: 0
            }
        );
        assert_eq!(tail(b"a\nbc"), Tail::Torn { keep: 2 });
        assert_eq!(tail(b"partial"), Tail::Torn { keep: 0 });
        let mut long = b"a\n".to_vec();
        long.extend(std::iter::repeat_n(b'x', MAX_LINE * 2));
        assert_eq!(tail(&long), Tail::Torn { keep: 2 });
    }
}
