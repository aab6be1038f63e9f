//! `holdfast bench --quick --json` runs end to end: floors, seeding, in-process phases, a real
//! daemon child, 1- and 16-client phases, targets. This checks the shape of its JSON and that
//! every measured figure is a positive number; it asserts nothing about speed (speed is
//! measured, not asserted: see docs/benchmarks.md).
// Test code: fixtures are made directly, and a panic is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

#[allow(dead_code)] // each test binary uses only some of the shared helpers
mod common;

use std::fs;

use serde_json::Value;

fn positive(v: &Value, what: &str) -> f64 {
    let x = v
        .as_f64()
        .unwrap_or_else(|| panic!("{what} is not a number: {v}"));
    assert!(x > 0.0, "{what} is not positive: {x}");
    x
}

/// Every latency/throughput field of a phase row or a floor is a positive number, p99 >= p50.
fn check_figures(row: &Value, fields: &[&str], what: &str) {
    for f in fields {
        positive(&row[*f], &format!("{what}.{f}"));
    }
    if row.get("p50_us").is_some() {
        assert!(
            row["p99_us"].as_f64() >= row["p50_us"].as_f64(),
            "{what}: p99 < p50: {row}"
        );
    }
}

fn find<'a>(rows: &'a [Value], size: u64, clients: u64, op: &str) -> &'a Value {
    rows.iter()
        .find(|r| r["credentials"] == size && r["clients"] == clients && r["op"] == op)
        .unwrap_or_else(|| panic!("no row for {op} with {clients} client(s) at {size}"))
}

/// `holdfast bench` runs `holdfast-bench` from beside the `holdfast` binary; it is another
/// package of the workspace, which `cargo test` does not build for this one's tests.
#[track_caller]
fn bench_binary_is_built() {
    let bench =
        std::path::Path::new(env!("CARGO_BIN_EXE_holdfast")).with_file_name("holdfast-bench");
    assert!(
        bench.is_file(),
        "{} is missing: build it first (cargo build --workspace --bins; scripts/test.sh does)",
        bench.display()
    );
}

#[test]
fn quick_json_run_reports_every_figure() {
    bench_binary_is_built();
    let t = common::TempHome::new();
    let tmp = t.root.join("tmp");
    fs::create_dir(&tmp).expect("mkdir tmp");
    let mut c = t.cmd();
    c.args(["bench", "--quick", "--json"]).env("TMPDIR", &tmp);
    let started = std::time::Instant::now();
    let out = common::run(c, b"");
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(out.code, 0, "{out}");
    assert!(out.stderr.contains("bench: floors"), "no progress: {out}");
    let v: Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out}"));

    assert_eq!(v["settings"]["quick"], true);
    assert!(v["command"].as_str().unwrap().contains("bench --quick"));
    assert!(matches!(v["build"].as_str(), Some("debug" | "release")));
    positive(&v["machine"]["cpus"], "machine.cpus");
    assert!(v["machine"]["filesystem"].is_string());
    let sizes: Vec<u64> = v["settings"]["sizes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_u64().unwrap())
        .collect();
    let clients: Vec<u64> = v["settings"]["clients"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_u64().unwrap())
        .collect();
    assert_eq!(sizes, [100, 1000], "quick sizes");
    assert_eq!(clients, [1, 16], "default clients");

    let figures = ["n", "p50_us", "p99_us", "mean_us"];
    for floor in [
        "socket_round_trip_100b",
        "fsync_4k_in_place",
        "fsync_4k_new_file",
        "atomic_create_4k",
        "atomic_replace_4k",
    ] {
        check_figures(&v["floors"][floor], &figures, floor);
    }

    let seeding = v["seeding"].as_array().expect("seeding");
    assert_eq!(seeding.len(), sizes.len());
    for (s, &size) in seeding.iter().zip(&sizes) {
        assert_eq!(s["credentials"], size);
        check_figures(
            s,
            &["added", "secs", "per_sec", "index_json_bytes"],
            "seeding",
        );
    }

    let phase = ["ops", "secs", "ops_per_sec", "p50_us", "p99_us", "mean_us"];
    let local = v["in_process"].as_array().expect("in_process");
    let daemon = v["daemon"].as_array().expect("daemon");
    let mut rows = 0;
    for &size in &sizes {
        for op in ["store.get", "store.set", "set (batch)"] {
            check_figures(find(local, size, 1, op), &phase, op);
        }
        check_figures(find(daemon, size, 1, "no-op"), &phase, "no-op");
        rows += 1;
        for &n in &clients {
            for op in ["cred.get", "cred.set"] {
                check_figures(
                    find(daemon, size, n, op),
                    &phase,
                    &format!("{op} x{n} @{size}"),
                );
                rows += 1;
            }
        }
    }
    assert_eq!(daemon.len(), rows, "unexpected daemon rows");

    // Targets: get vs floor per size, set rate per size, and flatness across sizes.
    let targets = v["targets"].as_array().expect("targets");
    assert_eq!(targets.len(), 2 * sizes.len() + 1, "{targets:?}");
    for t in targets {
        assert!(t["pass"].is_boolean(), "{t}");
        assert!(t["target"].is_string(), "{t}");
        let measured = ["measured_us", "measured_per_sec", "ratio"]
            .iter()
            .find_map(|k| t.get(*k))
            .unwrap_or_else(|| panic!("target without a figure: {t}"));
        positive(measured, "target figure");
    }
    let attribution = v["attribution_p50"].as_array().expect("attribution");
    assert_eq!(attribution.len(), sizes.len());
    for a in attribution {
        for k in [
            "daemon_noop_round_trip_us",
            "store_get_in_process_us",
            "cred_get_us",
            "store_set_file_only_us",
            "store_set_with_index_rewrite_us",
            "cred_set_us",
        ] {
            positive(&a[k], k);
        }
        assert!(a["index_rewrite_us"].is_number(), "{a}");
    }

    // The temporary data dir (store, key, socket, daemon log) is gone afterwards.
    let left: Vec<_> = fs::read_dir(&tmp)
        .expect("read tmp")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "bench left {left:?} in its TMPDIR");
    eprintln!(
        "bench --quick --json: {secs:.1} s; {} daemon rows, {} targets ({} PASS)",
        daemon.len(),
        targets.len(),
        targets.iter().filter(|t| t["pass"] == true).count()
    );
}

