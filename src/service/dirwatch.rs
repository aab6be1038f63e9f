//! A directory watcher for a process that writes into the directories it watches: inotify,
//! read by one thread that the daemon's own writes do not keep waking.
//!
//! **Why not `notify`'s watcher.** The daemon watches its stores' `credentials/` directories for
//! other processes' changes, and writes into them itself. `notify` (8.2) watches with a fixed
//! mask that includes `IN_OPEN`, and its thread waits in `epoll` on the inotify descriptor, so
//! every `cred.set` — two opens, a write, a link, a rename — woke that thread once or more,
//! each wake-up a cross-CPU interrupt paid inside the writer's system calls. On this machine
//! kind the watcher cost a lone writer ~25 µs of a ~700 µs set (docs/benchmarks.md, issue 15,
//! eleventh session).
//!
//! **What this one does instead.** The mask leaves out opens and reads (they change nothing).
//! An idle thread blocks in `poll` on the descriptor, so the first event of a burst wakes it;
//! from then on it *collects*: it sleeps a [`Pace::tick`] without watching the descriptor and
//! drains what queued meanwhile, and the kernel queues events for a thread that is not waiting
//! without waking anyone. A stream of writes therefore costs one wake-up per tick, not one per
//! write. What was collected is delivered once no event came for [`Pace::quiet`], or at the
//! latest [`Pace::max_delay`] after its first event (a stream that never pauses is still seen).
//! Events lost to an overflow of the kernel's queue (`IN_Q_OVERFLOW`), a watched directory
//! deleted or moved, or a name that is not UTF-8 make the delivery say "rescan".

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask, Watches};
use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags, Timespec};

/// What changed since the last delivery.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Batch {
    /// The names of the entries events were about, per watched directory.
    pub files: BTreeMap<PathBuf, BTreeSet<String>>,
    /// Something was missed (queue overflow, a watched directory gone, a name that is not
    /// UTF-8): look at everything.
    pub rescan: bool,
}

impl Batch {
    fn is_empty(&self) -> bool {
        self.files.is_empty() && !self.rescan
    }
}

/// When collected events are delivered.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// Deliver once no event came for this long (the end of a burst).
    pub quiet: Duration,
    /// ... or once the first collected event is this old.
    pub max_delay: Duration,
    /// How long the thread sleeps between drains while it collects.
    pub tick: Duration,
}

/// Changes to entries of a watched directory; not opens, reads or closes after reading.
const MASK: WatchMask = WatchMask::CREATE
    .union(WatchMask::CLOSE_WRITE)
    .union(WatchMask::MODIFY)
    .union(WatchMask::ATTRIB)
    .union(WatchMask::MOVED_FROM)
    .union(WatchMask::MOVED_TO)
    .union(WatchMask::DELETE)
    .union(WatchMask::DELETE_SELF)
    .union(WatchMask::MOVE_SELF)
    .union(WatchMask::ONLYDIR);

/// Watched directories by watch descriptor.
type Dirs = Arc<Mutex<HashMap<WatchDescriptor, PathBuf>>>;

