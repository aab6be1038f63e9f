//! Reading the chain back: every record in order ([`walk`]), and the check of the whole chain
//! ([`verify`]).
//!
//! Readers take the directory's lock shared only to note each segment's length, then read up
//! to those lengths without it: appends only extend a segment, so a writer never waits for a
//! reader of a large log, and a reader never sees half an append.
//!
//! **What [`verify`] proves, and what it cannot.** Each record carries the SHA-256 of its own
//! bytes and its predecessor's hash, so an edited byte, a removed, inserted or reordered
//! record, or a segment removed from the middle or the end is found and named. Dropping the
//! oldest segments is legitimate only under retention, which writes an `audit.drop` record
//! vouching for the first record kept. What no chain can show: a cut of the newest whole
//! records (a shorter chain is still a valid chain), or a chain rewritten from some point on by
//! someone who recomputes the hashes — there is no secret in them, and anyone who can write the
//! files (the same uid) could. Against both, keep the head that `verify` prints somewhere else
//! and check it later with `--anchor SEQ:HASH`: the record numbered SEQ must still be there
//! with that hash, which proves nothing up to it was changed, and that the log was not cut
//! below it.

use std::io;
use std::path::Path;

use serde::Serialize;

use super::record::{check_line, hex, unhex, Entry, LineError, GENESIS};
use super::segments::{self, Segment, LOCK_FILE};
use crate::durable::{lock, LockMode};

/// The segments of `dir` with their lengths now, noted under the lock (shared).
pub fn snapshot(dir: &Path) -> io::Result<Vec<Segment>> {
    segments::check_dir(dir)?;
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let _guard = lock::lock(&dir.join(LOCK_FILE), LockMode::Shared, super::LOCK_TIMEOUT)
        .map_err(|e| io::Error::other(e.to_string()))?;
    segments::list(dir)
}

/// Call `f` with every line of every segment in `segs` (as noted by [`snapshot`]): the
/// segment, the line's number (from 1), the record or why the line is not one, and whether the
/// line is a last one without its newline (cut off).
pub fn walk(
    dir: &Path,
    segs: &[Segment],
    mut f: impl FnMut(&Segment, usize, Result<Entry, LineError>, bool),
) -> io::Result<()> {
    for seg in segs {
        let bytes = match read_segment(dir, seg) {
            Ok(b) => b,
            // Dropped by retention since the snapshot: its records are gone from the chain.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let mut n = 0;
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            n += 1;
            match memchr::memchr(b'\n', rest) {
                Some(i) => {
                    f(seg, n, check_line(&rest[..i]), false);
                    rest = &rest[i + 1..];
                }
                None => {
                    f(seg, n, Err(LineError::NoHash), true);
                    break;
                }
            }
        }
    }
    Ok(())
}

/// The first `seg.len` bytes of a segment.
fn read_segment(dir: &Path, seg: &Segment) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let f = std::fs::File::open(dir.join(&seg.name))?;
    let mut bytes = Vec::with_capacity(seg.len as usize);
    f.take(seg.len).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// One break in the chain, where it was found.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Problem {
    /// The segment file.
    pub segment: String,
    /// The line in it (from 1), if the problem is one line.
    pub line: Option<usize>,
    /// The record's sequence number, if it could be read.
    pub seq: Option<u64>,
    /// What is wrong.
    pub what: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.segment)?;
        if let Some(l) = self.line {
            write!(f, " line {l}")?;
        }
        if let Some(s) = self.seq {
            write!(f, " (seq {s})")?;
        }
        write!(f, ": {}", self.what)
    }
}

/// What [`verify`] found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Verified {
    /// Segments read.
    pub segments: usize,
    /// Records whose line is sound.
    pub records: u64,
    /// The first record's number and time.
    pub first_seq: Option<u64>,
    /// The first record's time.
    pub first_ts: Option<String>,
    /// The last record's number.
    pub last_seq: Option<u64>,
    /// The last record's time.
    pub last_ts: Option<String>,
    /// The last record's hash: keep it elsewhere, check it later with `--anchor`.
    pub head_hash: Option<String>,
    /// Records before this number were dropped by retention (an `audit.drop` vouches).
    pub dropped_through: Option<u64>,
    /// What `--anchor` found, if given.
    pub anchor: Option<String>,
    /// Every break found; empty means the chain verifies.
    pub problems: Vec<Problem>,
}

