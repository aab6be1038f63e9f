//! Appending to the chain: under the directory's lock, find the head (the last record: this
//! process's cached view, checked with one `fstat`, or read from the files when another
//! process appended, rotated or a crash left a torn line), rotate to a new segment when the
//! active one is full, drop the oldest segments past the retention bounds, and write a batch
//! of records with one `write`. Syncing is the caller's ([`super::AuditLog`]).

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::json;

use super::record::{self, check_line, Record, Via, Who, GENESIS, OK};
use super::segments::{self, segment_name, Segment, Tail, DAMAGED_DIR, LOCK_FILE, RESERVE_FILE};
use super::{AuditError, Settings};
use crate::durable::{self, lock, Appender, Faults, IoError, LockFile, LockMode, Poison};

/// How long an append waits for another process's hold on the lock.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// What the writer needs besides its state.
pub(super) struct Ctx<'a> {
    pub dir: &'a Path,
    pub settings: &'a Settings,
    pub faults: &'a Faults,
    pub poison: &'a Poison,
    /// Set once the space reserve was released on a full disk, until it is made again.
    pub low_space: &'a std::sync::atomic::AtomicBool,
}

/// The segment being appended to, as this process last saw it.
struct Active {
    name: String,
    file: Appender,
    /// Its length after the last record this process wrote or read.
    len: u64,
    head_seq: u64,
    head_hash: [u8; 32],
}

/// The writer's state (under [`super::AuditLog`]'s mutex).
#[derive(Default)]
pub(super) struct Writer {
    active: Option<Active>,
    /// The highest sequence number this process wrote (0: none).
    pub written: u64,
    /// The file holding record `written` (what a sync must cover).
    pub written_file: Option<Appender>,
    /// The directory was made (and checked) by this process.
    dir_ready: bool,
    /// Reused for encoding.
    buf: Vec<u8>,
    /// The directory's lock file, kept open between appends.
    lock: Option<LockFile>,
}

/// What one append did.
pub(super) struct Appended {
    /// The sequence numbers given to the caller's records, in order.
    pub seqs: Vec<u64>,
}

fn io_err(e: IoError) -> AuditError {
    AuditError::from_io(&e)
}

fn audit_who() -> Who {
    Who {
        via: Via::Audit,
        pid: Some(std::process::id()),
        uid: Some(durable::perms::euid()),
        ..Who::default()
    }
}

impl Writer {
    /// Append `recs` under the directory's lock. `wait`: wait for another process's hold on
    /// the lock (up to [`LOCK_TIMEOUT`]); otherwise `Ok(None)` if it is held.
    pub fn append(
        &mut self,
        cx: &Ctx<'_>,
        recs: &[Record],
        wait: bool,
    ) -> Result<Option<Appended>, AuditError> {
        if let Some(why) = cx.poison.reason() {
            return Err(AuditError::Poisoned(why));
        }
        if !self.dir_ready {
            make_dir(cx)?;
            self.dir_ready = true;
        }
        let lock_err = |e: lock::LockError| match e {
            lock::LockError::Timeout { .. } => AuditError::Busy(e.to_string()),
            _ => AuditError::Write(e.to_string()),
        };
        let lock_file = match self.lock.take() {
            Some(l) if !l.stale() => l,
            _ => {
                segments::check_dir(cx.dir).map_err(|e| AuditError::Write(e.to_string()))?;
                LockFile::open(&cx.dir.join(LOCK_FILE)).map_err(lock_err)?
            }
        };
        let result = {
            let taken = if wait {
                lock_file.exclusive(LOCK_TIMEOUT).map(Some)
            } else {
                lock_file.try_exclusive()
            };
            match taken.map_err(lock_err)? {
                None => None,
                Some(_guard) => {
                    let mut pre = Vec::new();
                    Some(self.append_locked(cx, &mut pre, recs))
                }
            }
        };
        self.lock = Some(lock_file);
        let Some(result) = result else {
            return Ok(None);
        };
        if result.is_err() {
            // What this process knows of the files may be stale now: read them again.
            self.active = None;
        }
        result.map(Some)
    }

