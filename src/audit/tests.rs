//! The audit log's own tests: the chain, rotation and retention, tampering of every kind, a
//! crash or an I/O error at every step of an append, and group commit.
#![allow(clippy::disallowed_methods)] // tests build and damage their fixtures directly

use std::fs;
use std::path::Path;
use std::sync::Arc;

use super::read::{self, Verified};
use super::segments;
use super::*;
use crate::durable::{FaultMode, Faults, Op};

fn who() -> Who {
    Who {
        via: Via::Cli,
        client: Some("test".into()),
        pid: Some(1),
        uid: Some(0),
        ..Who::default()
    }
}

fn rec(i: u64) -> Record {
    Record::new("cred.get", OK, who())
        .store("default")
        .id(&format!("id-{i}"))
}

fn small(segment: u64, max: u64) -> Settings {
    Settings {
        segment_bytes: segment,
        max_bytes: max,
        reserve_bytes: 0,
        ..Settings::default()
    }
}

fn verify(dir: &Path) -> Verified {
    read::verify(dir, None).unwrap()
}

/// Every record's (seq, id) in the log, in order.
fn ids(dir: &Path) -> Vec<(u64, Option<String>, String)> {
    let segs = read::snapshot(dir).unwrap();
    let mut v = Vec::new();
    read::walk(dir, &segs, |_, _, e, _| {
        if let Ok(e) = e {
            v.push((e.seq, e.id, e.op));
        }
    })
    .unwrap();
    v
}

fn segment_files(dir: &Path) -> Vec<String> {
    segments::list(dir)
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect()
}

#[test]
fn records_chain_from_genesis_and_verify() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("audit");
    let log = AuditLog::new(dir.clone(), Settings::default(), Faults::none());
    for i in 1..=50 {
        assert_eq!(log.record(rec(i), i % 2 == 0).unwrap(), i);
    }
    let v = verify(&dir);
    assert!(v.ok(), "{:?}", v.problems);
    assert_eq!(
        (v.records, v.first_seq, v.last_seq),
        (50, Some(1), Some(50))
    );
    let all = ids(&dir);
    assert_eq!(all[0].1.as_deref(), Some("id-1"));
    // A second writer (another process would do the same) continues the chain.
    let other = AuditLog::new(dir.clone(), Settings::default(), Faults::none());
    assert_eq!(other.record(rec(51), true).unwrap(), 51);
    assert_eq!(log.record(rec(52), true).unwrap(), 52);
    assert!(verify(&dir).ok());
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join(segments::segment_name(1))), 0o600);
}

#[test]
fn rotation_and_retention_keep_a_verifiable_chain() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("audit");
    let log = AuditLog::new(dir.clone(), small(4096, 3 * 4096), Faults::none());
    for i in 1..=400 {
        log.record(rec(i), false).unwrap();
    }
    log.close();
    let v = verify(&dir);
    assert!(v.ok(), "{:?}", v.problems);
    let files = segment_files(&dir);
    assert!(files.len() >= 2 && files.len() <= 4, "{files:?}");
    let total: u64 = segments::list(&dir).unwrap().iter().map(|s| s.len).sum();
    assert!(total <= 3 * 4096 + 4096 + 1024, "kept {total} bytes");
    let dropped = v.dropped_through.expect("old segments were dropped");
    assert_eq!(v.first_seq, Some(dropped + 1));
    let kept = ids(&dir);
    let drops = kept.iter().filter(|r| r.2 == "audit.drop").count();
    let ends = kept.iter().filter(|r| r.2 == "audit.segment_end").count();
    // Every caller's record after the drop point is there, in order.
    let mine: Vec<u64> = kept
        .iter()
        .filter_map(|r| r.1.as_deref()?.strip_prefix("id-")?.parse().ok())
        .collect();
    assert_eq!(mine.last(), Some(&400));
    assert!(
        mine.windows(2).all(|w| w[1] == w[0] + 1),
        "no gap among the kept records"
    );
    println!(
        "rotation: 400 records written; kept records {}..=400 in {} segments ({ends} segment ends, {drops} drop records); seq 1..={dropped} dropped by retention; the chain verifies",
        mine[0],
        files.len()
    );
}

