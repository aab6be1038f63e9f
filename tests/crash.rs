//! Crash and fault tests for the credential store (issue 2; SECURITY-CHECKLIST items 17, 19, 20,
//! 22 and 24).
//!
//! - `crash_at_every_step`: for every write operation, learn its file-system steps with a recorder,
//!   then crash at each step in turn, restart (reopen), and check every invariant.
//! - `io_error_at_every_step`: the same loop with the k-th step failing once or from then on with
//!   EIO or ENOSPC: a `storage` error, the old value intact, no temp file, and after a failed fsync
//!   a poisoned store (writes refused with a reason, reads served) until it is reopened.
//! - `kill_9_loop`: a child process (this test binary re-executed, entry `child_writer`) writes in a
//!   loop and is SIGKILLed at random; after each kill every id must hold its last acknowledged value
//!   or the one in flight.
//! - `fault_during_recovery`: a damaged store (temp files, missing or stale index, orphan, ghost,
//!   damaged file) opened with a crash or an I/O error at each step of the open-time repair, and
//!   again a crash during the recovery from that crash; a clean reopen must then be consistent.
//! - `startup_sweeps_leftover_temp_files`: planted temp files are swept and reported on open.
//!
//! Every loop prints what it explored and the totals of violations; a violation fails the test
//! with the first few details.
// Test code: fixtures are made directly, and a panic is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

#[allow(dead_code)] // each test binary uses only some of the shared helpers
mod common;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt::Display;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{enc_files, names_in, reexec, store_config, temps_in};
use holdfast::crypto::{keys, Keyring, Secret};
use holdfast::durable::{FaultMode, Faults, Op};
use holdfast::error::ErrorKind;
use holdfast::store::{
    id, init_store, Credential, CredentialStore, Error, StoreConfig, StoreOptions,
};
use serde_json::Value;

const EIO: i32 = 5;
const ENOSPC: i32 = 28;

// ---------------------------------------------------------------------------------------------
// Small utilities
// ---------------------------------------------------------------------------------------------

/// xorshift64: enough randomness for kill timing, reproducible from a printed seed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
}

fn seed(var: &str) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            let t = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1);
            t ^ (u64::from(std::process::id()) << 32)
        })
}

/// `head` padded with letters to `len` bytes (varying file sizes make torn writes detectable).
fn padded(head: &str, len: usize) -> String {
    let mut s = head.to_owned();
    s.push('-');
    while s.len() < len {
        s.push(char::from(b'a' + (s.len() % 26) as u8));
    }
    s
}

fn api_key(id: &str, value: &str) -> Credential {
    Credential::api_key(id, Secret::new(value.to_owned()))
}

fn copy_tree(src: &Path, dst: &Path) {
    for e in fs::read_dir(src).unwrap().flatten() {
        let ft = e.file_type().unwrap();
        let to = dst.join(e.file_name());
        if ft.is_dir() {
            fs::DirBuilder::new().mode(0o700).create(&to).unwrap();
            copy_tree(&e.path(), &to);
        } else if ft.is_file() {
            fs::copy(e.path(), &to).unwrap();
        }
    }
}

fn write_private(path: &Path, bytes: &[u8]) {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .unwrap();
    f.write_all(bytes).unwrap();
}

// ---------------------------------------------------------------------------------------------
// A store in a temp dir: <root>/store (the base) and <root>/keys/crash.key
// ---------------------------------------------------------------------------------------------

struct Env {
    _dir: Option<tempfile::TempDir>,
    root: PathBuf,
    config: StoreConfig,
}

impl Env {
    fn at(root: PathBuf, dir: Option<tempfile::TempDir>) -> Env {
        let config = store_config(
            "crash",
            &root.join("store"),
            &root.join("keys").join("crash.key"),
        );
        Env {
            _dir: dir,
            root,
            config,
        }
    }

    /// A new, initialized, empty store.
    fn fresh() -> Env {
        let dir = tempfile::tempdir().unwrap();
        let env = Env::at(dir.path().to_path_buf(), Some(dir));
        init_store(&env.config, &Faults::none()).unwrap();
        env
    }

    /// A byte-for-byte copy (modes kept) in a new temp dir: a template's state, ready to fault.
    fn copy(&self) -> Env {
        let dir = tempfile::tempdir().unwrap();
        copy_tree(&self.root, dir.path());
        Env::at(dir.path().to_path_buf(), Some(dir))
    }

    fn key_file(&self) -> PathBuf {
        self.root.join("keys").join("crash.key")
    }
    fn keys_dir(&self) -> PathBuf {
        self.root.join("keys")
    }
    fn cred_dir(&self) -> PathBuf {
        self.config.base.join("credentials")
    }
    fn meta_dir(&self) -> PathBuf {
        self.config.base.join("metadata")
    }
    fn quarantine_dir(&self) -> PathBuf {
        self.config.base.join("quarantine")
    }

    fn open_with(&self, faults: &Faults) -> Result<CredentialStore, Error> {
        CredentialStore::open(
            self.config.clone(),
            StoreOptions {
                faults: faults.clone(),
                ..StoreOptions::default()
            },
        )
    }

    /// Reopen as a restarted process would: default options.
    fn open(&self) -> CredentialStore {
        CredentialStore::open(self.config.clone(), StoreOptions::default())
            .unwrap_or_else(|e| panic!("reopen of {} failed: {e}", self.config.base.display()))
    }

    /// Temp files in every directory holdfast writes to.
    fn all_temps(&self) -> Vec<String> {
        let mut v = Vec::new();
        for d in [self.cred_dir(), self.meta_dir(), self.keys_dir()] {
            v.extend(temps_in(&d));
        }
        v
    }
}

// ---------------------------------------------------------------------------------------------
// Violation bookkeeping
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum V {
    /// An acknowledged value is missing or older.
    Lost,
    /// A value that is neither old nor new, or does not decrypt/parse.
    Torn,
    /// A temp file left where none may be.
    TempLeft,
    /// Something in quarantine that should not be (or missing from it).
    Quarantine,
    /// index.json unparseable or disagreeing with the files.
    Index,
    /// fsck finds problems.
    Fsck,
    /// The in-flight value is on the wrong side of the operation's commit point.
    Order,
    /// Wrong error kind, missing poison, writes refused after reopen, …
    Other,
}

const V_COUNT: usize = 8;

#[derive(Default)]
struct Tally {
    counts: [usize; V_COUNT],
    notes: Vec<String>,
}

