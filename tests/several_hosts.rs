//! The PostgreSQL backend under fire: each test starts its own throwaway server
//! (scripts/pg-cluster.sh: initdb in a temp dir, a Unix socket there only) so it can stop it
//! with `pg_ctl -m immediate` or not start it at all, and two daemons ("hosts": two data
//! directories, two sockets) on its one database. SKIPPED, with the reason, where no server
//! can be started. The streams suite itself runs on both backends (scripts/test.sh).
// Test code: fixtures are made directly, and a panic is a failed test.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::disallowed_methods,
    clippy::print_stdout
)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

#[allow(dead_code)] // each test binary uses only some of the shared helpers
mod common;
use common::*;

/// A server of this test's own, stopped (fast) when dropped.
struct Server {
    dir: PathBuf,
    _tmp: tempfile::TempDir,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/pg-cluster.sh")
}

impl Server {
    /// Start one, or `None` after printing why not (SKIPPED).
    fn start(test: &str) -> Option<Server> {
        Self::start_with(test, |_| String::new())
    }

    /// Start one with extra server options, made by `opts` from the server's directory (before
    /// the server starts: files it needs go there).
    fn start_with(test: &str, opts: impl FnOnce(&Path) -> String) -> Option<Server> {
        // Short: the socket path DIR/.s.PGSQL.5432 must fit 107 bytes.
        let tmp = tempfile::Builder::new()
            .prefix("hfpg")
            .tempdir_in("/tmp")
            .unwrap();
        let dir = tmp.path().to_path_buf();
        let extra = opts(&dir);
        let out = Command::new(script())
            .arg("start")
            .arg(&dir)
            .env("PG_CLUSTER_OPTS", extra)
            .output()
            .unwrap();
        if !out.status.success() {
            println!(
                "SKIPPED {test}: no PostgreSQL server can be started here: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            return None;
        }
        Some(Server { dir, _tmp: tmp })
    }

    /// libpq key=value parameters of the server (no database).
    fn base(&self) -> String {
        let user = if is_root() {
            "postgres".to_owned()
        } else {
            std::env::var("USER").unwrap()
        };
        format!("host={} user={user}", self.dir.display())
    }

    /// The `[backend]` section of a new database on this server.
    fn backend(&self) -> String {
        fresh_pg_backend(&self.base())
    }

    /// `pg_ctl -m immediate stop`: the server dies as in a crash (no checkpoint, clients cut).
    fn crash(&self) {
        let bindir = pg_bindir();
        let mut c = if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(bindir.join("pg_ctl"));
            c
        } else {
            Command::new(bindir.join("pg_ctl"))
        };
        let st = c
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "immediate", "-w", "stop"])
            .output()
            .unwrap();
        assert!(
            st.status.success(),
            "{}",
            String::from_utf8_lossy(&st.stderr)
        );
    }

    fn restart(&self) {
        let out = Command::new(script())
            .arg("start")
            .arg(&self.dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new(script()).arg("stop").arg(&self.dir).output();
    }
}

fn pg_bindir() -> PathBuf {
    let out = Command::new("pg_config").arg("--bindir").output();
    if let Ok(o) = out {
        let p = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
        if p.join("pg_ctl").exists() {
            return p;
        }
    }
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .unwrap()
        .flatten()
        .map(|e| e.path().join("bin"))
        .collect();
    dirs.sort();
    dirs.pop().unwrap()
}

/// A daemon environment on `backend` (another "host" when given the same section).
fn host(backend: &str) -> DaemonEnv {
    let env = DaemonEnv::new("");
    env.write_config(backend);
    env
}

fn text_of(i: usize, k: usize) -> String {
    format!("r{i}-d{k:04} ")
}

