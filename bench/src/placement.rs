//! Where a round trip's two ends run: the client on one CPU and the server on the same one or
//! another, for the `cred.get` target's like-for-like comparison with the socket floor.
//!
//! Why: on a virtual machine a Unix-socket round trip between two processes is bimodal — ~9 µs
//! when both ends share a CPU (each wake-up is a context switch), 40–50 µs when each wake-up
//! crosses to the other vCPU (an inter-processor interrupt, which a hypervisor makes expensive).
//! Unplaced, a fresh echo process lands in either mode as the kernel places it, while the
//! daemon's threads, which move between CPUs, always cross; a ratio between the two then
//! measured the placement instead of the daemon (docs/benchmarks.md, issue 15's eighth and ninth
//! sessions). Placed alike, the floor and the daemon pay the same wake-ups, and what is left is
//! the daemon's own work.
//!
//! Placement is set from outside with `sched_setaffinity` on every thread of the server (a
//! process's threads are `/proc/PID/task/*`), and on the calling thread for the client (threads
//! it spawns inherit it); everything is put back as it was afterwards.

use std::fs;

use rustix::process::Pid;
use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};

use super::{fail, CliResult};

/// The CPUs a round trip's ends are pinned to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The client's CPU.
    pub client: usize,
    /// The server's CPU.
    pub server: usize,
}

impl Placement {
    /// The two placements measured on a machine with two CPUs or more: both ends on CPU 0, and
    /// the client on CPU 0 with the server on CPU 1.
    pub fn both() -> [Placement; 2] {
        [
            Placement {
                client: 0,
                server: 0,
            },
            Placement {
                client: 0,
                server: 1,
            },
        ]
    }

    /// How the report names it.
    pub fn label(&self) -> &'static str {
        if self.client == self.server {
            "one CPU"
        } else {
            "two CPUs"
        }
    }
}

fn only(cpu: usize) -> CpuSet {
    let mut set = CpuSet::new();
    set.set(cpu);
    set
}

/// Pin the calling thread to `cpu` until the guard is dropped (then its mask is put back).
pub struct PinnedHere {
    before: CpuSet,
}

impl PinnedHere {
    /// Pin the calling thread.
    pub fn to(cpu: usize) -> CliResult<PinnedHere> {
        let before = sched_getaffinity(None).map_err(|e| fail("reading this thread's CPUs", e))?;
        sched_setaffinity(None, &only(cpu)).map_err(|e| fail("pinning this thread", e))?;
        Ok(PinnedHere { before })
    }
}

impl Drop for PinnedHere {
    fn drop(&mut self) {
        let _ = sched_setaffinity(None, &self.before);
    }
}

/// The threads of process `pid` now.
fn threads(pid: u32) -> CliResult<Vec<Pid>> {
    let dir = format!("/proc/{pid}/task");
    let mut out = Vec::new();
    for e in fs::read_dir(&dir).map_err(|e| fail("listing the server's threads", e))? {
        let name = e
            .map_err(|e| fail("listing the server's threads", e))?
            .file_name();
        if let Some(tid) = name
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
            .and_then(Pid::from_raw)
        {
            out.push(tid);
        }
    }
    Ok(out)
}

/// Pin every thread of process `pid` to `cpu` until the guard is dropped; then every thread it
/// has by then (threads started meanwhile inherited the pin) gets the mask its main thread had.
pub struct PinnedProcess {
    pid: u32,
    before: CpuSet,
}

impl PinnedProcess {
    /// Pin process `pid`.
    pub fn to(pid: u32, cpu: usize) -> CliResult<PinnedProcess> {
        let main = Pid::from_raw(pid as i32).ok_or_else(|| fail("pinning the server", "pid 0"))?;
        let before =
            sched_getaffinity(Some(main)).map_err(|e| fail("reading the server's CPUs", e))?;
        let set = only(cpu);
        for tid in threads(pid)? {
            // A thread that ended since it was listed is not an error.
            let _ = sched_setaffinity(Some(tid), &set);
        }
        Ok(PinnedProcess { pid, before })
    }
}

impl Drop for PinnedProcess {
    fn drop(&mut self) {
        if let Ok(tids) = threads(self.pid) {
            for tid in tids {
                let _ = sched_setaffinity(Some(tid), &self.before);
            }
        }
    }
}
