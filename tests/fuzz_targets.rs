//! Issue 16: the fuzz targets of `holdfast::fuzz` (the journal's segment scan and record replay,
//! `index.json`, a credential's plaintext, the recovery planner's input, a run log's lines),
//! each checked against its model, driven on every `cargo test`:
//!
//! 1. **Corpus replay.** Every file in `tests/corpus/<target>/` goes through its target: the
//!    seeds (`seed-*`, made by the code that writes those bytes for real:
//!    `write_seed_corpora` below), the inputs the coverage-guided runs kept (`afl-*`, see
//!    `fuzz/README.md`), and any input that once broke an invariant (`crash-*`).
//! 2. **Mutation.** A deterministic xorshift RNG (seed printed; `HOLDFAST_FUZZ_SEED=0x…`
//!    replays a run) mutates corpus inputs — bit flips, interesting bytes, insertions,
//!    deletions, duplications, splices between inputs, the target's dictionary tokens,
//!    truncation — `HOLDFAST_FUZZ_TARGET_ITERS` times per target (default 10,000; the run-log
//!    target, which reads real files, a tenth of that).
//!
//! An input that breaks an invariant (`Fault::Broken`: the model disagreed; or a reader
//! panicked) is written to `tests/corpus/<target>/crash-<sha256[..16]>`, so every
//! later run replays it, and the test fails naming it.
// Test code: fixtures are made directly, and a panic is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::fs;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use holdfast::fuzz::{seeds, Fault, Target, TARGETS};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/corpus")
        .join(target)
}

fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = fs::read_dir(corpus_dir(target))
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.path().is_file())
                .map(|e| {
                    (
                        e.file_name().to_string_lossy().into_owned(),
                        fs::read(e.path()).unwrap(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Tokens each target's mutations splice in (JSON structure, the field names its reader
/// looks for).
fn dictionary(target: &str) -> &'static [&'static [u8]] {
    match target {
        "journal_segment" => &[b"\0\0\0\0", b"\xff\xff\xff\xff", b"HFJ1", b"\x01\0\0\0"],
        "journal_replay" => &[
            b"\"t\":\"ev\"",
            b"\"t\":\"begin\"",
            b"\"t\":\"plan\"",
            b"\"t\":\"snap\"",
            b"\"t\":\"end\"",
            b"\"seq\":",
            b"\"epoch\":",
            b"{\"type\":\"text\",\"text\":\"x\"}",
            b"{\"type\":\"tool_call_end\",\"id\":\"c\"}",
            b"\n",
        ],
        "index_json" => &[
            b"\"version\":\"2.0\"",
            b"\"credentials\":{}",
            b"\"holdfast\":{\"files\":{}}",
            b"\xef\xbb\xbf",
            b"null",
        ],
        "credential_plaintext" => &[
            b"\"id\":\"x\"",
            b"\"keys\":{}",
            b"{\"name\":\"k\",\"value\":\"v\"}",
            b"\"holdfast_generation\":",
            b"-1",
            b"\xef\xbb\xbf",
        ],
        "recovery_input" => &[
            b"\"cause\":",
            b"\"rate_limited\"",
            b"\"retry_after\":",
            b"\"tool_calls\":[{\"id\":\"a\",\"name\":\"n\",\"arguments\":\"{}\"}]",
            b"\"stall_history\":[\"n\"]",
            b"\"attempt\":",
            b"\"policy\":{\"transient_budget\":0}",
            b"\"stale\":{\"reason\":\"r\",\"fail\":true}",
        ],
        "protocol" => &[
            b"\"jsonrpc\":\"2.0\"",
            b"\"method\":\"cred.get\"",
            b"\"params\":{}",
            b"\"id\":1",
            b"\n",
        ],
        "runlog_lines" => &[
            b"\n",
            b"{\"node_id\":\"n\",\"attempt\":1}\n",
            b"\"seq\":18446744073709551615",
            b"\"attempt\":",
            b"\r\n",
        ],
        _ => &[],
    }
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

fn mutate(rng: &mut Rng, input: &[u8], others: &[Vec<u8>], dict: &[&[u8]]) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(v.len() + 1);
        match rng.below(9) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = [0, 0xff, b'"', b'\\', b'\n', b'{', b'}', b'0', 0x80][rng.below(9)];
            }
            2 => v.insert(at, rng.next() as u8),
            3 if !v.is_empty() => {
                let end = (at + 1 + rng.below(16)).min(v.len());
                v.drain(at.min(end)..end);
            }
            4 if !v.is_empty() => {
                let start = rng.below(v.len());
                let end = (start + 1 + rng.below(32)).min(v.len());
                let piece = v[start..end].to_vec();
                v.splice(at..at, piece);
            }
            5 if !others.is_empty() => {
                let o = &others[rng.below(others.len())];
                let start = rng.below(o.len() + 1);
                let end = (start + rng.below(64)).min(o.len());
                v.splice(at..at, o[start..end].iter().copied());
            }
            6 if !dict.is_empty() => {
                let t = dict[rng.below(dict.len())];
                v.splice(at..at, t.iter().copied());
            }
            7 => v.truncate(at),
            _ => {
                let digits = (rng.next() % 100_000).to_string();
                v.splice(at..at, digits.bytes());
            }
        }
    }
    v.truncate(1 << 16);
    v
}

