//! The journal read back: replaying records at open through the same code as live changes,
//! and re-sealing everything under a new key (snapshot records, state and checkpoint files).

use super::*;

/// A run as [`Streams::replay_alone`] leaves it.
#[doc(hidden)]
#[derive(Debug)]
pub struct ReplayedRun {
    /// Its id.
    pub run_id: String,
    /// The seq its next event gets.
    pub next_seq: u64,
    /// Its events in memory: seq and JSON.
    pub events: Vec<(u64, String)>,
}

impl Streams {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn apply_begin(
        st: &mut State,
        run_id: &str,
        epoch: u64,
        stream_id: &str,
        thread_id: Option<String>,
        model: Option<String>,
        at: u64,
        mark: u64,
    ) {
        st.runs
            .entry(run_id.to_owned())
            .or_insert_with(|| Run::new(run_id, at, mark))
            .begin(epoch, stream_id, thread_id, model, at, mark);
    }

    /// Apply one journal record at start-up.
    pub(super) fn replay_record(st: &mut State, rec: Record, segment: u64) {
        match rec {
            Record::Begin(b) => Self::apply_begin(
                st, &b.run, b.epoch, &b.sid, b.thread, b.model, b.at, segment,
            ),
            Record::Events(ev) => {
                let Some(run) = st.runs.get_mut(&ev.run) else {
                    return;
                };
                let first = ev.seq;
                if first != run.next_seq {
                    tracing::warn!(
                        run = %ev.run,
                        "stream journal: a record out of sequence was skipped"
                    );
                    return;
                }
                let mut out = Vec::new();
                for (i, e) in ev.events.iter().enumerate() {
                    let seq = first.saturating_add(i as u64);
                    if let Ok(parsed) = Event::parse(e) {
                        if let Ok(o) = run.acc.apply(seq, &parsed) {
                            out.extend(o);
                        }
                    }
                    run.next_seq = seq.saturating_add(1);
                }
                run.status = Status::Streaming;
                run.updated_at_ms = ev.at;
                run.push_events(out);
            }
            Record::Plan(p) => {
                let Some(run) = st.runs.get_mut(&p.run) else {
                    return;
                };
                let mut out = run.acc.flush_trim();
                run.push_events(std::mem::take(&mut out));
                // Re-plan from the recorded plan's decisions (not re-run: jitter and the clock
                // differ); what matters for the state is the plan kind, its cancelled calls,
                // counters and events.
                match p.plan() {
                    Ok(plan) => {
                        let cause = plan.cause;
                        let _ = run.apply_plan(&plan, &cause, p.at);
                    }
                    Err(e) => tracing::error!(run = %p.run, kind = ?e.classify(),
                        "stream journal: a plan that does not read was skipped"),
                }
            }
            Record::Lost(l) => {
                let Some(run) = st.runs.get_mut(&l.run) else {
                    return;
                };
                if l.seq != run.next_seq || l.epoch != run.epoch {
                    tracing::warn!(run = %l.run, "stream journal: a lost record out of sequence was skipped");
                    return;
                }
                run.apply_lost(l.at);
            }
            Record::Snapshot(snap) => {
                let run_id = snap.run.clone();
                st.runs.insert(run_id, Run::from_snapshot(*snap, segment));
            }
            Record::End(e) => {
                st.runs.remove(&e.run);
            }
            Record::Reseal(_) => {}
        }
    }

    /// Replay `records` into runs from nothing, as at open (without a journal: the fuzz
    /// targets, `fuzz::journal_replay`): each run's id, next seq and its events'
    /// seqs and JSON, in the order memory holds them.
    #[doc(hidden)]
    pub fn replay_alone(records: Vec<Record>) -> Vec<ReplayedRun> {
        let mut st = State {
            runs: HashMap::new(),
        };
        for r in records {
            Self::replay_record(&mut st, r, 0);
        }
        let mut runs: Vec<ReplayedRun> = st
            .runs
            .into_values()
            .map(|run| ReplayedRun {
                run_id: run.run_id.to_string(),
                next_seq: run.next_seq,
                events: run
                    .events
                    .iter()
                    .map(|(s, e)| (*s, e.get().to_owned()))
                    .collect(),
            })
            .collect();
        runs.sort_by(|a, b| a.run_id.cmp(&b.run_id));
        runs
    }

    /// Re-seal everything of the streams under the sealer's current (primary) key: a snapshot
    /// record of every active run (after which the segments holding their older records are
    /// released), and every run's state and checkpoint file. Called during a rotation of the
    /// key, before the old one is forgotten. Returns (runs snapshotted, files re-sealed).
    pub fn reseal(&self) -> Result<(usize, usize), StreamError> {
        if self.is_shared() {
            // Nothing of a shared store is sealed with this host's key.
            return Ok((0, self.store.reseal_files()?));
        }
        let tickets: Vec<(String, Arc<Promise>)> = {
            // Every shard held: no record of any run is queued between the mark and the
            // snapshots.
            let all = self.runs.lock_all();
            // The snapshots open a new segment: everything before them can then go whole.
            self.store.start_new_mark();
            // A marker first, so the new segment starts even with no active run.
            let mark = self
                .store
                .append(Out::Record(&Record::Reseal(record::Reseal {
                    run: String::new(),
                    at: now_ms(),
                })))?;
            let mut v = vec![(String::new(), mark)];
            for run in all.iter().flat_map(|st| st.runs.values()) {
                // The whole run: a snapshot replaces every earlier record, and the segments
                // holding them go.
                let events = self.all_events(run)?;
                let snap = self.store.append(Out::Record(&run.snapshot_with(events)))?;
                v.push((run.run_id.to_string(), snap));
            }
            v
        };
        let runs = tickets.len() - 1;
        for (run_id, p) in tickets {
            let pos = store::wait(&p)?;
            if let Some(run) = self.lock(&run_id).runs.get_mut(&run_id) {
                // Everything the run needs is in the snapshot now.
                run.first_segment = pos.segment;
            }
        }
        self.release_segments();
        let files = self.store.reseal_files()?;
        tracing::info!(runs, files, "streams re-sealed under the current key");
        Ok((runs, files))
    }

    // ---- checkpoints (the plain snapshot contract) ----
}
