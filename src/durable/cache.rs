//! A cache of small files' bytes, vouched for by a `stat` on every read: a hit costs one
//! `lstat` instead of `open`/`read`/`close` (and, under a file watcher, no inotify event: every
//! `open` of a watched file wakes the watcher). Used by the daemon for credential files, which
//! are read far more often than written; it holds ciphertext only.
//!
//! A cached entry is served only while the file's stamp (size, mtime, inode, and ctime, which
//! unlike mtime no system call can set back) is unchanged and the entry is *racily clean*
//! (git's rule): the file's mtime and ctime were comfortably older than the moment we read it. File timestamps come from a coarse clock that can lag real time by a
//! timer tick, so an in-place rewrite within a tick of our read could otherwise keep the same
//! mtime and size and hide behind an equal stamp; with the mtime at least [`RACY_MARGIN`]
//! older than the read, any later rewrite gets a newer mtime. A racy entry is re-read on each
//! use until it ages out of the margin. A file system with whole-second timestamps (no
//! nanoseconds) gets a two-second margin. Callers that write (read-modify-write under the
//! store lock) read the file itself, not the cache.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use super::atomic::{ctime_ns, read_capped_stamped, FileStamp};

/// How much older than our read a file's mtime must be for its cached bytes to be trusted
/// (several timer ticks at any HZ).
pub const RACY_MARGIN_NS: i64 = 50_000_000;

use crate::limits::FILE_CACHE_MAX_ENTRY_BYTES as MAX_ENTRY_BYTES;

/// Cached bytes of the files of one directory.
#[derive(Debug)]
pub struct FileCache {
    state: Mutex<State>,
    cap_bytes: usize,
}

enum Lookup {
    Hit(Arc<[u8]>),
    Missing,
    Miss,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<String, Entry>,
    bytes: usize,
}

#[derive(Debug)]
struct Entry {
    stamp: FileStamp,
    /// The inode change time too: unlike mtime, no system call can set it back.
    ctime_ns: i64,
    bytes: Arc<[u8]>,
    clean: bool,
}

/// On a file system with whole-second timestamps (no nanoseconds at all), the racy margin
/// must cover a second.
const COARSE_RACY_MARGIN_NS: i64 = 2_000_000_000;

