//! The write path as the kernel sees it (SECURITY-CHECKLIST item 16) and the secret prompt as a
//! person at a terminal sees it.
//!
//! 1. `strace` one `holdfast cred set`: the credential's temp file is created in the target
//!    directory with `O_EXCL|O_NOFOLLOW`, mode 0600, then written, fsynced, renamed over the
//!    target, the directory fsynced, and only then is "stored …" written to stdout.
//! 2. Under a real pseudo-terminal (Python's `pty`), `cred set` prompts on the terminal with echo
//!    off: the secret typed is stored and never appears in what the terminal shows.
// Test code: fixtures are made directly, and a panic is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

#[allow(dead_code)] // each test binary uses only some of the shared helpers
mod common;

use std::fs;
use std::process::Command;

use common::{clean_env, holdfast_cmd, run, TempHome};

/// A temporary HOME in which `holdfast init` has made the default store.
fn init_home() -> TempHome {
    let th = TempHome::new();
    let out = th.cmd().arg("init").output().expect("init");
    assert!(out.status.success(), "init: {out:?}");
    th
}

/// One traced syscall of interest, in order.
#[derive(Debug)]
struct Call {
    line: String,
}

impl Call {
    fn is(&self, name: &str) -> bool {
        self.line.starts_with(&format!("{name}("))
    }
    /// The return value (after " = ").
    fn ret(&self) -> Option<i64> {
        self.line
            .rsplit(" = ")
            .next()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }
    /// The fd argument of write/fsync.
    fn fd(&self) -> Option<i64> {
        self.line
            .split_once('(')?
            .1
            .split([',', ')'])
            .next()?
            .trim()
            .parse()
            .ok()
    }
}

#[test]
fn one_set_is_temp_write_fsync_rename_fsync_dir_then_reply() {
    if !Command::new("strace")
        .arg("-V")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
    {
        println!("SKIPPED: strace is not available (scripts/test-deps.sh installs it)");
        return;
    }
    let th = init_home();
    let home = &th.home;
    let trace = th.root.join("trace.txt");
    let mut c = Command::new("strace");
    // The same environment as holdfast_cmd() gives the binary itself.
    clean_env(&mut c, home)
        .args([
            "-qq",
            "-e",
            "trace=openat,write,fsync,fdatasync,rename,renameat,renameat2",
            "-o",
        ])
        .arg(&trace)
        .arg(env!("CARGO_BIN_EXE_holdfast"))
        .args(["cred", "set", "traced-id"]);
    let out = run(c, b"sk-traced-value\n");
    if out.code != 0 && out.stderr.contains("ptrace") {
        println!("SKIPPED: strace cannot trace here: {}", out.stderr.trim());
        return;
    }
    assert_eq!(out.code, 0, "cred set under strace: {out}");
    let calls: Vec<Call> = fs::read_to_string(&trace)
        .expect("trace")
        .lines()
        .map(|l| Call { line: l.to_owned() })
        .collect();

    let cred_dir = home.join("state/holdfast/stores/default/credentials");
    let cred_dir_s = cred_dir.to_string_lossy().into_owned();
    let find = |from: usize, what: &str, pred: &dyn Fn(&Call) -> bool| -> usize {
        calls[from..]
            .iter()
            .position(pred)
            .map(|i| i + from)
            .unwrap_or_else(|| {
                panic!(
                    "no {what} after call #{from} in the trace:\n{}",
                    calls
                        .iter()
                        .map(|c| c.line.as_str())
                        .collect::<Vec<_>>()
                        .join("\n")
                )
            })
    };
    let open_tmp = find(0, "openat of the credential temp file", &|c| {
        c.is("openat")
            && c.line
                .contains(&format!("{cred_dir_s}/.traced-id.enc.hf-tmp-"))
    });
    let o = &calls[open_tmp].line;
    assert!(
        o.contains("O_CREAT")
            && o.contains("O_EXCL")
            && o.contains("O_NOFOLLOW")
            && o.contains("0600"),
        "temp file not opened O_CREAT|O_EXCL|O_NOFOLLOW, 0600: {o}"
    );
    let fd = calls[open_tmp].ret().expect("temp fd");
    let write = find(open_tmp, "write of the temp file", &|c| {
        c.is("write") && c.fd() == Some(fd)
    });
    let fsync = find(write, "fsync of the temp file", &|c| {
        (c.is("fsync") || c.is("fdatasync")) && c.fd() == Some(fd)
    });
    let rename = find(fsync, "rename onto traced-id.enc", &|c| {
        (c.is("rename") || c.is("renameat") || c.is("renameat2"))
            && c.line.contains(".traced-id.enc.hf-tmp-")
            && c.line.contains(&format!("{cred_dir_s}/traced-id.enc\""))
    });
    let open_dir = find(rename, "openat of the credentials directory", &|c| {
        c.is("openat")
            && c.line.contains(&format!("\"{cred_dir_s}\""))
            && c.line.contains("O_DIRECTORY")
    });
    let dir_fd = calls[open_dir].ret().expect("dir fd");
    let dir_fsync = find(open_dir, "fsync of the credentials directory", &|c| {
        c.is("fsync") && c.fd() == Some(dir_fd)
    });
    let reply = find(0, "the reply on stdout", &|c| {
        c.is("write") && c.fd() == Some(1) && c.line.contains("stored traced-id")
    });
    assert!(
        dir_fsync < reply,
        "the reply (call #{reply}) came before the directory fsync (call #{dir_fsync})"
    );
    println!(
        "write order (strace, {} calls): openat O_EXCL|O_NOFOLLOW 0600 #{open_tmp} -> write #{write} -> \
         fsync #{fsync} -> rename #{rename} -> fsync(dir) #{dir_fsync} -> reply #{reply}",
        calls.len()
    );
}

