//! Runs whose producer is gone. The connections through which a run's holder speaks are
//! attached to the run; when the last one closes without a commit or abort, the producer is
//! lost: `interrupted` (cause `producer_lost`) is published at once and the holder's stream id
//! retired. A producer that resumes within `[streams] orphan_timeout_s` goes on as after any
//! interruption; past it, the run ends as `abandoned`, its text kept for `stream.get`, so every
//! viewer gets `finish`. A daemon restart is no loss: its runs are unattached from the start
//! (no event), and end only if no producer speaks for them within the timeout.

use super::*;
use crate::streams::run::LOST_CAUSE;
use crate::streams::store::SharedStore;

use ending::Holder;

/// What became of a loss.
enum Lose {
    /// Recorded (queued: published once durable).
    Lost,
    /// Nothing to record: resumed, taken over, ended, held again, or another host's.
    Moot,
    /// The store could not take it now: tried again by the next sweep.
    Later(String),
}

/// The connections through which one run's holder (`sid`) speaks.
#[derive(Debug)]
pub(super) struct Holders {
    sid: String,
    conns: Vec<u64>,
}

impl Streams {
    fn holders(&self) -> std::sync::MutexGuard<'_, HashMap<String, Holders>> {
        self.holders
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a connection speaks for `run_id`'s holder `sid` (called with the run's lock
    /// held: the holders' lock is taken after it).
    fn held(&self, run_id: &str, sid: &str) -> bool {
        self.holders()
            .get(run_id)
            .is_some_and(|h| h.sid == sid && !h.conns.is_empty())
    }

    /// Connection `conn` spoke for `stream_id`, the holder of `run_id` (a begin, resume,
    /// interrupt or append answered): the run's producer is there. Whether the run took it
    /// (it is in memory, held by that stream id).
    pub fn attach(&self, run_id: &str, stream_id: &str, conn: u64) -> bool {
        let mut st = self.lock(run_id);
        match st.runs.get_mut(run_id) {
            Some(run) if !stream_id.is_empty() && run.stream_id == stream_id => {
                let mut holders = self.holders();
                let h = holders.entry(run_id.to_owned()).or_insert_with(|| Holders {
                    sid: stream_id.to_owned(),
                    conns: Vec::new(),
                });
                if h.sid != stream_id {
                    // A new holder: the old one's connections hold nothing any more.
                    *h = Holders {
                        sid: stream_id.to_owned(),
                        conns: Vec::new(),
                    };
                }
                if !h.conns.contains(&conn) {
                    h.conns.push(conn);
                }
                run.unattached_since = None;
                true
            }
            _ => false,
        }
    }

    /// The run ended through `conn` (commit or abort): nothing of it is held any more.
    pub fn release(&self, run_id: &str) {
        self.holders().remove(run_id);
    }

