//! Concurrency: several processes and threads writing one store at once (issue 2, checklist 23).
//!
//! Child processes are this test binary re-executed with `--exact <child test> --ignored`; the
//! child entry points are `#[ignore]`d tests that do nothing unless the `HF_CHILD_*` environment
//! variables are set. Every child waits behind a start barrier (a file the parent creates once
//! all children have reported ready) so the writes really overlap.
// Test code: fixtures are made directly, and a panic is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

#[allow(dead_code)] // each test binary uses only some of the shared helpers
mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use common::{index_json, reexec, store_config, temps_in, value_of, TestStore};
use holdfast::crypto::Secret;
use holdfast::error::ErrorKind;
use holdfast::store::{Credential, CredentialStore, Error, StoreOptions};

const STORE_NAME: &str = "concurrency-test";

/// Multiplier for loop counts (`HOLDFAST_TEST_SCALE`, default 1; the defaults meet the issue's
/// minimums).
fn scale() -> usize {
    std::env::var("HOLDFAST_TEST_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| n >= 1)
        .unwrap_or(1)
}

/// Temp files anywhere under the store (names containing `.hf-tmp-`).
fn temp_files(base: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for sub in ["credentials", "metadata", ""] {
        for n in temps_in(&base.join(sub)) {
            found.push(format!("{sub}/{n}"));
        }
    }
    found
}

fn index_ids(base: &Path) -> BTreeSet<String> {
    index_json(base)["credentials"]
        .as_object()
        .expect("index.json has a credentials object")
        .keys()
        .cloned()
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Child processes

/// Environment a child reads.
struct ChildEnv {
    base: PathBuf,
    key: PathBuf,
    worker: usize,
    count: usize,
    barrier: PathBuf,
    out: PathBuf,
}

impl ChildEnv {
    fn from_env() -> Option<Self> {
        let get = |k: &str| std::env::var_os(k);
        Some(ChildEnv {
            base: get("HF_CHILD_BASE")?.into(),
            key: get("HF_CHILD_KEY")?.into(),
            worker: get("HF_CHILD_WORKER")?.to_str()?.parse().ok()?,
            count: get("HF_CHILD_COUNT")?.to_str()?.parse().ok()?,
            barrier: get("HF_CHILD_BARRIER")?.into(),
            out: get("HF_CHILD_OUT")?.into(),
        })
    }

    /// Report ready, then wait for the parent's go file.
    fn wait_for_start(&self) {
        fs::write(
            self.barrier
                .with_file_name(format!("ready-{}", self.worker)),
            b"",
        )
        .expect("write ready file");
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.barrier.exists() {
            assert!(Instant::now() < deadline, "start barrier never opened");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

fn spawn_children(
    child_test: &str,
    ts: &TestStore,
    workers: usize,
    count: usize,
    tag: &str,
) -> Vec<(Child, PathBuf)> {
    let sync = ts.root.join(format!("sync-{tag}"));
    fs::create_dir_all(&sync).expect("sync dir");
    let barrier = sync.join("go");
    let mut children = Vec::new();
    for w in 0..workers {
        let out = sync.join(format!("out-{w}"));
        let child = reexec(child_test, &ts.home())
            .env("HF_CHILD_BASE", &ts.base)
            .env("HF_CHILD_KEY", &ts.key)
            .env("HF_CHILD_WORKER", w.to_string())
            .env("HF_CHILD_COUNT", count.to_string())
            .env("HF_CHILD_BARRIER", &barrier)
            .env("HF_CHILD_OUT", &out)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn child");
        children.push((child, out));
    }
    // Open the barrier only when every child is ready to write.
    let deadline = Instant::now() + Duration::from_secs(60);
    while (0..workers).any(|w| !sync.join(format!("ready-{w}")).exists()) {
        assert!(
            Instant::now() < deadline,
            "children did not get ready in time"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    fs::write(&barrier, b"go").expect("open barrier");
    children
}

/// Wait for every child; panic with its output if one failed. Returns each child's out file.
fn wait_children(children: Vec<(Child, PathBuf)>) -> Vec<String> {
    let mut outs = Vec::new();
    for (child, out) in children {
        let o = child.wait_with_output().expect("wait child");
        let stdout = String::from_utf8_lossy(&o.stdout);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(
            o.status.success(),
            "child failed ({}):\n{stdout}\n{stderr}",
            o.status
        );
        // The child test must actually have run (not been filtered out).
        assert!(
            stdout.contains("1 passed"),
            "child test did not run:\n{stdout}\n{stderr}"
        );
        outs.push(fs::read_to_string(&out).expect("child out file"));
    }
    outs
}

fn distinct_id(worker: usize, i: usize) -> String {
    format!("proc{worker}/cred-{i:04}")
}

fn distinct_value(worker: usize, i: usize) -> String {
    // Varying lengths, unique per id.
    format!("v-{worker}-{i}-{}", "z".repeat((worker * 31 + i * 7) % 300))
}

/// Child of [`four_processes_distinct_ids`]: writes `count` distinct ids.
#[test]
#[ignore = "child process entry point of four_processes_distinct_ids"]
fn child_distinct_ids() {
    run_child("child_distinct_ids", |w, i| {
        (distinct_id(w, i), distinct_value(w, i))
    });
}

/// The body of every child entry point: open the store, wait for the start barrier, set
/// `count` credentials named and valued by `cred(worker, i)`, and write the generations each
/// set returned to the parent's output file.
fn run_child(name: &str, cred: impl Fn(usize, usize) -> (String, String)) {
    let Some(env) = ChildEnv::from_env() else {
        eprintln!("{name}: not started as a child (no HF_CHILD_* env); nothing to do");
        return;
    };
    let store = CredentialStore::open(
        store_config(STORE_NAME, &env.base, &env.key),
        StoreOptions::default(),
    )
    .expect("child open");
    env.wait_for_start();
    let mut gens = Vec::new();
    for i in 0..env.count {
        let (id, value) = cred(env.worker, i);
        let g = store
            .set(Credential::api_key(&id, Secret::new(value)), None)
            .unwrap_or_else(|e| panic!("child {} set {id} #{i}: {e}", env.worker));
        gens.push(g.to_string());
    }
    drop(store);
    fs::write(&env.out, gens.join("\n")).expect("write out");
}

fn same_value(worker: usize, i: usize) -> String {
    // Distinct per writer and iteration, lengths from 20 to ~1000 bytes, self-describing so a
    // mix of two values is detectable: the filler length and character are derived from the
    // header.
    let len = (worker * 257 + i * 61) % 977;
    let fill = (b'a' + worker as u8) as char;
    format!("w{worker}:i{i}:n{len}:{}", fill.to_string().repeat(len))
}

/// A value is complete when it parses as `w{w}:i{i}:n{len}:` followed by exactly what
/// [`same_value`] would write.
fn parse_same_value(v: &str) -> Option<(usize, usize)> {
    let mut parts = v.splitn(4, ':');
    let w: usize = parts.next()?.strip_prefix('w')?.parse().ok()?;
    let i: usize = parts.next()?.strip_prefix('i')?.parse().ok()?;
    (same_value(w, i) == v).then_some((w, i))
}

/// Child of [`same_id_processes`]: sets one id `count` times.
#[test]
#[ignore = "child process entry point of same_id_processes"]
fn child_same_id() {
    run_child("child_same_id", |w, i| {
        ("shared".to_owned(), same_value(w, i))
    });
}

// ---------------------------------------------------------------------------------------------
// Tests

#[test]
fn four_processes_distinct_ids() {
    let workers = 4;
    let per = 250 * scale();
    let ts = TestStore::new(STORE_NAME);
    let started = Instant::now();
    let children = spawn_children("child_distinct_ids", &ts, workers, per, "distinct");
    let outs = wait_children(children);
    let elapsed = started.elapsed();
    for (w, out) in outs.iter().enumerate() {
        assert_eq!(out.lines().count(), per, "worker {w} acknowledged writes");
        assert!(
            out.lines().all(|g| g == "1"),
            "worker {w}: a new id must get generation 1"
        );
    }

    let total = workers * per;
    let expected: BTreeMap<String, String> = (0..workers)
        .flat_map(|w| (0..per).map(move |i| (distinct_id(w, i), distinct_value(w, i))))
        .collect();
    // The index as the writers left it (hive lists from it), before any reopen repairs it.
    let index_before = index_ids(&ts.base);

    let store = ts.open();
    assert_eq!(
        store.open_report().orphans.len() + store.open_report().ghosts.len(),
        0,
        "open found index drift: {}",
        store.open_report()
    );
    let listing = store.list().expect("list");
    let listed: BTreeSet<String> = listing.credentials.iter().map(|c| c.id.clone()).collect();
    let missing_list = expected.keys().filter(|id| !listed.contains(*id)).count();
    let extra_list = listed
        .iter()
        .filter(|id| !expected.contains_key(*id))
        .count();
    let mut readable = 0;
    let mut wrong = Vec::new();
    for (id, want) in &expected {
        match store.get(id) {
            Ok(c) if value_of(&c) == *want && c.id() == id => readable += 1,
            Ok(c) => wrong.push(format!("{id}: wrong value (len {})", value_of(&c).len())),
            Err(e) => wrong.push(format!("{id}: {e}")),
        }
    }
    drop(store);
    let store = ts.open();
    drop(store);
    let index_after = index_ids(&ts.base);
    let temps = temp_files(&ts.base);
    println!(
        "4 processes x {per} distinct ids in {:.1} s: {}/{total} listed, {readable}/{total} readable \
         with the exact value, index.json lists {} as the writers left it and {} after reopen, \
         {} missing from list, {} unexpected, {} wrong, {} temp files",
        elapsed.as_secs_f64(),
        listed.len(),
        index_before.len(),
        index_after.len(),
        missing_list,
        extra_list,
        wrong.len(),
        temps.len()
    );
    assert_eq!(listing.unreadable, 0);
    assert_eq!(listed.len(), total);
    assert_eq!((missing_list, extra_list), (0, 0));
    assert!(wrong.is_empty(), "{wrong:?}");
    assert_eq!(readable, total);
    let expected_ids: BTreeSet<String> = expected.keys().cloned().collect();
    assert_eq!(
        index_after, expected_ids,
        "index.json after reopen must list every id"
    );
    assert_eq!(
        index_before, expected_ids,
        "index.json as left by the writers must list every id"
    );
    assert!(temps.is_empty(), "temp files left: {temps:?}");
}

/// Check the generations every writer got back: together exactly 1..=n, each once.
fn check_generations(all: &[u64], n: usize) -> (usize, usize) {
    let set: BTreeSet<u64> = all.iter().copied().collect();
    let dupes = all.len() - set.len();
    let missing = (1..=n as u64).filter(|g| !set.contains(g)).count();
    (dupes, missing)
}

#[test]
fn same_id_processes() {
    let workers = 4;
    let per = 100 * scale();
    let ts = TestStore::new(STORE_NAME);
    let started = Instant::now();
    let children = spawn_children("child_same_id", &ts, workers, per, "same");
    let outs = wait_children(children);
    let elapsed = started.elapsed();
    let mut all_gens = Vec::new();
    for out in &outs {
        let gens: Vec<u64> = out.lines().map(|l| l.parse().expect("gen")).collect();
        assert_eq!(gens.len(), per);
        assert!(
            gens.windows(2).all(|w| w[0] < w[1]),
            "one writer's generations must increase"
        );
        all_gens.extend(gens);
    }
    let total = workers * per;
    let (dupes, missing) = check_generations(&all_gens, total);
    // Which writer wrote last: the one that got the highest generation.
    let last_writer = outs
        .iter()
        .position(|o| o.lines().any(|l| l == total.to_string()))
        .expect("someone got the last generation");

    let store = ts.open();
    let c = store.get("shared").expect("get shared");
    let v = value_of(&c);
    let parsed = parse_same_value(&v);
    println!(
        "same id from 4 processes x {per} sets in {:.1} s: final generation {} (want {total}), \
         {dupes} duplicate and {missing} missing generations, final value {} ({} bytes), last \
         writer by generation: {last_writer}",
        elapsed.as_secs_f64(),
        c.generation(),
        match parsed {
            Some((w, i)) => format!("= writer {w}'s write #{i}"),
            None => "is NOT any writer's complete value".into(),
        },
        v.len()
    );
    assert_eq!(c.generation(), total as u64);
    assert_eq!((dupes, missing), (0, 0));
    assert_eq!(
        parsed,
        Some((last_writer, per - 1)),
        "final value must be the last value of the writer that got the last generation"
    );
    assert!(temp_files(&ts.base).is_empty());
}

#[test]
fn same_id_threads() {
    let threads = 8;
    let per = 100 * scale();
    let ts = TestStore::new(STORE_NAME);
    let store = ts.open();
    // Half the threads share one handle, the other half use a second handle on the same store
    // (two opens in one process must serialize the same way).
    let other = ts.open();
    let barrier = Barrier::new(threads);
    let gens = Mutex::new(vec![Vec::new(); threads]);
    let started = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (store, barrier, gens) =
                (if t % 2 == 0 { &store } else { &other }, &barrier, &gens);
            s.spawn(move || {
                barrier.wait();
                let mut mine = Vec::with_capacity(per);
                for i in 0..per {
                    let g = store
                        .set(
                            Credential::api_key("shared", Secret::new(same_value(t, i))),
                            None,
                        )
                        .unwrap_or_else(|e| panic!("thread {t} set #{i}: {e}"));
                    mine.push(g);
                }
                gens.lock().unwrap()[t] = mine;
            });
        }
    });
    let elapsed = started.elapsed();
    let gens = gens.into_inner().unwrap();
    let total = threads * per;
    let all: Vec<u64> = gens.iter().flatten().copied().collect();
    let (dupes, missing) = check_generations(&all, total);
    let last_writer = gens
        .iter()
        .position(|g| g.contains(&(total as u64)))
        .expect("someone got the last generation");
    drop(other);
    let c = store.get("shared").expect("get");
    let v = value_of(&c);
    let parsed = parse_same_value(&v);
    println!(
        "same id from {threads} threads (2 handles) x {per} sets in {:.1} s: final generation {} \
         (want {total}), {dupes} duplicate and {missing} missing generations, final value {}",
        elapsed.as_secs_f64(),
        c.generation(),
        match parsed {
            Some((w, i)) => format!("= thread {w}'s write #{i}"),
            None => "is NOT any writer's complete value".into(),
        },
    );
    assert_eq!(c.generation(), total as u64);
    assert_eq!((dupes, missing), (0, 0));
    for g in &gens {
        assert!(g.windows(2).all(|w| w[0] < w[1]));
    }
    assert_eq!(parsed, Some((last_writer, per - 1)));
    drop(store);
    assert!(temp_files(&ts.base).is_empty());
}

#[test]
fn compare_and_swap_race_has_one_winner() {
    let threads = 8;
    let rounds = 50 * scale();
    let ts = TestStore::new(STORE_NAME);
    let store = ts.open();
    let barrier = Barrier::new(threads);
    let mut wins_per_thread = vec![0usize; threads];
    let mut bad_rounds = Vec::new();
    let mut conflicts = 0;
    for round in 0..rounds {
        // Round 0 races to create (generation 0 = must not exist yet).
        let seen = match store.get("cas") {
            Ok(c) => c.generation(),
            Err(Error::NotFound { .. }) => 0,
            Err(e) => panic!("get: {e}"),
        };
        assert_eq!(seen, round as u64);
        let results: Vec<Result<u64, Error>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let (store, barrier) = (&store, &barrier);
                    s.spawn(move || {
                        barrier.wait();
                        store.set(
                            Credential::api_key("cas", Secret::new(format!("r{round}-t{t}"))),
                            Some(seen),
                        )
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("thread"))
                .collect()
        });
        let winners: Vec<usize> = results
            .iter()
            .enumerate()
            .filter(|(_, r)| r.is_ok())
            .map(|(t, _)| t)
            .collect();
        for r in &results {
            match r {
                Ok(g) => assert_eq!(*g, seen + 1, "the winner's generation"),
                Err(
                    e @ Error::GenerationMismatch {
                        expected, actual, ..
                    },
                ) => {
                    assert_eq!(e.kind(), ErrorKind::Conflict);
                    assert_eq!((*expected, *actual), (seen, seen + 1));
                    conflicts += 1;
                }
                Err(e) => panic!("round {round}: unexpected error {e} (kind {})", e.kind()),
            }
        }
        let now = store.get("cas").expect("get after round");
        let ok = winners.len() == 1
            && now.generation() == seen + 1
            && value_of(&now) == format!("r{round}-t{}", winners[0]);
        if !ok {
            bad_rounds.push(round);
        }
        if let [w] = winners[..] {
            wins_per_thread[w] += 1;
        }
    }
    println!(
        "CAS race: {rounds} rounds x {threads} threads: {} rounds with exactly one winner, {} bad \
         rounds, {conflicts} conflicts (want {}), wins per thread {wins_per_thread:?}",
        rounds - bad_rounds.len(),
        bad_rounds.len(),
        rounds * (threads - 1)
    );
    assert!(bad_rounds.is_empty(), "bad rounds: {bad_rounds:?}");
    assert_eq!(conflicts, rounds * (threads - 1));
}

#[test]
fn cli_process_and_library_write_the_same_id() {
    let n = 50 * scale();
    let ts = TestStore::new(STORE_NAME);
    let store = ts.open();
    // Who wrote which generation: 'c' = CLI, 'l' = library.
    let order = Mutex::new(BTreeMap::<u64, (char, usize)>::new());
    let cli_started = AtomicUsize::new(0);
    let barrier = Barrier::new(2);
    let started = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            barrier.wait();
            for i in 0..n {
                cli_started.fetch_add(1, Ordering::SeqCst);
                let o = ts.cli(
                    ["--json", "cred", "set", "shared"],
                    format!("{}\n", same_value(0, i)).as_bytes(),
                );
                assert_eq!(o.code, 0, "cli set #{i}: {o}");
                let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("json");
                let g = v["generation"].as_u64().expect("generation");
                assert!(order.lock().unwrap().insert(g, ('c', i)).is_none());
            }
        });
        s.spawn(|| {
            barrier.wait();
            for i in 0..n {
                // Pace the library so its writes spread over the CLI's run instead of all
                // landing before the first CLI process has started.
                while cli_started.load(Ordering::SeqCst) <= i && started.elapsed().as_secs() < 60 {
                    std::thread::sleep(Duration::from_micros(200));
                }
                std::thread::sleep(Duration::from_millis(2));
                let g = store
                    .set(
                        Credential::api_key("shared", Secret::new(same_value(1, i))),
                        None,
                    )
                    .unwrap_or_else(|e| panic!("library set #{i}: {e}"));
                assert!(order.lock().unwrap().insert(g, ('l', i)).is_none());
            }
        });
    });
    let elapsed = started.elapsed();
    let order = order.into_inner().unwrap();
    let total = 2 * n;
    let gens: Vec<u64> = order.keys().copied().collect();
    let (dupes, missing) = check_generations(&gens, total);
    let switches = order
        .values()
        .zip(order.values().skip(1))
        .filter(|(a, b)| a.0 != b.0)
        .count();
    let (last_src, last_i) = *order.values().last().expect("writes");
    drop(store);

    let store = ts.open();
    let c = store.get("shared").expect("get");
    let parsed = parse_same_value(&value_of(&c));
    drop(store);
    let temps = temp_files(&ts.base);
    println!(
        "CLI process x {n} + library x {n} on one id in {:.1} s: final generation {} (want \
         {total}), {dupes} duplicate / {missing} missing generations, {switches} switches between \
         writers in generation order, final value {}, {} temp files",
        elapsed.as_secs_f64(),
        c.generation(),
        match parsed {
            Some((w, i)) => format!("= {} write #{i}", if w == 0 { "CLI" } else { "library" }),
            None => "is NOT a complete value".into(),
        },
        temps.len()
    );
    assert_eq!(c.generation(), total as u64);
    assert_eq!((dupes, missing), (0, 0));
    let want_writer = if last_src == 'c' { 0 } else { 1 };
    assert_eq!(parsed, Some((want_writer, last_i)));
    assert_eq!(last_i, n - 1);
    assert!(temps.is_empty(), "temp files: {temps:?}");
}

