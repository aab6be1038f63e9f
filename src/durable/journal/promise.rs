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
    /// One callback: the common case (an append answered from its commit), kept without a
    /// `Vec`'s allocation.
    One(Callback),
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
            PromiseState::One(cb) => {
                drop(st);
                cb(res);
            }
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
            PromiseState::Waiting | PromiseState::One(_) | PromiseState::Registered(_)
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
            PromiseState::Waiting => *st = PromiseState::One(Box::new(cb)),
            PromiseState::One(_) => {
                if let PromiseState::One(first) = std::mem::replace(&mut *st, PromiseState::Waiting)
                {
                    *st = PromiseState::Registered(vec![first, Box::new(cb)]);
                }
            }
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
        match st {
            PromiseState::One(cb) => cb(Err(JournalError::Closed)),
            PromiseState::Registered(cbs) => {
                for cb in cbs {
                    cb(Err(JournalError::Closed));
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorder(
        log: &Arc<Mutex<Vec<String>>>,
        name: &'static str,
    ) -> impl FnOnce(Result<Position, JournalError>) + Send + 'static {
        let log = Arc::clone(log);
        move |res| {
            let what = match res {
                Ok(p) => format!("{name}:ok@{}", p.offset),
                Err(e) => format!("{name}:{e}"),
            };
            log.lock().unwrap().push(what);
        }
    }

    /// However many callbacks wait (none, the one an append registers, or more), each runs
    /// once, in the order registered, when the promise is kept — or at once after that.
    #[test]
    fn every_callback_runs_once_in_order() {
        let at = Position {
            segment: 1,
            offset: 7,
        };
        for waiting in 0..4 {
            let log = Arc::new(Mutex::new(Vec::new()));
            let p = Promise::new();
            let names = ["a", "b", "c"];
            for name in &names[..waiting] {
                p.then(recorder(&log, name));
            }
            assert!(!p.is_done());
            assert!(log.lock().unwrap().is_empty(), "ran before the commit");
            p.complete(Ok(at));
            assert!(p.is_done());
            p.then(recorder(&log, "late"));
            let want: Vec<String> = names[..waiting]
                .iter()
                .chain(&["late"])
                .map(|n| format!("{n}:ok@7"))
                .collect();
            assert_eq!(*log.lock().unwrap(), want, "{waiting} waiting");
        }
        println!("promise: 0 to 3 callbacks waiting, each ran once in order, then a late one");
    }

    /// A promise dropped unkept (the journal closed) answers every waiting callback `Closed`.
    #[test]
    fn an_unkept_promise_answers_closed() {
        for waiting in 1..4 {
            let log = Arc::new(Mutex::new(Vec::new()));
            let p = Promise::new();
            for name in &["a", "b", "c"][..waiting] {
                p.then(recorder(&log, name));
            }
            drop(p);
            let got = log.lock().unwrap().clone();
            assert_eq!(got.len(), waiting);
            assert!(
                got.iter().all(|g| g.ends_with("stream journal is closed")),
                "{got:?}"
            );
        }
    }
}