#[test]
fn sizes_smaller_than_the_client_count_are_a_usage_error() {
    bench_binary_is_built();
    let t = common::TempHome::new();
    let mut c = t.cmd();
    c.args(["bench", "--sizes", "10", "--clients", "16"]);
    let out = common::run(c, b"");
    assert_eq!(out.code, 2, "{out}");
    assert!(out.stderr.contains("--sizes"), "{out}");
}

/// `holdfast bench --streams --quick --json`: every system measured reports positive figures,
/// the start-up phase restores all its runs, and every target has a verdict or says why not.
#[test]
fn streams_quick_json_run_reports_every_figure() {
    bench_binary_is_built();
    let t = common::TempHome::new();
    let tmp = t.root.join("tmp");
    fs::create_dir(&tmp).expect("mkdir tmp");
    let mut c = t.cmd();
    c.args(["bench", "--streams", "--quick", "--json"])
        .env("TMPDIR", &tmp);
    let out = common::run(c, b"");
    assert_eq!(out.code, 0, "{out}");
    let v: Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out}"));
    for f in ["fdatasync_20b_preallocated", "fdatasync_20b_append"] {
        check_figures(&v["floors"][f], &["n", "p50_us", "p99_us"], f);
    }
    let rows = v["rows"].as_array().expect("rows");
    for streams in [1, 16, 256] {
        let row = rows
            .iter()
            .find(|r| r["system"] == "holdfast stream.append" && r["streams"] == streams)
            .unwrap_or_else(|| panic!("no holdfast row for {streams}"));
        positive(&row["ops_per_sec"], "holdfast ops_per_sec");
        positive(&row["server_cpu_us_per_op"], "holdfast server CPU per op");
        check_figures(
            &row["latency"],
            &["n", "p50_us", "p99_us"],
            "holdfast latency",
        );
    }
    let measured: Vec<&str> = rows.iter().filter_map(|r| r["system"].as_str()).collect();
    assert!(
        measured.iter().any(|s| s.starts_with("SQLite")),
        "{measured:?}"
    );
    assert_eq!(
        v["startup"]["restored"], v["startup"]["runs"],
        "{}",
        v["startup"]
    );
    positive(&v["startup"]["ready_secs"], "startup.ready_secs");
    for t in v["targets"].as_array().expect("targets") {
        assert!(t["measured"].is_string() && t.get("pass").is_some(), "{t}");
    }
    println!(
        "bench --streams --quick: {} rows ({}), start-up {} s",
        rows.len(),
        measured.join(", "),
        v["startup"]["ready_secs"]
    );
}

/// `holdfast bench --runs --quick --json`: every phase reports positive figures.
#[test]
fn runs_quick_json_run_reports_every_figure() {
    bench_binary_is_built();
    let t = common::TempHome::new();
    let tmp = t.root.join("tmp");
    fs::create_dir(&tmp).expect("mkdir tmp");
    let mut c = t.cmd();
    c.args(["bench", "--runs", "--quick", "--json"])
        .env("TMPDIR", &tmp);
    let out = common::run(c, b"");
    assert_eq!(out.code, 0, "{out}");
    let v: Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out}"));
    check_figures(&v["floor"], &["n", "p50_us", "p99_us"], "floor");
    let rows = v["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 7, "{v}");
    for r in rows {
        positive(&r["ops_per_sec"], "ops_per_sec");
        check_figures(&r["latency"], &["n", "p50_us", "p99_us"], "latency");
    }
    println!("bench --runs --quick: {} rows", rows.len());
}
