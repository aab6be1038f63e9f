//! A connection's subscriptions (`cred.watch`, `stream.subscribe`): their numbers, the cap on
//! how many one connection holds, and their off switch (`unsubscribe`).
//!
//! Each subscription is a forwarder task sending notifications into the connection's outbox.
//! `unsubscribe` must be exact for a client to rely on it: once its answer is sent, no line of
//! that subscription follows. So a forwarder sends each line while holding its [`Gate`]'s lock
//! and only if the gate is open, and `unsubscribe` closes the gate (taking the same lock) before
//! its answer is queued: any line sent before that is ahead of the answer in the outbox, and
//! none is sent after. The slot is freed when the gate closes, not when the forwarder notices,
//! so a client that unsubscribes and at once subscribes again never meets the cap.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;
use zeroize::Zeroizing;

use super::outbox::Outbox;
use crate::limits::MAX_SUBSCRIPTIONS_PER_CONNECTION;

/// The open subscriptions of one connection.
#[derive(Default)]
pub struct Subscriptions {
    next: AtomicU64,
    open: Mutex<HashMap<u64, Arc<Gate>>>,
}

/// One subscription's off switch.
#[derive(Default)]
pub struct Gate {
    closed: Mutex<bool>,
    wake: Notify,
}

impl Gate {
    /// Queue `line` unless the subscription was closed. False: closed, or the connection's
    /// outbox is gone (the forwarder should stop either way).
    pub fn send(&self, outbox: &Outbox, line: Zeroizing<Vec<u8>>) -> bool {
        let closed = self.closed.lock().unwrap_or_else(PoisonError::into_inner);
        !*closed && outbox.send(line)
    }

    /// `fut`'s output, or `None` if the subscription is closed (`unsubscribe`) first: what a
    /// forwarder waits on for its next event.
    pub async fn until_closed<F: std::future::Future>(&self, fut: F) -> Option<F::Output> {
        tokio::select! {
            v = fut => Some(v),
            () = self.closed() => None,
        }
    }

    /// Wait until the subscription is closed. Armed before the flag is read, so a close between
    /// the two is not missed.
    async fn closed(&self) {
        let woken = self.wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        if *self.closed.lock().unwrap_or_else(PoisonError::into_inner) {
            return;
        }
        woken.await;
    }

    fn close(&self) {
        *self.closed.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.wake.notify_waiters();
    }
}

impl Subscriptions {
    /// A new subscription: its number and gate, or `None` when the connection already holds
    /// [`MAX_SUBSCRIPTIONS_PER_CONNECTION`].
    pub fn open(&self) -> Option<(u64, Arc<Gate>)> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if open.len() >= MAX_SUBSCRIPTIONS_PER_CONNECTION {
            return None;
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let gate = Arc::new(Gate::default());
        open.insert(id, Arc::clone(&gate));
        Some((id, gate))
    }

    /// `unsubscribe`: close subscription `id`. False if this connection has no such open
    /// subscription (never made, already closed, or ended with its run's `finish`).
    pub fn close(&self, id: u64) -> bool {
        let gate = self
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
        match gate {
            Some(g) => {
                g.close();
                true
            }
            None => false,
        }
    }

    /// A forwarder ended by itself (its run finished, or the connection is going).
    pub fn ended(&self, id: u64) {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
    }

    /// How many are open.
    pub fn count(&self) -> usize {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}
