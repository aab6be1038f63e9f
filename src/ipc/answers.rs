//! Answers to appends, made while the append lane commits a turn and sent after it: by the
//! lane itself when they are few, by the sender thread (`holdfast-send`) when they are many.
//!
//! Why: at 256 streams the lane is the daemon's bottleneck (asleep in `epoll_wait` once per
//! ~200 appends) and a third of its time was the answers' `sendto`s — each wakes the client it
//! answers, which on a VM costs an inter-processor interrupt. Handed to a thread of their own,
//! those wake-ups run on the other CPU while the lane reads the next turn's requests, as the
//! clients answered first send them. A batch of fewer than [`HANDOFF_MIN`] answers (one
//! stream, two or three) is sent by the lane at once: handing it over would add a thread's
//! wake-up to every acknowledgement for little to overlap with.
//!
//! Order: while the lane commits, an answer is queued in its connection's outbox without waking
//! anyone ([`Outbox::push_quiet`](super::outbox::Outbox::push_quiet)); sending it is a flush of
//! that outbox, from whichever thread. Anything sent on the connection later, from any thread,
//! queues behind it, so a connection's answers leave in the order they were made whoever sends
//! them (a client pipelining appends sees `acked_seq` rise).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;

use super::session::Session;

/// A batch of at least this many answers goes to the sender thread; a smaller one is sent by
/// the lane. Measured (docs/benchmarks.md, "Issue 15, ninth session"): at 16 streams (batches
/// of ~8) 4 gave 10 % more appends/s than 16 (`ROUNDS=6 COUNTS=16 scripts/bench-ab.sh`, 41.4 k
/// → 45.6 k/s) for 15 % more server CPU per append (a wake-up of the sender per batch); one
/// stream's batches of one never go.
pub const HANDOFF_MIN: usize = 4;

/// The connections answered while the lane committed, each to be flushed.
#[derive(Default)]
pub struct Batch {
    to: Vec<Arc<Session>>,
}

impl Batch {
    /// How many answers it holds.
    pub fn len(&self) -> usize {
        self.to.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.to.is_empty()
    }

    /// Flush each connection's outbox, in the order answered; the batch is left empty.
    pub fn send(&mut self) {
        for session in self.to.drain(..) {
            session.flush_now();
        }
    }
}

thread_local! {
    /// The batch this thread collects answers into while it commits ([`Sender::commit`]).
    static COLLECTING: RefCell<Option<Batch>> = const { RefCell::new(None) };
}

/// Queue `line`, an append's answer to `session`, for the batch this thread is collecting;
/// `false` when the thread collects none (the answer is then the caller's to send).
pub fn collect(session: &Arc<Session>, line: &[u8]) -> bool {
    COLLECTING.with(|c| match c.borrow_mut().as_mut() {
        Some(batch) => {
            // Refused only when the connection is closing (gone, or over its output cap).
            if session.outbox.push_quiet(line) {
                batch.to.push(Arc::clone(session));
            }
            true
        }
        None => false,
    })
}

#[derive(Default)]
struct Queue {
    full: VecDeque<Batch>,
    /// Sent batches, kept for their buffers.
    empty: Vec<Batch>,
    stopping: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    work: Condvar,
}

impl Shared {
    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The sender thread and the way to hand it answers.
pub struct Sender {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// Batches kept for their buffers (more would only hold memory).
const KEPT: usize = 4;

impl Sender {
    /// Start the thread.
    pub fn start() -> io::Result<Sender> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            work: Condvar::new(),
        });
        let thread = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("holdfast-send".into())
                .spawn(move || run(&shared))?
        };
        Ok(Sender {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Run `commit` (the journal's commit of a turn) collecting the answers it makes, then
    /// send them: here if they are few, on the sender thread if they are many.
    pub fn commit(&self, commit: impl FnOnce()) {
        let batch = self.shared.queue().empty.pop().unwrap_or_default();
        COLLECTING.with(|c| *c.borrow_mut() = Some(batch));
        commit();
        let Some(mut batch) = COLLECTING.with(|c| c.borrow_mut().take()) else {
            return;
        };
        if batch.len() >= HANDOFF_MIN {
            let mut q = self.shared.queue();
            if !q.stopping {
                q.full.push_back(batch);
                drop(q);
                self.shared.work.notify_one();
                return;
            }
        }
        batch.send();
        let mut q = self.shared.queue();
        if q.empty.len() < KEPT {
            q.empty.push(batch);
        }
    }

    /// Send what is queued and stop the thread.
    pub fn stop(&self) {
        self.shared.queue().stopping = true;
        self.shared.work.notify_one();
        join_once(&self.thread);
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Take a thread out of its slot and wait for it to end: once (a later call finds the slot
/// empty and returns), whichever of `stop` and `drop` comes first.
pub(super) fn join_once(slot: &Mutex<Option<JoinHandle<()>>>) {
    let t = slot.lock().unwrap_or_else(PoisonError::into_inner).take();
    if let Some(t) = t {
        let _ = t.join();
    }
}

/// The sender thread: flush each batch handed over, in order, until stopped (a batch queued
/// before the stop is still sent).
fn run(shared: &Shared) {
    let mut q = shared.queue();
    loop {
        if let Some(mut batch) = q.full.pop_front() {
            drop(q);
            // A bug in a flush must not leave every later batch unsent: the batch is dropped
            // (its connections' outboxes still hold what was not sent, for their writer tasks
            // at the next line) and the thread goes on.
            let sent = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| batch.send()));
            if sent.is_err() {
                tracing::error!("answer sender: a flush panicked; its batch is left to the connections' writers");
                batch = Batch::default();
            }
            q = shared.queue();
            if q.empty.len() < KEPT {
                q.empty.push(batch);
            }
            continue;
        }
        if q.stopping {
            return;
        }
        q = shared.work.wait(q).unwrap_or_else(PoisonError::into_inner);
    }
}