/// Appends from both hosts while the server is killed with `pg_ctl -m immediate` and started
/// again: every acknowledged append is there afterwards, an append that got `storage` is
/// either absent or whole (the producer sends it again with the same seq: taken, or
/// acknowledged as a duplicate — never twice), and both daemons serve again without a restart.
#[test]
fn postgres_killed_mid_append_loses_nothing_acknowledged() {
    let Some(server) = Server::start("postgres_killed_mid_append_loses_nothing_acknowledged")
    else {
        return;
    };
    let backend = server.backend();
    let (mut a, mut b) = (host(&backend), host(&backend));
    let (da, db) = (a.start(), b.start());
    const RUNS: usize = 4;
    const DELTAS: usize = 300;
    // The crash comes once a third of the appends are acknowledged, whatever the machine's
    // speed, so it lands mid-stream.
    let acked = Arc::new(AtomicUsize::new(0));
    let sockets = [da.socket.clone(), db.socket.clone()];
    let producers: Vec<_> = (0..RUNS)
        .map(|i| {
            let socket = sockets[i % 2].clone();
            let acked = Arc::clone(&acked);
            thread::spawn(move || {
                let run = format!("crash-{i}");
                let mut c = Conn::open(&socket);
                let sid = c.ok("stream.begin", json!({"run_id": run}))["stream_id"].clone();
                let (mut storage_errors, mut duplicates) = (0usize, 0usize);
                for k in 0..DELTAS {
                    let seq = k as u64 + 1;
                    let deadline = Instant::now() + Duration::from_secs(60);
                    loop {
                        let r = c.call(
                            "stream.append",
                            json!({"run_id": run, "stream_id": sid, "seq": seq,
                                   "events": [{"type": "text", "text": text_of(i, k)}]}),
                        );
                        if let Some(res) = r.get("result") {
                            assert_eq!(res["acked_seq"], seq, "{r}");
                            duplicates += usize::from(res["duplicate"] == true);
                            acked.fetch_add(1, Ordering::SeqCst);
                            break;
                        }
                        let kind = r["error"]["data"]["kind"].as_str().unwrap_or("").to_owned();
                        assert_eq!(
                            kind, "storage",
                            "only storage errors while the server is down: {r}"
                        );
                        storage_errors += 1;
                        assert!(
                            Instant::now() < deadline,
                            "no service 60 s after the crash: {r}"
                        );
                        thread::sleep(Duration::from_millis(50));
                    }
                }
                let r = c.ok(
                    "stream.commit",
                    json!({"run_id": run, "stream_id": sid,
                           "final_message": {"role": "assistant"},
                           "content_from_stream": true}),
                );
                assert_eq!(r["status"], "committed");
                (storage_errors, duplicates)
            })
        })
        .collect();
    let waited = Instant::now();
    while acked.load(Ordering::SeqCst) < RUNS * DELTAS / 3 {
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "appends do not progress"
        );
        thread::sleep(Duration::from_millis(1));
    }
    server.crash();
    thread::sleep(Duration::from_millis(800));
    server.restart();
    let mut totals = (0, 0);
    for p in producers {
        let (e, d) = p.join().unwrap();
        totals.0 += e;
        totals.1 += d;
    }
    assert!(
        totals.0 > 0,
        "the crash landed while appends were in flight"
    );
    // Every run's text, read on both hosts: each delta once, in order.
    for socket in &sockets {
        let mut c = Conn::open(socket);
        for i in 0..RUNS {
            let run = format!("crash-{i}");
            let st = c.ok("stream.get", json!({"run_id": run, "reveal": true}));
            assert_eq!(st["status"], "committed", "{st}");
            assert_eq!(st["finish_seq"], DELTAS as u64 + 1, "{st}");
            // The committed message is the streamed text (content_from_stream): every delta
            // once, in order.
            let want: String = (0..DELTAS).map(|k| text_of(i, k)).collect();
            assert_eq!(st["final_message"]["content"], want, "run {i}");
        }
    }
    println!(
        "postgres killed (-m immediate) mid-append: {RUNS} runs x {DELTAS} deltas on 2 daemons; \
         {} appends got `storage` and were sent again ({} of them acknowledged as duplicates: \
         committed before the crash cut the answer); 0 lost, 0 doubled; both daemons served \
         again without a restart",
        totals.0, totals.1
    );
    da.stop();
    db.stop();
}