    fn append_locked(
        &mut self,
        cx: &Ctx<'_>,
        pre: &mut Vec<Record>,
        recs: &[Record],
    ) -> Result<Appended, AuditError> {
        self.find_head(cx, pre)?;
        let mut drop_after = Vec::new();
        if self
            .active
            .as_ref()
            .is_some_and(|a| a.len >= cx.settings.segment_bytes)
        {
            self.rotate(cx, pre, &mut drop_after)?;
        }
        let Some(active) = self.active.as_mut() else {
            return Err(AuditError::Write("no active segment".into()));
        };
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        let now = crate::timefmt::now_micros();
        let (mut seq, mut hash) = (active.head_seq, active.head_hash);
        let mut seqs = Vec::with_capacity(recs.len());
        for (i, r) in pre.iter().chain(recs).enumerate() {
            seq += 1;
            hash = record::encode(r, seq, now, &hash, &mut buf);
            if i >= pre.len() {
                seqs.push(seq);
            }
        }
        let written = write_with_reserve(cx, &active.file, &buf, active.len);
        let len = buf.len() as u64;
        if buf.capacity() <= 1 << 20 {
            self.buf = buf;
        }
        written?;
        active.len += len;
        active.head_seq = seq;
        active.head_hash = hash;
        self.written = seq;
        self.written_file = Some(active.file.clone());
        if !drop_after.is_empty() {
            // The `audit.drop` record says what goes; it is durable before anything goes.
            active.file.sync(cx.faults, cx.poison).map_err(io_err)?;
            for name in &drop_after {
                durable::remove_durably(cx.dir, name, cx.faults).map_err(io_err)?;
            }
        }
        Ok(Appended { seqs })
    }

    /// Make `self.active` the segment to append to, with the chain's head, reading the files
    /// unless this process's view is current (the active file's length is what it left and
    /// it still has a name). Records the log owes about what it found go to `pre`.
    ///
    /// A head older than the one this process last wrote means its newest records were cut
    /// from the log (no writer removes records; retention drops only the oldest): recorded as
    /// an `audit.break`, and numbering goes on after the last number written, so no number is
    /// used twice. (`verify` then reports the break; without a writer that saw the cut, only
    /// an anchor kept elsewhere shows it.)
    fn find_head(&mut self, cx: &Ctx<'_>, pre: &mut Vec<Record>) -> Result<(), AuditError> {
        // What this process last wrote: where its last record ended, its number and hash.
        let had = match &self.active {
            Some(a) => {
                let st = a.file.stat().map_err(io_err)?;
                if st.nlink > 0 && st.len == a.len {
                    return Ok(());
                }
                Some((a.name.clone(), a.len, a.head_seq, a.head_hash))
            }
            None => None,
        };
        self.active = None;
        self.read_head(cx, pre)?;
        let (Some((name, end, seq, hash)), Some(a)) = (had, self.active.as_mut()) else {
            return Ok(());
        };
        // Its last record must still be there: numbered below the head, and, in the same
        // segment, still ending where it did with its hash (others only append after it). A
        // cut refilled by other writers to the same numbers is caught by the hash.
        let gone = a.head_seq < seq
            || (a.name == name
                && (a.len < end
                    || !matches!(
                        segments::tail_of(end, |at, buf| a.file.read_at(at, buf).map_err(|e| e.source)),
                        Ok(Tail::Line { line, .. })
                            if check_line(&line).is_ok_and(|e| e.seq == seq && e.hash_bytes() == hash)
                    )));
        if gone {
            tracing::error!(
                found = a.head_seq,
                written = seq,
                "the newest records of the audit log were removed or replaced behind the daemon's back: recorded as an audit.break"
            );
            pre.push(Record::new("audit.break", OK, audit_who()).detail(json!({
                "why": format!(
                    "record {seq}, the last this process wrote, is gone from the end of the log (cut, or replaced by other records); numbering goes on after {}",
                    a.head_seq.max(seq)
                ),
            })));
            a.head_seq = a.head_seq.max(seq);
        }
        Ok(())
    }

