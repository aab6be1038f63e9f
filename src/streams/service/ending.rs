//! The end of a run: the commit point (the state file), `stream.commit` / `stream.abort`, and
//! expiry of idle runs.

use super::*;

impl Streams {
    /// The run's state file, if it has one (committed or aborted); an error if it has one
    /// that does not read.
    pub fn read_state(&self, run_id: &str) -> Result<Option<Value>, StreamError> {
        self.store.read_state(run_id)
    }

    /// End runs with no event for `expire_after` (failed, or abandoned by their producer) as
    /// `expired`: their state files keep what they were for inspection. Returns how many.
    pub fn expire_idle(&self) -> usize {
        let cutoff = now_ms().saturating_sub(self.config.expire_after.as_millis() as u64);
        if let Some(shared) = self.shared() {
            let keep = now_ms().saturating_sub(limits::PG_ENDED_EVENTS_KEPT.as_millis() as u64);
            match shared.sweep(keep) {
                Ok(0) => {}
                Ok(n) => tracing::debug!(rows = n, "swept what ended runs no longer need"),
                Err(e) => tracing::warn!(error = %e, "could not sweep ended runs' rows"),
            }
            // Every host's idle runs (whoever expires one first ends it; the others are fenced).
            match shared.idle(cutoff) {
                Ok(ids) => {
                    for id in ids {
                        if let Err(e) = self.load_if_missing(&id) {
                            tracing::warn!(run = %id, error = %e, "could not load an idle run to expire it");
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "could not list idle runs to expire"),
            }
        }
        let mut idle: Vec<(String, String, Status)> = Vec::new();
        self.runs.each(|st| {
            idle.extend(
                st.runs
                    .values()
                    .filter(|r| r.updated_at_ms < cutoff)
                    .map(|r| (r.run_id.to_string(), r.stream_id.clone(), r.status)),
            )
        });
        let mut n = 0;
        for (run_id, sid, status) in idle {
            let detail = json!({"reason": format!("no event for {} s", self.config.expire_after.as_secs()),
                                "was": status});
            match self.end_with(&run_id, Holder::Daemon(&sid), "expired", detail, false) {
                Ok(_) => n += 1,
                Err(e) => tracing::warn!(run = %run_id, error = %e, "could not expire an idle run"),
            }
        }
        if n > 0 {
            tracing::info!(expired = n, "ended idle stream runs as expired");
        }
        n
    }

    /// `stream.commit`: the final message durable and the run ended in one step (see
    /// [`Streams::end`]). With `content_from_stream`, the message's `content` is set to the
    /// text the run's subscribers are shown — everything published, plus what the overlap
    /// trimmer still holds as its last decision will publish it — so the stored message and
    /// the streamed text can never differ (a producer composing it itself cannot see that
    /// decision: it is made after the commit point).
    pub fn commit(
        &self,
        run_id: &str,
        stream_id: &str,
        final_message: Value,
        content_from_stream: bool,
    ) -> Result<Value, StreamError> {
        if content_from_stream && !final_message.is_object() {
            return Err(StreamError::FinalMessageShape);
        }
        self.end_with(
            run_id,
            Holder::Stream(stream_id),
            "committed",
            json!({"final_message": final_message}),
            content_from_stream,
        )
    }

    /// `stream.abort` (and expiry): one atomic step ends the run; then `finish` is published and
    /// the run leaves memory. A failed end leaves it resumable.
    pub fn end(
        &self,
        run_id: &str,
        stream_id: &str,
        status: &str,
        detail: Value,
    ) -> Result<Value, StreamError> {
        self.end_with(run_id, Holder::Stream(stream_id), status, detail, false)
    }

    pub(super) fn end_with(
        &self,
        run_id: &str,
        who: Holder<'_>,
        status: &str,
        mut detail: Value,
        content_from_stream: bool,
    ) -> Result<Value, StreamError> {
        self.load_if_missing(run_id)?;
        let finish = event_json(&json!({"type": "finish", "status": status}));
        let (finish_seq, events_total, ending) = {
            let mut st = self.lock(run_id);
            let run = match who {
                Holder::Stream(stream_id) => Self::run_mut(&mut st, run_id, stream_id)?,
                Holder::Daemon(stream_id) => {
                    let run = st.runs.get_mut(run_id).ok_or(StreamError::NotActive)?;
                    // The run as the daemon saw it when it decided (not since taken over).
                    if run.stream_id != stream_id || run.ending {
                        return Err(StreamError::NotHolder { epoch: run.epoch });
                    }
                    run
                }
                Holder::Orphan(stream_id, cutoff) => {
                    let run = st.runs.get_mut(run_id).ok_or(StreamError::NotActive)?;
                    // Decided again under the lock: a producer that spoke since the sweep
                    // looked (its append is acknowledged) holds the run.
                    if run.stream_id != stream_id
                        || run.ending
                        || run.unattached_since.is_none_or(|t| t > cutoff)
                    {
                        return Err(StreamError::NotHolder { epoch: run.epoch });
                    }
                    detail["partial_message"] = super::orphans::partial_message(run);
                    run
                }
            };
            // From here until the state file is written (or not), nothing else touches the run.
            run.ending = true;
            if content_from_stream {
                // The trimmer's decision, foreseen: the real one is made (identically) after the
                // commit point, when the held text is published.
                detail["final_message"]["content"] = Value::String(run.acc.text_when_flushed());
            }
            let summary = run.summary();
            let mut ending = Ending::of(run);
            if self.store.shared().is_some() {
                // A shared store writes the run's last events with the commit point: those not
                // yet handed to it, what the trimmer holds (foreseen on a copy: a failed end
                // leaves the run as it was), and `finish`.
                let mut acc = run.acc.clone();
                ending.events.extend(acc.flush_trim());
                ending.events.push((run.next_seq, Arc::clone(&finish)));
            }
            (run.next_seq, (run.end_pos(), summary), ending)
        };
        let (events_total, summary) = events_total;
        let mut state = json!({"status": status, "run_id": run_id, "at_ms": now_ms(),
                               "finish_seq": finish_seq, "attempts": summary["attempts"],
                               "last_plan": summary["last_plan"],
                               "text_chars": summary["text_chars"]});
        if let (Value::Object(s), Value::Object(d)) = (&mut state, detail) {
            s.extend(d);
        }
        // The single commit point. Before it: resumable, nothing final kept. After: ended.
        if let Err(e) = self.store.end_run(&state, ending.tail()) {
            let mut st = self.lock(run_id);
            if let Some(run) = st.runs.get_mut(run_id) {
                run.ending = false;
            }
            if self.store.shared().is_some() && matches!(e, StreamError::Journal(_)) {
                // Fenced or not written: the shared store has the run as it is; load it again.
                st.runs.remove(run_id);
            }
            return Err(e);
        }
        let mut st = self.lock(run_id);
        if let Some(mut run) = st.runs.remove(run_id) {
            let held = run.acc.flush_trim();
            run.push_events(held);
            // Everything before finish went out once durable; finish goes out now (the state
            // file is durable) after whatever is still pending in the journal.
            for (s, e) in run.events_since(run.published) {
                for tx in &run.subscribers {
                    tx.push_uncapped(*s, e);
                }
            }
            for tx in run.subscribers.drain(..) {
                tx.push_uncapped(finish_seq, &finish);
            }
        }
        drop(st);
        let rec = Record::End(record::End {
            run: run_id.to_owned(),
            status: status.to_owned(),
        });
        if let Ok(prepared) = self.store.prepare(Out::Record(&rec)) {
            // Not awaited: the state file already decided; this only spares replay a lookup.
            drop(self.store.queue(prepared));
        }
        self.release_segments();
        Ok(
            json!({"run_id": run_id, "status": status, "finish_seq": finish_seq,
                  "events": events_total}),
        )
    }
}

/// Who ends a run: its holder (by stream id), or the daemon itself (expiry, an orphaned run),
/// for the holder it saw when it decided (whose stream id may be retired: empty).
#[derive(Clone, Copy)]
pub(super) enum Holder<'a> {
    /// A producer's `stream.commit` / `stream.abort`.
    Stream(&'a str),
    /// The daemon, for the run as it was held by this stream id.
    Daemon(&'a str),
    /// The daemon ending an orphaned run: held by this stream id and unheld since this time
    /// (Unix ms) or earlier, checked under the run's lock.
    Orphan(&'a str, u64),
}

/// What the commit point writes beside the state: the run's head and its last events, owned
/// (the streams' lock is not held while the store commits).
struct Ending {
    run_id: String,
    version: u64,
    epoch: u64,
    sid: String,
    next_seq: u64,
    created_ms: u64,
    updated_ms: u64,
    first_pos: u64,
    copy: u64,
    events: Vec<(u64, crate::streams::EventJson)>,
}

impl Ending {
    fn of(run: &Run) -> Ending {
        let tail = run.tail();
        Ending {
            run_id: run.run_id.to_string(),
            version: run.version,
            epoch: run.epoch,
            sid: run.stream_id.clone(),
            next_seq: run.next_seq,
            created_ms: run.created_at_ms,
            updated_ms: now_ms(),
            first_pos: tail.first_pos,
            copy: run.copy,
            events: tail.events.to_vec(),
        }
    }

    fn tail(&self) -> store::RunTail<'_> {
        store::RunTail {
            run: &self.run_id,
            from_version: self.version,
            epoch: self.epoch,
            sid: &self.sid,
            status: Status::Streaming,
            next_seq: self.next_seq,
            thread: None,
            model: None,
            created_ms: self.created_ms,
            updated_ms: self.updated_ms,
            first_pos: self.first_pos,
            copy: self.copy,
            events: &self.events,
        }
    }
}
