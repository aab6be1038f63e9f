use super::*;
use crate::durable::create_private_dir;
use crate::durable::fault::FaultMode;
use std::fs::{self, OpenOptions};

/// The journal directory inside a temp dir (created 0700 by the journal itself).
fn jd(t: &tempfile::TempDir) -> PathBuf {
    t.path().join("streams")
}

fn open(dir: &Path) -> (Journal, Vec<Replayed>, ReplayReport) {
    Journal::open(dir, Durability::Always, Faults::none()).expect("open journal")
}

fn payloads(frames: &[Replayed]) -> Vec<String> {
    frames
        .iter()
        .map(|f| String::from_utf8(f.payload.clone()).unwrap())
        .collect()
}

/// Frames `"T:I"` from `threads` threads of `per` appends each: each thread's, in its order.
fn assert_each_thread_in_order(frames: &[Replayed], threads: usize, per: usize) {
    for t in 0..threads {
        let mine: Vec<usize> = payloads(frames)
            .iter()
            .filter_map(|p| p.strip_prefix(&format!("{t}:")).map(|i| i.parse().unwrap()))
            .collect();
        assert_eq!(mine, (0..per).collect::<Vec<_>>(), "thread {t}");
    }
}

fn segments(dir: &Path) -> Vec<u64> {
    let mut v: Vec<u64> = fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter_map(|e| segment_number(&e.file_name().to_string_lossy()))
        .collect();
    v.sort_unstable();
    v
}

#[test]
fn appends_replay_in_order_and_continue_after_reopen() {
    let d = tempfile::tempdir().unwrap();
    let (j, frames, report) = open(&jd(&d));
    assert!(frames.is_empty());
    assert_eq!(report.segments, 0);
    let mut positions = Vec::new();
    for i in 0..50 {
        positions.push(j.append_wait(format!("record {i}").into_bytes()).unwrap());
    }
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "positions increase"
    );
    drop(j);
    let (j, frames, report) = open(&jd(&d));
    assert_eq!(report.frames, 50);
    assert!(report.torn_tail.is_none() && report.corrupt.is_empty());
    assert_eq!(payloads(&frames)[49], "record 49");
    assert_eq!(frames.iter().map(|f| f.pos).collect::<Vec<_>>(), positions);
    j.append_wait(b"after reopen".to_vec()).unwrap();
    // One writer at a time.
    let second = Journal::open(&jd(&d), Durability::Always, Faults::none())
        .err()
        .unwrap();
    assert!(second.to_string().contains("in use"), "{second}");
    drop(j);
    let (_, frames, _) = open(&jd(&d));
    assert_eq!(frames.len(), 51);
    assert_eq!(payloads(&frames)[50], "after reopen");
    // One segment, zero-filled to its full size, private.
    let segs = segments(&jd(&d));
    assert_eq!(segs.len(), 1);
    let meta = fs::metadata(jd(&d).join(segment_name(segs[0]))).unwrap();
    assert_eq!(meta.len(), SEGMENT_BYTES);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
}