/// A running watcher; dropping it stops its thread.
pub struct DirWatcher {
    watches: Watches,
    dirs: Dirs,
    /// An eventfd: written to stop the thread.
    stop: Arc<OwnedFd>,
    wakeups: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl DirWatcher {
    /// Start the thread; `deliver` is called on it with each batch.
    pub fn start(pace: Pace, deliver: impl FnMut(Batch) + Send + 'static) -> io::Result<Self> {
        let inotify = Inotify::init()?;
        let watches = inotify.watches();
        let dirs = Dirs::default();
        let stop = Arc::new(eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?);
        let wakeups = Arc::new(AtomicU64::new(0));
        let collector = Collector {
            inotify,
            dirs: Arc::clone(&dirs),
            stop: Arc::clone(&stop),
            wakeups: Arc::clone(&wakeups),
            pace,
        };
        let thread = std::thread::Builder::new()
            .name("holdfast-watch".into())
            .spawn(move || collector.run(deliver))?;
        Ok(DirWatcher {
            watches,
            dirs,
            stop,
            wakeups,
            thread: Some(thread),
        })
    }

    /// Watch `dir` (again: a directory still watched keeps its watch; one that was replaced
    /// gets a watch on its new inode).
    pub fn watch(&mut self, dir: &Path) -> io::Result<()> {
        let wd = self.watches.add(dir, MASK)?;
        self.dirs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(wd, dir.to_path_buf());
        Ok(())
    }

    /// How many times the thread was woken by the descriptor (a measure of what watching
    /// costs the writers).
    pub fn wakeups(&self) -> u64 {
        self.wakeups.load(Ordering::Relaxed)
    }
}

impl Drop for DirWatcher {
    fn drop(&mut self) {
        let _ = rustix::io::write(&*self.stop, &1u64.to_ne_bytes());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The thread's side.
struct Collector {
    inotify: Inotify,
    dirs: Dirs,
    stop: Arc<OwnedFd>,
    wakeups: Arc<AtomicU64>,
    pace: Pace,
}

/// What a wait ended with.
#[derive(PartialEq)]
enum Woke {
    Stop,
    /// Events to read (or the timeout passed).
    Go,
}

impl Collector {
    fn run(mut self, mut deliver: impl FnMut(Batch)) {
        let mut buf = vec![0u8; 64 * 1024];
        let mut pending = Batch::default();
        let mut first: Option<Instant> = None;
        let mut last = Instant::now();
        loop {
            // Idle: wait on the descriptor. Collecting: sleep a tick, not watching it.
            let woke = if pending.is_empty() {
                let w = self.wait(true, None);
                self.wakeups.fetch_add(1, Ordering::Relaxed);
                w
            } else {
                self.wait(false, Some(self.pace.tick))
            };
            if woke == Woke::Stop {
                return;
            }
            if self.drain(&mut buf, &mut pending) {
                last = Instant::now();
                first.get_or_insert(last);
            }
            let now = Instant::now();
            let due = first.is_some_and(|f| {
                now.duration_since(last) >= self.pace.quiet
                    || now.duration_since(f) >= self.pace.max_delay
            });
            if due && !pending.is_empty() {
                first = None;
                tracing::trace!(
                    dirs = pending.files.len(),
                    names = pending.files.values().map(BTreeSet::len).sum::<usize>(),
                    rescan = pending.rescan,
                    "file watcher: delivering a batch"
                );
                deliver(std::mem::take(&mut pending));
            }
        }
    }

    /// Wait until stopped, or (if `on_events`) events are ready, or `timeout` passed.
    fn wait(&self, on_events: bool, timeout: Option<Duration>) -> Woke {
        let timeout = timeout.map(|t| Timespec {
            tv_sec: i64::try_from(t.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(t.subsec_nanos()),
        });
        loop {
            let mut both = [
                PollFd::new(&*self.stop, PollFlags::IN),
                PollFd::new(&self.inotify, PollFlags::IN),
            ];
            let fds = if on_events {
                &mut both[..]
            } else {
                &mut both[..1]
            };
            match poll(fds, timeout.as_ref()) {
                Ok(_) if fds[0].revents().contains(PollFlags::IN) => return Woke::Stop,
                Ok(_) => return Woke::Go,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    // poll on two valid descriptors does not fail; if it ever does, do not spin.
                    tracing::warn!(error = %e, "file watcher: poll failed");
                    std::thread::sleep(self.pace.tick);
                    return Woke::Go;
                }
            }
        }
    }

    /// Read every queued event into `pending`. Whether there were any.
    fn drain(&mut self, buf: &mut [u8], pending: &mut Batch) -> bool {
        let mut any = false;
        loop {
            let events = match self.inotify.read_events(buf) {
                Ok(events) => events,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return any,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "file watcher: reading events failed; rescanning");
                    pending.rescan = true;
                    return true;
                }
            };
            let mut dirs = self.dirs.lock().unwrap_or_else(PoisonError::into_inner);
            for ev in events {
                any = true;
                if ev.mask.contains(EventMask::Q_OVERFLOW) {
                    tracing::info!("file watcher: the kernel's event queue overflowed");
                    pending.rescan = true;
                    continue;
                }
                if ev.mask.contains(EventMask::IGNORED) {
                    // The watch is gone (its directory was deleted or unmounted).
                    dirs.remove(&ev.wd);
                    pending.rescan = true;
                    continue;
                }
                if ev
                    .mask
                    .intersects(EventMask::DELETE_SELF | EventMask::MOVE_SELF)
                {
                    pending.rescan = true;
                    continue;
                }
                let (Some(dir), Some(name)) = (dirs.get(&ev.wd), ev.name) else {
                    pending.rescan = true;
                    continue;
                };
                match name.to_str() {
                    Some(name) => {
                        pending
                            .files
                            .entry(dir.clone())
                            .or_default()
                            .insert(name.to_owned());
                    }
                    None => pending.rescan = true,
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // the tests play the other process, writing files directly
mod tests {
    use super::*;
    use std::sync::mpsc;

    const PACE: Pace = Pace {
        quiet: Duration::from_millis(100),
        max_delay: Duration::from_millis(400),
        tick: Duration::from_millis(20),
    };

    fn merged(rx: &mpsc::Receiver<Batch>, until: Duration) -> (Batch, usize) {
        let mut all = Batch::default();
        let mut n = 0;
        let deadline = Instant::now() + until;
        while let Ok(b) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            n += 1;
            all.rescan |= b.rescan;
            for (d, f) in b.files {
                all.files.entry(d).or_default().extend(f);
            }
        }
        (all, n)
    }

    /// Every kind of change another process makes is delivered by name (creation, a write, a
    /// rename into place, a chmod, a deletion); reading a file is not an event.
    #[test]
    fn every_change_is_delivered_by_name_and_reads_are_not() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("read-me"), b"x").unwrap();
        std::fs::write(dir.path().join("chmod-me"), b"x").unwrap();
        std::fs::write(dir.path().join("delete-me"), b"x").unwrap();
        let (tx, rx) = mpsc::channel();
        let mut w = DirWatcher::start(PACE, move |b| tx.send(b).unwrap()).unwrap();
        w.watch(dir.path()).unwrap();
        let _ = std::fs::read(dir.path().join("read-me")).unwrap();
        std::fs::write(dir.path().join("new"), b"x").unwrap();
        std::fs::write(dir.path().join(".tmp"), b"y").unwrap();
        std::fs::rename(dir.path().join(".tmp"), dir.path().join("renamed")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            dir.path().join("chmod-me"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        std::fs::remove_file(dir.path().join("delete-me")).unwrap();
        let (all, deliveries) = merged(&rx, Duration::from_secs(2));
        let names: Vec<&str> = all.files[dir.path()].iter().map(String::as_str).collect();
        println!("delivered in {deliveries} batch(es): {names:?}");
        assert_eq!(
            names,
            [".tmp", "chmod-me", "delete-me", "new", "renamed"],
            "every changed name, and not the file that was only read"
        );
        assert!(!all.rescan);
    }

    /// The property the watcher exists for: a stream of writes into a watched directory wakes
    /// its thread about once per tick, not once per write. 2,000 files written over ~0.5 s;
    /// with one wake-up per write there would be hundreds.
    #[test]
    fn a_stream_of_writes_wakes_the_thread_once_per_tick_not_per_write() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, rx) = mpsc::channel();
        let mut w = DirWatcher::start(PACE, move |b| tx.send(b).unwrap()).unwrap();
        w.watch(dir.path()).unwrap();
        let started = Instant::now();
        let n = 2_000;
        for i in 0..n {
            std::fs::write(dir.path().join(format!("f{i:05}")), b"x").unwrap();
            if i % 100 == 99 {
                std::thread::sleep(Duration::from_millis(25));
            }
        }
        let spent = started.elapsed();
        let (all, deliveries) = merged(&rx, Duration::from_secs(2));
        let wakeups = w.wakeups();
        println!(
            "{n} writes over {spent:?}: {wakeups} wake-up(s) of the thread, {deliveries} \
             deliveries, {} names",
            all.files.get(dir.path()).map_or(0, BTreeSet::len)
        );
        assert_eq!(all.files[dir.path()].len(), n, "every name delivered");
        // Idle waits end only when events arrive: at most one per delivery (plus the first).
        assert!(
            wakeups <= deliveries as u64 + 1,
            "{wakeups} wake-ups for {deliveries} deliveries"
        );
        // A delivery needs `quiet` without events or `max_delay` since the first; the writes
        // pause for less than `quiet`, but a loaded machine may stall them longer.
        let most = spent.as_millis() / PACE.quiet.as_millis() + 2;
        assert!(
            deliveries as u128 <= most,
            "{deliveries} deliveries over {spent:?}"
        );
    }

    /// A watched directory that is deleted makes the next delivery say "rescan".
    #[test]
    fn a_watched_directory_deleted_asks_for_a_rescan() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("credentials");
        std::fs::create_dir(&dir).unwrap();
        let (tx, rx) = mpsc::channel();
        let mut w = DirWatcher::start(PACE, move |b| tx.send(b).unwrap()).unwrap();
        w.watch(&dir).unwrap();
        std::fs::remove_dir(&dir).unwrap();
        let (all, _) = merged(&rx, Duration::from_secs(2));
        assert!(all.rescan, "{all:?}");
    }

    /// Dropping the watcher stops its thread promptly, idle or collecting.
    #[test]
    fn dropping_the_watcher_stops_its_thread() {
        for collecting in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let mut w = DirWatcher::start(PACE, |_| {}).unwrap();
            w.watch(dir.path()).unwrap();
            if collecting {
                std::fs::write(dir.path().join("f"), b"x").unwrap();
                std::thread::sleep(Duration::from_millis(5));
            }
            let t = Instant::now();
            drop(w);
            assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        }
    }
}
