//! systemd integration, with systemd's own tools where they exist here: socket activation through
//! `systemd-socket-activate`, every malformed `LISTEN_*` refused, a fake `NOTIFY_SOCKET`
//! capturing `READY=1`, `WATCHDOG=1` and `STOPPING=1`, a key from `$CREDENTIALS_DIRECTORY`.
// Test code: fixtures are made directly, and a panic is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]
#![allow(clippy::print_stdout)] // what a fault test explored is printed

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::Signal;
use serde_json::json;

#[allow(dead_code)] // each test binary uses only some of the shared helpers
mod common;
use common::*;

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `systemd-socket-activate -l SOCKET holdfast daemon` (the environment passed with -E): the
/// child, the socket path, the log path.
fn activate(env: &DaemonEnv) -> (std::process::Child, std::path::PathBuf, std::path::PathBuf) {
    assert!(
        have("systemd-socket-activate"),
        "systemd-socket-activate missing: scripts/test-deps.sh installs systemd"
    );
    let dir = env.root.join("activated");
    fs::create_dir_all(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
    let sock = dir.join("holdfast.sock");
    let inner = env.holdfast(&["daemon"]);
    let mut c = Command::new("systemd-socket-activate");
    c.arg("-l").arg(&sock);
    // systemd-socket-activate passes only the environment named with -E.
    for (k, v) in inner.get_envs() {
        if let Some(v) = v {
            c.arg("-E")
                .arg(format!("{}={}", k.to_string_lossy(), v.to_string_lossy()));
        }
    }
    c.arg(inner.get_program()).args(inner.get_args());
    let log = env.root.join("activate.log");
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log).unwrap());
    (c.spawn().unwrap(), sock, log)
}

/// `systemd-socket-activate -l PATH holdfast daemon`: the daemon serves the socket it was
/// given (fd 3) and leaves the file in place when it stops.
#[test]
fn serves_a_socket_from_systemd_socket_activate_and_never_unlinks_it() {
    let env = DaemonEnv::new("");
    let (mut child, sock, log) = activate(&env);
    // The socket exists before the daemon does; the first connection starts it.
    let start = Instant::now();
    while !sock.exists() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut conn = match std::panic::catch_unwind(|| Conn::open(&sock)) {
        Ok(c) => c,
        Err(_) => panic!(
            "no answer on the activated socket:\n{}",
            fs::read_to_string(&log).unwrap_or_default()
        ),
    };
    let st = conn.ok("admin.status", json!({}));
    assert_eq!(
        st["socket"].as_str().map(Path::new),
        Some(sock.as_path()),
        "{st}"
    );
    drop(conn);
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(child.id() as i32).unwrap(),
        Signal::TERM,
    )
    .unwrap();
    let status = child.wait().unwrap();
    let text = strip_ansi(&fs::read_to_string(&log).unwrap());
    assert!(status.success(), "{status}: {text}");
    assert!(text.contains("socket_activated=true"), "{text}");
    assert!(sock.exists(), "the inherited socket was unlinked:\n{text}");
    println!(
        "socket activation: served {}, socket kept after SIGTERM",
        sock.display()
    );
}

/// Every malformed hand-over is refused with a message naming the problem; the daemon does not
/// start (and creates no socket of its own).
#[test]
fn malformed_listen_fds_are_refused() {
    let mut env = DaemonEnv::new("");
    // fd 3 made by Python (socket kinds the shell cannot make), LISTEN_PID set to its own pid
    // (execve keeps it), then holdfast exec'd.
    let py = r#"
import os, socket, sys
kind, argv = sys.argv[1], sys.argv[2:]
if kind == "dgram":
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); s.bind(os.environ["HF_SOCK"])
elif kind == "unbound-stream":
    s, _peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
elif kind == "tcp":
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM); s.bind(("127.0.0.1", 0)); s.listen()
elif kind == "file":
    s = open("/dev/null")