#[test]
fn concurrent_appends_share_fsyncs() {
    let d = tempfile::tempdir().unwrap();
    let (j, _, _) = open(&jd(&d));
    let j = Arc::new(j);
    let threads = 8;
    let per = 200;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let j = Arc::clone(&j);
            std::thread::spawn(move || {
                for i in 0..per {
                    j.append_wait(format!("{t}:{i}").into_bytes()).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let (appends, syncs) = (
        j.stats().appends.load(Ordering::Relaxed),
        j.stats().syncs.load(Ordering::Relaxed),
    );
    println!(
        "group commit: {threads} threads x {per} acknowledged appends = {appends} appends in {syncs} fsyncs ({:.1} per fsync)",
        appends as f64 / syncs as f64
    );
    assert_eq!(appends, (threads * per) as u64);
    assert!(syncs < appends, "no fsync was shared");
    drop(Arc::try_unwrap(j).unwrap());
    let (_, frames, _) = open(&jd(&d));
    assert_eq!(frames.len(), threads * per);
    // Each thread's records are in its order.
    assert_each_thread_in_order(&frames, threads, per);
}

/// Group commit gathers only while appenders keep coming: after a burst whose batches carried
/// several appends (so the committer gathers the next one), lone appends are still written —
/// the window ends — and everything is acknowledged once, in order.
#[test]
fn lone_appends_after_a_burst_are_not_held_by_the_gathering() {
    let d = tempfile::tempdir().unwrap();
    let (j, _, _) = open(&jd(&d));
    let j = Arc::new(j);
    let burst = 256;
    let pending: Vec<_> = (0..burst)
        .map(|i| j.append(format!("burst:{i}").into_bytes()))
        .collect();
    for rx in pending {
        rx.blocking_recv().unwrap().unwrap();
    }
    let syncs = j.stats().syncs.load(Ordering::Relaxed);
    assert!(
        syncs * committer::GATHER_MIN as u64 <= burst as u64,
        "the burst was not batched ({syncs} fsyncs for {burst}): the gathering is not exercised"
    );
    let lone = 20;
    for i in 0..lone {
        // On a thread, so a committer stuck gathering fails the test instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        let jj = Arc::clone(&j);
        let h = std::thread::spawn(move || {
            let _ = tx.send(jj.append_wait(format!("lone:{i}").into_bytes()));
        });
        rx.recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("lone append {i} was never acknowledged"))
            .unwrap();
        h.join().unwrap();
    }
    println!(
        "gathering: a burst of {burst} appends in {syncs} fsyncs, then {lone} lone appends acknowledged"
    );
    drop(Arc::try_unwrap(j).unwrap());
    let (_, frames, _) = open(&jd(&d));
    let want: Vec<String> = (0..burst)
        .map(|i| format!("burst:{i}"))
        .chain((0..lone).map(|i| format!("lone:{i}")))
        .collect();
    assert_eq!(payloads(&frames), want);
}

/// A crash mid-write leaves the last frame partly written (zeros, or garbage, past some byte):
/// every cut point of it is cut off, the earlier frames survive, and appending resumes cleanly.
#[test]
fn a_torn_last_frame_is_cut_at_every_byte() {
    let mut explored = 0;
    for garbage in [false, true] {
        let probe = tempfile::tempdir().unwrap();
        let (j, _, _) = open(&jd(&probe));
        j.append_wait(b"first".to_vec()).unwrap();
        let last = j.append_wait(b"the last record".to_vec()).unwrap();
        drop(j);
        let frame_len = FRAME_HEADER + b"the last record".len();
        for cut in 0..frame_len {
            let d = tempfile::tempdir().unwrap();
            create_private_dir(&jd(&d), &Faults::none()).unwrap();
            for e in fs::read_dir(jd(&probe)).unwrap().flatten() {
                if e.file_type().unwrap().is_file() {
                    fs::copy(e.path(), jd(&d).join(e.file_name())).unwrap();
                }
            }
            let seg = jd(&d).join(segment_name(last.segment));
            let f = OpenOptions::new().write(true).open(&seg).unwrap();
            let fill = if garbage { 0xA5u8 } else { 0 };
            let rest = vec![fill; frame_len - cut];
            f.write_all_at(&rest, last.offset + cut as u64).unwrap();
            drop(f);
            let (j, frames, report) = open(&jd(&d));
            assert_eq!(
                payloads(&frames),
                vec!["first"],
                "cut at {cut} (garbage {garbage})"
            );
            assert!(report.corrupt.is_empty(), "cut {cut}: {report:?}");
            // Nothing of it reached the disk (cut 0, zeros): a clean end, not a torn tail.
            let expect = (garbage || cut > 0).then_some(last.offset);
            assert_eq!(report.torn_tail.map(|t| t.1), expect, "cut {cut}");
            j.append_wait(b"after".to_vec()).unwrap();
            drop(j);
            let (_, frames, report) = open(&jd(&d));
            assert_eq!(payloads(&frames), vec!["first", "after"], "cut {cut}");
            assert!(
                report.torn_tail.is_none(),
                "cut {cut}: still torn after the cut"
            );
            explored += 1;
        }
    }
    println!("torn tail: {explored} cut points explored (zeros and garbage), 0 acknowledged records lost");
    assert_eq!(explored, 2 * (FRAME_HEADER + 15));
}

#[test]
fn a_bad_frame_in_the_middle_is_quarantined_not_dropped() {
    let d = tempfile::tempdir().unwrap();
    let (j, _, _) = open(&jd(&d));
    let mut pos = Vec::new();
    for i in 0..10 {
        pos.push(j.append_wait(format!("record {i}").into_bytes()).unwrap());
    }
    // Far past the torn-write window, so the damage cannot be a torn tail.
    let far = Position {
        segment: pos[0].segment,
        offset: pos[9].offset + TORN_WINDOW as u64 + 4096,
    };
    drop(j);
    let seg = jd(&d).join(segment_name(pos[0].segment));
    let f = OpenOptions::new().write(true).open(&seg).unwrap();
    // Flip a payload byte of record 4, and leave a stray byte far away.
    f.write_all_at(b"X", pos[4].offset + FRAME_HEADER as u64 + 2)
        .unwrap();
    f.write_all_at(b"\x01", far.offset).unwrap();
    drop(f);
    let (j, frames, report) = open(&jd(&d));
    assert_eq!(
        payloads(&frames),
        (0..4).map(|i| format!("record {i}")).collect::<Vec<_>>()
    );
    assert_eq!(report.corrupt.len(), 1, "{report:?}");
    let (n, off, copy) = &report.corrupt[0];
    assert_eq!((*n, *off), (pos[4].segment, pos[4].offset));
    assert_eq!(
        fs::read(copy).unwrap(),
        fs::read(&seg).unwrap(),
        "the copy is the segment"
    );
    assert!(seg.exists(), "the damaged segment is kept");
    // Appends go to a new segment.
    let p = j.append_wait(b"new".to_vec()).unwrap();
    assert_eq!(p.segment, pos[0].segment + 1);
}

#[test]
fn a_failed_fsync_fails_the_batch_and_poisons_until_reopened() {
    let d = tempfile::tempdir().unwrap();
    let faults = Faults::recorder();
    let (j, _, _) = Journal::open(&jd(&d), Durability::Always, faults.clone()).unwrap();
    j.append_wait(b"durable".to_vec()).unwrap();
    faults.arm(Some(Op::FsyncFile), 1, FaultMode::FailOnce(5));
    let err = j.append_wait(b"lost".to_vec()).unwrap_err();
    assert!(matches!(err, JournalError::Poisoned(_)), "{err}");
    // FailOnce: the disk would now "succeed", but nothing since the failure can be vouched for.
    let err = j.append_wait(b"later".to_vec()).unwrap_err();
    assert!(err.to_string().contains("refuses writes"), "{err}");
    assert!(j.poisoned().is_some());
    drop(j);
    let (j, frames, _) = open(&jd(&d));
    assert_eq!(payloads(&frames)[0], "durable");
    j.append_wait(b"after reopen".to_vec()).unwrap();
}

#[test]
fn segments_roll_over_and_old_ones_are_released() {
    let d = tempfile::tempdir().unwrap();
    let (j, _, _) = Journal::open(&jd(&d), Durability::None, Faults::none()).unwrap();
    let big = vec![b'x'; 1 << 20];
    let mut last = None;
    for i in 0..20u8 {
        let mut p = big.clone();
        p[0] = i;
        last = Some(j.append_wait(p).unwrap());
    }
    let last = last.unwrap();
    assert_eq!(
        last.segment, 2,
        "20 MiB of records span two 16 MiB segments"
    );
    drop(j);
    let (j, frames, _) = Journal::open(&jd(&d), Durability::None, Faults::none()).unwrap();
    assert_eq!(frames.len(), 20);
    assert!(frames
        .iter()
        .enumerate()
        .all(|(i, f)| f.payload[0] == i as u8));
    assert_eq!(segments(&jd(&d)), vec![1, 2]);
    assert_eq!(j.release_before(2).unwrap(), 1);
    assert_eq!(segments(&jd(&d)), vec![2]);
    drop(j);
    let (_, frames, _) = Journal::open(&jd(&d), Durability::None, Faults::none()).unwrap();
    assert!(frames.iter().all(|f| f.pos.segment == 2));
}

#[test]
fn batch_durability_syncs_in_the_background_and_limits_hold() {
    let d = tempfile::tempdir().unwrap();
    let (j, _, _) = Journal::open(
        &jd(&d),
        Durability::Batch(Duration::from_millis(20)),
        Faults::none(),
    )
    .unwrap();
    for i in 0..10 {
        j.append_wait(vec![i + 1]).unwrap();
    }
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        j.stats().syncs.load(Ordering::Relaxed) >= 1,
        "no background fsync"
    );
    assert!(matches!(
        j.append_wait(vec![0; MAX_PAYLOAD + 1]),
        Err(JournalError::TooLarge(_))
    ));
    assert!(matches!(
        j.append_wait(Vec::new()),
        Err(JournalError::TooLarge(0))
    ));
}

/// Assisted, the thread that queued an append commits it itself: its callback runs on that
/// thread, in that call, with no hand-off to the committer thread. The committer thread takes
/// over a batch nobody took within `ASSIST_GRACE` (the fallback). On a loaded machine either
/// may commit a given round (the test thread descheduled between its append and its `assist`,
/// or the committer's grace started before the round was queued: a timed check cannot tell),
/// so the claim is that rounds committed and answered on the appending thread within its
/// `assist` call happen (at least 20), and that every round is answered once, whoever commits.
#[test]
fn an_assisting_thread_commits_what_it_queued_itself() {
    let d = tempfile::tempdir().unwrap();
    let (j, _, _) = open(&jd(&d));
    j.set_assisted(true);
    let me = std::thread::current().id();
    let (mut on_time, mut late, mut rounds) = (0, 0, 0);
    while on_time < 20 && rounds < 2000 {
        let p = j.append_promise(format!("a:{rounds}").into_bytes());
        rounds += 1;
        let (tx, rx) = std::sync::mpsc::channel();
        p.then(move |res| {
            let _ = tx.send((res.is_ok(), std::thread::current().id()));
        });
        j.assist(&|| false);
        let answered = rx.try_recv().ok();
        if let Some((ok, _)) = answered.filter(|(_, on)| *on == me) {
            // Committed and answered by this thread, in this call.
            assert!(ok);
            on_time += 1;
        } else if let Some((ok, _)) = answered {
            // The committer thread took it (its grace ran out first).
            assert!(ok);
            late += 1;
        } else {
            let (ok, _) = rx
                .recv_timeout(Duration::from_secs(10))
                .expect("a late round was never answered");
            assert!(ok);
            late += 1;
        }
    }
    assert!(
        on_time >= 20,
        "only {on_time} of {rounds} rounds assisted in time"
    );
    assert_eq!(j.stats().syncs.load(Ordering::Relaxed), rounds as u64);
    drop(j);
    let (_, frames, _) = open(&jd(&d));
    let want: Vec<String> = (0..rounds).map(|i| format!("a:{i}")).collect();
    assert_eq!(payloads(&frames), want);
    println!(
        "assisted: {on_time} appends committed and answered on the appending thread within its \
         assist call; {late} rounds committed by the committer thread; all answered once"
    );
}

/// Assisted but nobody assists (a runtime whose workers never run out of work): the committer
/// thread commits after the grace, not before, and not never.
#[test]
fn unassisted_appends_are_committed_by_the_thread_after_the_grace() {
    let d = tempfile::tempdir().unwrap();
    let (j, _, _) = open(&jd(&d));
    j.set_assisted(true);
    for i in 0..3 {
        let started = Instant::now();
        j.append_wait(format!("late:{i}").into_bytes()).unwrap();
        let waited = started.elapsed();
        assert!(
            waited >= ASSIST_GRACE,
            "committed after {waited:?}, before the grace of {ASSIST_GRACE:?}"
        );
    }
    // Switched off: the committer thread commits at once again.
    j.set_assisted(false);
    j.append_wait(b"prompt".to_vec()).unwrap();
    drop(j);
    let (_, frames, _) = open(&jd(&d));
    assert_eq!(payloads(&frames), ["late:0", "late:1", "late:2", "prompt"]);
}

/// Threads appending and assisting at once, beside the committer thread: every append is
/// acknowledged once, each thread's records replay in its order, none twice.
#[test]
fn concurrent_assisting_threads_lose_and_repeat_nothing() {
    let d = tempfile::tempdir().unwrap();
    let (j, _, _) = open(&jd(&d));
    j.set_assisted(true);
    let j = Arc::new(j);
    let (threads, per) = (6, 150);
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let j = Arc::clone(&j);
            std::thread::spawn(move || {
                let mut pending = Vec::new();
                for i in 0..per {
                    pending.push(j.append(format!("{t}:{i}").into_bytes()));
                    // Some threads assist after every append, some every few, one never (the
                    // committer thread's grace covers it).
                    if t > 0 && i % t == 0 {
                        j.assist(&|| false);
                    }
                }
                j.assist(&|| false);
                for rx in pending {
                    rx.blocking_recv().unwrap().unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let (appends, syncs) = (
        j.stats().appends.load(Ordering::Relaxed),
        j.stats().syncs.load(Ordering::Relaxed),
    );
    assert_eq!(appends, (threads * per) as u64);
    drop(Arc::try_unwrap(j).unwrap());
    let (_, frames, _) = open(&jd(&d));
    assert_eq!(frames.len(), threads * per);
    assert_each_thread_in_order(&frames, threads, per);
    println!(
        "assisted: {threads} threads x {per} appends, assisting at different rates: {appends} \
         acknowledged once, in order, in {syncs} fsyncs"
    );
}

/// Segment rotation and release, crashed and failed at each of their file-system steps: a
/// journal with three records starts a new segment (as a key rotation does), appends a fourth
/// (the roll: sync, prepare the next segment — temp, zeros, fsync, rename, fsync dir — open it,
/// write, sync) and releases the old segment (unlink, fsync dir). At every step k: a crash
/// (that step and all later refused), EIO once, EIO from then on. Reopened without faults:
/// what replays is in order, none twice, nothing never appended; the released segment's
/// records are all there or all gone (a segment goes whole), the new segment's acknowledged
/// record always there; no temp file is left; the journal appends again.
#[test]
fn segment_rotation_and_release_hold_at_every_crash_and_io_error_point() {
    let all = ["a1", "a2", "a3", "b1"];
    // Armed once the journal is open: the steps counted are the scenario's own.
    let scenario = |faults: &Faults, dir: &Path, arm: Option<(u64, FaultMode)>| {
        let (j, _, _) = Journal::open(dir, Durability::Always, faults.clone()).unwrap();
        // Re-armed (counting from here) even to only count: past the last step, no trigger.
        let (k, mode) = arm.unwrap_or((u64::MAX, FaultMode::Crash));
        faults.arm(None, k, mode);
        let mut acked = Vec::new();
        for p in &all[..3] {
            if j.append_wait(p.as_bytes().to_vec()).is_ok() {
                acked.push(*p);
            }
        }
        j.start_new_segment();
        if j.append_wait(b"b1".to_vec()).is_ok() {
            acked.push("b1");
        }
        let _ = j.release_before(j.active_segment());
        drop(j);
        (acked, faults.steps_seen())
    };
    // The steps of the whole scenario, counted once.
    let d = tempfile::tempdir().unwrap();
    let recorder = Faults::recorder();
    let (acked, steps) = scenario(&recorder, &jd(&d), None);
    assert_eq!(acked, all);
    assert!(steps >= 8, "only {steps} steps: {:?}", recorder.log());
    let modes = [
        ("crash", FaultMode::Crash),
        ("EIO once", FaultMode::FailOnce(5)),
        ("EIO from then on", FaultMode::FailAlways(5)),
    ];
    let mut points = 0;
    let mut acked_total = 0;
    for (mode_name, mode) in modes {
        for k in 1..=steps {
            let d = tempfile::tempdir().unwrap();
            let (acked, _) = scenario(&Faults::recorder(), &jd(&d), Some((k, mode)));
            let (j, frames, report) = open(&jd(&d));
            let got = payloads(&frames);
            let what =
                format!("{mode_name} at step {k} of {steps}: acked {acked:?}, replayed {got:?}");
            assert!(
                report.corrupt.is_empty(),
                "{what}: corrupt {:?}",
                report.corrupt
            );
            // Replayed: a subsequence of what was appended, in order, holding every ack.
            let mut it = all.iter();
            for g in &got {
                assert!(
                    it.any(|a| a == g),
                    "{what}: {g} out of order, twice, or never appended"
                );
            }
            // The release deletes segment 1 (a1..a3) whole, on purpose: its records are there
            // all (every acknowledged one) or not at all; b1, in the segment kept, always.
            let first: Vec<&str> = acked
                .iter()
                .copied()
                .filter(|a| a.starts_with('a'))
                .collect();
            let kept: Vec<&str> = got
                .iter()
                .map(String::as_str)
                .filter(|g| g.starts_with('a'))
                .collect();
            assert!(
                kept.is_empty() || first.iter().all(|a| kept.contains(a)),
                "{what}: segment 1 partly lost"
            );
            if acked.contains(&"b1") {
                assert!(
                    got.iter().any(|g| g == "b1"),
                    "{what}: acknowledged b1 lost"
                );
            }
            let temps: Vec<String> = fs::read_dir(jd(&d))
                .unwrap()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| crate::durable::is_temp_name(n))
                .collect();
            assert!(temps.is_empty(), "{what}: temp files left {temps:?}");
            j.append_wait(b"after".to_vec())
                .unwrap_or_else(|e| panic!("{what}: the reopened journal refuses appends: {e}"));
            points += 1;
            acked_total += acked.len();
        }
    }
    println!(
        "segment rotation and release: {steps} steps x 3 modes = {points} points, {acked_total} \
         acknowledged appends; replays in order, the released segment whole or gone, the new \
         segment's record kept; 0 temp files left"
    );
}

/// A failed fsync in a batch an assisting thread commits is what it is on the committer thread:
/// the batch's appends fail, the journal is poisoned (later appends refused, never retried into
/// success), and what was durable before replays after a reopen.
#[test]
fn a_failed_fsync_in_an_assisted_commit_fails_the_batch_and_poisons() {
    let d = tempfile::tempdir().unwrap();
    let faults = Faults::recorder();
    let (j, _, _) = Journal::open(&jd(&d), Durability::Always, faults.clone()).unwrap();
    j.set_assisted(true);
    let first = j.append_promise(b"durable".to_vec());
    j.assist(&|| false);
    let (tx, rx) = std::sync::mpsc::channel();
    first.then(move |r| {
        let _ = tx.send(r.is_ok());
    });
    assert!(rx.recv().unwrap(), "the first append failed");
    faults.arm(Some(Op::FsyncFile), 1, FaultMode::FailOnce(5));
    let lost = j.append_promise(b"lost".to_vec());
    j.assist(&|| false);
    let (tx, rx) = std::sync::mpsc::channel();
    lost.then(move |r| {
        let _ = tx.send(r.map_err(|e| e.to_string()));
    });
    let err = rx
        .try_recv()
        .expect("not settled by the assisting thread")
        .unwrap_err();
    assert!(err.contains("refuses writes"), "{err}");
    let later = j.append_promise(b"later".to_vec());
    j.assist(&|| false);
    let (tx, rx) = std::sync::mpsc::channel();
    later.then(move |r| {
        let _ = tx.send(r.is_err());
    });
    assert!(
        rx.try_recv().unwrap(),
        "an append after the failed fsync was accepted"
    );
    assert!(j.poisoned().is_some());
    drop(j);
    let (_, frames, _) = open(&jd(&d));
    assert_eq!(payloads(&frames)[0], "durable");
}