    /// [`Self::find_head`]'s reading of the files.
    fn read_head(&mut self, cx: &Ctx<'_>, pre: &mut Vec<Record>) -> Result<(), AuditError> {
        let mut segs = segments::list(cx.dir).map_err(|e| AuditError::read(cx.dir, &e))?;
        // Each pass settles the newest segment or sets it aside; bounded by their number.
        for _ in 0..=segs.len() + 1 {
            let Some(top) = segs.last().cloned() else {
                refill_reserve_locked(cx);
                let name = segment_name(1);
                let file = Appender::create_new(cx.dir, &name, cx.faults).map_err(io_err)?;
                self.active = Some(Active {
                    name,
                    file,
                    len: 0,
                    head_seq: 0,
                    head_hash: GENESIS,
                });
                return Ok(());
            };
            let file = Appender::open(cx.dir, &top.name).map_err(io_err)?;
            let len = file.stat().map_err(io_err)?.len;
            let tail =
                segments::tail_of(len, |at, buf| file.read_at(at, buf).map_err(|e| e.source))
                    .map_err(|e| AuditError::read(&cx.dir.join(&top.name), &e))?;
            match tail {
                Tail::Torn { keep } => {
                    file.cut(keep, cx.faults, cx.poison).map_err(io_err)?;
                    pre.push(Record::new("audit.cut", OK, audit_who()).detail(json!({
                        "segment": top.name,
                        "bytes": len - keep,
                        "why": "a line cut off by a writer that died mid-append",
                    })));
                    // Read it again, whole now.
                    continue;
                }
                Tail::Empty => {
                    let prev = segs.len().checked_sub(2).map(|i| segs[i].clone());
                    return self.continue_empty(cx, pre, top, file, prev);
                }
                Tail::Line { line, .. } => match check_line(&line) {
                    Ok(e) if e.op == "audit.segment_end" => {
                        // The newest segment ends by naming a next one that is not there: it
                        // was created before this end was written, so it was removed since.
                        let next = segment_name(e.seq + 1);
                        let file =
                            Appender::create_new(cx.dir, &next, cx.faults).map_err(io_err)?;
                        pre.push(Record::new("audit.break", OK, audit_who()).detail(json!({
                            "why": format!("segment {next}, named by the end of {}, is missing: the records in it were removed", top.name),
                        })));
                        self.active = Some(Active {
                            name: next,
                            file,
                            len: 0,
                            head_seq: e.seq,
                            head_hash: e.hash_bytes(),
                        });
                        return Ok(());
                    }
                    Ok(e) => {
                        self.active = Some(Active {
                            name: top.name,
                            file,
                            len,
                            head_seq: e.seq,
                            head_hash: e.hash_bytes(),
                        });
                        return Ok(());
                    }
                    Err(why) => {
                        // Kept as evidence, out of the chain; the chain goes on from what is
                        // left, saying so.
                        let moved = durable::move_aside(
                            cx.dir,
                            &top.name,
                            &cx.dir.join(DAMAGED_DIR),
                            cx.faults,
                        )
                        .map_err(io_err)?;
                        tracing::error!(segment = %top.name, moved_to = %moved.display(), error = %why, "the audit log's last record is damaged; its segment was moved aside and the chain goes on with an audit.break record");
                        pre.push(Record::new("audit.break", OK, audit_who()).detail(json!({
                            "why": format!("the last line of {} is not a sound record ({why}); the segment was moved to {}", top.name, moved.display()),
                        })));
                        segs.pop();
                        if segs.is_empty() {
                            // Nothing left to chain to: a new chain starts, numbered on.
                            let first = top.first.max(1);
                            let name = segment_name(first);
                            let file =
                                Appender::create_new(cx.dir, &name, cx.faults).map_err(io_err)?;
                            self.active = Some(Active {
                                name,
                                file,
                                len: 0,
                                head_seq: first - 1,
                                head_hash: GENESIS,
                            });
                            return Ok(());
                        }
                        continue;
                    }
                },
            }
        }
        Err(AuditError::Write(
            "the audit directory kept changing while its head was read".into(),
        ))
    }

