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

/// A figure that is a number and at least 0: a CPU time read from the kernel's clock ticks
/// (10 ms each) over a short run can be 0 on a loaded or fast machine, and no test may depend
/// on a measured figure's precision.
fn non_negative(v: &Value, what: &str) -> f64 {
    let x = v
        .as_f64()
        .unwrap_or_else(|| panic!("{what} is not a number: {v}"));
    assert!(x >= 0.0, "{what} is negative: {x}");
    x
}

/// Whether `ratio` (rounded to 3 decimals) can be `num / den` where both were rounded to 0.1
/// (the JSON's p50s): the interval the unrounded quotient may lie in, not a relative
/// tolerance that a floor of ~3 µs makes too tight.
fn ratio_of_rounded(ratio: f64, num: f64, den: f64) -> bool {
    let (r, q) = (0.05, 0.0005);
    let lo = (num - r) / (den + r) - q;
    let hi = if den > r {
        (num + r) / (den - r) + q
    } else {
        f64::MAX
    };
    ratio >= lo && ratio <= hi
}

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
        // The 1-client get again through the raw line client, which the target is judged by.
        check_figures(
            find(daemon, size, 1, "cred.get (raw client)"),
            &phase,
            "raw get",
        );
        rows += 1;
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
        if t.get("limit_per_sec").is_some() {
            // The set rate's floor, the atomic replace alone, is measured just before the sets.
            positive(
                &t["adjacent_floor_per_sec"],
                "the set target's adjacent floor",
            );
            check_figures(
                &t["adjacent_floor"],
                &["n", "p50_us", "p99_us", "mean_us"],
                "adjacent floor",
            );
            // And served: the same replace done by another process before it answers a socket
            // round trip, measured right after it.
            let served = positive(&t["served_floor_per_sec"], "the set target's served floor");
            check_figures(
                &t["served_floor"],
                &["n", "p50_us", "p99_us", "mean_us"],
                "served floor",
            );
            // The rate is that floor's (one over its mean), not another measurement's.
            let mean_us = positive(&t["served_floor"]["mean_us"], "the served floor's mean");
            assert!((1e6 / mean_us - served).abs() <= 1.0 + 0.01 * served, "{t}");
            // The verdict's floor: the rounds' median where they ran (as here, with two
            // sizes and one client), each round's floor recorded beside its rate.
            let judged = positive(
                &t["judged_served_floor_per_sec"],
                "the set target's judged served floor",
            );
            assert_eq!(t["judged_on"], "the interleaved rounds (medians)", "{t}");
            let rounds: Vec<f64> = v["set_rounds"]["rounds"]
                .as_array()
                .expect("set rounds")
                .iter()
                .flat_map(|r| r.as_array().expect("a round").iter())
                .filter(|x| x["credentials"] == t["credentials"])
                .map(|x| positive(&x["served_floor_per_sec"], "a round's served floor"))
                .collect();
            assert!(!rounds.is_empty(), "{t}");
            let (lo, hi) = rounds
                .iter()
                .fold((f64::MAX, 0.0f64), |(a, b), &x| (a.min(x), b.max(x)));
            assert!(
                judged >= lo - 1.0 && judged <= hi + 1.0,
                "{t} vs {rounds:?}"
            );
        }
        if t.get("floor_us").is_some() {
            // The get target is judged by the raw client, with the library's figure beside it.
            assert_eq!(t["client"], "cred.get (raw client)", "{t}");
            positive(&t["library_client_us"], "the library client's get");
            // With two CPUs or more it is judged placed alike: both placements measured, the
            // verdict theirs (each within 3x its own floor).
            if v["machine"]["cpus"].as_u64().unwrap_or(0) >= 2 {
                let placed = t["placed"].as_array().expect("placed round trips");
                let labels: Vec<&str> = placed
                    .iter()
                    .map(|p| p["placement"].as_str().unwrap())
                    .collect();
                assert_eq!(labels, ["one CPU", "two CPUs"], "{t}");
                let mut all = true;
                for p in placed {
                    let floor = positive(&p["floor"]["p50_us"], "a placed floor");
                    let get = positive(&p["get"]["p50_us"], "a placed get");
                    let ratio = positive(&p["ratio"], "a placed ratio");
                    assert!(ratio_of_rounded(ratio, get, floor), "{p}");
                    assert_eq!(p["client_cpu"], 0, "{p}");
                    all &= ratio <= 3.0;
                }
                assert_eq!(t["pass"], all, "the verdict is the placed ratios': {t}");
            }
        }
    }
    if v["machine"]["cpus"].as_u64().unwrap_or(0) >= 2 {
        let placed = v["placed_round_trips"]
            .as_array()
            .expect("placed_round_trips");
        assert_eq!(placed.len(), 2 * sizes.len(), "{placed:?}");
    }
    // Flatness is judged on interleaved rounds: every round measured every size, the order
    // rotating, and the target's ratio is the median of the rounds' own ratios.
    let rounds = v["set_rounds"]["rounds"].as_array().expect("set_rounds");
    assert_eq!(rounds.len(), 2, "quick runs 2 rounds: {rounds:?}");
    let mut firsts = Vec::new();
    let mut per_round = Vec::new();
    for round in rounds {
        let round = round.as_array().expect("a round");
        let mut seen: Vec<u64> = round
            .iter()
            .map(|x| x["credentials"].as_u64().unwrap())
            .collect();
        firsts.push(seen[0]);
        seen.sort_unstable();
        assert_eq!(seen, sizes, "a round measures every size once");
        let rate = |size: u64| {
            let x = round.iter().find(|x| x["credentials"] == size).unwrap();
            positive(&x["per_sec"], "a round's set rate");
            x["per_sec"].as_f64().unwrap()
        };
        per_round.push(rate(sizes[1]) / rate(sizes[0]));
    }
    assert_ne!(firsts[0], firsts[1], "the order rotates between rounds");
    let flat = targets
        .iter()
        .find(|t| t.get("round_ratios").is_some())
        .expect("the flatness target");
    let judged: Vec<f64> = flat["round_ratios"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_f64().unwrap())
        .collect();
    for (j, r) in judged.iter().zip(&per_round) {
        assert!(
            (j - r).abs() < 0.01,
            "round ratios {judged:?} vs rates {per_round:?}"
        );
    }
    let median = (judged[0] + judged[1]) / 2.0;
    assert!(
        (flat["ratio"].as_f64().unwrap() - median).abs() < 0.002,
        "{flat}"
    );
    assert_eq!(flat["pass"], median >= 0.9, "{flat}");
    positive(&flat["sequential_ratio"], "the sequential phases' ratio");

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
        non_negative(&row["server_cpu_us_per_op"], "holdfast server CPU per op");
        check_figures(
            &row["latency"],
            &["n", "p50_us", "p99_us"],
            "holdfast latency",
        );
    }
    // The two ceilings (bench/src/ceiling.rs) are measured whenever the peers are, with the
    // same load: both the server's CPU and the clients' are read.
    for system in [
        "ceiling: group commit, nothing else",
        "ceiling + parse + seal",
    ] {
        for streams in [1, 16, 256] {
            let row = rows
                .iter()
                .find(|r| r["system"] == system && r["streams"] == streams)
                .unwrap_or_else(|| panic!("no {system} row for {streams}"));
            positive(&row["ops_per_sec"], system);
            non_negative(&row["server_cpu_us_per_op"], system);
            non_negative(&row["client_cpu_us_per_op"], system);
        }
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

/// `holdfast bench --report FILE --readme README --quick`: every part runs, FILE's generated
/// part is replaced and nothing else in it, the charts it links exist and say the machine,
/// date and command, the raw figures are kept, the README's summary is the report's, and the
/// progress lines say what is left. Nothing about speed is asserted.
#[test]
fn quick_report_writes_the_document_charts_and_readme_summary() {
    bench_binary_is_built();
    let t = common::TempHome::new();
    let tmp = t.root.join("tmp");
    let docs = t.root.join("docs");
    fs::create_dir(&tmp).expect("mkdir tmp");
    fs::create_dir(&docs).expect("mkdir docs");
    let begin =
        "<!-- holdfast bench --report: begin (generated; rerun the command to change it) -->";
    let end = "<!-- holdfast bench --report: end -->";
    let file = docs.join("benchmarks.md");
    fs::write(
        &file,
        format!("# Benchmarks\n\nintro kept\n\n{begin}\nstale figures\n{end}\n\n## Hand-written\nanalysis kept\n"),
    )
    .unwrap();
    let readme = t.root.join("README.md");
    fs::write(
        &readme,
        "# x\n\n<!-- holdfast bench --report: summary begin (generated from docs/benchmarks.md's run) -->\nold claim\n<!-- holdfast bench --report: summary end -->\n\nrest kept\n",
    )
    .unwrap();
    let report = || {
        let mut c = t.cmd();
        c.current_dir(&t.root)
            .args(["bench", "--report", "docs/benchmarks.md"])
            .args(["--readme", "README.md"]);
        c
    };
    let o = report()
        .args(["--quick", "--seconds", "0.1", "--tmpdir"])
        .arg(&tmp)
        .output()
        .expect("run holdfast bench --report");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "bench --report failed: {stderr}");
    // Progress: the part, the time spent and the time left, on every line.
    for part in ["1/3 credentials", "2/3 streams", "3/3 run logs"] {
        assert!(stderr.contains(part), "no progress for {part}: {stderr}");
    }
    assert!(
        stderr
            .lines()
            .filter(|l| l.starts_with("bench: "))
            .all(|l| l.contains(" left] ")),
        "{stderr}"
    );

    let doc = fs::read_to_string(&file).unwrap();
    assert!(doc.starts_with("# Benchmarks\n\nintro kept\n\n"), "{doc}");
    assert!(
        doc.ends_with("\n\n## Hand-written\nanalysis kept\n"),
        "{doc}"
    );
    assert!(!doc.contains("stale figures"));
    assert_eq!(
        (doc.matches(begin).count(), doc.matches(end).count()),
        (1, 1)
    );
    for needle in [
        "### Targets",
        "| stream.append, 16 streams |",
        "### Streams",
        "### Credentials",
        "### Run logs",
        "**Machine:**",
        "holdfast bench --report docs/benchmarks.md",
    ] {
        assert!(doc.contains(needle), "no {needle:?} in the report:\n{doc}");
    }
    if std::thread::available_parallelism().map_or(1, usize::from) >= 2 {
        // The cred.get target is judged placed alike, and the report shows those round trips.
        for needle in [
            "| credentials | placed on | socket floor p50 |",
            "| 100 | one CPU (client CPU 0, server CPU 0) |",
            "| 1,000 | two CPUs (client CPU 0, server CPU 1) |",
            "≤ 3× the socket floor, both placed alike",
        ] {
            assert!(doc.contains(needle), "no {needle:?} in the report:\n{doc}");
        }
    }
    let charts: Vec<&str> = doc
        .split("](benchmarks/")
        .skip(1)
        .filter_map(|s| s.split(')').next())
        .filter(|s| s.ends_with(".svg"))
        .collect();
    assert!(charts.len() >= 6, "charts linked: {charts:?}");
    for name in &charts {
        let svg = fs::read_to_string(docs.join("benchmarks").join(name))
            .unwrap_or_else(|e| panic!("{name} is linked but not there: {e}"));
        assert!(
            svg.starts_with("<svg ") && svg.trim_end().ends_with("</svg>"),
            "{name}"
        );
        assert!(
            svg.contains("holdfast bench --report") && svg.contains(" UTC"),
            "{name} has no provenance"
        );
        assert!(svg.contains("<title>"), "{name} has no values");
    }
    let raw: Value =
        serde_json::from_slice(&fs::read(docs.join("benchmarks/report.json")).unwrap()).unwrap();
    let parts = raw["parts"].as_array().unwrap();
    assert_eq!(
        parts
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["credentials", "streams", "run logs"]
    );
    positive(&raw["seconds_total"], "seconds_total");
    let readme = fs::read_to_string(&readme).unwrap();
    assert!(
        !readme.contains("old claim") && readme.ends_with("summary end -->\n\nrest kept\n"),
        "{readme}"
    );
    assert!(
        readme.contains("[the report](docs/benchmarks.md)") && readme.contains("stream.append"),
        "{readme}"
    );
    // Written again from report.json, measuring nothing: the same document and summary.
    let o = report()
        .args(["--from-json", "docs/benchmarks/report.json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        fs::read_to_string(&file).unwrap(),
        doc,
        "--from-json wrote another document"
    );
    assert_eq!(
        fs::read_to_string(t.root.join("README.md")).unwrap(),
        readme
    );
    println!(
        "bench --report --quick: {} charts, {} s, {} README lines",
        charts.len(),
        raw["seconds_total"],
        readme.lines().count()
    );
}

/// A README without the summary markers is refused before anything is measured.
#[test]
fn report_readme_without_markers_is_refused_at_once() {
    bench_binary_is_built();
    let t = common::TempHome::new();
    fs::write(t.root.join("README.md"), "# x\nno markers\n").unwrap();
    let o = t
        .cmd()
        .current_dir(&t.root)
        .args(["bench", "--report", "out.md", "--readme", "README.md"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("no summary markers") && err.contains("summary begin"),
        "{err}"
    );
    // Refused before anything was made: no report, no charts directory.
    assert!(!t.root.join("out.md").exists() && !t.root.join("out").exists());
}