os.dup2(s.fileno(), 3)
os.set_inheritable(3, True)
env = dict(os.environ, LISTEN_PID=str(os.getpid()), LISTEN_FDS=os.environ.get("HF_FDS", "1"))
os.execve(argv[0], argv, env)
"#;
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
    let cases: &[Case] = &[
        ("file", &[], "not a Unix stream socket"),
        ("dgram", &[], "not a Unix stream socket"),
        ("tcp", &[], "not a Unix stream socket"),
        ("unbound-stream", &[], "not listening"),
        ("file", &[("HF_FDS", "2")], "exactly one socket"),
        ("file", &[("HF_FDS", "0")], "exactly one socket"),
    ];
    let mut refused = 0;
    for (i, (kind, extra, want)) in cases.iter().enumerate() {
        let inner = env.holdfast(&["daemon"]);
        let mut c = Command::new("/usr/bin/python3");
        c.arg("-c").arg(py).arg(kind).arg(inner.get_program());
        c.args(inner.get_args());
        c.env_clear();
        for (k, v) in inner.get_envs() {
            if let Some(v) = v {
                c.env(k, v);
            }
        }
        c.env("HF_SOCK", env.root.join(format!("dgram-{i}.sock")));
        for (k, v) in *extra {
            c.env(k, v);
        }
        let out = run(c, b"");
        let err = strip_ansi(&out.stderr);
        assert_eq!(out.code, 1, "{kind} {extra:?}: {out}");
        assert!(
            err.contains(want),
            "{kind} {extra:?}: wanted {want:?}: {err}"
        );
        assert!(!env.socket.exists(), "{kind}: a socket was created");
        refused += 1;
    }
    // LISTEN_PID of another process, and LISTEN_FDS without LISTEN_PID.
    for (vars, want) in [
        (
            vec![("LISTEN_FDS", "1"), ("LISTEN_PID", "1")],
            "not this process",
        ),
        (vec![("LISTEN_FDS", "1")], "without LISTEN_PID"),
    ] {
        let mut c = env.holdfast(&["daemon"]);
        for (k, v) in &vars {
            c.env(k, v);
        }
        let out = run(c, b"");
        assert_eq!(out.code, 1, "{vars:?}: {out}");
        assert!(strip_ansi(&out.stderr).contains(want), "{vars:?}: {out}");
        refused += 1;
    }
    println!("malformed LISTEN_*: {refused} cases, {refused} refused with their reason");
    // And without LISTEN_* at all the daemon binds its own socket as usual.
    let d = env.start();
    d.stop();
}

/// A fake service manager: a datagram socket as `NOTIFY_SOCKET`. `READY=1` comes once the
/// socket already answers; `WATCHDOG=1` at under half of `WATCHDOG_USEC`; `STOPPING=1` on
/// SIGTERM. The key comes from `$CREDENTIALS_DIRECTORY` (LoadCredential=), a 0400 file.
#[test]
fn notify_socket_gets_ready_watchdog_and_stopping() {
    let mut env = DaemonEnv::new("");
    let notify_path = env.root.join("notify.sock");
    let manager = UnixDatagram::bind(&notify_path).unwrap();
    manager
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    // LoadCredential=holdfast-default.key:… puts a copy here, 0400.
    let creds = env.root.join("credentials");
    fs::create_dir(&creds).unwrap();
    let key = fs::read(env.key_file()).unwrap();
    let cred_key = creds.join("holdfast-default.key");
    fs::write(&cred_key, &key).unwrap();
    fs::set_permissions(&cred_key, fs::Permissions::from_mode(0o400)).unwrap();
    fs::remove_file(env.key_file()).unwrap();
    let watchdog_usec = 900_000u64;
    let opts = DaemonOpts {
        env: vec![
            ("NOTIFY_SOCKET".into(), notify_path.display().to_string()),
            ("WATCHDOG_USEC".into(), watchdog_usec.to_string()),
            ("CREDENTIALS_DIRECTORY".into(), creds.display().to_string()),
        ],
        ..Default::default()
    };
    let mut d = env.spawn(&opts);
    let mut buf = [0u8; 4096];
    let mut recv = || -> (Instant, String) {
        let n = manager.recv(&mut buf).expect("a notification");
        (
            Instant::now(),
            String::from_utf8_lossy(&buf[..n]).into_owned(),
        )
    };
    let (_, first) = recv();
    assert!(first.contains("READY=1"), "first message: {first:?}");
    assert!(first.contains("STATUS=serving 1 store(s)"), "{first:?}");
    // Ready means serving: the first connection after READY=1 is answered, no retry.
    let mut c = Conn::open(&d.socket);
    let st = c.ok("admin.status", json!({}));
    assert_eq!(st["stores"][0]["sealed"], json!(false), "{st}");
    let source = st["stores"][0]["key_source"].to_string();
    assert!(source.contains("credentials"), "key source: {source}");
    drop(c);
    // Watchdog pings for ~3 s.
    let mut pings = Vec::new();
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let (t, m) = recv();
        assert!(m.contains("WATCHDOG=1"), "{m:?}");
        pings.push(t);
    }
    let gaps: Vec<u128> = pings
        .windows(2)
        .map(|w| (w[1] - w[0]).as_millis())
        .collect();
    let mut sorted = gaps.clone();
    sorted.sort_unstable();
    let median = sorted[sorted.len() / 2];
    let limit = u128::from(watchdog_usec / 1000);
    println!(
        "watchdog: {} pings in 3 s, gaps median {median} ms, max {} ms (WATCHDOG_USEC {limit} ms)",
        pings.len(),
        sorted.last().unwrap()
    );
    assert!(median < limit / 2, "median gap {median} ms: {gaps:?}");
    assert!(
        *sorted.last().unwrap() < limit,
        "a gap over the deadline: {gaps:?}"
    );
    d.signal(Signal::TERM);
    let mut stopping = false;
    for _ in 0..20 {
        let (_, m) = recv();
        if m.contains("STOPPING=1") {
            stopping = true;
            break;
        }
    }
    assert!(stopping, "no STOPPING=1 after SIGTERM");
    let st = d.wait_exit(Duration::from_secs(30));
    assert!(st.is_some_and(|s| s.success()), "{st:?}");
}