/// Nothing starts the server before the daemon: credentials are served, streams answer
/// `storage` with the reason, and work once the server is up, with no restart.
#[test]
fn postgres_down_at_start_is_reported_and_served_once_up() {
    let Some(server) = Server::start("postgres_down_at_start_is_reported_and_served_once_up")
    else {
        return;
    };
    let backend = server.backend();
    server.crash();
    let mut a = host(&backend);
    let d = a.start();
    let mut c = Conn::open(&d.socket);
    c.ok("cred.set", json!({"id": "k", "value": "v"}));
    let e = c.err("stream.begin", json!({"run_id": "early"}));
    assert_eq!(e["data"]["kind"], "storage", "{e}");
    let msg = e["message"].as_str().unwrap();
    assert!(
        msg.contains("PostgreSQL") && msg.contains("unreachable"),
        "{msg}"
    );
    server.restart();
    let r = c.ok("stream.begin", json!({"run_id": "early"}));
    assert_eq!(r["epoch"], 1);
    println!("postgres down at start: `storage` ({msg}); served once it was up, no restart");
    d.stop();
}

/// `holdfast db status | migrate`, and a schema newer than the binary: refused with both
/// versions by the CLI (exit 4) and by the daemon (`storage`), and left unchanged.
#[test]
fn db_commands_migrate_and_a_newer_schema_is_refused() {
    let Some(server) = Server::start("db_commands_migrate_and_a_newer_schema_is_refused") else {
        return;
    };
    let backend = server.backend();
    let mut a = host(&backend);
    let st = run(a.holdfast(&["db", "status"]), b"");
    assert_eq!(st.code, 3, "pending: {st}");
    assert!(st.stdout.contains("version 0"), "{st}");
    let m = run(a.holdfast(&["db", "migrate"]), b"");
    assert_eq!(m.code, 0, "{m}");
    assert!(m.stdout.contains("applied: [1, 2]"), "{m}");
    let m = run(a.holdfast(&["db", "migrate"]), b"");
    assert!(m.stdout.contains("already at version 2"), "{m}");
    let st = run(a.holdfast(&["db", "status", "--json"]), b"");
    assert_eq!(st.code, 0, "{st}");
    let v: Value = serde_json::from_str(&st.stdout).unwrap();
    assert_eq!(v["database"], v["binary"]);
    assert_eq!(v["pending"], json!([]));
    // A newer holdfast migrated this database.
    let dbname = backend
        .split("dbname=")
        .nth(1)
        .unwrap()
        .trim_end_matches(['"', '\n']);
    pg_execute_in(
        &server.base(),
        dbname,
        "INSERT INTO holdfast_schema VALUES (99, 0, 'holdfast 9.9 elsewhere')",
    );
    let st = run(a.holdfast(&["db", "status"]), b"");
    assert_eq!(st.code, 4, "{st}");
    let m = run(a.holdfast(&["db", "migrate"]), b"");
    assert_eq!(m.code, 4, "{m}");
    assert!(
        m.stderr.contains("version 99") && m.stderr.contains("newer"),
        "{m}"
    );
    let d = a.start();
    let mut c = Conn::open(&d.socket);
    let e = c.err("stream.begin", json!({"run_id": "r"}));
    assert_eq!(e["data"]["kind"], "storage", "{e}");
    assert!(e["message"].as_str().unwrap().contains("version 99"), "{e}");
    d.stop();
    // A password in the URL is refused before anything connects.
    a.write_config(
        "[backend]\nkind = \"postgres\"\nurl = \"postgresql://u:hunter2@localhost/db\"\n",
    );
    let o = run(a.holdfast(&["db", "status"]), b"");
    assert_eq!(o.code, 2, "{o}");
    assert!(
        o.stderr.contains("holds a password") && !o.stderr.contains("hunter2"),
        "{o}"
    );
    println!("db status/migrate: 0 -> 2, idempotent; schema 99 refused by CLI (exit 4) and daemon (storage); a password in the URL refused without echoing it");
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// TLS to the server: with `tls = "require"` and the test CA as `ssl_root_cert`, the daemon's
/// connections are encrypted (the server's `pg_stat_ssl` says so) and verified; with another
/// CA the handshake is refused (`storage`, naming the certificate), never retried in clear; and
/// `tls = "disable"` towards a host that is not this one is refused before anything connects.
#[test]
fn tls_to_the_server_is_verified_and_never_falls_back_to_clear_text() {
    if Command::new("openssl").arg("version").output().is_err() {
        println!("SKIPPED tls_to_the_server_is_verified_and_never_falls_back_to_clear_text: no openssl binary to make the test certificates");
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let certs = tempfile::tempdir().unwrap();
    let c = certs.path();
    std::fs::write(c.join("san.ext"), "subjectAltName=DNS:localhost\n").unwrap();
    for ca in ["ca", "other"] {
        openssl(
            c,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                &format!("{ca}.key"),
                "-out",
                &format!("{ca}.pem"),
                "-days",
                "2",
                "-subj",
                &format!("/CN=holdfast test {ca}"),
            ],
        );
    }
    openssl(
        c,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ],
    );
    openssl(
        c,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ],
    );
    let Some(server) = Server::start_with("tls_to_the_server_is_verified", |dir| {
        for f in ["server.crt", "server.key"] {
            std::fs::copy(c.join(f), dir.join(f)).unwrap();
            std::fs::set_permissions(
                dir.join(f),
                std::os::unix::fs::PermissionsExt::from_mode(0o600),
            )
            .unwrap();
            if is_root() {
                let st = Command::new("chown")
                    .arg("postgres:")
                    .arg(dir.join(f))
                    .status()
                    .unwrap();
                assert!(st.success());
            }
        }
        format!(
            "-c listen_addresses=127.0.0.1 -c port={port} -c ssl=on -c ssl_cert_file={0}/server.crt -c ssl_key_file={0}/server.key",
            dir.display()
        )
    }) else {
        return;
    };
    let socket_base = format!("{} port={port}", server.base());
    let db = fresh_pg_backend(&socket_base);
    let dbname = pg_url_of(&db).split("dbname=").nth(1).unwrap().to_owned();
    let user = if is_root() {
        "postgres".to_owned()
    } else {
        std::env::var("USER").unwrap()
    };
    let backend = |ca: &str| {
        format!(
            "[backend]\nkind = \"postgres\"\nurl = \"host=localhost port={port} user={user} dbname={dbname}\"\ntls = \"require\"\nssl_root_cert = \"{}\"\n",
            c.join(ca).display()
        )
    };
    let mut a = host(&backend("ca.pem"));
    let d = a.start();
    let mut conn = Conn::open(&d.socket);
    let r = conn.ok("stream.begin", json!({"run_id": "tls-run"}));
    assert_eq!(r["epoch"], 1);
    let ssl = pg_pairs(
        &format!("{socket_base} dbname={dbname}"),
        "SELECT bool_and(s.ssl)::text, count(*) FROM pg_stat_ssl s
           JOIN pg_stat_activity a USING (pid) WHERE a.application_name = 'holdfast'",
    );
    assert_eq!(
        ssl[0].0, "true",
        "every holdfast connection is TLS: {ssl:?}"
    );
    assert!(ssl[0].1 >= 1, "{ssl:?}");
    d.stop();

    let mut b = host(&backend("other.pem"));
    let d = b.start();
    let mut conn = Conn::open(&d.socket);
    let e = conn.err("stream.begin", json!({"run_id": "tls-run-2"}));
    assert_eq!(e["data"]["kind"], "storage", "{e}");
    let msg = e["message"].as_str().unwrap().to_owned();
    assert!(
        msg.contains("certificate") || msg.contains("UnknownIssuer"),
        "{msg}"
    );
    d.stop();

    b.write_config("[backend]\nkind = \"postgres\"\nurl = \"host=db.example.org user=u dbname=d\"\ntls = \"disable\"\n");
    let o = run(b.holdfast(&["db", "status"]), b"");
    assert_eq!(o.code, 2, "{o}");
    assert!(o.stderr.contains("in clear"), "{o}");
    println!(
        "TLS: {} holdfast connection(s) encrypted and verified against the test CA; another CA refused ({msg}); tls = \"disable\" to a remote host refused",
        ssl[0].1
    );
}

