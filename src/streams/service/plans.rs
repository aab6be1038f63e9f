//! Recovery wired in: `stream.interrupt` and `stream.resume` plan with the run's own text,
//! calls, counters and stall history, apply the plan, journal it, and (after the streams' lock)
//! annotate R2 plans from the run log.

use super::*;
use crate::recovery::Continuation;

impl Streams {
    /// `stream.interrupt` with the default continuation (`exact`).
    pub fn interrupt(
        &self,
        run_id: &str,
        stream_id: &str,
        cause: &Value,
    ) -> Result<Ticket, StreamError> {
        self.interrupt_as(run_id, stream_id, cause, Continuation::Exact)
    }

    /// `stream.interrupt`: plan the recovery, publish its events. `continuation` is how the
    /// producer will continue the text (an R1/R3 plan records it; replay trims alike).
    pub fn interrupt_as(
        &self,
        run_id: &str,
        stream_id: &str,
        cause: &Value,
        continuation: Continuation,
    ) -> Result<Ticket, StreamError> {
        self.load_if_missing(run_id)?;
        let mut t = self.interrupt_locked(run_id, stream_id, cause, continuation)?;
        if let Answer::Value(plan) = &mut t.answer {
            self.annotate(run_id, plan);
        }
        Ok(t)
    }

    /// Read the run logs for R2 plans (see [`tool_log`](super::tool_log)).
    pub fn attach_tool_log(&self, log: Arc<dyn ToolLog>) {
        let _ = self.tool_log.set(log);
    }

    pub(super) fn annotate(&self, run_id: &str, plan: &mut Value) {
        if let Some(log) = self.tool_log.get() {
            tool_log::annotate(log.as_ref(), run_id, plan);
        }
    }

    /// Put a plan in the run log's recovery timeline (see [`tool_log::log_plan`]). Called once
    /// the plan's journal record is durable; file work: not on an async task.
    pub fn log_plan(&self, run_id: &str, event: &str, plan: &Value) {
        if let Some(log) = self.tool_log.get() {
            tool_log::log_plan(log.as_ref(), run_id, event, plan);
        }
    }

    pub(super) fn interrupt_locked(
        &self,
        run_id: &str,
        stream_id: &str,
        cause: &Value,
        continuation: Continuation,
    ) -> Result<Ticket, StreamError> {
        let mut st = self.lock(run_id);
        let run = Self::run_mut(&mut st, run_id, stream_id)?;
        if run.status == Status::Failed {
            return Err(StreamError::Failed);
        }
        // Only the cause (and its Retry-After) comes from the producer; the text, calls,
        // counters and policy are the run's own.
        let snapshot = match cause {
            Value::String(c) => json!({"cause": c}),
            Value::Object(o) if o.contains_key("status") => json!({"error": o}),
            Value::Object(o) if o.contains_key("cause") => {
                if let Some(k) = o
                    .keys()
                    .find(|k| !["cause", "retry_after"].contains(&k.as_str()))
                {
                    return Err(StreamError::CauseField(k.chars().take(40).collect()));
                }
                Value::Object(o.clone())
            }
            _ => return Err(StreamError::CauseShape),
        };
        let mut input = self.planner_input(run, &snapshot, None)?;
        input.continuation = continuation;
        self.plan_and_record(run, input, "interrupt")
    }

    pub(super) fn planner_input(
        &self,
        run: &mut Run,
        cause: &Value,
        stale: Option<Stale>,
    ) -> Result<Input, StreamError> {
        // Validate first: a refused cause must change nothing (replay would not see it).
        let mut input =
            recovery::input_from_json(cause, now_ms()).map_err(StreamError::BadCause)?;
        let out = run.acc.flush_trim();
        run.push_events(out);
        input.text = run.acc.text.clone();
        input.tool_calls = run.acc.tool_calls();
        input.attempts = run.attempts;
        input.stall_history = run.stall_history.clone();
        input.stale = stale;
        input.policy = self.config.policy.clone();
        let mut b = [0u8; 8];
        input.jitter = getrandom::fill(&mut b)
            .ok()
            .map(|()| (u64::from_le_bytes(b) >> 11) as f64 / (1u64 << 53) as f64);
        Ok(input)
    }

