//! What part of a durable `cred.set` is the store itself: `CredentialStore::set` opened with
//! the daemon's options (recycled files, the file cache, the index written behind) against the
//! atomic-replace floor (`durable::atomic_write` of one file: a write, two fsyncs and a
//! rename), in alternating blocks of 300 in one process, so that both see the disk of the same
//! seconds. No daemon, no socket: docs/benchmarks.md (issue 15, tenth session) sets it beside
//! the same set through the daemon and beside a served floor.
//!
//! `cargo run --release --example set_vs_floor -- [CREDENTIALS] [ROUNDS]` (100 and 6 by
//! default). The store and the floor's file live in a temp directory under `$TMPDIR`.
// Measurement code: a failure is a panic with its cause.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]
#![allow(clippy::print_stdout)] // its output is its figures

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use holdfast::crypto::{KeySource, Secret};
use holdfast::durable::{self, Faults};
use holdfast::store::{
    init_store, Credential, CredentialStore, IndexFlush, StoreConfig, StoreOptions,
};

/// Operations per block; each round runs one block of each.
const BLOCK: usize = 300;

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map_or(100, |a| a.parse().expect("CREDENTIALS"));
    let rounds: usize = args.next().map_or(6, |a| a.parse().expect("ROUNDS"));
    let root = tempfile::tempdir().unwrap();
    // The store refuses a base whose parent others can read into.
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let key = root.path().join("bench.key");
    let config = StoreConfig {
        name: "bench".into(),
        base: root.path().join("store"),
        key_sources: vec![KeySource::File(key.clone())],
        key_dir: None,
    };
    init_store(&config, &Faults::none()).unwrap();
    let open = |recycle_files| {
        CredentialStore::open(
            config.clone(),
            StoreOptions {
                index_flush: IndexFlush::Deferred,
                recycle_files,
                cache_files: true,
                ..StoreOptions::default()
            },
        )
        .unwrap()
    };
    let id = |i: usize| format!("cred-{:07}", i % n);
    {
        // Seeded without recycling: a short-lived process leaves no spares behind.
        let seeding = open(false);
        seeding
            .batch(|s| {
                for i in 0..n {
                    s.set(
                        Credential::api_key(&id(i), Secret::new(format!("{i:040}"))),
                        None,
                    )
                    .unwrap();
                }
            })
            .unwrap();
        seeding.flush().unwrap();
    }
    // As the daemon opens it.
    let store = open(true);
    let floor_dir = root.path().join("floor");
    durable::create_private_dir(&floor_dir, &Faults::none()).unwrap();
    let bytes = vec![b'x'; 652]; // the size of a bench credential's Fernet token
    let rate = |d: Duration| BLOCK as f64 / d.as_secs_f64();
    println!("{n} credentials, blocks of {BLOCK}: the atomic-replace floor, then store.set");
    let mut k = 0usize;
    let mut ratios = Vec::new();
    for round in 1..=rounds {
        let t = Instant::now();
        for _ in 0..BLOCK {
            durable::atomic_write(&floor_dir, "file", &bytes, &Faults::none()).unwrap();
        }
        let floor = rate(t.elapsed());
        let t = Instant::now();
        for _ in 0..BLOCK {
            k += 1;
            let value = Secret::new(format!("{k:040}"));
            store.set(Credential::api_key(&id(k), value), None).unwrap();
        }
        let set = rate(t.elapsed());
        ratios.push(set / floor);
        println!(
            "round {round}: floor {floor:>6.0} /s  store.set {set:>6.0} /s  = {:.2}x",
            set / floor
        );
        store.flush().unwrap();
    }
    ratios.sort_by(f64::total_cmp);
    let m = ratios.len() / 2;
    let median = if ratios.len() % 2 == 1 {
        ratios[m]
    } else {
        (ratios[m - 1] + ratios[m]) / 2.0
    };
    println!("median store.set / floor: {median:.2}x");
}