/// Whether a file read at `read_at` with this stamp can be trusted while its stamp holds.
fn racily_clean(stamp: &FileStamp, ctime: i64, read_at: i64) -> bool {
    let newest = stamp.mtime_ns.max(ctime);
    let coarse = stamp.mtime_ns % 1_000_000_000 == 0 && ctime % 1_000_000_000 == 0;
    let margin = if coarse {
        COARSE_RACY_MARGIN_NS
    } else {
        RACY_MARGIN_NS
    };
    newest < read_at.saturating_sub(margin)
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

impl FileCache {
    /// An empty cache holding at most `cap_bytes` of file contents.
    pub fn new(cap_bytes: usize) -> Self {
        FileCache {
            state: Mutex::new(State::default()),
            cap_bytes,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The bytes of `dir/name` (at most `cap` bytes, no symlinks, regular files only: the same
    /// contract and errors as [`super::read_capped`]). `Ok(None)` if it does not exist.
    pub fn read(&self, dir: &Path, name: &str, cap: u64) -> io::Result<Option<Arc<[u8]>>> {
        let path = dir.join(name);
        match self.lookup(&path, name) {
            Lookup::Hit(bytes) => return Ok(Some(bytes)),
            Lookup::Missing => return Ok(None),
            Lookup::Miss => {}
        }
        let read_at = now_ns();
        let Some((bytes, stamp, ctime)) = read_capped_stamped(&path, cap)? else {
            self.forget(name);
            return Ok(None);
        };
        let bytes: Arc<[u8]> = Arc::from(bytes);
        if bytes.len() > MAX_ENTRY_BYTES {
            self.forget(name);
        } else {
            let clean = racily_clean(&stamp, ctime, read_at);
            let mut st = self.state();
            if st.bytes + bytes.len() > self.cap_bytes {
                // Simple and bounded: start over rather than track recency.
                st.entries.clear();
                st.bytes = 0;
            }
            st.bytes += bytes.len();
            let old = st.entries.insert(
                name.to_owned(),
                Entry {
                    stamp,
                    ctime_ns: ctime,
                    bytes: Arc::clone(&bytes),
                    clean,
                },
            );
            if let Some(old) = old {
                st.bytes -= old.bytes.len();
            }
        }
        Ok(Some(bytes))
    }

    /// The bytes of `dir/name` if they are cached and still current; never opens the file
    /// (one `lstat`). `None`: not cached, changed, racy, or gone — use [`FileCache::read`].
    pub fn peek(&self, dir: &Path, name: &str) -> Option<Arc<[u8]>> {
        match self.lookup(&dir.join(name), name) {
            Lookup::Hit(bytes) => Some(bytes),
            Lookup::Missing | Lookup::Miss => None,
        }
    }

    fn lookup(&self, path: &Path, name: &str) -> Lookup {
        match fs::symlink_metadata(path) {
            Ok(meta) if meta.is_file() => {
                let (stamp, ctime) = (FileStamp::of(&meta), ctime_ns(&meta));
                let st = self.state();
                match st.entries.get(name) {
                    Some(e) if e.clean && e.stamp == stamp && e.ctime_ns == ctime => {
                        Lookup::Hit(Arc::clone(&e.bytes))
                    }
                    _ => Lookup::Miss,
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.forget(name);
                Lookup::Missing
            }
            // Symlinks, non-files and errors: the uncached read reports them.
            _ => Lookup::Miss,
        }
    }

    /// Drop what is cached for `name`.
    pub fn forget(&self, name: &str) {
        let mut st = self.state();
        if let Some(old) = st.entries.remove(name) {
            st.bytes -= old.bytes.len();
        }
    }

    /// Bytes cached.
    pub fn cached_bytes(&self) -> usize {
        self.state().bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::{FileTimes, OpenOptions};
    use std::io::Write;
    use std::time::Duration;

    /// Let the file's mtime and ctime fall behind the racy margin (ctime cannot be set back).
    fn settle(_path: &Path) {
        std::thread::sleep(Duration::from_nanos(2 * RACY_MARGIN_NS as u64));
    }

    #[test]
    fn serves_an_unchanged_file_from_memory() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a");
        fs::write(&p, b"cipher-1").unwrap();
        settle(&p);
        let c = FileCache::new(1 << 20);
        assert_eq!(&*c.read(d.path(), "a", 100).unwrap().unwrap(), b"cipher-1");
        assert_eq!(c.cached_bytes(), 8);
        // A hit needs no file: peek() answers from memory after one lstat.
        assert_eq!(&*c.peek(d.path(), "a").unwrap(), b"cipher-1");
        // Rewritten in place, same size, with the old mtime put back (as `touch -r` or
        // `rsync -t` would): the ctime still moves, so it is not served stale.
        let mtime = fs::metadata(&p).unwrap().modified().unwrap();
        let mut f = OpenOptions::new().write(true).open(&p).unwrap();
        f.write_all(b"cipher-2").unwrap();
        f.set_times(FileTimes::new().set_modified(mtime)).unwrap();
        drop(f);
        assert!(
            c.peek(d.path(), "a").is_none(),
            "a forged mtime hid a change"
        );
        assert_eq!(&*c.read(d.path(), "a", 100).unwrap().unwrap(), b"cipher-2");
    }

    #[test]
    fn notices_in_place_rewrites_of_the_same_size() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a");
        fs::write(&p, b"value-1").unwrap();
        settle(&p);
        let c = FileCache::new(1 << 20);
        assert_eq!(&*c.read(d.path(), "a", 100).unwrap().unwrap(), b"value-1");
        // Same size, same inode, rewritten in place (as hive does): the mtime moves.
        let mut f = OpenOptions::new().write(true).open(&p).unwrap();
        f.write_all(b"value-2").unwrap();
        drop(f);
        assert_eq!(&*c.read(d.path(), "a", 100).unwrap().unwrap(), b"value-2");
    }

    #[test]
    fn a_fresh_file_is_racy_and_reread_until_it_ages() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a");
        fs::write(&p, b"fresh-1").unwrap();
        let c = FileCache::new(1 << 20);
        assert_eq!(&*c.read(d.path(), "a", 100).unwrap().unwrap(), b"fresh-1");
        // Rewrite in place and put the old mtime back: the stamp is equal, but the entry was
        // racy (mtime within the margin of the read), so the file is read again.
        let mtime = fs::metadata(&p).unwrap().modified().unwrap();
        let mut f = OpenOptions::new().write(true).open(&p).unwrap();
        f.write_all(b"fresh-2").unwrap();
        f.set_times(FileTimes::new().set_modified(mtime)).unwrap();
        drop(f);
        assert_eq!(&*c.read(d.path(), "a", 100).unwrap().unwrap(), b"fresh-2");
    }

    #[test]
    fn renames_symlinks_missing_files_and_the_cap() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a");
        fs::write(&p, b"one").unwrap();
        settle(&p);
        let c = FileCache::new(10);
        assert_eq!(&*c.read(d.path(), "a", 100).unwrap().unwrap(), b"one");
        // Replaced by rename: a new inode.
        fs::write(d.path().join("t"), b"two").unwrap();
        settle(&d.path().join("t"));
        fs::rename(d.path().join("t"), &p).unwrap();
        assert_eq!(&*c.read(d.path(), "a", 100).unwrap().unwrap(), b"two");
        // Gone: None, and forgotten.
        fs::remove_file(&p).unwrap();
        assert!(c.read(d.path(), "a", 100).unwrap().is_none());
        assert_eq!(c.cached_bytes(), 0);
        // A symlink is refused as the uncached read refuses it.
        fs::write(d.path().join("target"), b"x").unwrap();
        std::os::unix::fs::symlink(d.path().join("target"), &p).unwrap();
        assert!(c.read(d.path(), "a", 100).is_err());
        // Over the byte cap the cache starts over instead of growing.
        for (n, v) in [("b", b"123456"), ("c", b"abcdef")] {
            fs::write(d.path().join(n), v).unwrap();
            settle(&d.path().join(n));
            assert_eq!(&*c.read(d.path(), n, 100).unwrap().unwrap(), v);
            assert!(c.cached_bytes() <= 10);
        }
    }
}