/// Damage the log every way a person (or a bug) could, and check that `verify` names the
/// place each time.
#[test]
fn every_kind_of_tampering_is_found_and_named() {
    let make = || {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("audit");
        let log = AuditLog::new(dir.clone(), small(4096, 1 << 20), Faults::none());
        for i in 1..=120 {
            log.record(rec(i), false).unwrap();
        }
        log.close();
        assert!(verify(&dir).ok());
        (d, dir)
    };
    let lines_of = |p: &Path| -> Vec<Vec<u8>> {
        fs::read(p)
            .unwrap()
            .split_inclusive(|&b| b == b'\n')
            .map(<[u8]>::to_vec)
            .collect()
    };
    let write_lines = |p: &Path, lines: &[Vec<u8>]| fs::write(p, lines.concat()).unwrap();
    let mut cases = 0;
    let mut found = 0;
    let mut check = |what: &str, dir: &Path, want_in: &str, anchor: Option<(u64, [u8; 32])>| {
        cases += 1;
        let v = read::verify(dir, anchor).unwrap();
        assert!(!v.ok(), "{what}: not detected");
        let first = v.problems[0].to_string();
        assert!(first.contains(want_in), "{what}: {first}");
        found += 1;
        println!("tamper {what}: found: {first}");
    };
    // An edited byte (the id of record 5).
    let (_d, dir) = make();
    let seg = dir.join(&segment_files(&dir)[0]);
    let mut lines = lines_of(&seg);
    let at = lines[4].windows(4).position(|w| w == b"id-5").unwrap();
    lines[4][at + 3] = b'6';
    write_lines(&seg, &lines);
    check("edit one byte", &dir, "line 5", None);
    // A deleted line.
    let (_d, dir) = make();
    let seg = dir.join(&segment_files(&dir)[0]);
    let mut lines = lines_of(&seg);
    lines.remove(6);
    write_lines(&seg, &lines);
    check("delete a line", &dir, "line 7 (seq 8)", None);
    // Two lines swapped.
    let (_d, dir) = make();
    let seg = dir.join(&segment_files(&dir)[0]);
    let mut lines = lines_of(&seg);
    lines.swap(2, 3);
    write_lines(&seg, &lines);
    check("swap two lines", &dir, "line 3 (seq 4)", None);
    // Cut mid-line.
    let (_d, dir) = make();
    let files = segment_files(&dir);
    let last = dir.join(files.last().unwrap());
    let len = fs::metadata(&last).unwrap().len();
    fs::File::options()
        .write(true)
        .open(&last)
        .unwrap()
        .set_len(len - 10)
        .unwrap();
    check("cut mid-line", &dir, "incomplete last line", None);
    // Whole newest lines cut: a valid shorter chain; only an anchor shows it.
    let (_d, dir) = make();
    let head = verify(&dir);
    let (seq, hash) = (
        head.last_seq.unwrap(),
        record::unhex(head.head_hash.as_deref().unwrap()).unwrap(),
    );
    let last = dir.join(segment_files(&dir).last().unwrap());
    let mut lines = lines_of(&last);
    lines.truncate(lines.len() - 2);
    write_lines(&last, &lines);
    assert!(
        verify(&dir).ok(),
        "a cut at a line boundary is a valid shorter chain"
    );
    check(
        "cut the newest whole lines (with --anchor)",
        &dir,
        "(anchor)",
        Some((seq, hash)),
    );
    // A middle segment removed.
    let (_d, dir) = make();
    let files = segment_files(&dir);
    assert!(files.len() >= 3, "{files:?}");
    fs::remove_file(dir.join(&files[1])).unwrap();
    check("remove a middle segment", &dir, &files[0], None);
    // The newest segment removed.
    let (_d, dir) = make();
    let files = segment_files(&dir);
    fs::remove_file(dir.join(files.last().unwrap())).unwrap();
    check("remove the newest segment", &dir, "missing", None);
    // The oldest segment removed (not by retention).
    let (_d, dir) = make();
    let files = segment_files(&dir);
    fs::remove_file(dir.join(&files[0])).unwrap();
    check(
        "remove the oldest segment",
        &dir,
        "no audit.drop record vouches",
        None,
    );
    // A record rewritten with a recomputed hash of its own: its successor's link breaks.
    let (_d, dir) = make();
    let seg = dir.join(&segment_files(&dir)[0]);
    let mut lines = lines_of(&seg);
    let text = String::from_utf8(lines[9].clone()).unwrap();
    let e: record::Entry = serde_json::from_str(&text).unwrap();
    let mut forged = Vec::new();
    let r = Record::new("cred.get", OK, who())
        .store("default")
        .id("forged");
    record::encode(&r, e.seq, 0, &e.prev_bytes().unwrap(), &mut forged);
    lines[9] = forged;
    write_lines(&seg, &lines);
    check(
        "rewrite a record and its hash",
        &dir,
        "line 11 (seq 11)",
        None,
    );
    println!("tampering: {cases} cases, {found} found and named, 0 missed");
}