    /// The newest segment is empty: a rotation made it. Its head is the end of the segment
    /// before (finishing the rotation if a crash came between the two steps).
    fn continue_empty(
        &mut self,
        cx: &Ctx<'_>,
        pre: &mut Vec<Record>,
        top: Segment,
        file: Appender,
        prev: Option<Segment>,
    ) -> Result<(), AuditError> {
        let Some(prev) = prev else {
            if top.first <= 1 {
                // The first segment, made by a writer that died before its first record.
                self.active = Some(Active {
                    name: top.name,
                    file,
                    len: 0,
                    head_seq: 0,
                    head_hash: GENESIS,
                });
                return Ok(());
            }
            pre.push(Record::new("audit.break", OK, audit_who()).detail(json!({
                "why": format!("{} is empty and no segment comes before it: the records before {} were removed", top.name, top.first),
            })));
            self.active = Some(Active {
                name: top.name,
                file,
                len: 0,
                head_seq: top.first.saturating_sub(1),
                head_hash: GENESIS,
            });
            return Ok(());
        };
        let pfile = Appender::open(cx.dir, &prev.name).map_err(io_err)?;
        let plen = pfile.stat().map_err(io_err)?.len;
        let tail = segments::tail_of(plen, |at, buf| pfile.read_at(at, buf).map_err(|e| e.source))
            .map_err(|e| AuditError::read(&cx.dir.join(&prev.name), &e))?;
        let last = match tail {
            Tail::Line { line, .. } => check_line(&line).ok(),
            Tail::Empty | Tail::Torn { .. } => None,
        };
        let (seq, hash) = match last {
            Some(e)
                if e.op == "audit.segment_end"
                    && e.detail.as_ref().and_then(|d| d["next"].as_str()) == Some(&top.name) =>
            {
                (e.seq, e.hash_bytes())
            }
            Some(e) if e.op != "audit.segment_end" && e.seq + 2 == top.first => {
                // Crashed between creating the new segment and ending the old one: end it.
                self.end_segment(cx, &pfile, plen, (e.seq, e.hash_bytes()), &top.name)?
            }
            _ => {
                pre.push(Record::new("audit.break", OK, audit_who()).detail(json!({
                    "why": format!("{} is empty and {} before it does not end by naming it", top.name, prev.name),
                })));
                (top.first.saturating_sub(1), GENESIS)
            }
        };
        self.active = Some(Active {
            name: top.name,
            file,
            len: 0,
            head_seq: seq,
            head_hash: hash,
        });
        Ok(())
    }

    /// Append `audit.segment_end` naming `next` to `file` (of length `len`, its last record
    /// number `seq` with hash `hash`) and sync it; the end's number and hash.
    fn end_segment(
        &mut self,
        cx: &Ctx<'_>,
        file: &Appender,
        len: u64,
        (seq, hash): (u64, [u8; 32]),
        next: &str,
    ) -> Result<(u64, [u8; 32]), AuditError> {
        let end = Record::new("audit.segment_end", OK, audit_who()).detail(json!({ "next": next }));
        let mut line = Vec::new();
        let hash = record::encode(
            &end,
            seq + 1,
            crate::timefmt::now_micros(),
            &hash,
            &mut line,
        );
        write_with_reserve(cx, file, &line, len)?;
        file.sync(cx.faults, cx.poison).map_err(io_err)?;
        Ok((seq + 1, hash))
    }

