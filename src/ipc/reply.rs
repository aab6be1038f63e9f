//! How a request is answered, shared by every method family (`creds`, `admin`, `streams`,
//! `runs`) and the router (`handlers`): the [`Answer`] sent once from whichever thread has the
//! result, the blocking pool, and opening a subscription within the connection's cap.

use std::sync::Arc;

use serde_json::Value;

use super::protocol::{self, Id, RpcError};
use super::session::Session;
use crate::error::ErrorKind;

/// Where the answer to one request goes: built and sent once, from whichever thread has the
/// result, straight to the socket when nothing is queued before it ([`Session::send_now`]).
/// Sending from the thread that finished the work saves a wake-up of another thread per
/// request (docs/benchmarks.md, issue 15, eleventh session). An answer dropped unsent (its
/// handler panicked on the blocking pool) answers an internal error, so the client never waits
/// for it forever.
pub struct Answer {
    /// `None` once sent.
    id: Option<Id>,
    session: Arc<Session>,
    /// The operation's audit record, which the answer waits for (ipc/audit.rs).
    audit: Option<super::audit::Pending>,
}

impl Answer {
    /// The answer to request `id` of `session`, waiting for the audit record `audit` (if the
    /// call is audited) before it leaves.
    pub(super) fn with_audit(
        id: Id,
        session: &Arc<Session>,
        audit: Option<super::audit::Pending>,
    ) -> Answer {
        Answer {
            id: Some(id),
            session: Arc::clone(session),
            audit,
        }
    }

    /// Whether the call is an audited change (its `begun` record comes first: [`Self::begin`]).
    pub fn audits_a_change(&self) -> bool {
        self.audit.as_ref().is_some_and(|p| p.is_change())
    }

    /// For a change: write its `begun` audit record durably before the change is made
    /// (blocking: from the blocking pool). An error means the change must not be made.
    pub fn begin(&mut self) -> Result<(), RpcError> {
        match &mut self.audit {
            Some(p) => p.begin(&self.session),
            None => Ok(()),
        }
    }

    /// Send `result` as this request's response.
    pub fn send(mut self, result: Result<Value, RpcError>) {
        self.finish(result);
    }

    fn finish(&mut self, result: Result<Value, RpcError>) {
        let Some(id) = self.id.take() else {
            return;
        };
        if let Some(p) = self.audit.take() {
            return p.deliver(&self.session, id, result);
        }
        let line = match result {
            Ok(v) => protocol::response_ok(&id, v),
            Err(e) => protocol::response_err(&id, &e),
        };
        self.session.send_now(line);
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        if self.id.is_some() {
            self.finish(Err(RpcError::new(
                ErrorKind::Storage,
                "internal error: the daemon failed while handling this request (its log says \
                 why); whether a write took effect is unknown: read it back",
            )));
        }
    }
}

/// Run a blocking store call on tokio's blocking pool.
pub(crate) async fn blocking<T: Send + 'static, E: Into<RpcError> + Send + 'static>(
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, RpcError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| RpcError::internal(&e))?
        .map_err(Into::into)
}

/// A new subscription of this connection, or `busy` at the cap.
pub fn open_subscription(
    session: &Session,
) -> Result<(u64, Arc<super::subscriptions::Gate>), RpcError> {
    session.subscriptions.open().ok_or_else(|| {
        RpcError::new(
            ErrorKind::Busy,
            format!(
                "this connection already has {} subscriptions (one per store or run shown is \
                 enough; `unsubscribe` frees one)",
                crate::limits::MAX_SUBSCRIPTIONS_PER_CONNECTION
            ),
        )
    })
}