#[test]
fn a_torn_tail_is_cut_and_the_cut_recorded() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("audit");
    let log = AuditLog::new(dir.clone(), Settings::default(), Faults::none());
    for i in 1..=3 {
        log.record(rec(i), true).unwrap();
    }
    let seg = dir.join(segments::segment_name(1));
    let mut f = fs::File::options().append(true).open(&seg).unwrap();
    std::io::Write::write_all(&mut f, b"{\"v\":1,\"seq\":4,\"ts\":\"20").unwrap();
    assert!(!verify(&dir).ok());
    let fresh = AuditLog::new(dir.clone(), Settings::default(), Faults::none());
    assert_eq!(fresh.record(rec(4), true).unwrap(), 5);
    let v = verify(&dir);
    assert!(v.ok(), "{:?}", v.problems);
    let all = ids(&dir);
    assert_eq!(all[3].2, "audit.cut");
}

#[test]
fn a_damaged_last_record_is_set_aside_and_the_break_recorded() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("audit");
    let log = AuditLog::new(dir.clone(), small(4096, 1 << 20), Faults::none());
    for i in 1..=60 {
        log.record(rec(i), false).unwrap();
    }
    log.close();
    let files = segment_files(&dir);
    let last = dir.join(files.last().unwrap());
    let mut bytes = fs::read(&last).unwrap();
    let n = bytes.len();
    bytes[n - 20] ^= 1;
    fs::write(&last, &bytes).unwrap();
    let fresh = AuditLog::new(dir.clone(), small(4096, 1 << 20), Faults::none());
    fresh.record(rec(61), true).unwrap();
    assert_eq!(
        fs::read_dir(dir.join(segments::DAMAGED_DIR))
            .unwrap()
            .count(),
        1
    );
    let v = verify(&dir);
    assert!(
        v.problems.iter().any(|p| p.what.contains("moved to")),
        "{:?}",
        v.problems
    );
    println!("damaged last record: {}", v.problems[0]);
}

/// A crash (the process gone at that instant) before each file-system step of a batch of
/// appends that rotates segments and drops old ones; then a fresh writer appends. The chain
/// must verify and every record a caller was told was written must be there.
#[test]
fn a_crash_at_every_step_leaves_a_chain_the_next_writer_continues() {
    let settings = small(4096, 3 * 4096);
    let steps = {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("audit");
        let f = Faults::recorder();
        let log = AuditLog::new(dir, settings.clone(), f.clone());
        for i in 1..=200 {
            log.record(rec(i), i % 7 == 0).unwrap();
        }
        f.steps_seen()
    };
    let (mut explored, mut lost, mut broken) = (0, 0, 0);
    for k in 1..=steps {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("audit");
        let f = Faults::at_step(k, FaultMode::Crash);
        let log = AuditLog::new(dir.clone(), settings.clone(), f);
        let mut acked = Vec::new();
        for i in 1..=200 {
            match log.record(rec(i), i % 7 == 0) {
                Ok(_) => acked.push(i),
                Err(_) => break,
            }
        }
        drop(log);
        let next = AuditLog::new(dir.clone(), settings.clone(), Faults::none());
        next.record(rec(1000), true).unwrap();
        let v = verify(&dir);
        if !v.ok() {
            broken += 1;
            eprintln!("crash at step {k}: {:?}", v.problems);
        }
        let kept: std::collections::BTreeSet<u64> = ids(&dir)
            .iter()
            .filter_map(|r| r.1.as_deref()?.strip_prefix("id-")?.parse().ok())
            .collect();
        let oldest = kept.iter().next().copied().unwrap_or(0);
        // Records older than the oldest kept may have been dropped by retention.
        lost += acked
            .iter()
            .filter(|i| **i >= oldest && !kept.contains(i))
            .count();
        explored += 1;
    }
    println!(
        "audit append: a crash before each of {steps} file-system steps (rotations and drops included), {explored} explored, {lost} acknowledged records lost, {broken} chains broken"
    );
    assert_eq!((lost, broken), (0, 0));
}

