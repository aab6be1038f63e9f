//! A subscriber's queue of events: bounded for live events, exact when it overflows.
//!
//! The run pushes each event once it is durable. A subscriber that does not keep up (its
//! connection's forwarder is starved, or its client reads slowly) must not make the daemon
//! hold an ever longer queue, and must not lose or repeat an event either. So live pushes stop
//! at [`crate::limits::SUBSCRIBER_QUEUE_EVENTS`]: the feed is marked lagged and dropped by the
//! run, the receiver drains what was queued (all in seq order, none missing), then gets
//! [`Next::Lagged`] and subscribes again after the last seq it took — the run's durable backlog
//! fills the gap exactly. Two pushes ignore the cap, both bounded by what the run already
//! holds: the backlog at subscription and the run's last events with its `finish` (after which
//! the run is gone from memory and a re-subscription could not fill a gap).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;

use super::EventJson;
use crate::limits::SUBSCRIBER_QUEUE_EVENTS;

#[derive(Default)]
struct State {
    events: VecDeque<(u64, EventJson)>,
    /// A live push found the queue full: the run dropped this feed.
    lagged: bool,
    /// The run dropped this feed (it ended, or lagged): nothing more will be pushed.
    closed: bool,
    /// The receiver is gone: pushes are refused so the run drops the feed.
    gone: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    wake: Notify,
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The run's end of a feed.
pub struct FeedTx(Arc<Shared>);

/// The subscriber's end of a feed.
pub struct Feed(Arc<Shared>);

/// What [`Feed::next`] gives.
#[derive(Debug)]
pub enum Next {
    /// The next event, in seq order.
    Event(u64, EventJson),
    /// The feed fell [`SUBSCRIBER_QUEUE_EVENTS`] behind and was dropped after the last event
    /// it gave: subscribe again after that event's seq.
    Lagged,
    /// Nothing more will come (the run ended after its `finish`, or the streams closed).
    Closed,
}

impl PartialEq for Next {
    fn eq(&self, other: &Next) -> bool {
        match (self, other) {
            (Next::Event(a, x), Next::Event(b, y)) => a == b && x.get() == y.get(),
            (Next::Lagged, Next::Lagged) | (Next::Closed, Next::Closed) => true,
            _ => false,
        }
    }
}

/// A new feed: the run keeps the sender, the subscriber the receiver.
pub fn feed() -> (FeedTx, Feed) {
    let shared = Arc::new(Shared::default());
    (FeedTx(Arc::clone(&shared)), Feed(shared))
}

impl FeedTx {
    /// Push a live event. `false` when the feed must be dropped: its receiver is gone, or it
    /// is [`SUBSCRIBER_QUEUE_EVENTS`] behind (then it is marked lagged, and the receiver
    /// re-subscribes once it has drained the queue).
    pub fn push(&self, seq: u64, event: &EventJson) -> bool {
        let mut st = self.0.state();
        if st.gone || st.lagged {
            return false;
        }
        if st.events.len() >= SUBSCRIBER_QUEUE_EVENTS {
            st.lagged = true;
            drop(st);
            self.0.wake.notify_one();
            return false;
        }
        st.events.push_back((seq, std::sync::Arc::clone(event)));
        drop(st);
        self.0.wake.notify_one();
        true
    }

    /// Whether the subscriber dropped its end (a follower can stop).
    pub fn receiver_gone(&self) -> bool {
        self.0.state().gone
    }

    /// Push without the cap: for the backlog at subscription and the run's final events,
    /// both bounded by what the run holds in memory anyway.
    pub fn push_uncapped(&self, seq: u64, event: &EventJson) {
        let mut st = self.0.state();
        if !st.gone && !st.lagged {
            st.events.push_back((seq, std::sync::Arc::clone(event)));
        }
        drop(st);
        self.0.wake.notify_one();
    }
}

impl Drop for FeedTx {
    fn drop(&mut self) {
        self.0.state().closed = true;
        self.0.wake.notify_one();
    }
}

impl Feed {
    /// The next event; [`Next::Lagged`] or [`Next::Closed`] once the queue is drained and
    /// nothing more will be pushed.
    pub async fn next(&mut self) -> Next {
        loop {
            let woken = self.0.wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            {
                let mut st = self.0.state();
                if let Some((seq, ev)) = st.events.pop_front() {
                    return Next::Event(seq, ev);
                }
                if st.lagged {
                    return Next::Lagged;
                }
                if st.closed {
                    return Next::Closed;
                }
            }
            woken.await;
        }
    }

    /// What is queued now, without waiting (tests, and callers draining a finished run).
    pub fn try_next(&mut self) -> Option<Next> {
        let mut st = self.0.state();
        if let Some((seq, ev)) = st.events.pop_front() {
            return Some(Next::Event(seq, ev));
        }
        if st.lagged {
            return Some(Next::Lagged);
        }
        st.closed.then_some(Next::Closed)
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        let mut st = self.0.state();
        st.gone = true;
        st.events.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(v: serde_json::Value) -> EventJson {
        crate::streams::run::event_json(&v)
    }

    fn next_value(n: Option<Next>) -> Option<(u64, serde_json::Value)> {
        match n {
            Some(Next::Event(s, e)) => Some((s, serde_json::from_str(e.get()).unwrap())),
            _ => None,
        }
    }

    /// A feed that falls behind keeps everything queued before the cap, in order, then says
    /// `Lagged`; pushes after that are refused (the run drops it).
    #[test]
    fn lag_is_reported_after_the_queued_events() {
        let (tx, mut rx) = feed();
        let mut pushed = 0u64;
        while tx.push(pushed + 1, &ev(json!({"n": pushed + 1}))) {
            pushed += 1;
        }
        assert_eq!(pushed as usize, SUBSCRIBER_QUEUE_EVENTS);
        assert!(
            !tx.push(pushed + 2, &ev(json!({}))),
            "a lagged feed takes nothing more"
        );
        for want in 1..=pushed {
            assert_eq!(next_value(rx.try_next()), Some((want, json!({"n": want}))));
        }
        assert_eq!(rx.try_next(), Some(Next::Lagged));
        println!("feed: {pushed} events queued, then lagged; none lost before the cap");
    }

    /// The final events and the backlog go past the cap; a dropped sender closes the feed
    /// after what it queued; a dropped receiver makes pushes fail.
    #[test]
    fn uncapped_pushes_close_and_gone() {
        let (tx, mut rx) = feed();
        for s in 1..=(SUBSCRIBER_QUEUE_EVENTS as u64 + 5) {
            tx.push_uncapped(s, &ev(json!(s)));
        }
        drop(tx);
        let mut n = 0;
        while let Some(Next::Event(..)) = rx.try_next() {
            n += 1;
        }
        assert_eq!(n, SUBSCRIBER_QUEUE_EVENTS + 5);
        assert_eq!(rx.try_next(), Some(Next::Closed));
        let (tx, rx) = feed();
        drop(rx);
        assert!(!tx.push(1, &ev(json!(1))));
    }

    #[tokio::test]
    async fn next_waits_for_a_push() {
        let (tx, mut rx) = feed();
        let waiter = tokio::spawn(async move { rx.next().await });
        tokio::task::yield_now().await;
        assert!(tx.push(7, &ev(json!("x"))));
        assert_eq!(
            next_value(Some(waiter.await.unwrap())),
            Some((7, json!("x")))
        );
    }
}