/// Counters incremented by compare-and-swap from threads that read lock-free (the daemon's
/// options: file cache and recycled files), the case an independent tester broke: a read whose
/// bytes the same process's later writes overtook was answered with a generation that later
/// belonged to other content, and a stale CAS won. Every successful CAS must be counted in the
/// final value.
#[test]
fn cas_increments_from_lock_free_readers_never_lose_one() {
    let threads = 4;
    let ts = TestStore::new(STORE_NAME);
    let store = CredentialStore::open(
        ts.config(),
        holdfast::store::StoreOptions {
            recycle_files: true,
            cache_files: true,
            ..holdfast::store::StoreOptions::default()
        },
    )
    .expect("open");
    store
        .set(Credential::api_key("ctr", Secret::new("0".into())), None)
        .expect("seed");
    let until = std::time::Instant::now() + std::time::Duration::from_millis(1500 * scale() as u64);
    let (wins, conflicts) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let store = &store;
                s.spawn(move || {
                    let (mut wins, mut conflicts) = (0u64, 0u64);
                    while std::time::Instant::now() < until {
                        let c = store.get("ctr").expect("get");
                        let v: u64 = c.key_value("api_key").expect("value").parse().expect("n");
                        let next = Credential::api_key("ctr", Secret::new((v + 1).to_string()));
                        match store.set(next, Some(c.generation())) {
                            Ok(_) => wins += 1,
                            Err(Error::GenerationMismatch { .. }) => conflicts += 1,
                            Err(e) => panic!("set: {e}"),
                        }
                    }
                    (wins, conflicts)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .fold((0, 0), |(w, c), (a, b)| (w + a, c + b))
    });
    let v: u64 = store
        .get("ctr")
        .expect("get")
        .key_value("api_key")
        .expect("value")
        .parse()
        .expect("n");
    println!(
        "CAS increments, {threads} lock-free readers: {wins} won, {conflicts} conflicts, final value {v}, {} lost",
        wins.saturating_sub(v)
    );
    assert!(wins > 0);
    assert_eq!(v, wins, "a compare-and-swap against a stale read won");
}
