//! Progress on stderr. A single bench prints one line per phase (`bench: …`). Under `--report`,
//! which runs every bench in turn, each line also says which part is running, the time spent
//! and about how long is left; on a terminal a status line stays at the bottom and is redrawn
//! every second beneath the phases as they scroll by.
//!
//! The time left is an estimate from the plan: each part's expected seconds (its timed phases
//! plus a measured allowance for set-up), re-based as each part ends, so a slow part does not
//! leave the rest of the estimate wrong.

use std::io::{IsTerminal, Write};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The report's parts and where the run is.
struct Budget {
    start: Instant,
    /// (name, expected seconds) per part.
    parts: Vec<(String, f64)>,
    current: usize,
    part_start: Instant,
    /// The last phase announced.
    phase: String,
    tty: bool,
}

impl Budget {
    fn left(&self) -> f64 {
        let this = self.parts.get(self.current).map_or(0.0, |p| {
            (p.1 - self.part_start.elapsed().as_secs_f64()).max(0.0)
        });
        this + self
            .parts
            .iter()
            .skip(self.current + 1)
            .map(|p| p.1)
            .sum::<f64>()
    }

    fn status(&self) -> String {
        let name = self.parts.get(self.current).map_or("", |p| p.0.as_str());
        let s = format!(
            "[{}/{} {name} · {} elapsed · about {} left] {}",
            self.current + 1,
            self.parts.len(),
            clock(self.start.elapsed().as_secs_f64()),
            clock(self.left()),
            self.phase
        );
        if !self.tty {
            return s;
        }
        // On a terminal the status line is redrawn in place: it must fit on one row.
        let width = rustix::termios::tcgetwinsize(std::io::stderr())
            .map_or(80, |w| usize::from(w.ws_col))
            .max(20);
        if s.chars().count() < width {
            s
        } else {
            s.chars()
                .take(width - 2)
                .chain(std::iter::once('…'))
                .collect()
        }
    }
}

static BUDGET: Mutex<Option<Budget>> = Mutex::new(None);

/// `83.4` → `1m23s`.
pub fn clock(secs: f64) -> String {
    let s = secs.round() as u64;
    if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

/// Start a report of `parts` (name, expected seconds); on a terminal, a thread redraws the
/// status line every second until [`finish`].
pub fn begin(parts: Vec<(String, f64)>) {
    let tty = std::io::stderr().is_terminal();
    let now = Instant::now();
    *BUDGET.lock().unwrap_or_else(PoisonError::into_inner) = Some(Budget {
        start: now,
        parts,
        current: 0,
        part_start: now,
        phase: String::new(),
        tty,
    });
    if tty {
        std::thread::spawn(|| loop {
            std::thread::sleep(Duration::from_secs(1));
            let b = BUDGET.lock().unwrap_or_else(PoisonError::into_inner);
            match &*b {
                Some(b) => {
                    let _ = write!(std::io::stderr(), "\r\x1b[K{}", b.status());
                }
                None => return,
            }
        });
    }
}

/// Part `i` of the report starts now.
pub fn part(i: usize) {
    if let Some(b) = BUDGET
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_mut()
    {
        b.current = i;
        b.part_start = Instant::now();
    }
}

/// The report is done: the status line goes, and the total time is given.
pub fn finish() -> Duration {
    let b = BUDGET.lock().unwrap_or_else(PoisonError::into_inner).take();
    match b {
        Some(b) => {
            if b.tty {
                let _ = write!(std::io::stderr(), "\r\x1b[K");
            }
            b.start.elapsed()
        }
        None => Duration::ZERO,
    }
}

/// One phase's line.
pub fn line(msg: &str) {
    let mut guard = BUDGET.lock().unwrap_or_else(PoisonError::into_inner);
    let mut err = std::io::stderr().lock();
    match guard.as_mut() {
        None => {
            let _ = writeln!(err, "bench: {msg}");
        }
        Some(b) => {
            b.phase = msg.to_owned();
            if b.tty {
                // The phase scrolls by above; the status line is redrawn beneath it.
                let _ = write!(err, "\r\x1b[Kbench: {msg}\n{}", b.status());
            } else {
                let _ = writeln!(err, "bench: {}", b.status());
            }
        }
    }
}
