//! A connection's session: what its handlers share (output, grant, subscriptions, the runs its
//! producer holds), and the holding back of answers to pipelined requests so they leave in one
//! send (`cork`).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;
use zeroize::{Zeroize, Zeroizing};

use super::conn::Conn;
use super::outbox::Outbox;
#[cfg(test)]
use super::outbox::OutputBudget;
use crate::config::PluginGrant;

/// Answers to pipelined requests held back to leave in one send, at most this many bytes.
pub(super) const CORK_MAX: usize = 64 * 1024;

/// What a connection's handlers share.
pub struct Session {
    /// Connection number (for logs and leases).
    pub id: u64,
    /// The grant bound by `hello` (`None` until hello): [`Session::bind`].
    grant: Mutex<Option<Arc<PluginGrant>>>,
    /// The grant admits `stream.append` of every run (set with it).
    appends: AtomicBool,
    /// Open subscriptions (`cred.watch`, `stream.subscribe`).
    pub subscriptions: super::subscriptions::Subscriptions,
    /// Responses and events to send.
    pub outbox: Outbox,
    ended: AtomicBool,
    /// Notified when the connection ends (subscription forwarders stop).
    pub ended_notify: Notify,
    /// The socket, for [`Session::send_now`].
    sock: Arc<Conn>,
    /// The peer's pid and uid (`SO_PEERCRED` at accept), for the audit log.
    peer: (Option<u32>, Option<u32>),
    /// Who the audit log says asked: the peer, with the names `hello` gave.
    who: std::sync::OnceLock<crate::audit::Who>,
    /// The runs this connection's producer holds, as (run id, stream id): attached to the run
    /// when first spoken for, detached when the connection closes (the producer is then lost:
    /// `Streams::detach`). Ended runs leave with their commit or abort.
    held: Mutex<Vec<(String, String)>>,
}

impl Session {
    /// The session of connection `id` over `sock`, with no grant yet.
    pub(super) fn new(
        id: u64,
        sock: Arc<Conn>,
        outbox: Outbox,
        peer: (Option<u32>, Option<u32>),
    ) -> Arc<Session> {
        Arc::new(Session {
            id,
            grant: Mutex::new(None),
            appends: AtomicBool::new(false),
            subscriptions: Default::default(),
            outbox,
            ended: AtomicBool::new(false),
            ended_notify: Notify::new(),
            sock,
            peer,
            who: Default::default(),
            held: Mutex::new(Vec::new()),
        })
    }

    /// Wait for `fut` unless the connection ends first (`None`). Subscription forwarders wait
    /// through it, so none outlives its connection. The end notification is armed before the
    /// flags are checked: an end between the check and the wait is not missed.
    pub async fn unless_ended<T>(&self, fut: impl Future<Output = T>) -> Option<T> {
        let ended = self.ended_notify.notified();
        tokio::pin!(ended);
        ended.as_mut().enable();
        if self.has_ended() || self.outbox.is_closed() {
            return None;
        }
        tokio::select! {
            _ = &mut ended => None,
            v = fut => Some(v),
        }
    }

    /// Send a line, writing it to the socket right away if nothing is queued and the socket
    /// takes it without waiting (from any thread: the journal's committer answers appends with
    /// it); otherwise it is queued for the writer task.
    pub fn send_now(&self, line: Zeroizing<Vec<u8>>) -> bool {
        self.outbox.send_now(&self.sock, line)
    }

    /// [`Session::send_now`] of a line on the caller's stack (copied only if it must be
    /// queued).
    pub fn send_now_bytes(&self, line: &[u8]) -> bool {
        self.outbox.send_now_bytes(&self.sock, line)
    }

    /// Send what this connection's outbox holds, from this thread, as far as the socket takes
    /// it now ([`Outbox::flush_now`]).
    pub fn flush_now(&self) {
        self.outbox.flush_now(&self.sock);
    }

    /// Who the audit log says asked on this connection: the peer, and the client and plugin
    /// names `hello` gave (set once, by [`Session::name`]).
    pub fn audit_who(&self) -> crate::audit::Who {
        match self.who.get() {
            Some(w) => w.clone(),
            None => crate::audit::Who {
                via: crate::audit::Via::Daemon,
                pid: self.peer.0,
                uid: self.peer.1,
                conn: Some(self.id),
                ..Default::default()
            },
        }
    }

    /// The names `hello` gave (cut to 64 characters), for the audit log.
    pub fn name(&self, client: Option<&str>, plugin: Option<&str>) {
        let cut = |s: &str| -> Arc<str> {
            crate::audit::record::cut_chars(s, crate::audit::record::MAX_NAME_CHARS).into()
        };
        let mut who = self.audit_who();
        who.client = client.map(cut);
        who.plugin = plugin.map(cut);
        let _ = self.who.set(who);
    }

