//! Regression tests for store semantics found in review: each test fails on the code before
//! its fix.
//!
//! - keys rotated by another handle are picked up under the lock (no mass quarantine);
//! - rotation keeps the old key while a file may still need it;
//! - a hostile timestamp in a credential cannot panic (and brick) the store;
//! - the seal check is not fooled by empty or torn files;
//! - two racing `init`s cannot both create a key;
//! - a closure cannot store a document a later open would quarantine;
//! - unknown top-level index fields added by another writer survive our rewrite;
//! - a hung lock holder costs at most one helper thread, however many waiters time out;
//! - reads during key reloads and deletes never deadlock.
// Test code: fixtures are made directly, and a panic is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

#[allow(dead_code)]
mod common;

use std::fs;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::TestStore;
use holdfast::crypto::{generate_key, keys, KeySource, Keyring, Secret};
use holdfast::durable::{lock, Faults, LockError, LockMode};
use holdfast::error::ErrorKind;
use holdfast::store::{
    init_store, Credential, CredentialStore, Error, OpenMode, SealedReason, StoreOptions,
};
use serde_json::json;

fn api(id: &str, v: &str) -> Credential {
    Credential::api_key(id, Secret::new(v.to_owned()))
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn quarantine_count(ts: &TestStore) -> usize {
    fs::read_dir(ts.base.join("quarantine"))
        .map(|d| d.count())
        .unwrap_or(0)
}

#[test]
fn rotation_by_another_handle_is_picked_up_under_the_lock() {
    let ts = TestStore::new("semantics");
    let n = 12;
    let a = ts.open();
    for i in 0..n {
        a.set(api(&format!("c{i}"), &format!("v{i}")), None)
            .unwrap();
    }
    // Another handle (another process, as far as `a` knows) rotates the key completely.
    let b = ts.open();
    let rep = b.rotate_key(|_, _| {}).unwrap();
    assert_eq!(rep.reencrypted, n);
    drop(b);
    // `a` still holds the old key in memory. Everything it decides under the lock must use
    // the new one: a repairing fsck must not quarantine the re-encrypted files.
    let report = a.fsck(true).unwrap();
    assert!(report.quarantined.is_empty(), "{report}");
    assert_eq!(report.readable, n, "{report}");
    a.set(api("after", "x"), None).unwrap();
    assert_eq!(a.list().unwrap().credentials.len(), n + 1);
    for i in 0..n {
        assert_eq!(
            a.get(&format!("c{i}")).unwrap().key_value("api_key"),
            Some(format!("v{i}").as_str())
        );
    }
    drop(a);
    assert_eq!(quarantine_count(&ts), 0);
    let c = ts.open();
    assert!(c.open_report().quarantined.is_empty());
    assert_eq!(c.list().unwrap().credentials.len(), n + 1);
    println!(
        "rotation by another handle: {n} files re-encrypted, 0 quarantined by the stale handle"
    );
}

#[test]
fn rotation_keeps_the_old_key_while_a_future_stamped_file_needs_it() {
    let ts = TestStore::new("semantics");
    let store = ts.open();
    store.set(api("normal", "v"), None).unwrap();
    // A credential stamped an hour ahead under the current (soon old) key.
    let key = keys::load(&[KeySource::File(ts.key.clone())])
        .unwrap()
        .unwrap();
    let ring = Keyring::new(&key.primary, &[]).unwrap();
    let doc = api("future", "f");
    let token = ring.encrypt_at_time(&doc.to_bytes(), now() + 3600);
    fs::write(ts.base.join("credentials/future.enc"), token).unwrap();
    let err = store.rotate_key(|_, _| {}).unwrap_err();
    assert!(matches!(err, Error::RotationBlocked { .. }), "{err}");
    assert_eq!(err.kind(), ErrorKind::Integrity);
    assert!(err.to_string().contains("future.enc"), "{err}");
    // The old key is still there: the future file is clock skew, not undecryptable.
    assert!(keys::prev_path(&ts.key).exists());
    assert!(store.get("future").unwrap_err().is_clock_skew());
    assert_eq!(store.get("normal").unwrap().key_value("api_key"), Some("v"));
    drop(store);
    // Once the file no longer needs the old key, the rotation finishes.
    fs::remove_file(ts.base.join("credentials/future.enc")).unwrap();
    let store = ts.open();
    let rep = store.rotate_key(|_, _| {}).unwrap();
    assert!(rep.resumed);
    // Complete: the retired key stays archived until a prune proves nothing needs it.
    assert!(keys::prev_path(&ts.key).exists());
    let pruned = store.prune_keys(|_, _| {}).unwrap();
    assert_eq!(pruned.pruned.len(), 1, "{pruned:?}");
    assert!(!keys::prev_path(&ts.key).exists());
}

#[test]
fn rotation_reencrypts_a_file_that_decrypts_but_is_not_a_credential() {
    let ts = TestStore::new("semantics");
    let store = ts.open();
    store.set(api("ok", "v"), None).unwrap();
    let key = keys::load(&[KeySource::File(ts.key.clone())])
        .unwrap()
        .unwrap();
    let ring = Keyring::new(&key.primary, &[]).unwrap();
    // Authentic under the old key, but not JSON: the old key is the only way to read it.
    let odd = ts.base.join("credentials/odd.enc");
    fs::write(&odd, ring.encrypt(b"not json at all")).unwrap();
    store.rotate_key(|_, _| {}).unwrap();
    // Re-encrypted with the new key, byte-for-byte the same plaintext; the old key stays
    // archived until a prune proves nothing needs it.
    let new_key = keys::load(&[KeySource::File(ts.key.clone())])
        .unwrap()
        .unwrap();
    assert_eq!(new_key.previous.len(), 1);
    assert_eq!(store.prune_keys(|_, _| {}).unwrap().pruned.len(), 1);
    let new_ring = Keyring::new(&new_key.primary, &[]).unwrap();
    let (plain, idx) = new_ring
        .decrypt(&fs::read_to_string(&odd).unwrap())
        .expect("the odd file must decrypt under the new key alone");
    assert_eq!(idx, 0);
    assert_eq!(plain.expose(), b"not json at all");
}

#[test]
fn hostile_timestamp_cannot_brick_the_store() {
    let ts = TestStore::new("semantics");
    let store = ts.open();
    let doc = json!({"id": "odd", "credential_type": "api_key", "keys": {"api_key": {
        "name": "api_key", "value": "v", "expires_at": "2026-01-01T00:00:00+0é00",
        "metadata": {}}}, "created_at": "2026-01-01T00:00:00+é:00"});
    // holdfast refuses to write what hive cannot load ...
    let e = store
        .set(Credential::from_value(doc.clone()).unwrap(), None)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidParams, "{e}");
    drop(store);
    // ... and another program's file with such times neither bricks the store nor is moved.
    let key = keys::load(&[KeySource::File(ts.key.clone())])
        .unwrap()
        .unwrap();
    let ring = Keyring::new(&key.primary, &[]).unwrap();
    fs::write(
        ts.base.join("credentials/odd.enc"),
        ring.encrypt(doc.to_string().as_bytes()),
    )
    .unwrap();
    let store = ts.open();
    assert_eq!(store.get("odd").unwrap().key_value("api_key"), Some("v"));
    assert!(store.fsck(true).unwrap().quarantined.is_empty());
}

