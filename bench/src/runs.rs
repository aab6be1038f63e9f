//! `holdfast bench --runs`: durable `run.log_node` and `run.ensure_node` through a real daemon.
//!
//! In a fresh temporary directory: the floor (a ~300-byte line appended and `fdatasync`ed to a
//! growing file, what one durable node entry costs at least), then 1 and 16 clients, each its
//! own connection and thread: `log_node` of new nodes into a run per client (files apart),
//! `log_node` of new nodes into one shared run (every writer behind one lock: the hive-race
//! shape), `ensure_node` of new nodes (a check and a write), `ensure_node` of nodes already
//! logged (the check alone: no write, no fsync).

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use super::streams::{timed, RawConn};
use super::{fmt_count, fmt_d, out, progress, CliResult, DaemonChild, Env, Global, Stats};

const CLIENTS: &[usize] = &[1, 16];

fn detail(node: &str) -> String {
    format!(
        r#"{{"node_id":"{node}","node_name":"{node}","node_type":"llm","success":true,"attempt":1,"input_tokens":812,"output_tokens":164,"tokens_used":976,"latency_ms":1840,"total_steps":3,"exit_status":"success","trace_id":"0af7651916cd43dd8448eb211c80319c"}}"#
    )
}

#[derive(Clone, Copy)]
enum Op {
    LogOwnRun,
    LogSharedRun,
    EnsureNew,
    EnsureExisting,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::LogOwnRun => "run.log_node, a run per client",
            Op::LogSharedRun => "run.log_node, one shared run",
            Op::EnsureNew => "run.ensure_node, new nodes",
            Op::EnsureExisting => "run.ensure_node, already logged",
        }
    }
}

struct Row {
    op: Op,
    clients: usize,
    ops: usize,
    secs: f64,
    stats: Stats,
}

fn phase(env: &Env, op: Op, clients: usize, d: Duration, tag: &str) -> CliResult<Row> {
    let socket = env.socket.clone();
    let tag = tag.to_owned();
    let (ops, secs, stats) = timed(
        clients,
        d,
        move |i| {
            let mut c = RawConn::open(&socket)?;
            let run = match op {
                Op::LogSharedRun => format!("bench-{tag}-shared"),
                _ => format!("bench-{tag}-{i}"),
            };
            if let Op::EnsureExisting = op {
                // The nodes it will ask about, logged before the clock starts.
                for n in 0..64 {
                    let node = format!("n{n}");
                    c.roundtrip(&format!(
                        r#"{{"jsonrpc":"2.0","id":1,"method":"run.log_node","params":{{"run_id":"{run}","detail":{}}}}}"#,
                        detail(&node)
                    ))?;
                }
            }
            Ok((c, run, i))
        },
        move |(c, run, i): &mut (RawConn, String, usize), n| {
            let req = match op {
                Op::LogOwnRun | Op::LogSharedRun => format!(
                    r#"{{"jsonrpc":"2.0","id":{n},"method":"run.log_node","params":{{"run_id":"{run}","detail":{}}}}}"#,
                    detail(&format!("c{i}-n{n}"))
                ),
                Op::EnsureNew => format!(
                    r#"{{"jsonrpc":"2.0","id":{n},"method":"run.ensure_node","params":{{"run_id":"{run}","node_id":"n{n}","detail":{}}}}}"#,
                    detail(&format!("n{n}"))
                ),
                Op::EnsureExisting => format!(
                    r#"{{"jsonrpc":"2.0","id":{n},"method":"run.ensure_node","params":{{"run_id":"{run}","node_id":"n{}","detail":{{}}}}}}"#,
                    n % 64
                ),
            };
            let answer = c.roundtrip(&req)?;
            let want = match op {
                Op::EnsureExisting => r#""written":false"#,
                _ => r#""written":true"#,
            };
            if !answer.contains(want) {
                return Err(format!("unexpected answer {answer}"));
            }
            Ok(())
        },
    )?;
    Ok(Row {
        op,
        clients,
        ops,
        secs,
        stats,
    })
}

/// Run `holdfast bench --runs`.
pub fn run(g: &Global, quick: bool, seconds: Option<f64>, tmpdir: Option<&Path>) -> CliResult {
    let d = Duration::from_secs_f64(seconds.unwrap_or(if quick { 0.5 } else { 3.0 }));
    let (tmp, env) = super::temp_world(g, tmpdir, "holdfast-bench-runs-")?;
    let n_floor = if quick { 100 } else { 1000 };
    progress(&format!(
        "floor: {n_floor} x (300 B line appended + fdatasync)"
    ));
    let floor = super::floors::line(tmp.path(), n_floor)?;
    let child = DaemonChild::start(&env)?;
    let mut rows = Vec::new();
    for op in [
        Op::LogOwnRun,
        Op::LogSharedRun,
        Op::EnsureNew,
        Op::EnsureExisting,
    ] {
        for &clients in CLIENTS {
            if clients == 1 && matches!(op, Op::LogSharedRun) {
                continue; // the same as a run of its own
            }
            progress(&format!(
                "{}: {clients} client(s) for {:.1} s",
                op.name(),
                d.as_secs_f64()
            ));
            rows.push(phase(
                &env,
                op,
                clients,
                d,
                &format!("{}-{clients}", rows.len()),
            )?);
        }
    }
    child.stop()?;
    let floor_rate = 1.0 / floor.mean.as_secs_f64().max(1e-9);
    if g.structured() {
        g.emit(json!({
            "floor": {"n": floor.n, "p50_us": floor.p50.as_secs_f64() * 1e6,
                      "p99_us": floor.p99.as_secs_f64() * 1e6, "per_sec": floor_rate.round()},
            "rows": rows.iter().map(|r| json!({
                "op": r.op.name(), "clients": r.clients, "ops": r.ops,
                "ops_per_sec": (r.ops as f64 / r.secs).round(), "latency": r.stats.json(),
            })).collect::<Vec<Value>>(),
        }));
        return Ok(());
    }
    out(format!(
        "holdfast bench --runs: {:.1} s per phase",
        d.as_secs_f64()
    ));
    out(format!("temp dir on {}", super::filesystem(tmp.path())));
    out("");
    out(format!(
        "floor: 300 B line appended + fdatasync   n {}   p50 {}   p99 {}   = {} /s back to back",
        floor.n,
        fmt_d(floor.p50),
        fmt_d(floor.p99),
        fmt_count(floor_rate)
    ));
    out("");
    out(format!(
        "{:<36} {:>7} {:>10} {:>10} {:>10} {:>9}",
        "durable run log", "clients", "ops/s", "p50", "p99", "vs floor"
    ));
    for r in &rows {
        let rate = r.ops as f64 / r.secs.max(1e-9);
        out(format!(
            "  {:<34} {:>7} {:>10} {:>10} {:>10} {:>8.2}x",
            r.op.name(),
            r.clients,
            fmt_count(rate),
            fmt_d(r.stats.p50),
            fmt_d(r.stats.p99),
            rate / floor_rate
        ));
    }
    Ok(())
}
