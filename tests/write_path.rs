//! The write path as the kernel sees it (SECURITY-CHECKLIST item 16) and the secret prompt as a
//! person at a terminal sees it.
//!
//! 1. `strace` one `holdfast cred set`: the credential's temp file is created in the target
//!    directory with `O_EXCL|O_NOFOLLOW`, mode 0600, then written, fsynced, renamed over the
//!    target, the directory fsynced, and only then is "stored …" written to stdout.
//! 2. Under a real pseudo-terminal (Python's `pty`), `cred set` prompts on the terminal with echo
//!    off: the secret typed is stored and never appears in what the terminal shows.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn holdfast(home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_holdfast"));
    c.env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env("XDG_STATE_HOME", home.join("state"))
        .env_remove("CREDENTIALS_DIRECTORY")
        .env_remove("STATE_DIRECTORY")
        .env_remove("HIVE_HOME")
        .env_remove("HIVE_CREDENTIAL_KEY")
        .env_remove("HOLDFAST_DATA_DIR")
        .env_remove("HOLDFAST_STORE")
        .env_remove("RUST_LOG");
    c
}

fn run_with_stdin(mut c: Command, stdin: &[u8]) -> std::process::Output {
    use std::io::Write;
    let mut child = c
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin)
        .expect("write stdin");
    child.wait_with_output().expect("wait")
}

fn home() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    fs::create_dir(&home).expect("mkdir home");
    let out = holdfast(&home).arg("init").output().expect("init");
    assert!(out.status.success(), "init: {out:?}");
    (dir, home)
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
    let (dir, home) = home();
    let trace = dir.path().join("trace.txt");
    let mut c = Command::new("strace");
    c.args([
        "-qq",
        "-e",
        "trace=openat,write,fsync,fdatasync,rename,renameat,renameat2",
        "-o",
    ])
    .arg(&trace)
    .arg(env!("CARGO_BIN_EXE_holdfast"))
    .args(["cred", "set", "traced-id"]);
    // Same environment as holdfast() gives the binary itself.
    let probe = holdfast(&home);
    for (k, v) in probe.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    let out = run_with_stdin(c, b"sk-traced-value\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && stderr.contains("ptrace") {
        println!("SKIPPED: strace cannot trace here: {}", stderr.trim());
        return;
    }
    assert!(out.status.success(), "cred set under strace: {out:?}");
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
    let (_dir, home) = home();
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
    let env_src = holdfast(&home);
    for (k, v) in env_src.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
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
    let got = holdfast(&home)
        .args(["cred", "get", "typed"])
        .output()
        .expect("get");
    assert_eq!(
        String::from_utf8_lossy(&got.stdout),
        "tty-typed-secret-9431\n"
    );
    println!("tty prompt: prompt shown, echo off (secret not in terminal output), value stored");
}