#[test]
fn empty_and_torn_files_do_not_seal_a_store() {
    let ts = TestStore::new("semantics");
    let store = ts.open();
    for i in 0..3 {
        store.set(api(&format!("z{i}"), "good"), None).unwrap();
    }
    drop(store);
    // Unpatched hive leaves empty or torn files; sorted first, they are what the key check
    // tries first. They say nothing about the key.
    let cred = ts.base.join("credentials");
    for i in 0..10 {
        let torn = if i % 2 == 0 { "" } else { "gAAAAABp" };
        fs::write(cred.join(format!("a{i:02}.enc")), torn).unwrap();
    }
    let store = ts.open();
    assert_eq!(store.sealed_reason(), None, "sealed by damaged files");
    // The torn ones go to quarantine; the empty ones stay (a writer in place may be about to
    // fill them), reported and not listed.
    assert_eq!(store.open_report().quarantined.len(), 5);
    assert_eq!(store.open_report().empty.len(), 5);
    assert_eq!(store.list().unwrap().credentials.len(), 3);
    drop(store);
    // A really wrong key is still caught.
    keys::write_key_file(&ts.key, &generate_key(), &Faults::none()).unwrap();
    let store = ts.open();
    assert!(matches!(
        store.sealed_reason(),
        Some(SealedReason::WrongKey { tried: 3, .. })
    ));
}

