//! The floors under holdfast's figures: what the disk costs with nothing of holdfast in the
//! way. Every floor runs through one helper, [`floor`]: `warmup` untimed runs, then `n` timed
//! ones, each returning the time of what it measures (some floors leave the write out of the
//! time), as [`Stats`].

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use holdfast::durable::{self, Faults};

use super::{fail, CliResult, Stats};

/// Bytes of one block of the fsync and atomic-write floors.
pub const BLOCK_BYTES: usize = 4096;

/// Run `op(i)` `warmup + n` times; the durations of the last `n` are the floor. `what` names it
/// in an error.
pub fn floor(
    what: &str,
    n: usize,
    warmup: usize,
    mut op: impl FnMut(usize) -> io::Result<Duration>,
) -> CliResult<Stats> {
    let mut lat = Vec::with_capacity(n);
    for i in 0..warmup + n {
        let d = op(i).map_err(|e| fail(what, e))?;
        if i >= warmup {
            lat.push(d);
        }
    }
    Ok(Stats::of(lat))
}

/// How long `f` took.
pub fn timed(f: impl FnOnce() -> io::Result<()>) -> io::Result<Duration> {
    let t = Instant::now();
    f()?;
    Ok(t.elapsed())
}

/// fsync of a 4 KiB block: `new` a freshly created file each time (block allocation and a
/// journal commit: what the first fsync of every durable write pays), else one block of one
/// file rewritten in place (the least an fsync can cost here). Only the fsync is timed.
pub fn fsync(dir: &Path, n: usize, new: bool) -> CliResult<Stats> {
    let sub = dir.join(if new {
        "floor-fsync-new"
    } else {
        "floor-fsync"
    });
    durable::create_private_dir(&sub, &Faults::none()).map_err(|e| fail("fsync floor", e))?;
    let open = |name: String| {
        OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(sub.join(name))
    };
    let same: Option<File> = if new {
        None
    } else {
        Some(open("f".into()).map_err(|e| fail("fsync floor", e))?)
    };
    let mut block = [0u8; BLOCK_BYTES];
    // The files stay (until the temp dir goes): unlinking them now would make the next
    // floor's first journal commits pay for freeing their blocks.
    floor("fsync floor", n, 5, |i| {
        block[0] = i as u8;
        let fresh;
        let f = match &same {
            Some(f) => f,
            None => {
                fresh = open(format!("f{i}"))?;
                &fresh
            }
        };
        f.write_all_at(&block, 0)?;
        timed(|| f.sync_all())
    })
}

/// One `durable::atomic_write` of 4 KiB (temp file, write, fsync, rename, fsync of the
/// directory): `replace` over the same name each time (the old file's blocks are freed, as
/// when a credential is overwritten), else to a new name each time.
pub fn atomic_write(dir: &Path, n: usize, replace: bool) -> CliResult<Stats> {
    let sub = dir.join(if replace {
        "floor-replace"
    } else {
        "floor-create"
    });
    durable::create_private_dir(&sub, &Faults::none()).map_err(|e| fail("atomic floor", e))?;
    let mut block = vec![0u8; BLOCK_BYTES];
    floor("atomic floor", n, 5, |i| {
        block[0] = i as u8;
        let name = if replace {
            "file".to_string()
        } else {
            format!("f{i}")
        };
        timed(|| {
            durable::atomic_write(&sub, &name, &block, &Faults::none())
                .map(|_| ())
                .map_err(io::Error::other)
        })
    })
}

/// 28 bytes written after what was written and `fdatasync`ed, `n` times: into a preallocated,
/// zero-filled file (as the stream journal writes) or at the end of a growing one.
pub fn append(dir: &Path, n: usize, preallocated: bool) -> CliResult<Stats> {
    let path = dir.join(if preallocated {
        "floor-prealloc"
    } else {
        "floor-append"
    });
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| fail("creating the floor file", e))?;
    if preallocated {
        f.write_all_at(&vec![0u8; 4 << 20], 0)
            .and_then(|()| f.sync_all())
            .map_err(|e| fail("preallocating the floor file", e))?;
    }
    let rec = [b'x'; 28];
    let stats = floor("the fsync floor", n, 0, |i| {
        timed(|| {
            f.write_all_at(&rec, (i * rec.len()) as u64)
                .and_then(|()| f.sync_data())
        })
    });
    let _ = std::fs::remove_file(&path);
    stats
}

/// A 300-byte line appended and `fdatasync`ed, `n` times (a run-log record without holdfast).
pub fn line(dir: &Path, n: usize) -> CliResult<Stats> {
    use std::io::Write as _;
    let path = dir.join("floor-line");
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| fail("creating the floor file", e))?;
    let line = format!("{}\n", "x".repeat(300));
    let stats = floor("the fsync floor", n, 0, |_| {
        timed(|| f.write_all(line.as_bytes()).and_then(|()| f.sync_data()))
    });
    let _ = std::fs::remove_file(&path);
    stats
}
