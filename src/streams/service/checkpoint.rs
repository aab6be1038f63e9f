//! `checkpoint.*`: a runtime's own snapshot of a run (the plain snapshot contract), kept sealed
//! beside the run's state.

use super::*;

impl Streams {
    /// `checkpoint.put`: an idempotent upsert of a runtime's own snapshot.
    pub fn checkpoint_put(
        &self,
        run_id: &str,
        snapshot: &Map<String, Value>,
    ) -> Result<Value, StreamError> {
        validate_run_id(run_id)?;
        const FIELDS: &[&str] = &[
            "run_id",
            "thread_id",
            "upstream_model",
            "partial_text",
            "completed_tool_calls",
            "in_flight_tool",
            "updated_at_ms",
        ];
        if let Some(k) = snapshot.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(StreamError::SnapshotField {
                field: k.chars().take(40).collect(),
                fields: FIELDS.join(", "),
            });
        }
        if snapshot.get("run_id").is_some_and(|r| r != run_id) {
            return Err(StreamError::SnapshotRunId);
        }
        let mut snap = snapshot.clone();
        snap.insert("run_id".into(), run_id.into());
        snap.entry("updated_at_ms")
            .or_insert_with(|| now_ms().into());
        let snap = Value::Object(snap);
        self.store.put_checkpoint(run_id, &snap)?;
        Ok(json!({"run_id": run_id, "updated_at_ms": snap["updated_at_ms"]}))
    }

    /// `checkpoint.get`.
    pub fn checkpoint_get(&self, run_id: &str) -> Result<Value, StreamError> {
        validate_run_id(run_id)?;
        self.store
            .get_checkpoint(run_id)?
            .ok_or(StreamError::NoCheckpoint)
    }

    /// `checkpoint.delete`.
    pub fn checkpoint_delete(&self, run_id: &str) -> Result<bool, StreamError> {
        validate_run_id(run_id)?;
        self.store.delete_checkpoint(run_id)
    }
}