#[test]
fn racing_inits_create_exactly_one_key() {
    let mut created = 0;
    let rounds = 20;
    for _ in 0..rounds {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("store");
        let key = dir.path().join("keys/k.key");
        let config = common::store_config("race", &base, &key);
        let barrier = Arc::new(Barrier::new(4));
        let results: Vec<_> = (0..4)
            .map(|_| {
                let (config, barrier) = (config.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    init_store(&config, &Faults::none())
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect();
        let ok = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(ok, 1, "{results:?}");
        for r in results.iter().filter_map(|r| r.as_ref().err()) {
            assert_eq!(r.kind(), ErrorKind::Conflict, "{r}");
        }
        created += ok;
    }
    println!("racing inits: {rounds} rounds x 4 threads, {created} keys created (one per round)");
}

#[test]
fn update_cannot_store_a_document_open_would_quarantine() {
    let ts = TestStore::new("semantics");
    let store = ts.open();
    store.set(api("x", "v"), None).unwrap();
    let err = store
        .update("x", None, |c| {
            let mut c = c.unwrap();
            c.set_field("keys", json!(5));
            Ok(c)
        })
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidParams, "{err}");
    let err = store
        .update("x", None, |_| Ok(api("y", "other id")))
        .unwrap_err();
    assert!(err.to_string().contains("not the id"), "{err}");
    assert_eq!(store.get("x").unwrap().key_value("api_key"), Some("v"));
    assert_eq!(store.get("x").unwrap().generation(), 1);
}

#[test]
fn unknown_index_fields_added_by_another_writer_survive() {
    let ts = TestStore::new("semantics");
    let store = ts.open();
    store.set(api("a", "v"), None).unwrap();
    // Another tool adds a top-level field to the index after we opened.
    let path = ts.base.join("metadata/index.json");
    let mut idx: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    idx["other_tool"] = json!({"kept": true});
    fs::write(&path, serde_json::to_vec(&idx).unwrap()).unwrap();
    store.set(api("b", "v"), None).unwrap();
    let after: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    assert_eq!(after["other_tool"], json!({"kept": true}));
    assert!(after["credentials"]["b"].is_object());
}

fn flock_helper_threads() -> usize {
    fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| {
            fs::read_to_string(t.path().join("comm"))
                .map(|c| c.trim() == "holdfast-flock")
                .unwrap_or(false)
        })
        .count()
}

#[test]
fn a_hung_lock_holder_costs_at_most_one_helper_thread() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.lock");
    // A holder the in-process gate does not know about: another process, as far as the
    // gate can tell.
    let hung = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap();
    fs4::FileExt::lock(&hung).unwrap();
    for _ in 0..6 {
        let err = lock::lock(&path, LockMode::Exclusive, Duration::from_millis(30)).unwrap_err();
        assert!(matches!(err, LockError::Timeout { .. }));
    }
    let helpers = flock_helper_threads();
    assert!(
        helpers <= 1,
        "{helpers} helper threads blocked on one hung lock"
    );
    fs4::FileExt::unlock(&hung).unwrap();
    // The lock is usable again, and the blocked helper goes away.
    let start = Instant::now();
    let g = lock::lock(&path, LockMode::Exclusive, Duration::from_secs(5)).unwrap();
    drop(g);
    while flock_helper_threads() > 0 && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(flock_helper_threads(), 0);
    println!("hung lock holder: 6 timed-out waiters left {helpers} helper thread(s)");
}