/// `holdfast migrate --to postgres` and back: an active run (mid-stream, resumable), a
/// committed one, a checkpoint and a run log move with their content, verified by the command
/// itself and then served by a daemon on the new backend; a target that is not empty is
/// refused.
#[test]
fn migrate_to_postgres_and_back_keeps_everything() {
    let Some(server) = Server::start("migrate_to_postgres_and_back_keeps_everything") else {
        return;
    };
    let backend = server.backend();
    let as_file = backend.replace("kind = \"postgres\"", "kind = \"file\"");
    let mut a = DaemonEnv::new("");
    a.write_config(&as_file);
    let d = a.start();
    let mut c = Conn::open(&d.socket);
    let sid = c.ok("stream.begin", json!({"run_id": "live", "model": "m"}))["stream_id"].clone();
    for (i, t) in ["The ", "answer ", "is "].iter().enumerate() {
        c.ok(
            "stream.append",
            json!({"run_id": "live", "stream_id": sid, "seq": i + 1,
                   "events": [{"type": "text", "text": t}]}),
        );
    }
    let done = c.ok("stream.begin", json!({"run_id": "done"}))["stream_id"].clone();
    c.ok(
        "stream.append",
        json!({"run_id": "done", "stream_id": done, "seq": 1,
        "events": [{"type": "text", "text": "final"}]}),
    );
    c.ok(
        "stream.commit",
        json!({"run_id": "done", "stream_id": done,
        "final_message": {"role": "assistant", "content": "final"}}),
    );
    c.ok(
        "checkpoint.put",
        json!({"run_id": "cp", "snapshot": {"partial_text": "kept"}}),
    );
    c.ok(
        "run.log_node",
        json!({"run_id": "live", "detail": {"node_id": "plan", "success": true,
        "input_tokens": 7, "output_tokens": 3}}),
    );
    c.ok(
        "run.tool_begin",
        json!({"run_id": "live", "tool_call_id": "t1", "name": "search", "input": {"q": "x"}}),
    );
    c.ok(
        "run.tool_end",
        json!({"run_id": "live", "tool_call_id": "t1", "result": "ok"}),
    );
    c.ok(
        "run.log_node",
        json!({"run_id": "done", "detail": {"node_id": "n", "success": true}}),
    );
    c.ok("run.end", json!({"run_id": "done", "status": "success"}));
    let before_live = c.ok("stream.get", json!({"run_id": "live", "reveal": true}));
    let before_log = c.ok("run.get", json!({"run_id": "live"}));
    d.stop();

    let o = run(a.holdfast(&["migrate", "--to", "postgres"]), b"");
    assert_eq!(o.code, 0, "{o}");
    assert!(o.stdout.contains("moved and verified: 1 active runs (3 events), 1 ended runs, 1 checkpoints, 2 run logs (4 records)"), "{o}");
    // Again: the database is not empty any more.
    let again = run(a.holdfast(&["migrate", "--to", "postgres"]), b"");
    assert_eq!(again.code, 1, "{again}");
    assert!(again.stderr.contains("already holds"), "{again}");

    // Served from the database now.
    a.write_config(&backend);
    let d = a.start();
    let mut c = Conn::open(&d.socket);
    let live = c.ok("stream.get", json!({"run_id": "live", "reveal": true}));
    assert_eq!(live["checkpoint"]["partial_text"], "The answer is ");
    assert_eq!(live["next_seq"], before_live["next_seq"]);
    let log = c.ok("run.get", json!({"run_id": "live"}));
    assert_eq!(log["details"], before_log["details"]);
    assert_eq!(log["tool_log"], before_log["tool_log"]);
    let g = c.ok("stream.get", json!({"run_id": "done", "reveal": true}));
    assert_eq!(g["final_message"]["content"], "final");
    assert_eq!(
        c.ok("checkpoint.get", json!({"run_id": "cp"}))["partial_text"],
        "kept"
    );
    let ended = c.ok("run.get", json!({"run_id": "done"}));
    assert_eq!(ended["ended"], true);
    // The producer's stream goes on where it was, on the new backend.
    c.ok(
        "stream.append",
        json!({"run_id": "live", "stream_id": sid, "seq": 4,
        "events": [{"type": "text", "text": "42."}]}),
    );
    d.stop();

    // And back, into a data directory of its own (this one's files are not empty).
    let back = run(a.holdfast(&["migrate", "--to", "file"]), b"");
    assert_eq!(back.code, 1, "{back}");
    assert!(back.stderr.contains("file backend already holds"), "{back}");
    let mut b = DaemonEnv::new("");
    b.write_config(&backend);
    let o = run(b.holdfast(&["migrate", "--to", "file"]), b"");
    assert_eq!(o.code, 0, "{o}");
    assert!(
        o.stdout
            .contains("1 active runs (4 events), 1 ended runs, 1 checkpoints, 2 run logs"),
        "{o}"
    );
    b.write_config(&as_file);
    let d = b.start();
    let mut c = Conn::open(&d.socket);
    let live = c.ok("stream.get", json!({"run_id": "live", "reveal": true}));
    assert_eq!(live["checkpoint"]["partial_text"], "The answer is 42.");
    let r = c.ok(
        "stream.commit",
        json!({"run_id": "live", "stream_id": sid,
        "final_message": {"role": "assistant"}, "content_from_stream": true}),
    );
    assert_eq!(r["status"], "committed");
    let g = c.ok("stream.get", json!({"run_id": "live", "reveal": true}));
    assert_eq!(g["final_message"]["content"], "The answer is 42.");
    d.stop();
    println!("migrate: files -> postgres (1 active run, 1 ended, 1 checkpoint, 2 run logs, verified; served and continued there) -> files in a new data dir (verified; the run committed there); non-empty targets refused");
}