    /// Connection `conn` closed (not at shutdown: a restart is no loss) having spoken for
    /// `held` (run id, stream id): each run it was the last connection of loses its producer.
    /// Returns how many did.
    pub fn detach(self: &Arc<Self>, held: &[(String, String)], conn: u64) -> usize {
        let mut lost = 0;
        for (run_id, sid) in held {
            {
                let mut holders = self.holders();
                let Some(h) = holders.get_mut(run_id.as_str()) else {
                    continue;
                };
                if h.sid != *sid {
                    continue; // taken over since: not this connection's run any more
                }
                h.conns.retain(|c| *c != conn);
                if !h.conns.is_empty() {
                    continue;
                }
                holders.remove(run_id.as_str());
            }
            match self.lose(run_id, sid) {
                Lose::Lost => {
                    tracing::info!(run = %run_id, conn,
                        "stream producer lost: its connection closed without commit or abort");
                    lost += 1;
                }
                Lose::Moot => {}
                Lose::Later(why) => {
                    tracing::warn!(run = %run_id, error = %why,
                        "could not record that a run's producer was lost; trying again");
                    self.pending().insert(run_id.clone(), sid.clone());
                }
            }
        }
        lost
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.pending_lost
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Record that `run_id`'s producer (`sid`) is lost, if it still is: held by that stream id
    /// with no connection speaking for it here, and — on a shared store — written last by this
    /// host (another host's connection that spoke since holds it: that host decides when it
    /// closes). A record the store does not keep is tried again by the next sweep.
    fn lose(self: &Arc<Self>, run_id: &str, sid: &str) -> Lose {
        if let Some(shared) = self.shared() {
            match shared.head(run_id) {
                Err(e) => return Lose::Later(e.to_string()),
                Ok(None) => return Lose::Moot,
                Ok(Some(h)) if h.ended || h.sid != sid || h.host != shared.host() => {
                    return Lose::Moot
                }
                Ok(Some(_)) => {}
            }
            if let Err(e) = self.load_if_missing(run_id) {
                return Lose::Later(e.to_string());
            }
        }
        let ticket = {
            let mut st = self.lock(run_id);
            // A connection may have spoken for it since (checked under the run's lock, which
            // every attach takes first).
            if self.held(run_id, sid) {
                return Lose::Moot;
            }
            let Some(run) = st.runs.get_mut(run_id) else {
                return Lose::Moot;
            };
            if run.stream_id != sid || run.ending {
                return Lose::Moot;
            }
            if run.status == Status::Failed {
                // Nothing to resume: no event, only the clock that ends it.
                run.unattached_since.get_or_insert(now_ms());
                return Lose::Moot;
            }
            match self.record_lost(run) {
                Ok(t) => t,
                Err(e) => return Lose::Later(e.to_string()),
            }
        };
        // Published once durable, like any record's events; a record not kept is tried again.
        let (me, run, sid) = (Arc::clone(self), run_id.to_owned(), sid.to_owned());
        self.settle_then(ticket, move |res| {
            if let Err(e) = res {
                tracing::warn!(run = %run, error = %e,
                    "the producer_lost record was not kept; trying again");
                me.pending().insert(run, sid);
            }
        });
        Lose::Lost
    }

    /// Try again the losses not yet recorded.
    fn retry_losses(self: &Arc<Self>) {
        let pending: Vec<(String, String)> = self.pending().drain().collect();
        for (run_id, sid) in pending {
            match self.lose(&run_id, &sid) {
                Lose::Lost => {
                    tracing::info!(run = %run_id, "stream producer lost (recorded late)")
                }
                Lose::Moot => {}
                Lose::Later(why) => {
                    tracing::debug!(run = %run_id, error = %why, "a producer's loss waits still");
                    self.pending().insert(run_id, sid);
                }
            }
        }
    }

    /// A shared store: load the runs another sweep (perhaps another host's) must see. Once,
    /// the runs this host wrote last before it started (no connection holds them: their
    /// clocks start now, as a file journal's runs do at open); every time, the runs
    /// interrupted for longer than the timeout (a `lost` record is an interruption: replayed,
    /// it sets the clock to when the producer was lost).
    fn load_orphans(&self, shared: &dyn SharedStore, cutoff: u64) {
        use std::sync::atomic::Ordering;
        let mut ids = Vec::new();
        let first = !self.adopted.swap(true, Ordering::AcqRel);
        if first {
            match shared.written_here() {
                Ok(v) => ids.extend(v.into_iter().map(|id| (id, true))),
                Err(e) => {
                    self.adopted.store(false, Ordering::Release);
                    tracing::warn!(error = %e, "could not list the runs this host held");
                }
            }
        }
        match shared.interrupted(cutoff) {
            Ok(v) => ids.extend(v.into_iter().map(|id| (id, false))),
            Err(e) => tracing::warn!(error = %e, "could not list interrupted runs"),
        }
        let now = now_ms();
        for (id, held_before) in ids {
            if let Err(e) = self.load_if_missing(&id) {
                tracing::debug!(run = %id, error = %e, "an orphan candidate did not load");
                continue;
            }
            if held_before {
                let mut st = self.lock(&id);
                if let Some(run) = st.runs.get_mut(&id) {
                    if !self.held(&id, &run.stream_id) {
                        run.unattached_since.get_or_insert(now);
                    }
                }
            }
        }
    }

    /// The producer of `run_id`, held by `sid`, is lost: its `lost` record queued (the ticket
    /// settles once it is durable, then the event is published). What `detach` does for the
    /// last holder connection; a run taken over since, ending, or failed is refused.
    pub fn producer_lost(&self, run_id: &str, sid: &str) -> Result<Ticket, StreamError> {
        let mut st = self.lock(run_id);
        let run = Self::run_mut(&mut st, run_id, sid)?;
        if run.status == Status::Failed {
            return Err(StreamError::Failed);
        }
        self.record_lost(run)
    }

    /// Journal a `lost` record for `run` and apply it.
    fn record_lost(&self, run: &mut Run) -> Result<Ticket, StreamError> {
        let at = now_ms();
        let rec = Record::Lost(record::Lost {
            run: run.run_id.to_string(),
            epoch: run.epoch,
            seq: run.next_seq,
            at,
        });
        // Sealed before the run changes: a refusal changes nothing.
        let prepared = self.store.prepare(Out::Record(&rec))?;
        // The trimmer's held text is decided first (it may be published under the flush's
        // seqs, which precede the event's): the record's seq is the one after them.
        let (seq, _) = run.apply_lost(at);
        debug_assert_eq!(seq + 1, run.next_seq);
        let durable = self.queue_for(run, prepared);
        Ok(Ticket {
            run_id: Arc::clone(&run.run_id),
            upto: run.end_pos(),
            version: run.version,
            durable,
            answer: Answer::Value(json!({"cause": LOST_CAUSE})),
        })
    }

    /// End the runs no producer has held for `[streams] orphan_timeout_s` as `abandoned`
    /// (their text kept in the state file, shown by `stream.get` with `reveal`). Returns how
    /// many ended.
    pub fn end_orphans(self: &Arc<Self>) -> usize {
        self.retry_losses();
        let timeout = self.config.orphan_timeout;
        let cutoff = now_ms().saturating_sub(timeout.as_millis() as u64);
        if let Some(shared) = self.shared() {
            self.load_orphans(shared, cutoff);
        }
        let mut due: Vec<(String, String)> = Vec::new();
        self.runs.each(|st| {
            due.extend(
                st.runs
                    .values()
                    .filter(|r| r.unattached_since.is_some_and(|t| t <= cutoff) && !r.ending)
                    .map(|r| (r.run_id.to_string(), r.stream_id.clone())),
            )
        });
        let mut n = 0;
        for (run_id, sid) in due {
            let detail = json!({
                "reason": format!("producer_lost: no producer resumed the run within {} s",
                                  timeout.as_secs()),
            });
            match self.end_with(
                &run_id,
                Holder::Orphan(&sid, cutoff),
                ABANDONED,
                detail,
                false,
            ) {
                Ok(_) => {
                    n += 1;
                    tracing::info!(run = %run_id, "ended a run whose producer was lost as abandoned");
                }
                // Resumed or ended meanwhile (or another host ended it first): not ours to end.
                Err(StreamError::NotHolder { .. }) | Err(StreamError::NotActive) => {}
                Err(StreamError::Journal(crate::durable::journal::JournalError::Fenced)) => {
                    tracing::debug!(run = %run_id, "another host moved the orphaned run on first");
                }
                Err(e) => tracing::warn!(run = %run_id, error = %e,
                    "could not end a run whose producer was lost"),
            }
        }
        n
    }
}

/// What an abandoned run's state keeps of it: the text its subscribers were shown (the
/// trimmer's decision foreseen, as a commit's) and its tool calls as streamed.
pub(super) fn partial_message(run: &Run) -> Value {
    let mut partial = json!({"role": "assistant", "content": run.acc.text_when_flushed()});
    let calls: Vec<Value> = run
        .acc
        .calls
        .iter()
        .map(|c| json!({"id": c.id, "name": c.name, "arguments": c.arguments}))
        .collect();
    if !calls.is_empty() {
        partial["tool_calls"] = Value::Array(calls);
    }
    partial
}

/// The status of a run ended because no producer came back.
pub const ABANDONED: &str = "abandoned";