#[test]
fn reads_during_key_reloads_and_deletes_do_not_deadlock() {
    let ts = TestStore::new("semantics");
    let store = Arc::new(ts.open());
    store.set(api("r", "v"), None).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let key = ts.key.clone();
    let threads: Vec<_> = (0..3)
        .map(|t| {
            let (store, stop, key) = (store.clone(), stop.clone(), key.clone());
            std::thread::spawn(move || {
                let mut ops = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    match t {
                        0 => {
                            store.set(api("d", "x"), None).unwrap();
                            store.delete("d").unwrap();
                        }
                        1 => {
                            assert_eq!(store.get("r").unwrap().key_value("api_key"), Some("v"));
                        }
                        _ => {
                            // Touch the key file: its stamp changes, every reader reloads.
                            let k = fs::read(&key).unwrap();
                            keys::write_key_file(
                                &key,
                                &Secret::new(String::from_utf8(k).unwrap()),
                                &Faults::none(),
                            )
                            .unwrap();
                        }
                    }
                    ops += 1;
                }
                ops
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut total = 0;
    for t in threads {
        while !t.is_finished() {
            assert!(
                Instant::now() < deadline,
                "deadlock: a thread did not finish"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        total += t.join().unwrap();
    }
    println!("deletes, reads and key reloads for 1.5 s: {total} operations, no deadlock");
}

#[test]
fn read_only_open_lists_without_modifying() {
    let ts = TestStore::new("semantics");
    let store = ts.open();
    for i in 0..5 {
        store.set(api(&format!("c{i}"), "v"), None).unwrap();
    }
    drop(store);
    let before = fs::read(ts.base.join("metadata/index.json")).unwrap();
    let ro = CredentialStore::open(
        ts.config(),
        StoreOptions {
            mode: OpenMode::ReadOnly,
            ..StoreOptions::default()
        },
    )
    .unwrap();
    assert_eq!(ro.list().unwrap().credentials.len(), 5);
    drop(ro);
    assert_eq!(
        fs::read(ts.base.join("metadata/index.json")).unwrap(),
        before
    );
}

/// Generations at the edge of their range, and junk where markers live (an independent
/// tester's finds): a document another program wrote with the largest u64 as its generation
/// made the next write overflow (a panic in debug, a wrap to 0 — "does not exist" — in
/// release); a planted marker with that generation crashed the CLI; a directory planted at a
/// marker's name made a write that succeeded answer `storage`.
#[test]
fn generations_at_the_edge_of_their_range_and_junk_markers() {
    let ts = TestStore::new("semantics");
    let store = ts.open();
    store.set(api("edge", "v1"), None).unwrap();
    let key = keys::load(&[KeySource::File(ts.key.clone())])
        .unwrap()
        .unwrap();
    let ring = Keyring::new(&key.primary, &[]).unwrap();
    let cred_dir = ts.base.join("credentials");
    // hive writes a document whose generation is u64::MAX.
    let mut doc = api("edge", "hive");
    doc.set_field("holdfast_generation", json!(u64::MAX));
    fs::write(cred_dir.join("edge.enc"), ring.encrypt(&doc.to_bytes())).unwrap();
    let got = store.get("edge").unwrap();
    assert_eq!(got.key_value("api_key"), Some("hive"));
    // Answered as the largest generation every client reads exactly, in get and list alike.
    use holdfast::limits::MAX_GENERATION;
    assert_eq!(got.generation(), MAX_GENERATION);
    let listed = store.list().unwrap().credentials;
    let edge = listed.iter().find(|c| c.id == "edge").unwrap();
    assert_eq!(edge.generation, MAX_GENERATION);
    let e = store
        .set(api("edge", "v2"), Some(MAX_GENERATION))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Integrity, "{e}");
    let e = store.set(api("edge", "v2"), None).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Integrity, "{e}");
    assert!(e.to_string().contains("largest a generation may be"), "{e}");
    assert_eq!(
        store.get("edge").unwrap().key_value("api_key"),
        Some("hive")
    );
    // Deleted, it is made again: its tombstone marker is at the largest, so it starts at 1
    // (it was refused for good, "delete it and set it again" leading nowhere).
    store.delete("edge").unwrap();
    assert_eq!(store.set(api("edge", "v3"), None).unwrap(), 1);
    assert_eq!(store.get("edge").unwrap().generation(), 1);
    assert_eq!(store.set(api("edge", "v4"), Some(1)).unwrap(), 2);
    // A marker with the largest generation planted for another credential: no panic, and
    // the credential still moves forward (saturating), never back to 0.
    store.set(api("m", "1"), None).unwrap();
    fs::write(
        cred_dir.join(format!(".hf-gen-{}-0123456789abcdef-m", u64::MAX)),
        b"",
    )
    .unwrap();
    drop(store);
    let store = ts.open();
    let g = store.get("m").unwrap().generation();
    assert!(g >= 1, "{g}");
    let e = store.set(api("m", "2"), None);
    assert!(e.is_err() || e.as_ref().is_ok_and(|g2| *g2 > g), "{e:?}");
    // A directory at a credential's marker name: the write succeeds and says so.
    store.set(api("d", "1"), None).unwrap();
    let marker = fs::read_dir(&cred_dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with(".hf-gen-") && n.ends_with("-d"))
        .expect("d's marker");
    fs::remove_file(cred_dir.join(&marker)).unwrap();
    fs::create_dir(cred_dir.join(&marker)).unwrap();
    let g = store.set(api("d", "2"), None).unwrap();
    assert_eq!(store.get("d").unwrap().key_value("api_key"), Some("2"));
    assert!(g >= 2, "{g}");
    println!("generation edges: u64::MAX from hive answered as 2^53-1 and refused to move (integrity), deleted and made again from 1, a planted max marker saturates, a directory at a marker's name does not fail the write");
}

/// Files another program wrote under a key of its own (hive mints one when its key is missing)
/// must not seal a store whose key opens the rest, however many there are and however their
/// names sort (an independent tester sealed a store with 8 named aaa1..aaa8).
#[test]
fn foreign_key_files_never_seal_a_store_the_key_opens() {
    let ts = TestStore::new("semantics");
    let store = ts.open();
    for i in 0..3 {
        store.set(api(&format!("zz{i}"), "v"), None).unwrap();
    }
    drop(store);
    let foreign = Keyring::new(&generate_key(), &[]).unwrap();
    for i in 0..20 {
        let id = format!("aaa{i:02}");
        fs::write(
            ts.base.join(format!("credentials/{id}.enc")),
            foreign.encrypt(&api(&id, "x").to_bytes()),
        )
        .unwrap();
    }
    let store = ts.open();
    assert!(
        store.sealed_reason().is_none(),
        "{:?}",
        store.sealed_reason()
    );
    assert_eq!(store.get("zz1").unwrap().key_value("api_key"), Some("v"));
    // The foreign files are what no key of the store opens: quarantined by the repair.
    assert_eq!(store.open_report().quarantined.len(), 20);
    println!("20 files under a foreign key sorted first: the store opens, 20 quarantined, 3 read");
}

/// One damaged line in the key archive sealed the whole store although its primary key opens
/// every file (an independent tester's find). It is kept as it is, rotations carry it along,
/// and no key is pruned while it is there.
#[test]
fn a_damaged_archive_line_is_kept_and_blocks_only_pruning() {
    let ts = TestStore::new("semantics");
    let store = ts.open();
    store.set(api("a", "v"), None).unwrap();
    store.rotate_key(|_, _| {}).unwrap();
    drop(store);
    let prev = keys::prev_path(&ts.key);
    let mut text = fs::read(&prev).unwrap();
    text.extend_from_slice(b"not-a-key-at-all\n");
    // A line that is not even text (the second round of attacks: it sealed the store).
    let not_text: &[u8] = b"\xff\xfe-latin1-caf\xe9";
    text.extend_from_slice(not_text);
    text.push(b'\n');
    fs::write(&prev, &text).unwrap();
    let store = ts.open();
    assert!(
        store.sealed_reason().is_none(),
        "{:?}",
        store.sealed_reason()
    );
    assert_eq!(store.get("a").unwrap().key_value("api_key"), Some("v"));
    assert_eq!(store.key_report().unwrap().archive_damaged, 2);
    store.rotate_key(|_, _| {}).unwrap();
    let after = fs::read(&prev).unwrap();
    let lines: Vec<&[u8]> = after
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .collect();
    assert!(
        lines.contains(&&b"not-a-key-at-all"[..]) && lines.contains(&not_text),
        "rotation dropped a line"
    );
    assert_eq!(lines.len(), 4, "two archived keys and the two lines");
    let e = store.prune_keys(|_, _| {}).unwrap_err();
    assert!(e.to_string().contains("not keys"), "{e}");
    assert!(e.to_string().contains("`holdfast key prune`"), "{e}");
    assert_eq!(fs::read(&prev).unwrap(), after, "the archive changed");
    let kept: Vec<u8> = lines
        .iter()
        .filter(|l| ![&b"not-a-key-at-all"[..], not_text].contains(l))
        .flat_map(|l| l.iter().copied().chain([b'\n']))
        .collect();
    fs::write(&prev, kept).unwrap();
    let p = store.prune_keys(|_, _| {}).unwrap();
    assert_eq!(p.pruned.len(), 2, "{p:?}");
    assert_eq!(store.get("a").unwrap().key_value("api_key"), Some("v"));
    println!("two damaged archive lines (one not text): the store opens, a rotation keeps them byte for byte, a prune refuses until they are removed, then prunes 2 keys");
}

/// An archive grows by a key each rotation; one past what holdfast reads back sealed the store
/// half-way through the rotation that wrote it (the second round of attacks, after ~1,457
/// rotations under the old 64 KiB cap). Now the archive may hold some 93,000 keys, and the
/// rotation that would overflow it is refused before anything changes; a prune makes room.
#[test]
fn a_rotation_that_would_overflow_the_archive_is_refused_before_it_starts() {
    use holdfast::limits::MAX_KEY_ARCHIVE_BYTES;
    let ts = TestStore::new("semantics");
    let store = ts.open();
    store.set(api("a", "v"), None).unwrap();
    drop(store);
    // As many retired keys as fit: 45 bytes a line.
    let fit = (MAX_KEY_ARCHIVE_BYTES / 45) as usize;
    let mut text = Vec::with_capacity(fit * 45);
    for _ in 0..fit {
        text.extend_from_slice(generate_key().expose().as_bytes());
        text.push(b'\n');
    }
    let prev = keys::prev_path(&ts.key);
    fs::write(&prev, &text).unwrap();
    let mut perms = fs::metadata(&prev).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o600);
    fs::set_permissions(&prev, perms).unwrap();
    let key_before = fs::read(&ts.key).unwrap();
    let store = ts.open();
    assert!(
        store.sealed_reason().is_none(),
        "{:?}",
        store.sealed_reason()
    );
    let e = store.rotate_key(|_, _| {}).unwrap_err();
    assert_eq!(e.kind().as_str(), "unsupported", "{e}");
    assert!(e.to_string().contains("holdfast key prune"), "{e}");
    assert!(e.to_string().contains("nothing was changed"), "{e}");
    assert_eq!(fs::read(&ts.key).unwrap(), key_before, "the key changed");
    assert_eq!(fs::read(&prev).unwrap(), text, "the archive changed");
    assert_eq!(store.get("a").unwrap().key_value("api_key"), Some("v"));
    let p = store.prune_keys(|_, _| {}).unwrap();
    assert_eq!(p.pruned.len(), fit, "no file needs any of them");
    store.rotate_key(|_, _| {}).unwrap();
    drop(store);
    let store = ts.open();
    assert_eq!(store.get("a").unwrap().key_value("api_key"), Some("v"));
    println!("an archive of {fit} retired keys ({} bytes): the rotation past {MAX_KEY_ARCHIVE_BYTES} bytes refused, nothing changed; pruned {fit}, then rotated", text.len());
}

/// A store renamed in the config (same directory, same identity) keeps the key it owns under
/// its old name: the identity is random and names one store, so `<old>.<id>.key` is found
/// when `<new>.<id>.key` is not. It used to read as a store with no key.
#[test]
fn a_renamed_store_keeps_the_key_it_had_under_its_old_name() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("data/stores/work");
    let key_dir = dir.path().join("config/holdfast/keys");
    let as_named = |name: &str| {
        holdfast::store::StoreConfig::owned(name, base.clone(), key_dir.clone(), Vec::new())
    };
    let open = |name: &str| {
        CredentialStore::open(
            as_named(name),
            StoreOptions {
                mode: OpenMode::Repair,
                ..StoreOptions::default()
            },
        )
        .unwrap()
    };
    init_store(&as_named("work"), &Faults::none()).unwrap();
    let store = open("work");
    store.set(api("kept", "v1"), None).unwrap();
    let key_file = store.key_source().unwrap().to_string();
    drop(store);
    let store = open("job");
    assert_eq!(store.sealed_reason(), None);
    assert_eq!(store.get("kept").unwrap().key_value("api_key"), Some("v1"));
    assert_eq!(store.key_source().unwrap().to_string(), key_file);
    // A rotation under the new name rotates that same file: the old name still opens it.
    store.rotate_key(|_, _| {}).unwrap();
    drop(store);
    let store = open("work");
    assert_eq!(store.get("kept").unwrap().key_value("api_key"), Some("v1"));
    let keys: Vec<String> = fs::read_dir(&key_dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".key"))
        .collect();
    assert_eq!(keys.len(), 1, "{keys:?}");
    println!("renamed store: opened as \"job\" with {key_file}, rotated, reopened as \"work\"");
}