/// A daemon environment on `backend`, named `name` in the database (two daemons on one
/// machine are two hosts only by their names), whose runs end 2 s after their producer is lost.
fn host_orphans(backend: &str, name: &str) -> DaemonEnv {
    let env = DaemonEnv::new("");
    env.write_config(&format!(
        "[streams]\norphan_timeout_s = 2\n{}\nhost_name = \"{name}\"\n",
        backend.trim_end()
    ));
    env
}

fn sid_of(r: &Value) -> String {
    r["stream_id"].as_str().unwrap().to_owned()
}

fn append_text(c: &mut Conn, run: &str, sid: &str, seq: u64, t: &str) -> Value {
    c.call(
        "stream.append",
        json!({"run_id": run, "stream_id": sid, "seq": seq,
               "events": [{"type": "text", "text": t}]}),
    )
}

/// Regression (issue 35 attack round): a producer whose stream id speaks through two hosts is
/// not lost when the first host's connection closes while the other host's wrote since; a
/// host whose copy of the run is behind takes the next seq after loading it again (not a
/// "gap"); the loss comes when the last connection closes, and the run ends abandoned.
#[test]
fn a_producer_on_two_hosts_is_lost_only_by_its_last_writer_and_stale_copies_reload() {
    let test = "a_producer_on_two_hosts_is_lost_only_by_its_last_writer_and_stale_copies_reload";
    let Some(server) = Server::start(test) else {
        return;
    };
    let backend = server.backend();
    let (mut a, mut b) = (
        host_orphans(&backend, "host-a"),
        host_orphans(&backend, "host-b"),
    );
    let (da, db) = (a.start(), b.start());
    let mut pa = Conn::open(&da.socket);
    let sid = sid_of(&pa.ok("stream.begin", json!({"run_id": "two"})));
    assert_eq!(
        append_text(&mut pa, "two", &sid, 1, "a1 ")["result"]["acked_seq"],
        1
    );
    let mut pb = Conn::open(&db.socket);
    for seq in 2..=3 {
        let r = append_text(&mut pb, "two", &sid, seq, "b ");
        assert_eq!(r["result"]["acked_seq"], seq, "{r}");
    }
    // Host A's copy is behind (it has seq 1): the next seq loads it again, no gap.
    let r = append_text(&mut pa, "two", &sid, 4, "a4 ");
    assert_eq!(r["result"]["acked_seq"], 4, "a stale copy answered: {r}");
    let r = append_text(&mut pb, "two", &sid, 5, "b5 ");
    assert_eq!(r["result"]["acked_seq"], 5, "{r}");
    // A's connection closes; B wrote last: not lost.
    drop(pa);
    thread::sleep(Duration::from_secs(3));
    let r = append_text(&mut pb, "two", &sid, 6, "b6");
    assert_eq!(r["result"]["acked_seq"], 6, "lost while B still spoke: {r}");
    let mut viewer = Conn::open(&da.socket);
    viewer.ok("stream.subscribe", json!({"run_id": "two", "after_seq": 6}));
    drop(pb);
    let mut got = Vec::new();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(40) {
        if let Some(ev) = viewer.next_event(Duration::from_millis(200)) {
            let done = ev["event"]["type"] == "finish";
            got.push(ev["event"].clone());
            if done {
                break;
            }
        }
    }
    let kinds: Vec<String> = got
        .iter()
        .map(|e| {
            format!(
                "{}:{}",
                e["type"],
                e.get("cause").or(e.get("status")).unwrap()
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            r#""interrupted":"producer_lost""#,
            r#""finish":"abandoned""#
        ],
        "{got:?}"
    );
    let mut c = Conn::open(&da.socket);
    let st = c.ok("stream.get", json!({"run_id": "two", "reveal": true}));
    assert_eq!(st["partial_message"]["content"], "a1 b b a4 b5 b6", "{st}");
    println!("two hosts: not lost while the other host's connection wrote last; lost and abandoned after it closed; a stale copy reloaded for seq 4");
    da.stop();
    db.stop();
}

/// Regression (issue 35 attack round): a producer whose connection closes while PostgreSQL is
/// down is lost once it is back — `interrupted` published, the stream id refused, the run
/// abandoned after the timeout — instead of being forgotten.
#[test]
fn a_producer_lost_while_postgres_is_down_is_recorded_once_it_is_back() {
    let test = "a_producer_lost_while_postgres_is_down_is_recorded_once_it_is_back";
    let Some(server) = Server::start(test) else {
        return;
    };
    let backend = server.backend();
    let mut a = host_orphans(&backend, "host-a");
    let d = a.start();
    let mut p = Conn::open(&d.socket);
    let sid = sid_of(&p.ok("stream.begin", json!({"run_id": "down"})));
    assert_eq!(
        append_text(&mut p, "down", &sid, 1, "kept")["result"]["acked_seq"],
        1
    );
    server.crash();
    drop(p); // lost while the database is unreachable
    thread::sleep(Duration::from_secs(2));
    server.restart();
    let mut c = Conn::open(&d.socket);
    let t0 = Instant::now();
    let mut status = String::new();
    while t0.elapsed() < Duration::from_secs(60) {
        if let Some(r) = c
            .call("stream.get", json!({"run_id": "down"}))
            .get("result")
        {
            status = r["status"].as_str().unwrap_or_default().to_owned();
            if status == "abandoned" {
                break;
            }
        }
        thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        status,
        "abandoned",
        "the loss was forgotten:\n{}",
        d.log_text()
    );
    let st = c.ok("stream.get", json!({"run_id": "down", "reveal": true}));
    assert_eq!(st["partial_message"]["content"], "kept", "{st}");
    let mut late = Conn::open(&d.socket);
    let r = append_text(&mut late, "down", &sid, 2, "late");
    assert!(r.get("error").is_some(), "the lost stream id appended: {r}");
    println!(
        "postgres down when the producer closed: recorded when it was back, abandoned after {:?}",
        t0.elapsed()
    );
    d.stop();
}
