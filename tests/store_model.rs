//! A model-based test of the credential store's first promise (issue 34): random sequences of
//! set, compare-and-swap, get, delete, key rotation and pruning, hive saving an old copy of a
//! credential (with the current key or one it still holds from before a rotation), values
//! near and over the size limit, a crash at any step of a write, reopening, and a second data
//! dir over the same key directory being rotated — and after every step:
//!
//! - every acknowledged value reads back exactly (an interrupted write reads as the old value
//!   or the new one, whole);
//! - a credential's generation never decreases, and rises whenever its content changed,
//!   whoever changed it (hive included), across deletes and re-creates;
//! - a compare-and-swap succeeds exactly when nothing changed the credential since the read
//!   it names;
//! - the second data dir's store still opens and reads.
//!
//! Bounded in CI (`HOLDFAST_MODEL_CASES`, default 24 sequences of up to 40 steps); set it
//! higher for a long run. Prints what it explored and its totals.
// Test code: fixtures are made directly, and a panic is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use holdfast::crypto::{keys, KeySource, Keyring, Secret};
use holdfast::durable::{FaultMode, Faults};
use holdfast::store::{
    identity, init_store, Credential, CredentialStore, Error, OpenMode, StoreConfig, StoreOptions,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

const IDS: [&str; 3] = ["a", "b/c", "b_c2"];

#[derive(Clone, Debug)]
enum Step {
    Set {
        id: usize,
        len: usize,
    },
    SetHuge {
        id: usize,
    },
    CasLastSeen {
        id: usize,
        len: usize,
    },
    CasStale {
        id: usize,
        back: u64,
    },
    Get {
        id: usize,
    },
    Delete {
        id: usize,
    },
    Rotate,
    Prune,
    HiveOldCopy {
        id: usize,
        pick: usize,
        archived_key: bool,
    },
    CrashedSet {
        id: usize,
        len: usize,
        at: u64,
    },
    Reopen,
    RotateOtherDataDir,
}

fn step() -> impl Strategy<Value = Step> {
    let id = 0..IDS.len();
    prop_oneof![
        6 => (id.clone(), 1usize..64).prop_map(|(id, len)| Step::Set { id, len }),
        1 => id.clone().prop_map(|id| Step::SetHuge { id }),
        3 => (id.clone(), 1usize..64).prop_map(|(id, len)| Step::CasLastSeen { id, len }),
        2 => (id.clone(), 1u64..4).prop_map(|(id, back)| Step::CasStale { id, back }),
        4 => id.clone().prop_map(|id| Step::Get { id }),
        2 => id.clone().prop_map(|id| Step::Delete { id }),
        1 => Just(Step::Rotate),
        1 => Just(Step::Prune),
        3 => (id.clone(), 0usize..8, any::<bool>())
            .prop_map(|(id, pick, archived_key)| Step::HiveOldCopy { id, pick, archived_key }),
        2 => (id.clone(), 1usize..64, 1u64..12)
            .prop_map(|(id, len, at)| Step::CrashedSet { id, len, at }),
        1 => Just(Step::Reopen),
        1 => Just(Step::RotateOtherDataDir),
    ]
}

/// What the model knows of one credential.
#[derive(Default, Clone, Debug)]
struct Known {
    /// The value it holds now (`None`: absent).
    value: Option<String>,
    /// Every plaintext it has held (for hive's old copies).
    history: Vec<Vec<u8>>,
    /// The highest generation ever reported for it.
    max_gen: u64,
    /// The generation of the last read or write, and whether anything changed it since.
    last_seen: Option<u64>,
    changed_since_seen: bool,
    /// A crash interrupted a write since the last read: its content is the old one, but its
    /// generation may have moved up (never down). A compare-and-swap at the last read may then
    /// fail (a false conflict); it must never succeed over a change.
    uncertain: bool,
}

struct World {
    _dir: tempfile::TempDir,
    key_dir: PathBuf,
    a: StoreConfig,
    b: StoreConfig,
    store: Option<CredentialStore>,
    known: Vec<Known>,
    b_value: String,
    counter: u64,
}

static TOTAL: AtomicU64 = AtomicU64::new(0);

fn owned(root: &Path, data: &str, key_dir: &Path) -> StoreConfig {
    StoreConfig::owned(
        "default",
        root.join(data).join("stores/default"),
        key_dir.to_path_buf(),
        Vec::new(),
    )
}

fn open(cfg: &StoreConfig, faults: Faults) -> CredentialStore {
    CredentialStore::open(
        cfg.clone(),
        StoreOptions {
            mode: OpenMode::Repair,
            faults,
            ..StoreOptions::default()
        },
    )
    .unwrap()
}

fn value_of(c: &Credential) -> String {
    c.key_value("api_key").unwrap_or_default().to_owned()
}

impl World {
    fn new() -> World {
        let dir = tempfile::tempdir().unwrap();
        let key_dir = dir.path().join("config/holdfast/keys");
        let a = owned(dir.path(), "A", &key_dir);
        let b = owned(dir.path(), "B", &key_dir);
        init_store(&a, &Faults::none()).unwrap();
        init_store(&b, &Faults::none()).unwrap();
        let sb = open(&b, Faults::none());
        sb.set(
            Credential::api_key("other", Secret::new("in-b".into())),
            None,
        )
        .unwrap();
        drop(sb);
        World {
            store: Some(open(&a, Faults::none())),
            _dir: dir,
            key_dir,
            a,
            b,
            known: vec![Known::default(); IDS.len()],
            b_value: "in-b".into(),
            counter: 0,
        }
    }

    fn s(&self) -> &CredentialStore {
        self.store.as_ref().unwrap()
    }

    fn fresh_value(&mut self, len: usize) -> String {
        self.counter += 1;
        format!("v{}-{}", self.counter, "x".repeat(len))
    }

    fn key_file(&self) -> PathBuf {
        identity::own_key_file(&self.key_dir, "default", &self.a.base)
            .unwrap()
            .unwrap()
    }

    /// A generation reported for `id` with its plaintext: never lower than before, higher
    /// when the content changed.
    fn observe(
        &mut self,
        id: usize,
        gen: u64,
        changed: bool,
        what: &str,
    ) -> Result<(), TestCaseError> {
        let k = &mut self.known[id];
        prop_assert!(
            gen >= k.max_gen,
            "{what}: {} generation went back from {} to {gen}",
            IDS[id],
            k.max_gen
        );
        if changed && k.max_gen > 0 {
            prop_assert!(
                gen > k.max_gen,
                "{what}: {} changed but its generation stayed {gen}",
                IDS[id]
            );
        }
        k.max_gen = k.max_gen.max(gen);
        k.last_seen = Some(gen);
        k.changed_since_seen = false;
        k.uncertain = false;
        Ok(())
    }

    /// Every credential reads back as the model says.
    fn check_all(&mut self, what: &str) -> Result<(), TestCaseError> {
        for id in 0..IDS.len() {
            self.check(id, what)?;
        }
        let sb = open(&self.b, Faults::none());
        let got = sb.get("other").map(|c| value_of(&c));
        prop_assert_eq!(
            got.ok(),
            Some(self.b_value.clone()),
            "{}: the other data dir",
            what
        );
        Ok(())
    }

    fn check(&mut self, id: usize, what: &str) -> Result<(), TestCaseError> {
        match (self.s().get(IDS[id]), self.known[id].value.clone()) {
            (Ok(c), Some(v)) => {
                prop_assert_eq!(value_of(&c), v, "{}: {} value", what, IDS[id]);
                let gen = c.generation();
                let k = &self.known[id];
                prop_assert!(
                    gen >= k.max_gen,
                    "{what}: {} generation {gen} < {}",
                    IDS[id],
                    k.max_gen
                );
                self.known[id].max_gen = gen.max(self.known[id].max_gen);
            }
            (Err(Error::NotFound { .. }), None) => {}
            (got, want) => prop_assert!(false, "{what}: {} read {got:?}, want {want:?}", IDS[id]),
        }
        Ok(())
    }

    fn apply(&mut self, step: &Step) -> Result<(), TestCaseError> {
        let what = format!("{step:?}");
        match step.clone() {
            Step::Set { id, len } => {
                let v = self.fresh_value(len);
                let gen = self
                    .s()
                    .set(Credential::api_key(IDS[id], Secret::new(v.clone())), None)
                    .map_err(|e| TestCaseError::fail(format!("{what}: {e}")))?;
                self.acked(id, v, gen, &what)?;
            }
            Step::SetHuge { id } => {
                let v = "h".repeat(800_000);
                match self
                    .s()
                    .set(Credential::api_key(IDS[id], Secret::new(v)), None)
                {
                    Err(e @ Error::ValueTooLarge { .. }) => {
                        prop_assert_eq!(e.kind(), holdfast::error::ErrorKind::InvalidParams)
                    }
                    other => prop_assert!(false, "{what}: {other:?}"),
                }
            }
            Step::CasLastSeen { id, len } => {
                let Some(seen) = self.known[id]
                    .last_seen
                    .filter(|_| self.known[id].value.is_some())
                else {
                    return Ok(());
                };
                let v = self.fresh_value(len);
                let r = self.s().set(
                    Credential::api_key(IDS[id], Secret::new(v.clone())),
                    Some(seen),
                );
                let k = &self.known[id];
                match (r, k.changed_since_seen, k.uncertain) {
                    (Ok(gen), false, _) => self.acked(id, v, gen, &what)?,
                    (Err(Error::GenerationMismatch { .. }), true, _) => {}
                    (Err(Error::GenerationMismatch { actual, .. }), false, true) => {
                        prop_assert!(actual > seen, "{what}: after a crash {actual} <= {seen}")
                    }
                    (r, changed, uncertain) => prop_assert!(
                        false,
                        "{what}: CAS at {seen} with changed_since_seen={changed} uncertain={uncertain}: {r:?}"
                    ),
                }
            }
            Step::CasStale { id, back } => {
                let k = &self.known[id];
                let Some(seen) = k.last_seen.filter(|g| *g > back) else {
                    return Ok(());
                };
                let stale = seen - back;
                let r = self.s().set(
                    Credential::api_key(IDS[id], Secret::new("stale".into())),
                    Some(stale),
                );
                prop_assert!(
                    matches!(r, Err(Error::GenerationMismatch { .. })),
                    "{what}: a CAS at stale generation {stale} (last seen {seen}): {r:?}"
                );
            }
            Step::Get { id } => match self.s().get(IDS[id]) {
                Ok(c) => {
                    let v = value_of(&c);
                    prop_assert_eq!(Some(v), self.known[id].value.clone(), "{}", what);
                    let changed = self.known[id].changed_since_seen;
                    self.observe(id, c.generation(), changed, &what)?;
                    self.known[id].history.push(c.to_bytes().to_vec());
                }
                Err(Error::NotFound { .. }) => {
                    prop_assert!(self.known[id].value.is_none(), "{what}")
                }
                Err(e) => prop_assert!(false, "{what}: {e}"),
            },
            Step::Delete { id } => {
                let existed = self
                    .s()
                    .delete(IDS[id])
                    .map_err(|e| TestCaseError::fail(format!("{what}: {e}")))?;
                prop_assert_eq!(existed, self.known[id].value.is_some(), "{}", what);
                self.known[id].value = None;
                self.known[id].changed_since_seen = true;
            }
            Step::Rotate => {
                self.s()
                    .rotate_key(|_, _| {})
                    .map_err(|e| TestCaseError::fail(format!("{what}: {e}")))?;
            }
            Step::Prune => {
                self.s()
                    .prune_keys(|_, _| {})
                    .map_err(|e| TestCaseError::fail(format!("{what}: {e}")))?;
            }
            Step::HiveOldCopy {
                id,
                pick,
                archived_key,
            } => {
                let k = &self.known[id];
                if k.history.is_empty() {
                    return Ok(());
                }
                let plain = k.history[pick % k.history.len()].clone();
                let loaded = keys::load(&[KeySource::File(self.key_file())])
                    .unwrap()
                    .unwrap();
                // hive keeps the key it read at start: one from before a rotation, if any.
                let key = match (archived_key, loaded.previous.first()) {
                    (true, Some(old)) => old,
                    _ => &loaded.primary,
                };
                let token = Keyring::new(key, &[]).unwrap().encrypt(&plain);
                let file = self
                    .a
                    .base
                    .join("credentials")
                    .join(holdfast::store::id::file_name(IDS[id]));
                // hive writes in place: truncate, then write.
                let mut f = fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(&file)
                    .unwrap();
                f.write_all(token.as_bytes()).unwrap();
                drop(f);
                let old = Credential::parse(&plain).unwrap();
                self.known[id].value = Some(value_of(&old));
                self.known[id].changed_since_seen = true;
                // The next read must report a generation above everything before.
                let c = self
                    .s()
                    .get(IDS[id])
                    .map_err(|e| TestCaseError::fail(format!("{what}: {e}")))?;
                prop_assert_eq!(value_of(&c), value_of(&old), "{}", what);
                self.observe(id, c.generation(), true, &what)?;
            }
            Step::CrashedSet { id, len, at } => {
                let v = self.fresh_value(len);
                let faults = Faults::recorder();
                drop(self.store.take());
                let crashing = open(&self.a, faults.clone());
                faults.arm(None, at, FaultMode::Crash);
                let r = crashing.set(Credential::api_key(IDS[id], Secret::new(v.clone())), None);
                drop(crashing);
                self.store = Some(open(&self.a, Faults::none()));
                let old = self.known[id].value.clone();
                match r {
                    Ok(gen) => self.acked(id, v, gen, &what)?,
                    Err(_) => {
                        // Not acknowledged: the old value or the new one, whole.
                        let now = self
                            .s()
                            .get(IDS[id])
                            .ok()
                            .map(|c| (value_of(&c), c.generation()));
                        match now {
                            Some((got, gen)) if Some(&got) == old.as_ref() => {
                                let k = &mut self.known[id];
                                prop_assert!(
                                    gen >= k.max_gen,
                                    "{what}: generation went back to {gen}"
                                );
                                k.max_gen = gen;
                                k.uncertain = true;
                            }
                            Some((got, gen)) if got == v => {
                                self.known[id].value = Some(v);
                                self.known[id].changed_since_seen = true;
                                self.observe(id, gen, true, &what)?;
                            }
                            None => prop_assert!(old.is_none(), "{what}: lost {old:?}"),
                            Some((got, _)) => {
                                prop_assert!(false, "{what}: read {got:?}, want {old:?} or {v:?}")
                            }
                        }
                    }
                }
            }
            Step::Reopen => {
                drop(self.store.take());
                self.store = Some(open(&self.a, Faults::none()));
            }
            Step::RotateOtherDataDir => {
                let sb = open(&self.b, Faults::none());
                sb.rotate_key(|_, _| {})
                    .map_err(|e| TestCaseError::fail(format!("{what}: {e}")))?;
                self.counter += 1;
                self.b_value = format!("b{}", self.counter);
                sb.set(
                    Credential::api_key("other", Secret::new(self.b_value.clone())),
                    None,
                )
                .map_err(|e| TestCaseError::fail(format!("{what}: {e}")))?;
            }
        }
        TOTAL.fetch_add(1, Ordering::Relaxed);
        self.check_all(&what)
    }

    fn acked(&mut self, id: usize, v: String, gen: u64, what: &str) -> Result<(), TestCaseError> {
        let prev = self.known[id].max_gen;
        prop_assert!(
            gen > prev,
            "{what}: a write got generation {gen}, not above {prev}"
        );
        self.known[id].value = Some(v);
        self.known[id].max_gen = gen;
        self.known[id].last_seen = Some(gen);
        self.known[id].changed_since_seen = false;
        self.known[id].uncertain = false;
        let c = self
            .s()
            .get(IDS[id])
            .map_err(|e| TestCaseError::fail(format!("{what}: {e}")))?;
        prop_assert_eq!(c.generation(), gen, "{}: read back", what);
        self.known[id].history.push(c.to_bytes().to_vec());
        Ok(())
    }
}

#[test]
fn acknowledged_values_read_back_and_generations_only_go_forward() {
    let cases: u32 = std::env::var("HOLDFAST_MODEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    let mut runner = TestRunner::new(Config {
        cases,
        max_shrink_iters: 200,
        failure_persistence: None,
        ..Config::default()
    });
    let started = std::time::Instant::now();
    let counts: std::sync::Mutex<BTreeMap<&'static str, u64>> = Default::default();
    let result = runner.run(&proptest::collection::vec(step(), 1..40), |steps| {
        let mut world = World::new();
        for s in &steps {
            let name = match s {
                Step::Set { .. } => "set",
                Step::SetHuge { .. } => "oversize set",
                Step::CasLastSeen { .. } => "cas (last seen)",
                Step::CasStale { .. } => "cas (stale)",
                Step::Get { .. } => "get",
                Step::Delete { .. } => "delete",
                Step::Rotate => "rotate",
                Step::Prune => "prune",
                Step::HiveOldCopy { .. } => "hive old copy",
                Step::CrashedSet { .. } => "crashed set",
                Step::Reopen => "reopen",
                Step::RotateOtherDataDir => "rotate other data dir",
            };
            *counts.lock().unwrap().entry(name).or_default() += 1;
            world.apply(s)?;
        }
        Ok(())
    });
    let counts = counts.into_inner().unwrap();
    println!(
        "store model: {cases} sequences, {} steps checked ({}), {:.1} s; violations: {}",
        TOTAL.load(Ordering::Relaxed),
        counts
            .iter()
            .map(|(k, v)| format!("{v} {k}"))
            .collect::<Vec<_>>()
            .join(", "),
        started.elapsed().as_secs_f64(),
        if result.is_ok() { 0 } else { 1 }
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}
