//! The daemon's background jobs, each its own task on its own interval, owned by [`Jobs`] and
//! stopped (and waited for) at shutdown:
//! - **index flush** (`INDEX_FLUSH_INTERVAL`): stores opened with deferred index rewrites write
//!   their pending index, and spare files idle too long are unlinked;
//! - **rescan** (`RESCAN_INTERVAL`): the safety net under the watcher — every store directory is
//!   watched again (a replaced directory lost its inotify watch) and rescanned in full;
//! - **stream expiry** (`RESCAN_INTERVAL`): runs idle past `expire_after` end as `expired`;
//! - **orphaned runs** (a tenth of `[streams] orphan_timeout_s`, 1-10 s): runs no producer has
//!   held for the timeout end as `abandoned`;
//! - **run-log retention** (`RUN_PRUNE_INTERVAL`, the first a minute after start): runs idle past
//!   `[runs] retention_days` are deleted.
//!
//! Each job's work is file work: it runs on the blocking pool, one at a time per job.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::limits::{INDEX_FLUSH_INTERVAL, RESCAN_INTERVAL, RUN_PRUNE_INTERVAL};
use crate::service::{watch as store_watch, Daemon};

/// The first retention sweep runs this long after start (then every `RUN_PRUNE_INTERVAL`).
const FIRST_PRUNE_AFTER: Duration = Duration::from_secs(60);

/// The running background jobs.
pub struct Jobs {
    tasks: JoinSet<()>,
    stop: watch::Sender<bool>,
}

impl Jobs {
    /// Start every job for `daemon`.
    pub fn start(daemon: &Arc<Daemon>) -> Jobs {
        let (stop, stopped) = watch::channel(false);
        let mut tasks = JoinSet::new();
        let job = |name: &'static str, first: Duration, every: Duration, work: fn(&Daemon)| {
            every_interval(
                Arc::clone(daemon),
                stopped.clone(),
                name,
                first,
                every,
                work,
            )
        };
        tasks.spawn(job(
            "index flush",
            INDEX_FLUSH_INTERVAL,
            INDEX_FLUSH_INTERVAL,
            Daemon::flush_dirty,
        ));
        tasks.spawn(job("rescan", RESCAN_INTERVAL, RESCAN_INTERVAL, |d| {
            d.rewatch();
            store_watch::sync_stores(d, None);
        }));
        // Orphaned runs: a tenth of the timeout apart (1-10 s), so a run ends at most that
        // late.
        let orphans = (daemon.config().streams_config().orphan_timeout / 10)
            .clamp(Duration::from_secs(1), Duration::from_secs(10));
        tasks.spawn(job("orphaned runs", orphans, orphans, |d| {
            if let Some(s) = d.streams_if_open() {
                s.end_orphans();
            }
        }));
        tasks.spawn(job(
            "stream expiry",
            RESCAN_INTERVAL,
            RESCAN_INTERVAL,
            |d| {
                if let Some(s) = d.streams_if_open() {
                    s.expire_idle();
                }
            },
        ));
        tasks.spawn(job(
            "run-log retention",
            FIRST_PRUNE_AFTER,
            RUN_PRUNE_INTERVAL,
            |d| {
                d.prune_runs();
            },
        ));
        Jobs { tasks, stop }
    }

    /// How many jobs are running.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Stop every job and wait (at most `grace`) for the ones in the middle of their work.
    pub async fn stop(mut self, grace: Duration) {
        let _ = self.stop.send(true);
        let all = async { while self.tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(grace, all).await.is_err() {
            tracing::warn!("background jobs still working at shutdown; not waiting longer");
            self.tasks.abort_all();
        }
    }
}

/// Run `work` on the blocking pool after `first`, then every `every`, until stopped.
async fn every_interval(
    daemon: Arc<Daemon>,
    mut stopped: watch::Receiver<bool>,
    name: &'static str,
    first: Duration,
    every: Duration,
    work: fn(&Daemon),
) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + first, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stopped.changed() => return,
            _ = tick.tick() => {}
        }
        let d = Arc::clone(&daemon);
        if let Err(e) = tokio::task::spawn_blocking(move || work(&d)).await {
            tracing::error!(job = name, error = %e, "a background job failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    /// Every job is a tracked task: started together, and all of them end when stopped (none
    /// is left running after the daemon stops).
    #[tokio::test]
    async fn jobs_are_tracked_and_stop_together() {
        let d = tempfile::tempdir().unwrap();
        let daemon = Arc::new(
            Daemon::open(
                d.path().join("s.sock"),
                d.path().join("data"),
                Config::default(),
            )
            .unwrap(),
        );
        let jobs = Jobs::start(&daemon);
        assert_eq!(jobs.len(), 5);
        // Let the first flush tick pass, so a job is seen mid-life, not only before its start.
        tokio::time::sleep(INDEX_FLUSH_INTERVAL * 2).await;
        let stopped = tokio::time::timeout(Duration::from_secs(30), jobs.stop(JOB_GRACE)).await;
        assert!(stopped.is_ok(), "the jobs did not stop");
        // Only this test's handle is left: no job task holds the daemon any more.
        assert_eq!(Arc::strong_count(&daemon), 1);
        println!("background jobs: 4 started, 4 stopped");
    }

    const JOB_GRACE: Duration = Duration::from_secs(5);
}
