//! How an appender learns that its record is durable: a [`Promise`] settled by the committer
//! (a callback run on the committer thread, or a channel), and the acknowledgement behind it.

use super::*;

/// What an append's outcome is handed to: a channel, or a [`Promise`].
pub(super) enum Ack {
    Channel(oneshot::Sender<Result<Position, JournalError>>),
    Promise(Arc<Promise>),
}

impl Ack {
    pub(super) fn send(self, res: Result<Position, JournalError>) -> Result<(), ()> {
        match self {
            Ack::Channel(tx) => tx.send(res).map_err(|_| ()),
            Ack::Promise(p) => {
                p.complete(res);
                Ok(())
            }
        }
    }
}

type Callback = Box<dyn FnOnce(Result<Position, JournalError>) + Send>;

enum PromiseState {
    Waiting,
    Done(Result<Position, JournalError>),
    Registered(Vec<Callback>),
    Finished,
}

/// An append's outcome, to be handed to a callback whenever both exist: the callback runs on
/// the committer thread when the append becomes durable, or at once (on the registering thread)
/// if it already is. Lets a server answer a client from the commit itself, with no task woken
/// in between.
pub struct Promise(Mutex<PromiseState>);

impl Promise {
    /// A promise to be kept by [`Promise::complete`] (a store's committer).
    pub fn new() -> Arc<Promise> {
        Arc::new(Promise(Mutex::new(PromiseState::Waiting)))
    }

    /// A promise already kept (an operation that needed no append).
    pub fn ready(res: Result<Position, JournalError>) -> Arc<Promise> {
        Arc::new(Promise(Mutex::new(PromiseState::Done(res))))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, PromiseState> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keep the promise: run the callbacks waiting, remember the outcome for later ones.
    pub fn complete(&self, res: Result<Position, JournalError>) {
        let mut st = self.state();
        match std::mem::replace(&mut *st, PromiseState::Done(res.clone())) {
            PromiseState::Registered(cbs) => {
                drop(st);
                for cb in cbs {
                    cb(res.clone());
                }
            }
            PromiseState::Waiting => {}
            other => *st = other,
        }
    }

    /// Whether the outcome is known.
    pub fn is_done(&self) -> bool {
        !matches!(
            *self.state(),
            PromiseState::Waiting | PromiseState::Registered(_)
        )
    }

    /// Run `cb` with the outcome (now, if it is known). Any number of callbacks may wait.
    pub fn then(&self, cb: impl FnOnce(Result<Position, JournalError>) + Send + 'static) {
        let mut st = self.state();
        match &mut *st {
            PromiseState::Done(res) => {
                let res = res.clone();
                drop(st);
                cb(res);
            }
            PromiseState::Waiting => *st = PromiseState::Registered(vec![Box::new(cb)]),
            PromiseState::Registered(cbs) => cbs.push(Box::new(cb)),
            PromiseState::Finished => {}
        }
    }
}

impl Drop for Promise {
    /// A promise dropped unanswered (the journal closed) answers its callback `Closed`.
    fn drop(&mut self) {
        let st = std::mem::replace(
            self.0.get_mut().unwrap_or_else(PoisonError::into_inner),
            PromiseState::Finished,
        );
        if let PromiseState::Registered(cbs) = st {
            for cb in cbs {
                cb(Err(JournalError::Closed));
            }
        }
    }
}
