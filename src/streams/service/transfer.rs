//! A data set moved between backends (`holdfast migrate --to`): every active run out as one
//! `snap` record (everything it is: events, accumulator, counters, holder) and in through the
//! store like any record; ended runs as their state (the commit point); checkpoints as they
//! are. The importing side must be empty, so nothing is merged or overwritten.

use super::*;
use crate::streams::record::Snapshot;

/// What one backend holds, for a move and its check.
pub struct Export {
    /// Every active run, whole.
    pub active: Vec<Snapshot>,
    /// Every ended run's state.
    pub ended: Vec<(String, Value)>,
    /// Every checkpoint.
    pub checkpoints: Vec<(String, Value)>,
}

impl Streams {
    /// Everything these streams hold (blocking). On a shared store every active run is loaded
    /// first.
    pub fn export(&self) -> Result<Export, StreamError> {
        if let Some(shared) = self.shared() {
            for r in shared.list()? {
                if let Some(id) = r["run_id"].as_str() {
                    self.load_if_missing(id)?;
                }
            }
        }
        let mut active: Vec<Snapshot> = Vec::new();
        for st in self.runs.lock_all() {
            for run in st.runs.values() {
                // A shared store's events come from it below; memory may hold only the latest
                // of a file run's.
                let events = if self.is_shared() {
                    Vec::new()
                } else {
                    self.all_events(run)?
                };
                if let Record::Snapshot(s) = run.snapshot_with(events) {
                    active.push(*s);
                }
            }
        }
        active.sort_by(|a, b| a.run.cmp(&b.run));
        if let Some(shared) = self.shared() {
            // Memory keeps no published event of a shared store's run: the store has them.
            for snap in &mut active {
                snap.events = shared.events(&snap.run)?;
            }
        }
        let mut ended = Vec::new();
        for id in self.store.ended_ids()? {
            let state = self.read_state(&id)?.ok_or(StreamError::NoSuchRun)?;
            ended.push((id, state));
        }
        let mut checkpoints = Vec::new();
        for id in self.store.checkpoint_ids()? {
            if let Some(c) = self.store.get_checkpoint(&id)? {
                checkpoints.push((id, c));
            }
        }
        Ok(Export {
            active,
            ended,
            checkpoints,
        })
    }

    /// Whether these streams hold nothing (the target of a move must not).
    pub fn is_empty(&self) -> Result<bool, StreamError> {
        let active = match self.shared() {
            Some(shared) => shared.list()?.len(),
            None => self.active_runs(),
        };
        Ok(active == 0
            && self.store.ended_ids()?.is_empty()
            && self.store.checkpoint_ids()?.is_empty())
    }

    /// Take in what [`Streams::export`] gave (blocking): each active run as one `snap` record
    /// with all its events, each ended run's state as its commit point, each checkpoint.
    pub fn import(&self, data: &Export) -> Result<(), StreamError> {
        let mut tickets = Vec::new();
        for snap in &data.active {
            let rec = Record::Snapshot(Box::new(clone_snapshot(snap)));
            let prepared = self.store.prepare(Out::Record(&rec))?;
            let mut st = self.lock(&snap.run);
            let mut run = Run::from_snapshot(clone_snapshot(snap), self.store.active_mark());
            // Everything the run published goes with its record (a shared store writes the
            // events for subscribers); it is the run's first record there.
            run.version = 0;
            run.queued = 0;
            run.held_here = true;
            let durable = self.queue_for(&mut run, prepared);
            tickets.push(Ticket {
                run_id: run.run_id.clone(),
                upto: run.end_pos(),
                version: run.version,
                durable,
                answer: Answer::Value(Value::Null),
            });
            st.runs.insert(run.run_id.to_string(), run);
        }
        for t in tickets {
            self.settle_blocking(t)?;
        }
        for (id, state) in &data.ended {
            let ending = EndedOnly {
                run_id: id.clone(),
                at: state["at_ms"].as_u64().unwrap_or_else(now_ms),
            };
            self.store.end_run(state, ending.tail())?;
        }
        for (id, c) in &data.checkpoints {
            self.store.put_checkpoint(id, c)?;
        }
        Ok(())
    }
}

/// A snapshot's copy (the record type is not `Clone`: it is built once per rotation).
fn clone_snapshot(s: &Snapshot) -> Snapshot {
    Snapshot {
        run: s.run.clone(),
        thread: s.thread.clone(),
        model: s.model.clone(),
        epoch: s.epoch,
        sid: s.sid.clone(),
        status: s.status,
        next_seq: s.next_seq,
        events: s.events.clone(),
        acc: s.acc.clone(),
        attempts: s.attempts,
        stall: s.stall.clone(),
        last_plan: s.last_plan.clone(),
        created: s.created,
        updated: s.updated,
    }
}

/// An ended run arriving with only its state: the commit point written as its first record.
struct EndedOnly {
    run_id: String,
    at: u64,
}

impl EndedOnly {
    fn tail(&self) -> store::RunTail<'_> {
        store::RunTail {
            run: &self.run_id,
            from_version: 0,
            epoch: 0,
            sid: "",
            status: Status::Streaming,
            next_seq: 1,
            thread: None,
            model: None,
            created_ms: self.at,
            updated_ms: self.at,
            first_pos: 0,
            copy: 0,
            events: &[],
        }
    }
}
