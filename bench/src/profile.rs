//! `--profile DIR`: record where the daemon spends its CPU during each timed phase, with
//! `perf record` attached to the daemon's pid (and to nothing else), one `perf.data` file per
//! phase, plus a text summary (`perf report --no-children`, the top symbols) beside it. The
//! findings behind the request path's design are written down in docs/benchmarks.md.
//!
//! perf is stopped the way it documents (SIGINT to the `perf` process this bench started, by
//! its pid), so it writes a complete file; nothing else is signalled.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

static DIR: OnceLock<PathBuf> = OnceLock::new();

/// Profile every following phase into `dir` (created if missing). Fails if perf cannot run.
pub fn enable(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let ok = Command::new("perf")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        return Err("--profile needs `perf` (Debian: apt-get install linux-perf)".into());
    }
    let _ = DIR.set(dir.to_path_buf());
    Ok(())
}

/// A `perf record` of one phase; stopped (and summarised) when dropped.
pub struct Recording {
    child: Option<Child>,
    data: PathBuf,
}

/// Start recording `pid` for the phase `name` (a file-name-safe label), if `--profile` was given.
pub fn record(pid: u32, name: &str) -> Recording {
    let Some(dir) = DIR.get() else {
        return Recording {
            child: None,
            data: PathBuf::new(),
        };
    };
    let data = dir.join(format!("{name}.data"));
    let child = Command::new("perf")
        .args([
            "record",
            "-q",
            "-F",
            "2999",
            "-g",
            "--call-graph",
            "dwarf,16384",
        ])
        .arg("-p")
        .arg(pid.to_string())
        .arg("-o")
        .arg(&data)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok();
    // perf attaches asynchronously; give it a moment so the phase's start is in the record.
    std::thread::sleep(Duration::from_millis(300));
    Recording { child, data }
}

impl Drop for Recording {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = rustix::process::Pid::from_child(&child);
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::INT);
        let _ = child.wait();
        let summary = self.data.with_extension("txt");
        let report = Command::new("perf")
            .args([
                "report",
                "--no-children",
                "--stdio",
                "--percent-limit",
                "0.7",
                "--sort",
                "dso,symbol",
                "-g",
                "caller,0.5,callee,function,percent",
                "-i",
            ])
            .arg(&self.data)
            .stderr(Stdio::null())
            .output();
        if let Ok(o) = report {
            let _ = std::fs::write(&summary, o.stdout);
            crate::progress(&format!("profile: {}", summary.display()));
        }
    }
}