impl Verified {
    /// Whether the chain verifies.
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Check the chain in `dir`: every line's hash, every link, every segment boundary, the start
/// (genesis, or an `audit.drop` vouching for it) and the end; `anchor` (SEQ, hash), if given,
/// must still be there.
pub fn verify(dir: &Path, anchor: Option<(u64, [u8; 32])>) -> io::Result<Verified> {
    let segs = snapshot(dir)?;
    let mut v = Verified {
        segments: segs.len(),
        ..Verified::default()
    };
    // The last sound record: (seq, hash); `None` at the start and after a damaged line.
    let mut last: Option<(u64, [u8; 32])> = None;
    let mut first: Option<(u64, [u8; 32], String)> = None;
    let mut drops: Vec<(u64, String)> = Vec::new();
    // The segment the previous one's end named, and which segment that was.
    let mut named_next: Option<(String, String)> = None;
    let mut seg_first_line: Option<String> = None;
    let mut anchor_found: Option<bool> = None;
    let mut current_segment: Option<String> = None;
    let mut segment_ended = false;
    fn problem(
        v: &mut Verified,
        seg: &Segment,
        line: Option<usize>,
        seq: Option<u64>,
        what: String,
    ) {
        v.problems.push(Problem {
            segment: seg.name.clone(),
            line,
            seq,
            what,
        });
    }
    walk(dir, &segs, |seg, n, line, torn| {
        if current_segment.as_deref() != Some(seg.name.as_str()) {
            // A new segment: the one before must have ended by naming it.
            if let Some(prev) = &current_segment {
                match &named_next {
                    Some((next, _)) if *next == seg.name => {}
                    Some((next, _)) => v.problems.push(Problem {
                        segment: prev.clone(),
                        line: None,
                        seq: None,
                        what: format!(
                            "ends by naming {next}, but {} follows it: segments are missing or out of place",
                            seg.name
                        ),
                    }),
                    None => v.problems.push(Problem {
                        segment: prev.clone(),
                        line: None,
                        seq: None,
                        what: format!(
                            "does not end with an audit.segment_end record, yet {} follows it",
                            seg.name
                        ),
                    }),
                }
            }
            current_segment = Some(seg.name.clone());
            named_next = None;
            segment_ended = false;
            seg_first_line = None;
        }
        if torn {
            problem(
                &mut v,
                seg,
                Some(n),
                None,
                "an incomplete last line: a crash during an append (the next append cuts it and records the cut), or the file was cut".into(),
            );
            last = None;
            return;
        }
        let e = match line {
            Ok(e) => e,
            Err(why) => {
                problem(
                    &mut v,
                    seg,
                    Some(n),
                    None,
                    format!("not a sound record: {why}"),
                );
                last = None;
                return;
            }
        };
        v.records += 1;
        if segment_ended {
            problem(
                &mut v,
                seg,
                Some(n),
                Some(e.seq),
                "a record after the segment's end".into(),
            );
        }
        if seg_first_line.is_none() {
            seg_first_line = Some(e.hash.clone());
            if e.seq != seg.first {
                problem(
                    &mut v,
                    seg,
                    Some(n),
                    Some(e.seq),
                    format!("the segment's name says it starts at seq {}", seg.first),
                );
            }
        }
        let prev = e.prev_bytes().unwrap_or(GENESIS);
        match last {
            Some((s, h)) => {
                let mut wrong = Vec::new();
                if e.seq != s + 1 {
                    wrong.push(format!("its number follows {s}"));
                }
                if prev != h {
                    wrong.push(format!("its prev is not the hash of record {s}"));
                }
                if !wrong.is_empty() {
                    problem(
                        &mut v,
                        seg,
                        Some(n),
                        Some(e.seq),
                        format!(
                            "the chain breaks here: {} (a record before it was removed, inserted, reordered, or rewritten)",
                            wrong.join(" and ")
                        ),
                    );
                }
            }
            None if first.is_none() => first = Some((e.seq, prev, seg.name.clone())),
            // After a damaged line: that line was the problem; the chain resumes here.
            None => {}
        }
        if let Some((want, hash)) = anchor {
            if e.seq == want {
                anchor_found = Some(e.hash_bytes() == hash);
            }
        }
        match e.op.as_str() {
            "audit.segment_end" => {
                let next = e
                    .detail
                    .as_ref()
                    .and_then(|d| d["next"].as_str())
                    .unwrap_or("")
                    .to_owned();
                named_next = Some((next, seg.name.clone()));
                segment_ended = true;
            }
            "audit.drop" => {
                let d = e.detail.clone().unwrap_or_default();
                if let (Some(t), Some(p)) = (d["through_seq"].as_u64(), d["next_prev"].as_str()) {
                    drops.push((t, p.to_owned()));
                }
            }
            "audit.break" => {
                let why = e
                    .detail
                    .as_ref()
                    .and_then(|d| d["why"].as_str())
                    .unwrap_or("")
                    .to_owned();
                problem(
                    &mut v,
                    seg,
                    Some(n),
                    Some(e.seq),
                    format!("the writer found the log damaged and recorded it: {why}"),
                );
            }
            _ => {}
        }
        if v.first_ts.is_none() {
            v.first_ts = Some(e.ts.clone());
        }
        v.last_seq = Some(e.seq);
        v.last_ts = Some(e.ts.clone());
        v.head_hash = Some(e.hash.clone());
        last = Some((e.seq, e.hash_bytes()));
    })?;
    v.first_seq = first.as_ref().map(|f| f.0);
    if let Some((seq, prev, seg)) = &first {
        if *seq <= 1 {
            if *prev != GENESIS {
                v.problems.push(Problem {
                    segment: seg.clone(),
                    line: Some(1),
                    seq: Some(*seq),
                    what: "the first record of the chain does not start from the genesis hash"
                        .into(),
                });
            }
        } else {
            match drops.iter().find(|(t, p)| t + 1 == *seq && unhex(p) == Some(*prev)) {
                Some((t, _)) => v.dropped_through = Some(*t),
                None => v.problems.push(Problem {
                    segment: seg.clone(),
                    line: Some(1),
                    seq: Some(*seq),
                    what: format!(
                        "the log starts at seq {seq}, and no audit.drop record vouches for the records before it: the oldest segments were removed outside retention, or this one was edited"
                    ),
                }),
            }
        }
    }
    if let Some((next, seg)) = named_next.filter(|(next, _)| !segs.iter().any(|s| s.name == *next))
    {
        v.problems.push(Problem {
            segment: seg,
            line: None,
            seq: v.last_seq,
            what: format!("the newest segment ends by naming {next}, which is missing: the newest records were removed"),
        });
    }
    if let Some((want, hash)) = anchor {
        v.anchor = Some(match anchor_found {
            Some(true) => format!("record {want} is there with the hash given"),
            Some(false) => {
                v.problems.push(Problem {
                    segment: String::from("(anchor)"),
                    line: None,
                    seq: Some(want),
                    what: format!(
                        "record {want} no longer has hash {}: the chain was rewritten up to it",
                        hex(&hash)
                    ),
                });
                format!("record {want} has another hash")
            }
            None if v.first_seq.is_some_and(|f| want < f) && v.dropped_through.is_some() => {
                format!("record {want} was dropped by retention: it cannot be checked any more")
            }
            None => {
                v.problems.push(Problem {
                    segment: String::from("(anchor)"),
                    line: None,
                    seq: Some(want),
                    what: format!(
                        "record {want} is not in the log (it ends at {}): records were cut from its end",
                        v.last_seq.map_or("nothing".into(), |s| s.to_string())
                    ),
                });
                format!("record {want} is missing")
            }
        });
    }
    Ok(v)
}