/// hive's `list_all` is its index's key order (insertion: an update keeps its place, a deleted
/// and re-made id goes last). The store lists and writes its index in that order, keeps it
/// across handles (a daemon restart reads it back from the index), puts credentials another
/// program made after the known ones, and forgets nothing when the index must be rebuilt.
#[test]
fn the_index_keeps_hives_insertion_order() {
    let ts = TestStore::new("order");
    let store = ts.open();
    for id in ["zeta", "alpha", "mid"] {
        store.set(api(id, "v1"), None).unwrap();
    }
    store.set(api("zeta", "v2"), None).unwrap();
    store.delete("alpha").unwrap();
    store.set(api("alpha", "v3"), None).unwrap();
    store.set(api("beta", "v1"), None).unwrap();
    store.flush().unwrap();
    let want = ["zeta", "mid", "alpha", "beta"];
    let ids = |s: &holdfast::store::CredentialStore| -> Vec<String> {
        s.list()
            .unwrap()
            .credentials
            .into_iter()
            .map(|c| c.id)
            .collect()
    };
    assert_eq!(ids(&store), want);
    let path = ts.base.join("metadata/index.json");
    let index_ids = || -> Vec<String> {
        let idx: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        idx["credentials"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect()
    };
    assert_eq!(index_ids(), want);
    drop(store);
    // Another handle (a restarted daemon) reads the order from the index; a write keeps it.
    let store = ts.open();
    assert_eq!(ids(&store), want);
    store.set(api("mid", "v2"), None).unwrap();
    store.set(api("new", "v1"), None).unwrap();
    store.flush().unwrap();
    let want = ["zeta", "mid", "alpha", "beta", "new"];
    assert_eq!(
        (ids(&store), index_ids()),
        (
            want.map(String::from).to_vec(),
            want.map(String::from).to_vec()
        )
    );
}