    /// Close the active segment and open the next: create it (so an end never names a file
    /// that was never made), append `audit.segment_end` naming it to the old one and sync
    /// that. Then choose the oldest segments past the retention bounds: an `audit.drop`
    /// record goes first in the batch, and the files go once it is durable.
    fn rotate(
        &mut self,
        cx: &Ctx<'_>,
        pre: &mut Vec<Record>,
        drop_after: &mut Vec<String>,
    ) -> Result<(), AuditError> {
        let Some(old) = self.active.take() else {
            return Ok(());
        };
        // `pre` records (a cut, a break) land in the old segment first.
        let mut seq = old.head_seq;
        let mut hash = old.head_hash;
        let mut len = old.len;
        if !pre.is_empty() {
            let mut buf = Vec::new();
            let now = crate::timefmt::now_micros();
            for r in pre.drain(..) {
                seq += 1;
                hash = record::encode(&r, seq, now, &hash, &mut buf);
            }
            write_with_reserve(cx, &old.file, &buf, len)?;
            len += buf.len() as u64;
        }
        let next = segment_name(seq + 2);
        let file = Appender::create_new(cx.dir, &next, cx.faults).map_err(io_err)?;
        let (seq, hash) = self.end_segment(cx, &old.file, len, (seq, hash), &next)?;
        tracing::debug!(closed = %old.name, next = %next, "audit log: new segment");
        self.active = Some(Active {
            name: next,
            file,
            len: 0,
            head_seq: seq,
            head_hash: hash,
        });
        self.choose_drops(cx, pre, drop_after, seq, hash)?;
        Ok(())
    }

    /// Pick the oldest closed segments to drop (total past `max_bytes`, or older than the
    /// retention), and put the `audit.drop` record saying so in `pre`. `head`: the new
    /// segment's first record's `prev`, when every closed segment goes.
    fn choose_drops(
        &mut self,
        cx: &Ctx<'_>,
        pre: &mut Vec<Record>,
        drop_after: &mut Vec<String>,
        head_seq: u64,
        head_hash: [u8; 32],
    ) -> Result<(), AuditError> {
        let segs = segments::list(cx.dir).map_err(|e| AuditError::read(cx.dir, &e))?;
        let Some((_, closed)) = segs.split_last() else {
            return Ok(());
        };
        let mut total: u64 = segs.iter().map(|s| s.len).sum();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let too_old = |s: &Segment| {
            cx.settings
                .retention
                .is_some_and(|r| now.saturating_sub(s.mtime) > r.as_secs() as i64)
        };
        let mut dropped = Vec::new();
        for s in closed {
            if total <= cx.settings.max_bytes && !too_old(s) {
                break;
            }
            total = total.saturating_sub(s.len);
            dropped.push(s.clone());
        }
        let Some(last_dropped) = dropped.last() else {
            return Ok(());
        };
        // The record that will come first after the dropped ones: the oldest kept segment's
        // first, whose `prev` the drop record vouches for.
        let kept = segs.iter().find(|s| s.first > last_dropped.first);
        let (through, next_prev) = match kept {
            Some(k) if k.len > 0 => {
                match segments::first_entry(&cx.dir.join(&k.name), k.len)
                    .map_err(|e| AuditError::read(&cx.dir.join(&k.name), &e))?
                {
                    Some(Ok(e)) => (e.seq - 1, e.prev),
                    _ => return Ok(()), // damaged: verify reports it; nothing is dropped
                }
            }
            _ => (head_seq, record::hex(&head_hash)),
        };
        let names: Vec<String> = dropped.iter().map(|s| s.name.clone()).collect();
        tracing::info!(segments = ?names, through, "audit log: dropping the oldest records (retention)");
        if dropped.iter().any(|s| now.saturating_sub(s.mtime) < 86_400) {
            tracing::warn!("the audit log's retention dropped records less than a day old: raise [audit] max_bytes to keep more");
        }
        pre.push(Record::new("audit.drop", OK, audit_who()).detail(json!({
            "through_seq": through,
            "next_prev": next_prev,
            "segments": names,
        })));
        drop_after.extend(names);
        Ok(())
    }