/// A JSON-aware mutation for the targets that read JSON (one document per line): a random
/// value in a random line's tree replaced (a scalar, a dictionary token's value, a copy of
/// another value), or an object's member removed or added, then written back. Byte
/// mutations mostly make JSON that does not parse; these reach the checks behind the parse.
fn mutate_json(rng: &mut Rng, input: &[u8], dict: &[&[u8]]) -> Option<Vec<u8>> {
    let lines: Vec<&[u8]> = input.split(|&b| b == b'\n').collect();
    let pick = rng.below(lines.len());
    let mut doc: Value = serde_json::from_slice(lines[pick]).ok()?;
    let mut nodes = 0;
    count(&doc, &mut nodes);
    let target = rng.below(nodes);
    let replacement = match rng.below(6) {
        0 => Value::Null,
        1 => json!(rng.next() as i64 % 1000 - 10),
        2 => json!("x".repeat(rng.below(5))),
        3 => json!(rng.below(2) == 0),
        4 => dict
            .iter()
            .filter_map(|t| serde_json::from_slice::<Value>(t).ok())
            .nth(rng.below(dict.len()))
            .unwrap_or(Value::Null),
        _ => json!([]),
    };
    let op = rng.below(4);
    let mut seen = 0;
    edit(&mut doc, target, &mut seen, op, replacement, rng);
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if i > 0 {
            out.push(b'\n');
        }
        if i == pick {
            out.extend(serde_json::to_vec(&doc).ok()?);
        } else {
            out.extend_from_slice(l);
        }
    }
    Some(out)
}

fn count(v: &Value, n: &mut usize) {
    *n += 1;
    match v {
        Value::Array(a) => a.iter().for_each(|x| count(x, n)),
        Value::Object(o) => o.values().for_each(|x| count(x, n)),
        _ => {}
    }
}

fn edit(v: &mut Value, target: usize, seen: &mut usize, op: usize, with: Value, rng: &mut Rng) {
    if *seen == target {
        *seen += 1;
        match (op, &mut *v) {
            (1, Value::Object(o)) if !o.is_empty() => {
                let k = o
                    .keys()
                    .nth(rng.below(o.len()))
                    .cloned()
                    .unwrap_or_default();
                o.remove(&k);
            }
            (2, Value::Object(o)) => {
                let k = [
                    "seq",
                    "id",
                    "name",
                    "keys",
                    "value",
                    "attempt",
                    "cause",
                    "holdfast_generation",
                    "retry_after",
                    "stall_history",
                    "logged_at_ms",
                    "x",
                ][rng.below(12)];
                o.insert(k.to_owned(), with);
            }
            (3, Value::Array(a)) if !a.is_empty() => {
                let copy = a[rng.below(a.len())].clone();
                a.insert(rng.below(a.len() + 1), copy);
            }
            _ => *v = with,
        }
        return;
    }
    *seen += 1;
    match v {
        Value::Array(a) => {
            for x in a {
                edit(x, target, seen, op, with.clone(), rng);
            }
        }
        Value::Object(o) => {
            for x in o.values_mut() {
                edit(x, target, seen, op, with.clone(), rng);
            }
        }
        _ => {}
    }
}

/// What one input did.
enum Ran {
    /// Nothing broke; whether it reached the target's deepest checks.
    Reached(bool),
    /// An invariant broke, or a reader panicked: a finding.
    Broken(String),
    /// The target could not set itself up: the machine's fault, not a finding.
    Setup(String),
}

