//! Credential-store write throughput, and what index write-behind saves.
//!
//! `cargo bench --bench store` (release build, real fsyncs on the temp dir's file system).
//! For stores already holding 100 and 1,000 credentials it times 200 durable `set`s three ways:
//! one thread with an index rewrite after every set (what hive does, O(n) per save), one thread
//! inside `batch()` (index rewritten once at the end), and 4 threads at once (group commit:
//! the index is rewritten only by the last queued writer). It prints sets/s and how many index
//! rewrites each run made. Figures are recorded in docs/benchmarks.md.
// Test code: fixtures are made directly, and a panic is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]
#![allow(clippy::print_stdout)] // its output is its figures

use std::os::unix::fs::DirBuilderExt;
use std::sync::Arc;
use std::time::Instant;

use holdfast::crypto::{generate_key, keys, KeySource, Secret};
use holdfast::durable::{Faults, Op};
use holdfast::store::Credential;
use holdfast::store::{CredentialStore, StoreConfig, StoreOptions};

const SETS: usize = 200;

fn open(dir: &std::path::Path, faults: Faults) -> CredentialStore {
    let key_file = dir.join("keys/k.key");
    if !key_file.exists() {
        keys::create_key_file(&key_file, &generate_key(), &Faults::none()).expect("key");
    }
    let base = dir.join("store");
    if !base.exists() {
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&base)
            .expect("mkdir");
    }
    let config = StoreConfig {
        name: "bench".into(),
        base,
        key_sources: vec![KeySource::File(key_file)],
        key_dir: None,
    };
    CredentialStore::open(
        config,
        StoreOptions {
            faults,
            ..StoreOptions::default()
        },
    )
    .expect("open")
}

fn cred(id: &str, i: usize) -> Credential {
    Credential::api_key(
        id,
        Secret::new(format!("sk-bench-{i:08}-xxxxxxxxxxxxxxxxxxxxxxxx")),
    )
}

fn run(existing: usize, mode: &str) -> (f64, usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let s = open(dir.path(), Faults::none());
        s.batch(|s| {
            for i in 0..existing {
                s.set(cred(&format!("seed-{i}"), i), None).expect("seed");
            }
        })
        .expect("batch");
    }
    let faults = Faults::recorder();
    let store = Arc::new(open(dir.path(), faults.clone()));
    let before = faults.log().iter().filter(|o| **o == Op::Rename).count();
    let start = Instant::now();
    match mode {
        "1 thread, index per set" => {
            for i in 0..SETS {
                store.set(cred(&format!("new-{i}"), i), None).expect("set");
            }
        }
        "1 thread, batch()" => {
            store
                .batch(|s| {
                    for i in 0..SETS {
                        s.set(cred(&format!("new-{i}"), i), None).expect("set");
                    }
                })
                .expect("batch");
        }
        _ => {
            let threads: Vec<_> = (0..4)
                .map(|t| {
                    let store = store.clone();
                    std::thread::spawn(move || {
                        for i in (t..SETS).step_by(4) {
                            store.set(cred(&format!("new-{i}"), i), None).expect("set");
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().expect("join");
            }
            store.flush().expect("flush");
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let renames = faults.log().iter().filter(|o| **o == Op::Rename).count() - before;
    (secs, renames - SETS)
}

fn main() {
    println!(
        "{:>9}  {:<26}  {:>5}  {:>8}  {:>7}  {:>14}",
        "existing", "mode", "sets", "secs", "sets/s", "index rewrites"
    );
    for existing in [100, 1000] {
        for mode in [
            "1 thread, index per set",
            "1 thread, batch()",
            "4 threads at once",
        ] {
            let (secs, rewrites) = run(existing, mode);
            println!(
                "{existing:>9}  {mode:<26}  {SETS:>5}  {secs:>8.3}  {:>7.0}  {rewrites:>14}",
                SETS as f64 / secs
            );
        }
    }
}