impl Tally {
    fn bad(&mut self, v: V, ctx: &str, msg: impl Display) {
        self.counts[v as usize] += 1;
        if self.notes.len() < 40 {
            self.notes.push(format!("[{v:?}] {ctx}: {msg}"));
        }
    }
    fn n(&self, v: V) -> usize {
        self.counts[v as usize]
    }
    fn total(&self) -> usize {
        self.counts.iter().sum()
    }
    fn line(&self) -> String {
        format!(
            "{} lost acked, {} torn, {} temp left, {} quarantine, {} index, {} fsck, {} commit-order, {} other",
            self.n(V::Lost),
            self.n(V::Torn),
            self.n(V::TempLeft),
            self.n(V::Quarantine),
            self.n(V::Index),
            self.n(V::Fsck),
            self.n(V::Order),
            self.n(V::Other)
        )
    }
    fn assert_none(&self, what: &str) {
        assert!(
            self.total() == 0,
            "{what}: {} violation(s): {}\n{}",
            self.total(),
            self.line(),
            self.notes.join("\n")
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Reading and checking a store
// ---------------------------------------------------------------------------------------------

/// A credential's value and generation.
type State = (String, u64);
/// id → acknowledged state.
type Model = BTreeMap<String, State>;

#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Absent,
    Value(String, u64),
    Broken(String),
}

impl Seen {
    fn state(&self) -> Option<Option<State>> {
        match self {
            Seen::Absent => Some(None),
            Seen::Value(v, g) => Some(Some((v.clone(), *g))),
            Seen::Broken(_) => None,
        }
    }
}

fn read(store: &CredentialStore, id: &str) -> Seen {
    match store.get(id) {
        Ok(c) => match c.key_value("api_key") {
            Some(v) => Seen::Value(v.to_owned(), c.generation()),
            None => Seen::Broken("no api_key key in the document".into()),
        },
        Err(Error::NotFound { .. }) => Seen::Absent,
        Err(e) => Seen::Broken(e.to_string()),
    }
}

fn show(s: &Option<State>) -> String {
    match s {
        None => "absent".into(),
        Some((v, g)) => format!("{}… gen {g}", &v[..v.len().min(24)]),
    }
}

/// What a reopened store must hold.
struct Expect<'a> {
    /// Acknowledged credentials that must read back exactly (the in-flight id excluded).
    fixed: &'a Model,
    /// The id of an interrupted write and the states it may be in (`None` = absent).
    inflight: Option<(&'a str, Vec<Option<State>>)>,
    /// Files expected in quarantine/.
    quarantine: usize,
    /// A rotation was interrupted: fsck may report files still under the previous key.
    allow_old_key: bool,
}

/// Check that index.json parses and agrees with the files (`files`) and the expected ids.
fn index_problems(env: &Env, files: &BTreeSet<String>, ids: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    let path = env.meta_dir().join("index.json");
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) => return vec![format!("cannot read index.json: {e}")],
    };
    let v: Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(e) => return vec![format!("index.json does not parse: {e}")],
    };
    if v.get("version").and_then(Value::as_str) != Some("2.0") {
        out.push(format!("index version {:?}", v.get("version")));
    }
    let listed: BTreeSet<String> = v
        .get("credentials")
        .and_then(Value::as_object)
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    if &listed != ids {
        out.push(format!(
            "index credentials {listed:?} != ids on disk {ids:?}"
        ));
    }
    let vouched: BTreeSet<String> = v
        .pointer("/holdfast/files")
        .and_then(Value::as_object)
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    if &vouched != files {
        out.push(format!(
            "index holdfast.files {vouched:?} != files {files:?}"
        ));
    }
    out
}

/// Check every invariant on a reopened store. Returns what the in-flight id held.
fn check_reopened(
    env: &Env,
    store: &CredentialStore,
    ex: &Expect,
    t: &mut Tally,
    ctx: &str,
) -> Option<Seen> {
    let inflight_id = ex.inflight.as_ref().map(|(i, _)| *i);
    // 1. Every acknowledged credential reads back with its acknowledged value and generation.
    for (cid, (val, gen)) in ex.fixed {
        if Some(cid.as_str()) == inflight_id {
            continue;
        }
        match read(store, cid) {
            Seen::Value(v, g) if v == *val && g == *gen => {}
            Seen::Value(v, g) => t.bad(
                V::Lost,
                ctx,
                format!(
                    "{cid}: acked {} but read {}",
                    show(&Some((val.clone(), *gen))),
                    show(&Some((v, g)))
                ),
            ),
            Seen::Absent => t.bad(V::Lost, ctx, format!("{cid}: acked value missing")),
            Seen::Broken(e) => t.bad(V::Torn, ctx, format!("{cid}: does not read: {e}")),
        }
    }
    // 2. The in-flight id holds one of its allowed complete states.
    let observed = ex.inflight.as_ref().map(|(cid, allowed)| {
        let seen = read(store, cid);
        match seen.state() {
            None => t.bad(V::Torn, ctx, format!("{cid}: does not read: {seen:?}")),
            Some(s) if allowed.contains(&s) => {}
            Some(None) => t.bad(
                V::Lost,
                ctx,
                format!("{cid}: missing (allowed {allowed:?})"),
            ),
            Some(s) => t.bad(
                V::Torn,
                ctx,
                format!("{cid}: neither old nor new: {}", show(&s)),
            ),
        }
        seen
    });
    // 3. The files on disk are exactly the expected ids.
    let mut ids: BTreeSet<String> = ex
        .fixed
        .keys()
        .filter(|k| Some(k.as_str()) != inflight_id)
        .cloned()
        .collect();
    if let (Some(cid), Some(Seen::Value(..))) = (inflight_id, &observed) {
        ids.insert(cid.to_owned());
    }
    let files = enc_files(&env.cred_dir());
    let want_files: BTreeSet<String> = ids.iter().map(|i| id::file_name(i)).collect();
    if files != want_files {
        t.bad(
            V::Other,
            ctx,
            format!("files on disk {files:?} != expected {want_files:?}"),
        );
    }
    // 4. No temp file in credentials/ or metadata/.
    for d in [env.cred_dir(), env.meta_dir()] {
        let temps = temps_in(&d);
        if !temps.is_empty() {
            t.bad(
                V::TempLeft,
                ctx,
                format!("{} after reopen: {temps:?}", d.display()),
            );
        }
    }
    // 5. Quarantine holds exactly what it should.
    let q = names_in(&env.quarantine_dir());
    if q.len() != ex.quarantine {
        t.bad(
            V::Quarantine,
            ctx,
            format!("quarantine holds {q:?}, expected {} file(s)", ex.quarantine),
        );
    }
    // 6. index.json parses and lists exactly the ids on disk.
    for p in index_problems(env, &files, &ids) {
        t.bad(V::Index, ctx, p);
    }
    // 7. fsck (read-only, every file decrypted) is clean.
    match store.fsck(false) {
        Ok(r) => {
            let allowed = if ex.allow_old_key { r.old_key.len() } else { 0 };
            if r.problems() != allowed || r.readable != files.len() {
                t.bad(V::Fsck, ctx, format!("fsck not clean:\n{r}"));
            }
        }
        Err(e) => t.bad(V::Fsck, ctx, format!("fsck failed: {e}")),
    }
    observed
}