/// Run `f` on `input`, catching a reader's panic as a finding.
fn run(f: Target, input: &[u8], last_panic: &Arc<Mutex<String>>) -> Ran {
    last_panic.lock().unwrap().clear();
    match catch_unwind(AssertUnwindSafe(|| f(input))) {
        Ok(Ok(reached)) => Ran::Reached(reached),
        Ok(Err(Fault::Broken(why))) => Ran::Broken(why),
        Ok(Err(Fault::Setup(why))) => Ran::Setup(why),
        Err(_) => Ran::Broken(format!("panicked: {}", last_panic.lock().unwrap())),
    }
}

fn save_crash(target: &str, input: &[u8]) -> PathBuf {
    let name = format!("crash-{}", &hex(&Sha256::digest(input))[..16]);
    let path = corpus_dir(target).join(name);
    fs::create_dir_all(corpus_dir(target)).unwrap();
    fs::write(&path, input).unwrap();
    path
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn fuzz_every_target() {
    let seed = std::env::var("HOLDFAST_FUZZ_SEED")
        .ok()
        .and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
                | 1
        });
    let iters: usize = std::env::var("HOLDFAST_FUZZ_TARGET_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    // Panics are the findings: keep their messages, not a screenful of backtraces.
    let last_panic = Arc::new(Mutex::new(String::new()));
    let hook_panic = Arc::clone(&last_panic);
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        *hook_panic.lock().unwrap() = info.to_string();
    }));
    let mut failures = Vec::new();
    let mut total = 0usize;
    let started = Instant::now();
    for (target, f) in TARGETS {
        let t0 = Instant::now();
        let files = corpus(target);
        assert!(
            !files.is_empty(),
            "{target}: no corpus in {} (cargo test --test fuzz_targets write_seed_corpora -- --ignored)",
            corpus_dir(target).display()
        );
        let mut deep = 0;
        for (name, input) in &files {
            match run(f, input, &last_panic) {
                Ran::Reached(reached) => deep += usize::from(reached),
                Ran::Broken(why) => failures.push(format!("{target}: corpus file {name}: {why}")),
                Ran::Setup(why) => failures.push(format!("{target}: could not set up: {why}")),
            }
        }
        let corpus_deep = deep;
        let inputs: Vec<Vec<u8>> = files.into_iter().map(|(_, b)| b).collect();
        let mut rng = Rng(seed ^ Sha256::digest(target.as_bytes())[0] as u64 | 1);
        let n = if target == "runlog_lines" {
            iters / 10
        } else {
            iters
        };
        let mut found = 0;
        for _ in 0..n {
            let base = &inputs[rng.below(inputs.len())];
            let json_aware = target != "journal_segment" && rng.below(2) == 0;
            let input = json_aware
                .then(|| mutate_json(&mut rng, base, dictionary(target)))
                .flatten()
                .unwrap_or_else(|| mutate(&mut rng, base, &inputs, dictionary(target)));
            match run(f, &input, &last_panic) {
                Ran::Reached(reached) => deep += usize::from(reached),
                Ran::Setup(why) => {
                    failures.push(format!("{target}: could not set up: {why}"));
                    break;
                }
                Ran::Broken(why) => {
                    let path = save_crash(target, &input);
                    failures.push(format!("{target}: {} ({why})", path.display()));
                    found += 1;
                    if found >= 3 {
                        break;
                    }
                }
            }
        }
        total += inputs.len() + n;
        println!(
            "fuzz {target}: {} corpus inputs replayed ({corpus_deep} reached the model), {n} mutated \
             ({} reached it), {found} broke an invariant [{:.1} s]",
            inputs.len(),
            deep - corpus_deep,
            t0.elapsed().as_secs_f64()
        );
    }
    std::panic::set_hook(previous);
    println!(
        "fuzz targets: {} targets, {total} executions in {:.1} s (seed {seed:#x}, HOLDFAST_FUZZ_SEED to replay); {} failures",
        TARGETS.len(),
        started.elapsed().as_secs_f64(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "invariants broken:\n{}",
        failures.join("\n")
    );
}

/// Writes every target's seeds (`seed-<name>`) into `tests/corpus/<target>/`, made by the code
/// that writes such bytes for real (`holdfast::fuzz::seeds`). Run by hand when a format
/// changes: `cargo test --test fuzz_targets write_seed_corpora -- --ignored`.
#[test]
#[ignore = "writes the seed corpora; run by hand"]
fn write_seed_corpora() {
    for (target, name, bytes) in seeds::all().unwrap() {
        let dir = corpus_dir(target);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(format!("seed-{name}")), bytes).unwrap();
    }
}
