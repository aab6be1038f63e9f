//! What memory keeps of a run's events. On a shared store, none once handed to it (the store
//! serves subscribers). On files, a window: the latest [`StreamsConfig::memory_events`]
//! published ones (and any not yet published); older ones are derived again when needed — a subscriber asking for them, a snapshot record that must carry
//! the whole run — from the run's records in the journal, replayed from nothing through the
//! same code as at open, so they are the events subscribers were shown, seq for seq.

use super::*;

impl Streams {
    /// Drop from memory the events the run no longer needs there. On a shared store: every
    /// event already handed to it (the queued write holds its own references). On files: the
    /// published ones older than the window, in steps of a window at least, so the list is
    /// moved once per window of events, not once per append: memory holds at most twice the
    /// window (and what is not yet published).
    pub(super) fn trim(&self, run: &mut Run) {
        if self.is_shared() {
            run.forget_events_before(run.queued);
            return;
        }
        let window = self.config.memory_events.max(1);
        let keep_from = run
            .published
            .min(run.queued)
            .min(run.end_pos().saturating_sub(window));
        if keep_from.saturating_sub(run.events_base) >= window {
            run.forget_events_before(keep_from);
        }
    }

    /// Every event of `run_id` as its records in the journal give them (blocking).
    pub(super) fn derive_events(
        &self,
        run_id: &str,
        first_mark: u64,
    ) -> Result<Vec<(u64, EventJson)>, StreamError> {
        let mut scratch = State {
            runs: HashMap::new(),
        };
        for r in self.store.records_from(first_mark)? {
            if r.record.run() == run_id {
                Self::replay_record(&mut scratch, r.record, r.mark);
            }
        }
        Ok(scratch
            .runs
            .remove(run_id)
            .map(|run| run.events)
            .unwrap_or_default())
    }

    /// The run's whole event list: what memory dropped, derived again, then what it holds
    /// (blocking; for a snapshot record, which replaces every earlier record of the run).
    pub(super) fn all_events(&self, run: &Run) -> Result<Vec<(u64, EventJson)>, StreamError> {
        if run.events_base == 0 {
            return Ok(run.events.clone());
        }
        let mut all = self.derive_events(&run.run_id, run.first_segment)?;
        if all.len() < run.events_base {
            return Err(StreamError::EventsLost {
                run_id: run.run_id.to_string(),
            });
        }
        all.truncate(run.events_base);
        all.extend(run.events.iter().cloned());
        Ok(all)
    }
}

#[cfg(test)]
impl Streams {
    /// How many of the run's events memory holds (tests).
    pub(crate) fn events_in_memory(&self, run_id: &str) -> Option<usize> {
        self.lock(run_id).runs.get(run_id).map(|r| r.events.len())
    }
}