    /// Bind the grant `hello` chose; `appends` says whether it admits `stream.append` of every
    /// run (then an append needs no look at the grant).
    pub fn bind(&self, grant: Arc<PluginGrant>, appends: bool) {
        *self.grant.lock().unwrap_or_else(PoisonError::into_inner) = Some(grant);
        self.appends.store(appends, Ordering::Release);
    }

    /// Whether `hello` bound a grant that admits `stream.append` of every run (the hottest
    /// request's admission, without the grant's lock). `false` for a grant limited to some
    /// runs: each of its appends is admitted with the grant and its run id.
    pub fn may_append(&self) -> bool {
        self.appends.load(Ordering::Acquire)
    }

    /// The grant, if `hello` was sent.
    pub fn grant(&self) -> Option<Arc<PluginGrant>> {
        self.grant
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// A session over `sock` with no grant yet (tests of what serves a connection).
    #[cfg(test)]
    pub(super) fn for_test(id: u64, sock: Arc<Conn>) -> Arc<Session> {
        Arc::new(Session {
            id,
            grant: Mutex::new(None),
            appends: AtomicBool::new(false),
            subscriptions: Default::default(),
            outbox: Outbox::new(1 << 20, OutputBudget::new(1 << 30), Arc::new(Notify::new())),
            ended: AtomicBool::new(false),
            ended_notify: Notify::new(),
            sock,
            peer: (None, None),
            who: Default::default(),
            held: Mutex::new(Vec::new()),
        })
    }

    /// Whether this connection already spoke for `stream_id` of `run_id` (an append's check:
    /// one short list, usually of one run).
    pub fn holds(&self, run_id: &str, stream_id: &str) -> bool {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .any(|(r, s)| r == run_id && s == stream_id)
    }

    /// This connection speaks for `stream_id` of `run_id` (it replaces an older holder id of
    /// the same run).
    pub fn hold(&self, run_id: &str, stream_id: &str) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.retain(|(r, _)| r != run_id);
        held.push((run_id.to_owned(), stream_id.to_owned()));
    }

    /// Whether this connection speaks for any run: then it is a producer, perhaps waiting on
    /// a model that thinks for minutes, and the idle timeout must not close it (that would
    /// declare its runs' producer lost).
    pub fn holds_any(&self) -> bool {
        !self
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    }

    /// The run ended (committed or aborted through this connection).
    pub fn release_run(&self, run_id: &str) {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|(r, _)| r != run_id);
    }

    /// What the connection held when it closed.
    pub(super) fn take_held(&self) -> Vec<(String, String)> {
        std::mem::take(&mut *self.held.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Whether the connection has ended.
    pub fn has_ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst)
    }

    /// The connection ended: subscription forwarders stop.
    pub(super) fn end(&self) {
        self.ended.store(true, Ordering::SeqCst);
        self.ended_notify.notify_waiters();
    }
}

/// Hold `reply` back in `corked`. The buffer never grows: answers may hold secrets, and a `Vec`
/// that reallocates leaves copies of them in the memory it frees, where zeroizing cannot reach
/// (docs/design.md). It is sized once (when first needed) and reused: sent first when the reply
/// would not fit, and replaced only by one large enough for a reply bigger than it.
pub(super) fn cork(session: &Session, corked: &mut Zeroizing<Vec<u8>>, reply: &[u8]) {
    if corked.capacity() - corked.len() < reply.len() {
        uncork(session, corked);
        if corked.capacity() < reply.len() {
            *corked = Zeroizing::new(Vec::with_capacity(CORK_MAX.max(reply.len())));
        }
    }
    corked.extend_from_slice(reply);
}

/// Send the answers held back in `corked`, if any. The socket takes them from the buffer, or
/// the outbox copies what must wait into a buffer of its own size (never this one: 64 KiB held
/// per answer batch was how 20,000 pipelined gets took 1.25 GB); the buffer is zeroized and
/// kept for the next batch.
pub(super) fn uncork(session: &Session, corked: &mut Zeroizing<Vec<u8>>) {
    if !corked.is_empty() {
        session.send_now_bytes(corked);
        corked.zeroize();
    }
}

/// Let go of the cork buffer while the connection waits for its client (an idle connection
/// holds none).
pub(super) fn release_cork(session: &Session, corked: &mut Zeroizing<Vec<u8>>) {
    uncork(session, corked);
    *corked = Zeroizing::new(Vec::new());
}
