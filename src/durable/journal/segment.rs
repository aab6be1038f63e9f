//! The on-disk format of the journal: segment names, headers and frames (with their CRC), a
//! segment prepared zero-filled before use, and the scan that reads a segment's good frames
//! and says how its tail ends (zero fill, a torn write, or corruption).

use super::*;

pub(super) fn segment_name(n: u64) -> String {
    format!("journal-{n:016x}.log")
}

pub(super) fn segment_number(name: &str) -> Option<u64> {
    let hex = name.strip_prefix("journal-")?.strip_suffix(".log")?;
    (hex.len() == 16)
        .then(|| u64::from_str_radix(hex, 16).ok())
        .flatten()
}

/// A frame's CRC32C: over the segment number, then the payload.
pub fn frame_crc(segment: u64, payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&segment.to_le_bytes()), payload)
}

/// Segment `segment`'s header.
pub fn header(segment: u64) -> [u8; HEADER_BYTES as usize] {
    let mut h = [0u8; HEADER_BYTES as usize];
    h[..4].copy_from_slice(MAGIC);
    h[4..12].copy_from_slice(&segment.to_le_bytes());
    let crc = crc32c::crc32c(&h[..12]);
    h[12..].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Ahead of use, a segment's zeros reach the disk a chunk at a time, with this pause after
/// each chunk's `fdatasync`.
///
/// Why: an `fdatasync` of the journal ends with a flush of the device's cache, which waits for
/// every write in flight; written in one piece and synced once, the 16 MiB of a segment being
/// prepared were one write-back of ~15 ms here, and every acknowledgement waiting on a journal
/// sync meanwhile waited for all of it (at 256 streams, a new segment every second or so: p99
/// 6.6 ms, against 5.1 ms in the same runs with segments so large none was prepared:
/// docs/benchmarks.md, "Issue 15, ninth session"). In 1 MiB pieces a journal sync waits for
/// one piece at most. The preparation starts half a segment ahead, hundreds of milliseconds at
/// the fastest appends measured; its 16 pauses add 16 ms.
const PREPARE_CHUNK: usize = 1 << 20;
/// See [`PREPARE_CHUNK`].
const PREPARE_PAUSE: Duration = Duration::from_millis(1);

/// Create segment `n` (zero-filled, header written, fsynced) under a temp name, then publish it.
/// `ahead`: prepared before it is needed (a helper thread), so its zeros are written back a
/// chunk at a time ([`PREPARE_CHUNK`]); a segment the next batch waits for is written at once.
pub(super) fn prepare_segment(
    dir: &Dir,
    n: u64,
    faults: &Faults,
    ahead: bool,
) -> Result<(), IoError> {
    let name = segment_name(n);
    let tmp = format!(".{name}{}prep", crate::durable::TEMP_MARKER);
    let tmp_path = dir.path().join(&tmp);
    let _ = dir.unlink(&tmp);
    faults
        .check(Op::CreateTemp)
        .map_err(|e| IoError::new(Op::CreateTemp, &tmp_path, e))?;
    let mut f = dir.open_own_file(
        Op::CreateTemp,
        &tmp,
        rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CREATE | rustix::fs::OFlags::EXCL,
        0o600,
    )?;
    let zeros = vec![0u8; PREPARE_CHUNK];
    let mut written = 0u64;
    let res = (|| {
        faults.check(Op::WriteTemp)?;
        f.write_all(&header(n))?;
        written += HEADER_BYTES;
        while written < SEGMENT_BYTES {
            let chunk = ((SEGMENT_BYTES - written) as usize).min(zeros.len());
            f.write_all(&zeros[..chunk])?;
            written += chunk as u64;
            if ahead {
                f.sync_data()?;
                std::thread::sleep(PREPARE_PAUSE);
            }
        }
        Ok(())
    })();
    if let Err(e) = res {
        let _ = dir.unlink(&tmp);
        return Err(IoError::new(Op::WriteTemp, &tmp_path, e));
    }
    faults
        .check(Op::FsyncFile)
        .and_then(|()| f.sync_all())
        .map_err(|e| IoError::new(Op::FsyncFile, &tmp_path, e))?;
    drop(f);
    faults
        .check(Op::Rename)
        .and_then(|()| dir.rename(&tmp, &name))
        .map_err(|e| dir.file_error(Op::Rename, &name, e))?;
    dir.fsync(faults)
}

pub(super) fn open_segment(dir: &Dir, n: u64) -> io::Result<File> {
    dir.open_file(&segment_name(n), rustix::fs::OFlags::RDWR, 0)
}

/// Scan one segment's bytes: good frames, and where (and how) the good part ends.
pub(super) enum Tail {
    /// Zero fill from here (or the segment is full).
    Clean(u64),
    /// A bad frame at this offset, with only zeros past the torn-write window.
    Torn(u64),
    /// A bad frame at this offset, with data past the window (or in a sealed segment).
    Corrupt(u64),
}

/// A segment whose header is not this format's (or not this segment's number).
#[derive(Debug, thiserror::Error)]
#[error("segment {} has no valid header", segment_name(*.0))]
pub(super) struct BadHeader(u64);

pub(super) fn scan(n: u64, bytes: &[u8], out: &mut Vec<Replayed>) -> Result<Tail, BadHeader> {
    if bytes.len() < HEADER_BYTES as usize || bytes[..HEADER_BYTES as usize] != header(n) {
        return Err(BadHeader(n));
    }
    let mut off = HEADER_BYTES as usize;
    loop {
        if off + FRAME_HEADER > bytes.len() {
            return Ok(Tail::Clean(off as u64));
        }
        let len = u32::from_le_bytes(bytes[off..off + 4].try_into().unwrap_or_default()) as usize;
        let crc = u32::from_le_bytes(bytes[off + 4..off + 8].try_into().unwrap_or_default());
        if len == 0 && crc == 0 {
            // Zero fill, unless something non-zero follows within reach of a torn write.
            let rest = &bytes[off..];
            return Ok(if rest.iter().all(|&b| b == 0) {
                Tail::Clean(off as u64)
            } else {
                bad_tail(bytes, off)
            });
        }
        let end = off + FRAME_HEADER + len;
        if len == 0 || len > MAX_PAYLOAD || end > bytes.len() {
            return Ok(bad_tail(bytes, off));
        }
        let payload = &bytes[off + FRAME_HEADER..end];
        if frame_crc(n, payload) != crc {
            return Ok(bad_tail(bytes, off));
        }
        out.push(Replayed {
            pos: Position {
                segment: n,
                offset: off as u64,
            },
            payload: payload.to_vec(),
        });
        off = end;
    }
}

pub(super) fn bad_tail(bytes: &[u8], off: usize) -> Tail {
    let window_end = (off + TORN_WINDOW).min(bytes.len());
    if bytes[window_end..].iter().all(|&b| b == 0) {
        Tail::Torn(off as u64)
    } else {
        Tail::Corrupt(off as u64)
    }
}