/// The prompt under a real terminal: echo is off, the typed secret is stored and not shown.
#[test]
fn tty_prompt_does_not_echo_the_secret() {
    let th = init_home();
    let script = r#"
import os, pty, sys, time
argv = sys.argv[1:]
pid, fd = pty.fork()
if pid == 0:
    os.execv(argv[0], argv)
seen = b""
deadline = time.time() + 20
def pump():
    global seen
    try:
        chunk = os.read(fd, 4096)
    except OSError:
        return False
    if not chunk:
        return False
    seen += chunk
    return True
while b"secret for" not in seen and time.time() < deadline:
    if not pump():
        break
os.write(fd, b"tty-typed-secret-9431\n")
while time.time() < deadline and pump():
    pass
_, status = os.waitpid(pid, 0)
sys.stdout.write(seen.decode("utf-8", "replace"))
sys.exit(os.waitstatus_to_exitcode(status))
"#;
    let mut c = Command::new("python3");
    clean_env(&mut c, &th.home);
    let out = c
        .args([
            "-c",
            script,
            env!("CARGO_BIN_EXE_holdfast"),
            "cred",
            "set",
            "typed",
        ])
        .output()
        .expect("python3 pty driver");
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "cred set under a pty failed: {shown}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        shown.contains("secret for typed (key api_key): "),
        "no prompt: {shown:?}"
    );
    assert!(
        shown.contains("stored typed (generation 1)"),
        "not stored: {shown:?}"
    );
    assert!(
        !shown.contains("tty-typed-secret-9431"),
        "the terminal echoed the secret: {shown:?}"
    );
    let got = holdfast_cmd(&th.home)
        .args(["cred", "get", "typed"])
        .output()
        .expect("get");
    assert_eq!(
        String::from_utf8_lossy(&got.stdout),
        "tty-typed-secret-9431\n"
    );
    println!("tty prompt: prompt shown, echo off (secret not in terminal output), value stored");
}
