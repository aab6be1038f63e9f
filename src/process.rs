//! Process hardening at daemon start (ssh-agent, gpg-agent):
//! - `PR_SET_DUMPABLE=0`: no core dumps, and `/proc/<pid>/mem`, `environ`, … become unreadable
//!   to other processes of the same uid (ptrace is refused too);
//! - `RLIMIT_CORE=0`: no core file even if something re-enables dumping;
//! - raise the open-file soft limit towards the hard limit, so the connection cap (not EMFILE)
//!   is what refuses clients.

use rustix::process::{self, DumpableBehavior, Resource, Rlimit};

use crate::limits::SPARE_FDS;

/// What hardening has to say: warnings (something could not be done) and facts to log once.
#[derive(Debug, Default)]
pub struct Notes {
    /// Something that could not be done (a kernel that refuses `PR_SET_DUMPABLE`, a low
    /// open-file hard limit): logged as warnings, never fatal.
    pub warnings: Vec<String>,
    /// Facts worth one line at start (memory locking).
    pub info: Vec<String>,
}

/// The one hardening step the daemon does not start without.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HardenError {
    /// Core dumps could not be turned off.
    #[error("cannot set RLIMIT_CORE=0: {0}")]
    CoreLimit(#[source] rustix::io::Errno),
}

/// Harden the process. Failures are returned as warnings to log (a kernel that refuses
/// `PR_SET_DUMPABLE` must not stop the daemon); the core limit is required.
pub fn harden(max_connections: usize) -> Result<Notes, HardenError> {
    let mut notes = Notes::default();
    process::setrlimit(
        Resource::Core,
        Rlimit {
            current: Some(0),
            maximum: Some(0),
        },
    )
    .map_err(HardenError::CoreLimit)?;
    if let Err(e) = process::set_dumpable_behavior(DumpableBehavior::NotDumpable) {
        notes.warnings.push(format!(
            "PR_SET_DUMPABLE=0 failed ({e}); core dumps are still off"
        ));
    }
    // Said once per start (SECURITY-CHECKLIST 35): holdfast does not lock its memory, so a tiny
    // or zero RLIMIT_MEMLOCK changes nothing; what protects secrets in memory is zeroizing them
    // after use and the two settings above (no core file, no ptrace/proc reads).
    let memlock = process::getrlimit(Resource::Memlock)
        .current
        .map_or("unlimited".to_owned(), |b| format!("{b} bytes"));
    notes.info.push(format!(
        "memory is not locked (no mlock; RLIMIT_MEMLOCK {memlock}): secrets are zeroized after \
         use, core dumps are off and the process is not dumpable"
    ));
    let want = max_connections as u64 * 2 + SPARE_FDS;
    let nofile = process::getrlimit(Resource::Nofile);
    let current = nofile.current.unwrap_or(u64::MAX);
    if current < want {
        let target = nofile.maximum.map_or(want, |m| m.min(want));
        let raised = process::setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(target),
                maximum: nofile.maximum,
            },
        );
        match raised {
            Ok(()) if target >= want => {}
            Ok(()) => notes.warnings.push(format!(
                "open-file limit is {target} (hard limit); fewer than {max_connections} connections may fit"
            )),
            Err(e) => notes.warnings.push(format!("cannot raise the open-file limit from {current}: {e}")),
        }
    }
    Ok(notes)
}