    /// The file `written` is in, if this process wrote anything.
    pub fn written_file(&self) -> Option<Appender> {
        self.written_file.clone()
    }
}

/// Make the audit directory (0700) if it is missing; one of ours that is too open is
/// tightened (said once in the log), one that is not ours or a symlink refused.
pub(super) fn make_dir(cx: &Ctx<'_>) -> Result<(), AuditError> {
    durable::create_private_dir(cx.dir, cx.faults).map_err(io_err)?;
    match durable::perms::tighten(cx.dir, true, true) {
        Ok(Some(t)) => {
            tracing::warn!(
                dir = %t.path.display(),
                from = format!("{:o}", t.from),
                to = format!("{:o}", t.to),
                "the audit directory let group or other in: tightened"
            );
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(e) => Err(AuditError::Write(e.to_string())),
    }
}

/// Append `bytes` to `file`; on a full disk, release the space reserve and try once more.
fn write_with_reserve(
    cx: &Ctx<'_>,
    file: &Appender,
    bytes: &[u8],
    len: u64,
) -> Result<(), AuditError> {
    match file.append(bytes, len, cx.faults, cx.poison) {
        Err(e) if e.is_disk_full() && release_reserve(cx) => file
            .append(bytes, len, cx.faults, cx.poison)
            .map_err(io_err),
        other => other.map_err(io_err),
    }
}

/// Remove the reserve file, if there is one, so the blocks it held serve the next appends.
fn release_reserve(cx: &Ctx<'_>) -> bool {
    match durable::remove_durably(cx.dir, RESERVE_FILE, cx.faults) {
        Ok(true) => {
            cx.low_space
                .store(true, std::sync::atomic::Ordering::SeqCst);
            tracing::error!(
                reserve_bytes = cx.settings.reserve_bytes,
                "the disk is full: the audit log released its space reserve, which now takes the records of reads; changes are refused until space is freed, and reads too once the reserve is used"
            );
            true
        }
        Ok(false) => false,
        Err(e) => {
            tracing::warn!(error = %e, "cannot release the audit log's space reserve");
            false
        }
    }
}

/// Make the reserve file if it is missing (best effort: a full disk simply has none yet);
/// whether there is one now (or none is wanted). Takes the directory's lock to make it (every
/// writer of the reserve holds it, so a temp file left by one that died is swept here).
pub(super) fn refill_reserve(cx: &Ctx<'_>) -> bool {
    if cx.settings.reserve_bytes == 0 || cx.dir.join(RESERVE_FILE).is_file() {
        return true;
    }
    if let Err(e) = segments::check_dir(cx.dir) {
        tracing::debug!(error = %e, "no space reserve in an audit directory that is refused");
        return false;
    }
    match lock::lock(&cx.dir.join(LOCK_FILE), LockMode::Exclusive, LOCK_TIMEOUT) {
        Ok(_guard) => refill_reserve_locked(cx),
        Err(e) => {
            tracing::debug!(error = %e, "cannot make the audit log's space reserve now");
            false
        }
    }
}

/// [`refill_reserve`], the directory's lock held by the caller.
fn refill_reserve_locked(cx: &Ctx<'_>) -> bool {
    let bytes = cx.settings.reserve_bytes;
    if bytes == 0 {
        return true;
    }
    if !cx.dir.join(RESERVE_FILE).is_file() {
        let _ = durable::sweep_temps_of(cx.dir, &[RESERVE_FILE], cx.faults);
        let zeros = vec![0u8; bytes as usize];
        if let Err(e) = durable::atomic_write(cx.dir, RESERVE_FILE, &zeros, cx.faults) {
            tracing::debug!(error = %e, "no room for the audit log's space reserve yet");
            return false;
        }
    }
    if cx
        .low_space
        .swap(false, std::sync::atomic::Ordering::SeqCst)
    {
        tracing::info!("the audit log's space reserve is back: changes are recorded again");
    }
    true
}