/// An I/O error at each step: the record that met it is refused, nothing half-written stays,
/// and the chain verifies; a failed fsync refuses every later record until a reopen.
#[test]
fn an_io_error_at_every_step_refuses_the_record_and_keeps_the_chain() {
    let settings = small(4096, 3 * 4096);
    let steps = {
        let d = tempfile::tempdir().unwrap();
        let f = Faults::recorder();
        let log = AuditLog::new(d.path().join("audit"), settings.clone(), f.clone());
        for i in 1..=200 {
            log.record(rec(i), i % 7 == 0).unwrap();
        }
        f.steps_seen()
    };
    let (mut refused, mut poisoned, mut bad) = (0, 0, 0);
    for errno in [28, 5] {
        for k in 1..=steps {
            let d = tempfile::tempdir().unwrap();
            let dir = d.path().join("audit");
            let log = AuditLog::new(
                dir.clone(),
                settings.clone(),
                Faults::at_step(k, FaultMode::FailOnce(errno)),
            );
            let mut failed = false;
            for i in 1..=200 {
                if log.record(rec(i), i % 7 == 0).is_err() {
                    failed = true;
                }
            }
            if failed {
                refused += 1;
            }
            if log.poisoned().is_some() {
                poisoned += 1;
                assert!(log.record(rec(999), true).is_err(), "poisoned: refused");
            }
            let next = AuditLog::new(dir.clone(), settings.clone(), Faults::none());
            next.record(rec(1000), true).unwrap();
            let v = verify(&dir);
            if !v.ok() {
                bad += 1;
                eprintln!("errno {errno} at step {k}: {:?}", v.problems);
            }
        }
    }
    println!(
        "audit append: ENOSPC and EIO once at each of {steps} steps: {refused} runs had a record refused, {poisoned} poisoned by a failed fsync, {bad} chains broken"
    );
    assert_eq!(bad, 0);
    assert!(refused > 0 && poisoned > 0);
}

#[test]
fn a_full_disk_releases_the_reserve_and_goes_on() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("audit");
    let settings = Settings {
        reserve_bytes: 64 << 10,
        ..Settings::default()
    };
    let log = AuditLog::new(dir.clone(), settings.clone(), Faults::none());
    log.record(rec(1), true).unwrap();
    writer::refill_reserve(&log.inner.cx());
    assert!(dir.join(segments::RESERVE_FILE).exists());
    // The next append meets ENOSPC once: the reserve goes, the retry lands.
    let f = Faults::at_op(Op::Append, 1, FaultMode::FailOnce(28));
    let log = AuditLog::new(dir.clone(), settings.clone(), f);
    log.record(rec(2), true).unwrap();
    assert!(!dir.join(segments::RESERVE_FILE).exists());
    // With no reserve left, a full disk refuses.
    let f = Faults::at_op(Op::Append, 1, FaultMode::FailAlways(28));
    let log = AuditLog::new(dir.clone(), settings, f);
    let e = log.record(rec(3), true).unwrap_err();
    assert_eq!(e.kind(), crate::error::ErrorKind::Storage);
    assert!(e.refusal().contains("No space left"), "{}", e.refusal());
    assert!(verify(&dir).ok());
}

/// Threads recording at once, each waiting for its record to be durable, share syncs.
#[test]
fn concurrent_durable_records_share_syncs() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("audit");
    let settings = Settings {
        durability: Durability::Always,
        ..Settings::default()
    };
    let log = AuditLog::new(dir.clone(), settings, Faults::none());
    log.start_committer().unwrap();
    let (threads, each) = (8u64, 100u64);
    let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let (log, done) = (log.clone(), Arc::clone(&done));
            std::thread::spawn(move || {
                for i in 0..each {
                    if t % 2 == 0 {
                        log.record(rec(t * 1000 + i), true).unwrap();
                    } else {
                        // The committer's path, as the daemon's async callers take it.
                        let (tx, rx) = std::sync::mpsc::channel();
                        log.record_then(
                            rec(t * 1000 + i),
                            false,
                            Box::new(move |r| {
                                let _ = tx.send(r);
                            }),
                        );
                        rx.recv().unwrap().unwrap();
                    }
                    done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    log.close();
    let n = threads * each;
    let v = verify(&dir);
    assert!(v.ok(), "{:?}", v.problems);
    assert_eq!(v.records, n);
    let syncs = log.syncs();
    println!("group commit: {n} durable records from {threads} threads, {syncs} fdatasyncs ({:.1} records per sync)", n as f64 / syncs as f64);
    assert!(syncs < n, "syncs were shared");
}