    /// Plan, apply to the run, and journal it; the ticket's answer is the plan.
    pub(super) fn plan_and_record(
        &self,
        run: &mut Run,
        input: Input,
        kind: &str,
    ) -> Result<Ticket, StreamError> {
        let plan = recovery::plan(&input);
        let at = now_ms();
        let (events, plan_json) = run.apply_plan(&plan, &input.cause, at);
        // The record carries what replay needs (kind, cancelled calls, counters, events), not
        // the text so far: a plan of a long turn must stay far below the frame limit.
        let mut compact = plan_json.clone();
        if let Value::Object(m) = &mut compact {
            m.remove("assistant_prefix");
            m.remove("completed");
        }
        let rec = Record::Plan(record::PlanRecord {
            run: run.run_id.to_string(),
            epoch: run.epoch,
            kind: kind.to_owned(),
            plan: compact,
            at,
            input: record::PlanInput {
                cause: input.cause,
                status: input.status,
            },
            events,
        });
        let mut answer = plan_json;
        answer["next_seq"] = run.next_seq.into();
        run.first_segment = run.first_segment.min(self.store.active_mark());
        self.submit(run, &rec, answer)
    }

    /// `stream.resume` with the default continuation (`exact`).
    pub fn resume(
        &self,
        run_id: &str,
        model: Option<String>,
        thread_id: Option<String>,
        fail_on_stale: bool,
    ) -> Result<Ticket, StreamError> {
        self.resume_as(run_id, model, thread_id, fail_on_stale, Continuation::Exact)
    }

    /// `stream.resume`: a new process takes the run over, gets its checkpoint and a plan
    /// (its continuation as declared, see [`Streams::interrupt_as`]).
    pub fn resume_as(
        &self,
        run_id: &str,
        model: Option<String>,
        thread_id: Option<String>,
        fail_on_stale: bool,
        continuation: Continuation,
    ) -> Result<Ticket, StreamError> {
        validate_run_id(run_id)?;
        self.refresh(run_id)?;
        let mut t = self.resume_locked(run_id, model, thread_id, fail_on_stale, continuation)?;
        if let Some(plan) = match &mut t.answer {
            Answer::Value(v) => v.get_mut("plan"),
            Answer::Acked { .. } => None,
        } {
            self.annotate(run_id, plan);
        }
        Ok(t)
    }

    pub(super) fn resume_locked(
        &self,
        run_id: &str,
        model: Option<String>,
        thread_id: Option<String>,
        fail_on_stale: bool,
        continuation: Continuation,
    ) -> Result<Ticket, StreamError> {
        validate_run_id(run_id)?;
        let mut st = self.lock(run_id);
        let run = st.runs.get_mut(run_id).ok_or(StreamError::NotResumable)?;
        let mut why = Vec::new();
        let age = now_ms().saturating_sub(run.updated_at_ms);
        if age > self.config.stale_after.as_millis() as u64 {
            why.push(format!("last event {} s ago", age / 1000));
        }
        if let (Some(want), Some(had)) = (&model, &run.model) {
            if want != had {
                why.push(format!("model {had:?} then, {want:?} now"));
            }
        }
        if let (Some(want), Some(had)) = (&thread_id, &run.thread_id) {
            if want != had {
                why.push("another thread".to_string());
            }
        }
        let stale = (!why.is_empty()).then(|| Stale {
            reason: why.join("; "),
            fail: fail_on_stale,
        });
        if run.ending {
            return Err(StreamError::Ending);
        }
        // What the trimmer holds is decided first (the plan below decides it anyway): the
        // checkpoint must be the text the plan continues from.
        let held = run.acc.flush_trim();
        run.push_events(held);
        let checkpoint = run.checkpoint();
        let (epoch, sid, at) = (run.epoch + 1, new_stream_id(), now_ms());
        let begin = Record::Begin(record::Begin {
            run: run_id.to_owned(),
            epoch,
            sid: sid.clone(),
            thread: thread_id.clone(),
            model: model.clone(),
            at,
        });
        // Sealed before anything changes: a failure here leaves the old holder in place.
        let prepared = self.store.prepare(Out::Record(&begin))?;
        // The new holder, by the rule replay applies to the same record (the plan that follows
        // sets the status and the time again).
        run.begin(epoch, &sid, thread_id, model, at, self.store.active_mark());
        run.held_here = true;
        // Not awaited on its own: the plan record queued after it settles both.
        drop(self.queue_for(run, prepared));
        let mut input =
            self.planner_input(run, &json!({"cause": "resumed_from_checkpoint"}), stale)?;
        input.continuation = continuation;
        let mut t = self.plan_and_record(run, input, "resume")?;
        let plan = std::mem::replace(&mut t.answer, Answer::Value(Value::Null)).into_value();
        t.answer = Answer::Value(json!({
            "stream_id": run.stream_id, "epoch": run.epoch, "next_seq": run.next_seq,
            "checkpoint": checkpoint, "plan": plan,
        }));
        Ok(t)
    }
}