/// Finish an interrupted rotation and check that the old key is no longer needed anywhere.
fn finish_rotation(env: &Env, store: CredentialStore, model: &Model, t: &mut Tally, ctx: &str) {
    let files = enc_files(&env.cred_dir());
    match store.rotate_key(|_, _| {}) {
        Ok(r) => {
            if r.verified != files.len() {
                t.bad(
                    V::Other,
                    ctx,
                    format!("rotation verified {} of {} files", r.verified, files.len()),
                );
            }
            if !r.undecryptable.is_empty() {
                t.bad(
                    V::Torn,
                    ctx,
                    format!("undecryptable: {:?}", r.undecryptable),
                );
            }
        }
        Err(e) => t.bad(V::Other, ctx, format!("resumed rotation failed: {e}")),
    }
    let mut rotating = env.key_file().into_os_string();
    rotating.push(".rotating");
    if std::path::Path::new(&rotating).exists() {
        t.bad(V::Other, ctx, "rotation mark still present after rotation");
    }
    // The retired keys stay in the archive until a prune proves nothing needs them: here
    // nothing does, so it empties.
    match store.prune_keys(|_, _| {}) {
        Ok(r) if r.retired.is_empty() => {}
        Ok(r) => t.bad(V::Other, ctx, format!("prune kept {:?}", r.kept)),
        Err(e) => t.bad(V::Other, ctx, format!("prune after rotation failed: {e}")),
    }
    let prev = keys::prev_path(&env.key_file());
    if prev.exists() {
        t.bad(V::Other, ctx, "archive still present after a prune");
    }
    let temps = env.all_temps();
    if !temps.is_empty() {
        t.bad(
            V::TempLeft,
            ctx,
            format!("temp files after the resumed rotation: {temps:?}"),
        );
    }
    match store.fsck(false) {
        Ok(r) if r.is_clean() => {}
        Ok(r) => t.bad(V::Fsck, ctx, format!("fsck after rotation:\n{r}")),
        Err(e) => t.bad(V::Fsck, ctx, format!("fsck after rotation failed: {e}")),
    }
    drop(store);
    // Every file decrypts with the primary key alone.
    let key = fs::read_to_string(env.key_file()).unwrap();
    let ring = Keyring::new(&Secret::new(key.trim().to_owned()), &[]).unwrap();
    for f in enc_files(&env.cred_dir()) {
        let token = fs::read_to_string(env.cred_dir().join(&f)).unwrap_or_default();
        if !matches!(ring.decrypt(&token), Ok((_, 0))) {
            t.bad(
                V::Torn,
                ctx,
                format!("{f} does not decrypt with the primary key alone"),
            );
        }
    }
    // And a restart with only that key reads every value.
    let store = env.open();
    for (cid, (val, gen)) in model {
        match read(&store, cid) {
            Seen::Value(v, g) if v == *val && g == *gen => {}
            other => t.bad(
                V::Lost,
                ctx,
                format!("{cid} after the finished rotation: {other:?}"),
            ),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The operations under test
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WriteOp {
    SetNew,
    SetOverwrite,
    Delete,
    UpdateCas,
    Rotate,
    IndexFlush,
}

const ALL_OPS: [WriteOp; 6] = [
    WriteOp::SetNew,
    WriteOp::SetOverwrite,
    WriteOp::Delete,
    WriteOp::UpdateCas,
    WriteOp::Rotate,
    WriteOp::IndexFlush,
];

impl WriteOp {
    fn name(self) -> &'static str {
        match self {
            WriteOp::SetNew => "set-new",
            WriteOp::SetOverwrite => "set-overwrite",
            WriteOp::Delete => "delete",
            WriteOp::UpdateCas => "update-cas",
            WriteOp::Rotate => "rotate",
            WriteOp::IndexFlush => "index-flush",
        }
    }

    /// The step that makes the operation visible (1-based position in its recorded steps):
    /// the rename of the credential file, or the unlink. Faults at or before it must leave the
    /// old state; faults after it the new one. `None`: the operation changes no value.
    fn commit_step(self, log: &[Op]) -> Option<usize> {
        let op = match self {
            WriteOp::SetNew | WriteOp::SetOverwrite | WriteOp::UpdateCas => Op::Rename,
            WriteOp::Delete => Op::Unlink,
            WriteOp::Rotate | WriteOp::IndexFlush => return None,
        };
        log.iter().position(|o| *o == op).map(|p| p + 1)
    }
}

const N_CREDS: usize = 5;

/// A store with `N_CREDS` acknowledged credentials of varying sizes.
fn template() -> (Env, Model) {
    let env = Env::fresh();
    let mut model = Model::new();
    {
        let store = env.open();
        for i in 0..N_CREDS {
            let cid = format!("cred-{i:02}");
            let val = padded(&format!("old-{i}"), 20 + i * 170);
            let gen = store.set(api_key(&cid, &val), None).unwrap();
            model.insert(cid, (val, gen));
        }
    }
    (env, model)
}

/// Put the store into the state the operation starts from. For the index flush: a set whose
/// index rewrite failed (the credential is acked, the index is dirty).
fn prepare(op: WriteOp, store: &CredentialStore, faults: &Faults, model: &mut Model) {
    if op == WriteOp::IndexFlush {
        faults.arm(Some(Op::Rename), 2, FaultMode::FailOnce(EIO));
        let val = padded("dirty", 333);
        let gen = store
            .set(api_key("cred-dirty", &val), None)
            .expect("a set whose index rewrite failed is still acknowledged");
        faults.disarm();
        model.insert("cred-dirty".into(), (val, gen));
    }
}

/// An interrupted write: the id, its state before, and its state if the write completed.
struct Flight {
    id: String,
    old: Option<State>,
    new: Option<State>,
}

fn run_op(
    op: WriteOp,
    store: &CredentialStore,
    model: &Model,
) -> (Result<(), Error>, Option<Flight>) {
    let flight = |cid: &str, new: Option<State>| Flight {
        id: cid.to_owned(),
        old: model.get(cid).cloned(),
        new,
    };
    match op {
        WriteOp::SetNew => {
            let val = padded("new", 1234);
            let f = flight("cred-new", Some((val.clone(), 1)));
            (
                store.set(api_key("cred-new", &val), None).map(drop),
                Some(f),
            )
        }
        WriteOp::SetOverwrite => {
            let cid = "cred-02";
            let val = padded("overwritten", 77);
            let gen = model[cid].1 + 1;
            let f = flight(cid, Some((val.clone(), gen)));
            (store.set(api_key(cid, &val), None).map(drop), Some(f))
        }
        WriteOp::Delete => {
            let f = flight("cred-01", None);
            (store.delete("cred-01").map(drop), Some(f))
        }
        WriteOp::UpdateCas => {
            let cid = "cred-03";
            let val = padded("updated", 900);
            let gen = model[cid].1;
            let f = flight(cid, Some((val.clone(), gen + 1)));
            let r = store.update(cid, Some(gen), |cur| {
                let mut c = cur.ok_or_else(|| Error::NotFound { id: cid.into() })?;
                c.set_key("api_key", Secret::new(val.clone()));
                Ok(c)
            });
            (r.map(drop), Some(f))
        }
        WriteOp::Rotate => (store.rotate_key(|_, _| {}).map(drop), None),
        WriteOp::IndexFlush => (store.flush(), None),
    }
}

/// Run the operation once without faults on a copy of the template: its recorded steps.
fn learn_steps(op: WriteOp, template: &Env, model: &Model) -> Vec<Op> {
    let env = template.copy();
    let faults = Faults::recorder();
    let store = env.open_with(&faults).unwrap();
    let mut model = model.clone();
    prepare(op, &store, &faults, &mut model);
    let start = faults.log().len();
    let (res, _) = run_op(op, &store, &model);
    res.unwrap_or_else(|e| panic!("{} without faults failed: {e}", op.name()));
    let log = faults.log()[start..].to_vec();
    assert!(!log.is_empty(), "{} took no steps", op.name());
    log
}

fn is_fsync(op: &Op) -> bool {
    matches!(op, Op::FsyncFile | Op::FsyncDir)
}

/// The model once the operation has (or has not) taken effect.
fn apply(model: &Model, flight: &Option<Flight>, committed: bool) -> Model {
    let mut m = model.clone();
    if let (Some(f), true) = (flight, committed) {
        match &f.new {
            Some(s) => {
                m.insert(f.id.clone(), s.clone());
            }
            None => {
                m.remove(&f.id);
            }
        }
    }
    m
}

// ---------------------------------------------------------------------------------------------
// 1. Crash at every injected step
// ---------------------------------------------------------------------------------------------

/// One crash point, as a restart finds it: a copy of the template, the operation crashed before
/// its step `k` (that step and every later one refused), then — with `power` — everything not
/// made durable lost (`Faults::lose_power`), the store reopened and checked against the model
/// (every acknowledged write there, the interrupted one old or new, nothing torn, the index
/// consistent). Returns what the reopened store holds of the interrupted write.
struct Point {
    env: Env,
    store: CredentialStore,
    model: Model,
    flight: Option<Flight>,
    acked: bool,
    observed: Option<Seen>,
}

/// An operation under test: the template it starts from and the steps it takes.
struct Subject<'a> {
    op: WriteOp,
    template: &'a Env,
    model0: &'a Model,
    steps: &'a [Op],
}

fn crash_point(sub: &Subject<'_>, k: usize, power: bool, t: &mut Tally, ctx: &str) -> Point {
    let Subject {
        op,
        template,
        model0,
        steps,
    } = *sub;
    let env = template.copy();
    let faults = Faults::recorder();
    let store = env.open_with(&faults).unwrap();
    let mut model = model0.clone();
    prepare(op, &store, &faults, &mut model);
    if power {
        faults.record_power(&env.root);
    }
    let start = faults.log().len();
    faults.arm(None, k as u64, FaultMode::Crash);
    let (res, flight) = run_op(op, &store, &model);
    let seen_log = faults.log()[start..].to_vec();
    if !faults.crashed() || seen_log.get(..k) != steps.get(..k) {
        t.bad(
            V::Other,
            ctx,
            format!("crash not injected where intended: {seen_log:?}"),
        );
    }
    let acked = res.is_ok();
    drop(store);
    if power {
        faults
            .lose_power(&env.root)
            .unwrap_or_else(|e| panic!("{ctx}: restoring the durable image: {e}"));
    }
    let store = env.open();
    let allowed = match &flight {
        Some(f) if acked => vec![f.new.clone()],
        Some(f) => vec![f.old.clone(), f.new.clone()],
        None => Vec::new(),
    };
    let ex = Expect {
        fixed: &model,
        inflight: flight.as_ref().map(|f| (f.id.as_str(), allowed)),
        quarantine: 0,
        allow_old_key: op == WriteOp::Rotate,
    };
    let observed = check_reopened(&env, &store, &ex, t, ctx);
    Point {
        env,
        store,
        model,
        flight,
        acked,
        observed,
    }
}

#[test]
fn crash_at_every_step() {
    let started = Instant::now();
    let mut t = Tally::default();
    let mut total_points = 0;
    let mut acked_before_crash = 0;
    let mut per_op = Vec::new();
    for op in ALL_OPS {
        let (template, model0) = template();
        let log = learn_steps(op, &template, &model0);
        let commit = op.commit_step(&log);
        let subject = Subject {
            op,
            template: &template,
            model0: &model0,
            steps: &log,
        };
        for k in 1..=log.len() {
            let ctx = format!(
                "{} crash at step {k}/{} ({:?})",
                op.name(),
                log.len(),
                log[k - 1]
            );
            let p = crash_point(&subject, k, false, &mut t, &ctx);
            acked_before_crash += usize::from(p.acked);
            let (flight, observed) = (&p.flight, &p.observed);
            // Without power loss a crash after the commit step shows the new state.
            if let (Some(f), Some(c), Some(seen)) = (flight, commit, observed) {
                let want = if k <= c { &f.old } else { &f.new };
                if seen.state().as_ref() != Some(want) {
                    t.bad(
                        V::Order,
                        &ctx,
                        format!(
                            "{}: expected {} (commit step {c}), read {seen:?}",
                            f.id,
                            show(want)
                        ),
                    );
                }
            }
            if op == WriteOp::Rotate {
                finish_rotation(&p.env, p.store, &p.model, &mut t, &ctx);
            }
            total_points += 1;
        }
        per_op.push(format!("{} {}", op.name(), log.len()));
    }
    println!(
        "crash-at-every-step: {} ops ({}) = {total_points} crash points, {acked_before_crash} acked before the crash (index rewrite after the commit); {} [{:.1} s]",
        ALL_OPS.len(),
        per_op.join(", "),
        t.line(),
        started.elapsed().as_secs_f64()
    );
    t.assert_none("crash at every step");
}

// ---------------------------------------------------------------------------------------------
// 2. I/O error at every step, once and persistently, EIO and ENOSPC
// ---------------------------------------------------------------------------------------------

/// Checklist row 18: simulated power loss. As `crash_at_every_step`, but after the crash at step
/// k the store's tree is made what stable storage held (`Faults::lose_power`): each directory's
/// entries as of its last fsync (a create, rename or unlink since is undone), each file's bytes as
/// of its last fsync (anything written since is lost; a file never synced is empty). Then every
/// state must still be valid: every acknowledged write there, nothing torn, the index consistent;
/// and the interrupted write's outcome is exact — old up to the directory fsync that follows its
/// commit step, new after it (it is acknowledged only after that fsync).
#[test]
fn power_loss_at_every_step() {
    let started = Instant::now();
    let mut t = Tally::default();
    let mut total_points = 0;
    let mut acked_before_crash = 0;
    let mut lost_unacked = 0;
    let mut per_op = Vec::new();
    for op in ALL_OPS {
        let (template, model0) = template();
        let log = learn_steps(op, &template, &model0);
        let subject = Subject {
            op,
            template: &template,
            model0: &model0,
            steps: &log,
        };
        // The write is durable once the directory holding its rename or unlink is synced.
        let durable_at = op.commit_step(&log).and_then(|c| {
            log[c..]
                .iter()
                .position(|o| *o == Op::FsyncDir)
                .map(|p| c + p + 1)
        });
        for k in 1..=log.len() {
            let ctx = format!(
                "{} power loss at step {k}/{} ({:?})",
                op.name(),
                log.len(),
                log[k - 1]
            );
            let p = crash_point(&subject, k, true, &mut t, &ctx);
            acked_before_crash += usize::from(p.acked);
            let (flight, observed) = (&p.flight, &p.observed);
            if let (Some(f), Some(seen)) = (flight, observed) {
                let durable = durable_at.is_some_and(|d| k > d);
                let want = if durable { &f.new } else { &f.old };
                if seen.state().as_ref() != Some(want) {
                    t.bad(
                        V::Order,
                        &ctx,
                        format!(
                            "{}: expected {} (durable after step {durable_at:?}), read {seen:?}",
                            f.id,
                            show(want)
                        ),
                    );
                }
                if !durable && f.old != f.new && k > op.commit_step(&log).unwrap_or(usize::MAX) {
                    lost_unacked += 1;
                }
            }
            if op == WriteOp::Rotate {
                finish_rotation(&p.env, p.store, &p.model, &mut t, &ctx);
            }
            total_points += 1;
        }
        per_op.push(format!("{} {}", op.name(), log.len()));
    }
    println!(
        "power-loss-at-every-step: {} ops ({}) = {total_points} crash points, each followed by the loss of everything not fsynced; {acked_before_crash} acked before the crash, {lost_unacked} renamed but unacknowledged writes rolled back by the loss; {} [{:.1} s]",
        ALL_OPS.len(),
        per_op.join(", "),
        t.line(),
        started.elapsed().as_secs_f64()
    );
    t.assert_none("power loss at every step");
}

#[test]
fn io_error_at_every_step() {
    let started = Instant::now();
    let modes = [
        FaultMode::FailOnce(EIO),
        FaultMode::FailOnce(ENOSPC),
        FaultMode::FailAlways(EIO),
        FaultMode::FailAlways(ENOSPC),
    ];
    let mut t = Tally::default();
    let (mut runs, mut errors, mut acked, mut poisoned, mut temp_until_reopen) = (0, 0, 0, 0, 0);
    for op in ALL_OPS {
        let (template, model0) = template();
        let log = learn_steps(op, &template, &model0);
        let commit = op.commit_step(&log);
        for k in 1..=log.len() {
            for mode in modes {
                let ctx = format!(
                    "{} {mode:?} at step {k}/{} ({:?})",
                    op.name(),
                    log.len(),
                    log[k - 1]
                );
                let env = template.copy();
                let faults = Faults::recorder();
                let store = env.open_with(&faults).unwrap();
                let mut model = model0.clone();
                prepare(op, &store, &faults, &mut model);
                let start = faults.log().len();
                faults.arm(None, k as u64, mode);
                let (res, flight) = run_op(op, &store, &model);
                let seen_log = faults.log()[start..].to_vec();
                faults.disarm();
                runs += 1;
                if seen_log.get(k - 1) != log.get(k - 1) {
                    t.bad(
                        V::Other,
                        &ctx,
                        format!("fault not injected where intended: {seen_log:?}"),
                    );
                }
                let failed_ops: &[Op] = match mode {
                    FaultMode::FailOnce(_) => seen_log.get(k - 1..k).unwrap_or(&[]),
                    _ => seen_log.get(k - 1..).unwrap_or(&[]),
                };
                let fsync_failed = failed_ops.iter().any(is_fsync);
                // FailAlways also fails the removal of the temp file (the seam fails every step).
                let cleanup_failed = failed_ops.contains(&Op::RemoveTemp);

                // The request gets a storage error — or, if only the index rewrite after the
                // commit failed, it is acknowledged (the credential itself is durable).
                let committed = match &res {
                    Ok(()) => {
                        acked += 1;
                        let after_commit = commit.is_some_and(|c| k > c);
                        if !after_commit {
                            t.bad(
                                V::Other,
                                &ctx,
                                "acknowledged although a step before the commit failed",
                            );
                        }
                        true
                    }
                    Err(e) => {
                        errors += 1;
                        if e.kind() != ErrorKind::Storage {
                            t.bad(
                                V::Other,
                                &ctx,
                                format!("error kind {} (want storage): {e}", e.kind()),
                            );
                        }
                        commit.is_some_and(|c| k > c)
                    }
                };
                let after = apply(&model, &flight, committed);

                // Live store: old value intact and readable (new if the failure came after the
                // rename), no temp file visible.
                for (cid, st) in &after {
                    match read(&store, cid) {
                        Seen::Value(v, g) if (v.clone(), g) == *st => {}
                        other => t.bad(
                            V::Lost,
                            &ctx,
                            format!(
                                "live read of {cid}: {other:?}, want {}",
                                show(&Some(st.clone()))
                            ),
                        ),
                    }
                }
                if let Some(f) = &flight {
                    if !after.contains_key(&f.id) && read(&store, &f.id) != Seen::Absent {
                        t.bad(V::Order, &ctx, format!("{} should be absent", f.id));
                    }
                }
                let temps = env.all_temps();
                if !temps.is_empty() {
                    if cleanup_failed {
                        temp_until_reopen += 1;
                    } else {
                        t.bad(
                            V::TempLeft,
                            &ctx,
                            format!("temp files visible after the failed write: {temps:?}"),
                        );
                    }
                }

                // After a failed fsync the store refuses writes, saying why; reads still work.
                let probe = store.set(api_key("probe", "probe-value"), None);
                let mut model_after = after.clone();
                match (fsync_failed, probe) {
                    (true, Err(e @ Error::Poisoned(_))) => {
                        poisoned += 1;
                        let msg = e.to_string();
                        if !(msg.contains("fsync") && msg.contains("reopen"))
                            || e.kind() != ErrorKind::Storage
                        {
                            t.bad(
                                V::Other,
                                &ctx,
                                format!("poisoned, but the message does not say why: {msg}"),
                            );
                        }
                        for (cid, st) in &after {
                            if !matches!(read(&store, cid), Seen::Value(v, g) if (v.clone(), g) == *st)
                            {
                                t.bad(
                                    V::Other,
                                    &ctx,
                                    format!("read of {cid} fails on the poisoned store"),
                                );
                            }
                        }
                    }
                    (true, other) => {
                        t.bad(V::Other, &ctx, format!("fsync failed but the next write was not refused as poisoned: {other:?}"));
                        if let Ok(g) = other {
                            model_after.insert("probe".into(), ("probe-value".into(), g));
                        }
                    }
                    (false, Ok(g)) => {
                        model_after.insert("probe".into(), ("probe-value".into(), g));
                    }
                    (false, Err(e)) => t.bad(
                        V::Other,
                        &ctx,
                        format!("store stopped serving writes after a non-fsync failure: {e}"),
                    ),
                }
                drop(store);

                // Restart: everything consistent, writes work again.
                let store = env.open();
                let ex = Expect {
                    fixed: &model_after,
                    inflight: None,
                    quarantine: 0,
                    allow_old_key: op == WriteOp::Rotate,
                };
                check_reopened(&env, &store, &ex, &mut t, &ctx);
                match store.set(api_key("probe-after", "after-reopen"), None) {
                    Ok(g) => {
                        model_after.insert("probe-after".into(), ("after-reopen".into(), g));
                    }
                    Err(e) => t.bad(V::Other, &ctx, format!("write after reopen failed: {e}")),
                }
                if op == WriteOp::Rotate {
                    finish_rotation(&env, store, &model_after, &mut t, &ctx);
                }
            }
        }
    }
    println!(
        "io-error-at-every-step: {runs} runs (6 ops x every step x FailOnce/FailAlways x EIO/ENOSPC): {errors} storage errors, {acked} acked (index rewrite failed after the commit), {poisoned} poisoned after a failed fsync, {temp_until_reopen} runs left a temp file until reopen (FailAlways also failed its removal); {} [{:.1} s]",
        t.line(),
        started.elapsed().as_secs_f64()
    );
    t.assert_none("I/O error at every step");
}

// ---------------------------------------------------------------------------------------------
// 3. kill -9 loop
// ---------------------------------------------------------------------------------------------

const KILL_IDS: u64 = 100;
const CHILD_MAX_PUTS: u64 = 10_000;

fn emit(line: &str) {
    let mut out = std::io::stdout().lock();
    // One write per line (atomic on a pipe under PIPE_BUF bytes), then flush.
    let buf = format!("{line}\n");
    if out
        .write_all(buf.as_bytes())
        .and_then(|()| out.flush())
        .is_err()
    {
        std::process::exit(0);
    }
}

/// The writer re-executed by `kill_9_loop`. Ignored so that it never runs on its own; without
/// `HF_CHILD_DIR` it does nothing.
#[test]
#[ignore = "child process of kill_9_loop"]
fn child_writer() {
    let Some(dir) = std::env::var_os("HF_CHILD_DIR") else {
        return;
    };
    let num = |var: &str| -> u64 {
        std::env::var(var)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    };
    let cycle = num("HF_CHILD_CYCLE");
    let mut rng = Rng::new(num("HF_CHILD_SEED"));
    let env = Env::at(PathBuf::from(dir), None);
    // A blank line first: libtest may have printed a partial line before us.
    emit("");
    let store = match CredentialStore::open(env.config.clone(), StoreOptions::default()) {
        Ok(s) => s,
        Err(e) => {
            emit(&format!("ERR open: {e}"));
            std::process::exit(3);
        }
    };
    emit("READY");
    for counter in 0..CHILD_MAX_PUTS {
        let cid = format!("id-{:03}", rng.below(KILL_IDS));
        let len = if rng.below(4) == 0 {
            rng.range(1000, 3000)
        } else {
            rng.range(10, 300)
        };
        let val = padded(&format!("v-{cycle}-{counter}"), len as usize);
        emit(&format!("TRY {cid} {val}"));
        match store.set(api_key(&cid, &val), None) {
            Ok(_) => emit(&format!("ACK {cid} {val}")),
            Err(e) => {
                emit(&format!("ERR set {cid}: {e}"));
                std::process::exit(3);
            }
        }
    }
    emit("DONE");
}

#[derive(Default)]
struct Cycle {
    pending: Option<(String, String)>,
    acks: u64,
    ready: bool,
    done: bool,
    errs: Vec<String>,
}

#[derive(Default)]
struct KillModel {
    /// id → last acknowledged (or, after a kill, observed) value.
    last: BTreeMap<String, String>,
    /// id → every value ever acknowledged or observed.
    history: BTreeMap<String, HashSet<String>>,
    acked: u64,
    tries: u64,
}

fn feed(line: &str, cyc: &mut Cycle, m: &mut KillModel, t: &mut Tally, ctx: &str) {
    // A line cut short by the kill was never fully emitted: ignore it.
    let Some(line) = line.strip_suffix('\n') else {
        return;
    };
    if line == "READY" {
        cyc.ready = true;
    } else if line == "DONE" {
        cyc.done = true;
    } else if let Some(rest) = line.strip_prefix("TRY ") {
        let (cid, val) = rest.split_once(' ').unwrap_or((rest, ""));
        if let Some((p, _)) = &cyc.pending {
            t.bad(V::Other, ctx, format!("TRY {cid} while {p} still pending"));
        }
        m.tries += 1;
        cyc.pending = Some((cid.to_owned(), val.to_owned()));
    } else if let Some(rest) = line.strip_prefix("ACK ") {
        let (cid, val) = rest.split_once(' ').unwrap_or((rest, ""));
        match cyc.pending.take() {
            Some((p, v)) if p == cid && v == val => {
                m.acked += 1;
                cyc.acks += 1;
                m.last.insert(p.clone(), v.clone());
                m.history.entry(p).or_default().insert(v);
            }
            other => t.bad(
                V::Other,
                ctx,
                format!("ACK {cid} without its TRY ({other:?})"),
            ),
        }
    } else if let Some(rest) = line.strip_prefix("ERR ") {
        cyc.errs.push(rest.to_owned());
    }
}

#[test]
fn kill_9_loop() {
    let started = Instant::now();
    let cycles: u64 = std::env::var("HOLDFAST_KILL_CYCLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    let seed = seed("HOLDFAST_CRASH_SEED");
    println!("kill-9 loop: seed {seed} (HOLDFAST_CRASH_SEED={seed} reuses the same random choices; kill timing still varies)");
    let mut rng = Rng::new(seed);
    let env = Env::fresh();
    let home = tempfile::tempdir().unwrap();
    let stderr_path = home.path().join("child-stderr.log");
    let mut m = KillModel::default();
    let mut t = Tally::default();
    let (mut landed, mut killed_before_ready, mut temp_seen_before_reopen) = (0u64, 0u64, 0u64);

    for cycle in 0..cycles {
        let ctx = format!("cycle {cycle}");
        let mut cmd = reexec("child_writer", home.path());
        cmd.env("HF_CHILD_DIR", &env.root)
            .env("HF_CHILD_CYCLE", cycle.to_string())
            .env("HF_CHILD_SEED", rng.next().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(fs::File::create(&stderr_path).unwrap());
        let spawned = Instant::now();
        let mut child = cmd.spawn().expect("re-exec the test binary");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            loop {
                let mut line = String::new();
                match r.read_line(&mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if tx.send(line).is_err() {
                            break;
                        }
                    }
                }
            }
        });

        // Kill after a random delay from spawn, from READY, or after a random number of acks.
        let how = rng.below(3);
        let delay = Duration::from_millis(rng.range(5, 60));
        let ack_target = rng.range(1, 40);
        let mut cyc = Cycle::default();
        let mut deadline = (how == 0).then(|| spawned + delay);
        let give_up = spawned + Duration::from_secs(60);
        loop {
            if deadline.is_some_and(|d| Instant::now() >= d) || (how == 2 && cyc.acks >= ack_target)
            {
                break;
            }
            if Instant::now() > give_up {
                t.bad(V::Other, &ctx, "child made no progress for 60 s");
                break;
            }
            let wait = deadline
                .map(|d| d.saturating_duration_since(Instant::now()))
                .unwrap_or(Duration::from_millis(50))
                .min(Duration::from_millis(50));
            match rx.recv_timeout(wait) {
                Ok(line) => {
                    feed(&line, &mut cyc, &mut m, &mut t, &ctx);
                    if how == 1 && cyc.ready && deadline.is_none() {
                        deadline = Some(Instant::now() + delay);
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        let _ = child.kill(); // SIGKILL
        let status = child.wait().unwrap();
        reader.join().unwrap();
        for line in rx.try_iter() {
            feed(&line, &mut cyc, &mut m, &mut t, &ctx);
        }
        use std::os::unix::process::ExitStatusExt;
        if status.signal() != Some(9) && !cyc.done {
            let stderr = fs::read_to_string(&stderr_path).unwrap_or_default();
            t.bad(
                V::Other,
                &ctx,
                format!(
                    "child exited on its own ({status}): {:?}\n{stderr}",
                    cyc.errs
                ),
            );
        }
        if !cyc.ready {
            killed_before_ready += 1;
        }
        if !env.all_temps().is_empty() {
            temp_seen_before_reopen += 1;
        }

        // Restart in-process and check every id.
        let store = env.open();
        if !store.open_report().quarantined.is_empty() {
            t.bad(
                V::Quarantine,
                &ctx,
                format!("open quarantined {:?}", store.open_report().quarantined),
            );
        }
        for i in 0..KILL_IDS {
            let cid = format!("id-{i:03}");
            let acked = m.last.get(&cid).cloned();
            let pending = cyc
                .pending
                .as_ref()
                .filter(|(p, _)| *p == cid)
                .map(|(_, v)| v.clone());
            match read(&store, &cid) {
                Seen::Absent if acked.is_none() => {}
                Seen::Absent => t.bad(V::Lost, &ctx, format!("{cid}: acked value missing")),
                Seen::Broken(e) => t.bad(V::Torn, &ctx, format!("{cid}: {e}")),
                Seen::Value(v, _) => {
                    if Some(&v) == acked.as_ref() {
                    } else if Some(&v) == pending.as_ref() {
                        landed += 1;
                        m.last.insert(cid.clone(), v.clone());
                        m.history.entry(cid).or_default().insert(v);
                    } else if m.history.get(&cid).is_some_and(|h| h.contains(&v)) {
                        t.bad(
                            V::Lost,
                            &ctx,
                            format!("{cid}: an older acked value came back"),
                        );
                    } else {
                        t.bad(
                            V::Torn,
                            &ctx,
                            format!("{cid}: a value never written ({} bytes)", v.len()),
                        );
                    }
                }
            }
        }
        for d in [env.cred_dir(), env.meta_dir()] {
            let temps = temps_in(&d);
            if !temps.is_empty() {
                t.bad(V::TempLeft, &ctx, format!("after reopen: {temps:?}"));
            }
        }
        let q = names_in(&env.quarantine_dir());
        if !q.is_empty() {
            t.bad(V::Quarantine, &ctx, format!("quarantine holds {q:?}"));
        }
        let files = enc_files(&env.cred_dir());
        let ids: BTreeSet<String> = files
            .iter()
            .filter_map(|f| f.strip_suffix(".enc").map(str::to_owned))
            .collect();
        for p in index_problems(&env, &files, &ids) {
            t.bad(V::Index, &ctx, p);
        }
        if cycle % 25 == 24 || cycle + 1 == cycles {
            match store.fsck(false) {
                Ok(r) if r.is_clean() => {}
                Ok(r) => t.bad(V::Fsck, &ctx, format!("fsck:\n{r}")),
                Err(e) => t.bad(V::Fsck, &ctx, format!("fsck failed: {e}")),
            }
        }
        drop(store);
        if t.total() > 20 {
            break;
        }
    }
    println!(
        "kill-9 loop: ran {cycles} kill cycles, {} acked puts, {} torn, {} lost acked, {} temp left ({} puts tried, {landed} unacked puts found landed, {killed_before_ready} kills before the store was open, {temp_seen_before_reopen} kills left a temp file for the sweep; all checks: {}) [{:.1} s]",
        m.acked,
        t.n(V::Torn),
        t.n(V::Lost),
        t.n(V::TempLeft),
        m.tries,
        t.line(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        m.acked > 0,
        "no put was ever acknowledged: the loop tested nothing"
    );
    t.assert_none("kill -9 loop");
}

// ---------------------------------------------------------------------------------------------
// 4. A fault during recovery
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Damage {
    /// Temp files in credentials/ and metadata/, and no index.json.
    MissingIndex,
    /// Temp files, an index missing one file (orphan) and listing a ghost, and a damaged file.
    StaleIndex,
}

const JUNK: &[u8] = b"gAAAAABthis-is-not-a-fernet-token-at-all";

/// A damaged store, its acknowledged credentials, and how many files must end up quarantined.
fn damaged_template(damage: Damage) -> (Env, Model, usize) {
    let env = Env::fresh();
    let mut model = Model::new();
    {
        let store = env.open();
        for i in 0..6 {
            let cid = format!("cred-{i:02}");
            let val = padded(&format!("rec-{i}"), 30 + i * 111);
            let gen = store.set(api_key(&cid, &val), None).unwrap();
            model.insert(cid, (val, gen));
        }
    }
    let key = fs::read_to_string(env.key_file()).unwrap();
    let ring = Keyring::new(&Secret::new(key.trim().to_owned()), &[]).unwrap();
    let token = ring.encrypt(&api_key("cred-02", "never-acked").to_bytes());
    // A complete temp (crash after fsync) and a torn one (crash mid-write).
    write_private(
        &env.cred_dir().join(".cred-02.enc.hf-tmp-00112233aabbccdd"),
        token.as_bytes(),
    );
    write_private(
        &env.cred_dir().join(".cred-04.enc.hf-tmp-0123456789abcdef"),
        &token.as_bytes()[..token.len() / 2],
    );
    write_private(
        &env.meta_dir().join(".index.json.hf-tmp-fedcba9876543210"),
        b"{\"credentials\": {\"cred-0",
    );
    let index = env.meta_dir().join("index.json");
    let quarantine = match damage {
        Damage::MissingIndex => {
            fs::remove_file(&index).unwrap();
            0
        }
        Damage::StaleIndex => {
            let mut v: Value = serde_json::from_slice(&fs::read(&index).unwrap()).unwrap();
            let creds = v["credentials"].as_object_mut().unwrap();
            let ghost = creds["cred-00"].clone();
            creds.shift_remove("cred-05");
            creds.insert("ghost-1".into(), ghost);
            v["holdfast"]["files"]
                .as_object_mut()
                .unwrap()
                .shift_remove("cred-05.enc");
            fs::write(&index, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
            write_private(&env.cred_dir().join("junk.enc"), JUNK);
            1
        }
    };
    (env, model, quarantine)
}

fn recovery_steps(env: &Env) -> Vec<Op> {
    let faults = Faults::recorder();
    let store = env.open_with(&faults).unwrap();
    let log = faults.log();
    drop(store);
    log
}

fn check_recovered(env: &Env, model: &Model, quarantine: usize, t: &mut Tally, ctx: &str) {
    let store = env.open();
    let ex = Expect {
        fixed: model,
        inflight: None,
        quarantine,
        allow_old_key: false,
    };
    check_reopened(env, &store, &ex, t, ctx);
    // The damaged file is kept, byte for byte, in quarantine.
    if quarantine > 0 {
        let kept = names_in(&env.quarantine_dir())
            .iter()
            .any(|n| fs::read(env.quarantine_dir().join(n)).ok().as_deref() == Some(JUNK));
        if !kept {
            t.bad(
                V::Quarantine,
                ctx,
                "the damaged file is not in quarantine intact",
            );
        }
    }
    if store.exists("ghost-1").unwrap_or(true) {
        t.bad(V::Index, ctx, "ghost entry still answers");
    }
}

#[test]
fn fault_during_recovery() {
    let started = Instant::now();
    let mut t = Tally::default();
    let mut lines = Vec::new();
    for damage in [Damage::MissingIndex, Damage::StaleIndex] {
        let (template, model, quarantine) = damaged_template(damage);
        let steps = recovery_steps(&template.copy());
        assert!(steps.len() >= 4, "{damage:?}: recovery took only {steps:?}");
        let (mut single, mut compound) = (0, 0);
        for k in 1..=steps.len() {
            for mode in [
                FaultMode::Crash,
                FaultMode::FailOnce(EIO),
                FaultMode::FailAlways(ENOSPC),
            ] {
                let ctx = format!(
                    "{damage:?}: {mode:?} at recovery step {k}/{} ({:?})",
                    steps.len(),
                    steps[k - 1]
                );
                let env = template.copy();
                let faults = Faults::at_step(k as u64, mode);
                let r = env.open_with(&faults);
                if mode == FaultMode::Crash && !faults.crashed() {
                    t.bad(V::Other, &ctx, "crash not injected");
                }
                if let Err(e) = &r {
                    if e.kind() != ErrorKind::Storage {
                        t.bad(V::Other, &ctx, format!("error kind {}: {e}", e.kind()));
                    }
                }
                drop(r);
                if mode == FaultMode::Crash {
                    // A crash while recovering from that crash, at every step of the second
                    // recovery.
                    let steps2 = recovery_steps(&env.copy());
                    for k2 in 1..=steps2.len() {
                        let ctx2 = format!(
                            "{ctx}, then crash at step {k2}/{} ({:?})",
                            steps2.len(),
                            steps2[k2 - 1]
                        );
                        let env2 = env.copy();
                        let f2 = Faults::at_step(k2 as u64, FaultMode::Crash);
                        drop(env2.open_with(&f2));
                        check_recovered(&env2, &model, quarantine, &mut t, &ctx2);
                        compound += 1;
                    }
                }
                check_recovered(&env, &model, quarantine, &mut t, &ctx);
                single += 1;
            }
        }
        lines.push(format!(
            "{damage:?}: {} recovery steps x (crash, EIO once, ENOSPC always) = {single} faulted recoveries + {compound} crashes during the recovery from a crash",
            steps.len()
        ));
    }
    println!(
        "fault-during-recovery: {}; {} [{:.1} s]",
        lines.join("; "),
        t.line(),
        started.elapsed().as_secs_f64()
    );
    t.assert_none("fault during recovery");
}

// ---------------------------------------------------------------------------------------------
// 5. Startup with leftover temp files
// ---------------------------------------------------------------------------------------------

#[test]
fn startup_sweeps_leftover_temp_files() {
    let (env, model) = template();
    let key = fs::read_to_string(env.key_file()).unwrap();
    let ring = Keyring::new(&Secret::new(key.trim().to_owned()), &[]).unwrap();
    let complete = ring.encrypt(&api_key("cred-01", "planted-never-acked").to_bytes());
    let planted = [
        (
            env.cred_dir(),
            ".x.enc.hf-tmp-0123456789abcdef",
            b"gAAAAAB-partial".to_vec(),
        ),
        (env.meta_dir(), ".x.enc.hf-tmp-0123456789abcdef", Vec::new()),
        (
            env.meta_dir(),
            ".index.json.hf-tmp-fedcba9876543210",
            b"{\"version\": \"2.".to_vec(),
        ),
        (
            env.cred_dir(),
            ".cred-01.enc.hf-tmp-00000000deadbeef",
            complete.into_bytes(),
        ),
    ];
    for (dir, name, bytes) in &planted {
        write_private(&dir.join(name), bytes);
    }
    let store = env.open();
    let mut reported = store.open_report().temp_files.clone();
    reported.sort();
    let mut want: Vec<String> = planted.iter().map(|(_, n, _)| (*n).to_owned()).collect();
    want.sort();
    assert_eq!(reported, want, "open_report().temp_files");
    let mut t = Tally::default();
    let ex = Expect {
        fixed: &model,
        inflight: None,
        quarantine: 0,
        allow_old_key: false,
    };
    // Also checks that the complete planted temp was not adopted as cred-01's value.
    check_reopened(&env, &store, &ex, &mut t, "leftover temp files");
    drop(store);
    let again = env.open();
    assert!(
        again.open_report().temp_files.is_empty(),
        "second open still found {:?}",
        again.open_report().temp_files
    );
    println!(
        "leftover-temp-files: {} planted, {} swept and reported, {} credentials readable; {}",
        planted.len(),
        reported.len(),
        model.len(),
        t.line()
    );
    t.assert_none("startup with leftover temp files");
}