/// Exposure `systemd-analyze security --offline=true` may report for the user unit. Most of
/// its score is capabilities and namespaces a user service cannot drop or set up without
/// failing (docs/operations.md): a user service has no capabilities to begin with.
const USER_EXPOSURE_MAX: f64 = 6.5;
/// And for the system unit, which can apply every sandboxing option.
const SYSTEM_EXPOSURE_MAX: f64 = 1.0;

fn analyze(args: &[&str], runtime_dir: &Path) -> (bool, String) {
    let out = Command::new("systemd-analyze")
        .args(args)
        .env("XDG_RUNTIME_DIR", runtime_dir)
        .env("SYSTEMD_COLORS", "0")
        .output()
        .expect("systemd-analyze (scripts/test-deps.sh installs systemd)");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn exposure(report: &str) -> f64 {
    let line = report
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or_else(|| panic!("no exposure line:\n{report}"));
    line.split(':')
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unreadable exposure: {line}"))
}

/// The shipped units, as `holdfast install-units` writes them: `systemd-analyze verify` says
/// nothing at all (it exits 0 even on unknown keys, so any output fails), the offline security
/// exposure stays under the stated thresholds, and the user unit has none of the options that
/// make a user service fail with 218/CAPABILITIES. install-units is idempotent and keeps files
/// it did not write.
#[test]
fn shipped_units_verify_silently_and_stay_under_the_exposure_thresholds() {
    let env = DaemonEnv::new("");
    let runtime = env.home.join("run");
    for (flag, max) in [
        ("--user", USER_EXPOSURE_MAX),
        ("--system", SYSTEM_EXPOSURE_MAX),
    ] {
        let dir = env.root.join(format!("units{flag}"));
        let dir_arg = format!("--dir={}", dir.display());
        let install = |extra: &[&str]| {
            let mut c = env.holdfast(&["install-units", flag, &dir_arg]);
            c.args(extra);
            run(c, b"")
        };
        let first = install(&[]);
        assert_eq!(first.code, 0, "{first}");
        assert!(
            first.stdout.contains("enable --now holdfast.socket"),
            "{first}"
        );
        let again = install(&[]);
        assert_eq!(again.stdout.matches("unchanged").count(), 2, "{again}");
        let units: Vec<String> = ["holdfast.socket", "holdfast.service"]
            .iter()
            .map(|u| dir.join(u).display().to_string())
            .collect();
        let mut args = vec!["verify"];
        if flag == "--user" {
            args.push("--user");
        }
        args.extend(units.iter().map(String::as_str));
        let (ok, said) = analyze(&args, &runtime);
        assert!(ok && said.trim().is_empty(), "verify {flag} said:\n{said}");
        let service = &units[1];
        let mut args = vec!["security", "--offline=true"];
        if flag == "--user" {
            args.push("--user");
        }
        args.push(service);
        let (_, report) = analyze(&args, &runtime);
        let level = exposure(&report);
        println!(
            "units {flag}: verify silent; security --offline exposure {level} (threshold {max})"
        );
        assert!(level <= max, "exposure {level} > {max}:\n{report}");
        let text = fs::read_to_string(service).unwrap();
        assert!(text.contains(&format!(
            "ExecStart={} daemon",
            env!("CARGO_BIN_EXE_holdfast")
        )));
        if flag == "--user" {
            for bad in [
                "CapabilityBoundingSet=",
                "PrivateDevices=",
                "ProtectKernelModules=",
                "ProtectKernelLogs=",
                "ProtectClock=",
            ] {
                assert!(
                    !text.lines().any(|l| l.trim_start().starts_with(bad)),
                    "{bad} fails user units (218/CAPABILITIES)"
                );
            }
        }
    }
    // A unit file install-units did not write is kept unless --force.
    let dir = env.root.join("foreign");
    fs::create_dir(&dir).unwrap();
    fs::write(
        dir.join("holdfast.service"),
        "[Service]\nExecStart=/bin/true\n",
    )
    .unwrap();
    let out = run(
        env.holdfast(&["install-units", &format!("--dir={}", dir.display())]),
        b"",
    );
    assert_eq!(out.code, 4, "{out}");
    assert!(out.stderr.contains("--force"), "{out}");
    assert_eq!(
        fs::read_to_string(dir.join("holdfast.service")).unwrap(),
        "[Service]\nExecStart=/bin/true\n"
    );
    // Nothing half-installed: the socket unit was not written either.
    assert!(!dir.join("holdfast.socket").exists());
}

/// `idle_exit_minutes` under socket activation: a held connection keeps the daemon up; once
/// nothing is connected and no request comes for the idle time, it exits 0 and leaves the
/// socket to systemd.
#[test]
fn idle_exit_under_socket_activation() {
    let env = DaemonEnv::new("idle_exit_minutes = 0.05\n"); // 3 s
    let (mut child, sock, log) = activate(&env);
    let start = Instant::now();
    while !sock.exists() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut conn = Conn::open(&sock);
    conn.ok("admin.status", json!({}));
    // Connected and silent for longer than the idle time: still serving.
    std::thread::sleep(Duration::from_secs(5));
    assert!(
        child.try_wait().unwrap().is_none(),
        "exited with a client connected"
    );
    conn.ok("admin.status", json!({}));
    let closed = Instant::now();
    drop(conn);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(
            closed.elapsed() < Duration::from_secs(20),
            "no idle exit:\n{}",
            fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let after = closed.elapsed();
    let text = strip_ansi(&fs::read_to_string(&log).unwrap());
    assert!(status.success(), "{status}: {text}");
    assert!(text.contains("idle: no client"), "{text}");
    assert!(sock.exists(), "the socket was removed");
    assert!(after >= Duration::from_secs(3), "exited after {after:?}");
    println!("idle exit: kept up 5 s with a client connected; exited {after:.1?} after it left");
}

/// The watchdog's self-probe counts any answer as alive: with `require_plugin = true` its
/// plugin-less hello is refused, and at the connection cap the accept loop refuses it `busy`;
/// the pings must still come (else systemd would restart a healthy daemon every WatchdogSec).
#[test]
fn the_watchdog_pings_when_every_client_must_name_a_plugin() {
    watchdog_pings_with("require_plugin = true\n", 0);
}

#[test]
fn the_watchdog_pings_at_the_connection_cap() {
    watchdog_pings_with("[limits]\nmax_connections = 2\n", 2);
}

fn watchdog_pings_with(config: &str, hold: usize) {
    let mut env = DaemonEnv::new(config);
    let notify_path = env.root.join("notify.sock");
    let manager = UnixDatagram::bind(&notify_path).unwrap();
    manager
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let opts = DaemonOpts {
        env: vec![
            ("NOTIFY_SOCKET".into(), notify_path.display().to_string()),
            ("WATCHDOG_USEC".into(), "600000".into()),
        ],
        ..Default::default()
    };
    let mut d = env.spawn(&opts);
    let mut buf = [0u8; 4096];
    // READY first; then take every connection slot.
    loop {
        let n = manager.recv(&mut buf).expect("READY=1");
        if String::from_utf8_lossy(&buf[..n]).contains("READY=1") {
            break;
        }
    }
    let held: Vec<std::os::unix::net::UnixStream> = (0..hold)
        .map(|_| std::os::unix::net::UnixStream::connect(&d.socket).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut pings = 0;
    let start = Instant::now();
    while pings < 3 {
        let n = manager.recv(&mut buf).expect("a notification");
        if String::from_utf8_lossy(&buf[..n]).contains("WATCHDOG=1") {
            pings += 1;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "too slow");
    }
    println!(
        "watchdog ({}, {hold} connections held): {pings} pings in {:.1?}",
        config.trim().replace('\n', " "),
        start.elapsed()
    );
    if hold > 0 {
        // The probes really met the cap (and were answered `busy`).
        assert!(
            d.log_text().contains("connection cap reached"),
            "{}",
            d.log_text()
        );
    }
    drop(held);
    d.signal(Signal::TERM);
    assert!(d
        .wait_exit(Duration::from_secs(30))
        .is_some_and(|s| s.success()));
}
