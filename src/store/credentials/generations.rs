//! Generations that only go forward, whoever writes the file.
//!
//! The document's own `holdfast_generation` cannot be trusted alone: hive keeps unknown fields,
//! so a hive process that loaded generation 5 writes a 5 back after holdfast wrote 6, and a
//! compare-and-swap by a client that read 5 long ago would then be accepted over hive's edit.
//! So holdfast records, for each credential file, the generation it gave the file's current
//! content, in the name of an empty **marker** file beside it:
//!
//! ```text
//! credentials/.hf-gen-<generation>-<16 hex of SHA-256(token)>-<file name without .enc>
//! ```
//!
//! A holdfast write renames the file's marker to the new generation and the new token's hash
//! right after the `.enc` file takes its place and before the directory fsync that makes the
//! write durable: the marker is durable with the write, at the cost of one `rename` and no fsync
//! of its own. Another writer (hive, a person) cannot keep a marker's hash: its tokens have fresh
//! IVs. So the generation of a file is:
//!
//! - **recorded**: a marker names this file and its token's hash: that marker's generation;
//! - **not recorded** (written by something else since): `max(document's, marker's + 1)`
//!   (`max(document's, 1)` when the file has no marker), and the first holdfast process that
//!   may write records it under the store lock before it answers with it — so two different
//!   contents never get one generation, and no generation ever reported is reused.
//!
//! A write's new generation is the current one plus one; a delete leaves the marker (it
//! records the generation the credential reached), so a credential made again continues above
//! it. Markers are only made or renamed under the store lock; a process sees another's changes
//! by the directory changing since its own last write (`fresh`), and reads the markers again.

use std::collections::HashMap;

use super::*;
use std::borrow::Cow;

use crate::durable::markers::{self, GEN_MARKER};

/// What the store knows of one file's generation: its (highest) marker.
#[derive(Clone, Debug)]
pub(super) struct Marker {
    pub gen: u64,
    /// 16 hex digits of the SHA-256 of the token it was given to.
    pub hash: String,
    /// The bytes last seen to have `hash` (compared by pointer first: the file cache hands
    /// back the same bytes until the file changes, so a cached read hashes nothing).
    pub seen: Option<Arc<[u8]>>,
}

/// A file's generation as resolved from its document and its marker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Resolved {
    pub gen: u64,
    /// A marker records this very content (false: written by something else since).
    pub recorded: bool,
}

/// Every marker of the store, by file name, and the directory's stamp when they were read or
/// last changed by this process.
#[derive(Default)]
pub(super) struct Markers {
    by_file: HashMap<String, Marker>,
    dir_seen: Option<(i64, i64)>,
    /// Files read in a state no marker records, to record at the next chance.
    pending: std::collections::BTreeSet<String>,
}

/// What a marker's name adds to the file's stem: the prefix, a generation (a u64: at most 20
/// digits), the hash and two dashes.
const MARKER_OVERHEAD: usize = GEN_MARKER.len() + 20 + 1 + 16 + 1;

/// The stem a marker of `file` carries: the file's own, shortened by [`durable::fit_name`]
/// where the marker's name would pass NAME_MAX (hive's ids reach 251 bytes).
fn marker_stem(file: &str) -> Cow<'_, str> {
    crate::durable::fit_name(file.strip_suffix(".enc").unwrap_or(file), MARKER_OVERHEAD)
}

/// The key markers are kept under for `file`: the file name a marker's name reads back as
/// ([`parse_marker`]), which is `file` itself unless its stem had to be shortened.
fn marker_key(file: &str) -> Cow<'_, str> {
    match marker_stem(file) {
        Cow::Borrowed(_) => Cow::Borrowed(file),
        Cow::Owned(stem) => Cow::Owned(format!("{stem}.enc")),
    }
}

/// The marker name for `file` at `gen` with token hash `hash`. It does not end with `.enc`:
/// nothing that lists credential files (holdfast's scan, hive's `*.enc` glob) sees it.
pub(super) fn marker_name(file: &str, gen: u64, hash: &str) -> String {
    format!("{GEN_MARKER}{gen}-{hash}-{}", marker_stem(file))
}

/// `(file, generation, hash)` of a marker name, if it is one.
pub(super) fn parse_marker(name: &str) -> Option<(String, u64, &str)> {
    let rest = name.strip_prefix(GEN_MARKER)?;
    let (gen, rest) = rest.split_once('-')?;
    let (hash, stem) = rest.split_once('-')?;
    let ok = hash.len() == 16
        && hash.bytes().all(|b| b.is_ascii_hexdigit())
        && !stem.is_empty()
        && !gen.is_empty()
        && gen.bytes().all(|b| b.is_ascii_digit());
    ok.then_some((format!("{stem}.enc"), gen.parse().ok()?, hash))
}

/// 16 hex digits of the SHA-256 of a credential file's bytes.
pub(super) fn token_hash(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The generation a file in a state no marker records gets: above its marker (what holdfast
/// gave its previous content), never below its document.
pub(super) fn unrecorded_gen(doc_gen: u64, marker: Option<u64>) -> u64 {
    doc_gen.max(marker.map_or(1, |g| g.saturating_add(1)))
}

/// The credentials directory's mtime and ctime, in ns (ctime cannot be set back).
fn dir_stamp(dir: &Path) -> Option<(i64, i64)> {
    let m = fs::symlink_metadata(dir).ok()?;
    Some((FileStamp::of(&m).mtime_ns, crate::durable::ctime_ns(&m)))
}

impl CredentialStore {
    fn markers(&self) -> MutexGuard<'_, Markers> {
        lock_guard(&self.markers)
    }

    /// Read every marker in `credentials/` (at open, and when another process may have
    /// changed them): the highest generation per file wins.
    pub(super) fn load_markers(&self) -> Result<()> {
        let seen = dir_stamp(&self.cred_dir);
        let names = markers::gen_markers(&self.cred_dir).map_err(|source| Error::Read {
            path: self.cred_dir.clone(),
            source,
        })?;
        let mut by_file: HashMap<String, Marker> = HashMap::new();
        for n in &names {
            if let Some((file, gen, hash)) = parse_marker(n) {
                if by_file.get(&file).is_none_or(|m| m.gen < gen) {
                    let marker = Marker {
                        gen,
                        hash: hash.to_owned(),
                        seen: None,
                    };
                    by_file.insert(file, marker);
                }
            }
        }
        let mut m = self.markers();
        m.by_file = by_file;
        m.dir_seen = seen;
        Ok(())
    }

    /// Under the store lock, before deciding anything from the markers: if the directory
    /// changed since this process last looked (another process held the lock and wrote, or
    /// hive made or removed a file), read the markers again.
    pub(super) fn fresh_markers(&self) -> Result<()> {
        let now = dir_stamp(&self.cred_dir);
        if now.is_some() && now == self.markers().dir_seen {
            return Ok(());
        }
        self.load_markers()
    }

    /// This process changed the directory (under the store lock): remember how it looks now.
    pub(super) fn note_markers_seen(&self) {
        let now = dir_stamp(&self.cred_dir);
        self.markers().dir_seen = now;
    }

    /// The generation of the marker of file `name`, if it has one (at most
    /// [`MAX_GENERATION`](crate::limits::MAX_GENERATION): a marker another program named
    /// higher is answered as the largest).
    pub(super) fn marker_gen(&self, name: &str) -> Option<u64> {
        self.markers()
            .by_file
            .get(&*marker_key(name))
            .map(|m| m.gen.min(crate::limits::MAX_GENERATION))
    }

    /// The name of file `name`'s marker, if it has one.
    pub(super) fn marker_of(&self, name: &str) -> Option<String> {
        self.markers()
            .by_file
            .get(&*marker_key(name))
            .map(|m| marker_name(name, m.gen, &m.hash))
    }

    /// Remember that file `name` now holds a token with `hash`, given generation `gen`.
    pub(super) fn note_marker(&self, name: &str, gen: u64, hash: String) {
        let marker = Marker {
            gen,
            hash,
            seen: None,
        };
        let mut m = self.markers();
        m.pending.remove(name);
        m.by_file.insert(marker_key(name).into_owned(), marker);
    }

    /// The generation of file `name` whose bytes are `bytes` and whose document says
    /// `doc_gen`. Lock-free: a state no marker records is noted for [`Self::record_pending`].
    pub(super) fn resolve_generation(
        &self,
        name: &str,
        bytes: &Arc<[u8]>,
        doc_gen: u64,
    ) -> Resolved {
        // Generations are answered as JSON numbers every client reads exactly: one another
        // program wrote (or named a marker) above the largest is answered as the largest,
        // and a write over it is refused (`write.rs`).
        let r = self.resolve_generation_unclamped(name, bytes, doc_gen);
        Resolved {
            gen: r.gen.min(crate::limits::MAX_GENERATION),
            ..r
        }
    }

    fn resolve_generation_unclamped(
        &self,
        name: &str,
        bytes: &Arc<[u8]>,
        doc_gen: u64,
    ) -> Resolved {
        {
            let m = self.markers();
            if let Some(mk) = m.by_file.get(&*marker_key(name)) {
                if mk.seen.as_ref().is_some_and(|s| Arc::ptr_eq(s, bytes)) {
                    return Resolved {
                        gen: mk.gen,
                        recorded: true,
                    };
                }
            }
        }
        let hash = token_hash(bytes);
        let mut m = self.markers();
        if let Some(mk) = m.by_file.get_mut(&*marker_key(name)) {
            if mk.hash == hash {
                mk.seen = Some(Arc::clone(bytes));
                return Resolved {
                    gen: mk.gen,
                    recorded: true,
                };
            }
        }
        // Another holdfast process wrote it: a write names its marker after the document's
        // generation. Not below a higher marker of the same file, though: a marker of older
        // content brought back beside the newer one (a backup copied over the directory, or
        // planted) must not take the generation back — that content is then an unrecorded
        // state, recorded above every marker (an independent tester's `cp -a backup/. dir/`
        // answered generation 1 after 3 and accepted a stale compare-and-swap). Told apart
        // from a write that made its marker and died before its rename (the higher marker then
        // names content that never reached the file) by inode change times, which nothing can
        // set back: that marker changed after the file did; a restored file changed after
        // every marker of what it replaced.
        let higher = m.by_file.get(&*marker_key(name)).is_some_and(|mk| {
            mk.gen > doc_gen && {
                let changed = |p: &std::path::Path| {
                    fs::symlink_metadata(p)
                        .ok()
                        .map(|meta| crate::durable::ctime_ns(&meta))
                };
                let marker = changed(&self.cred_dir.join(marker_name(name, mk.gen, &mk.hash)));
                let file = changed(&self.cred_dir.join(name));
                // No higher marker left, or one not older than the file: it never landed.
                // (Strictly older: file times tick coarsely, and a write that died right
                // after another one must keep its acknowledged generation.)
                matches!((marker, file), (Some(mk_t), Some(f_t)) if mk_t < f_t)
            }
        });
        if !higher && markers::marker_exists(&self.cred_dir, &marker_name(name, doc_gen, &hash)) {
            let marker = Marker {
                gen: doc_gen,
                hash,
                seen: Some(Arc::clone(bytes)),
            };
            m.by_file.insert(marker_key(name).into_owned(), marker);
            return Resolved {
                gen: doc_gen,
                recorded: true,
            };
        }
        m.pending.insert(name.to_owned());
        Resolved {
            gen: unrecorded_gen(doc_gen, m.by_file.get(&*marker_key(name)).map(|mk| mk.gen)),
            recorded: false,
        }
    }

    /// Take the files reads noted in states no marker records.
    pub(super) fn markers_pending(&self) -> Vec<String> {
        std::mem::take(&mut self.markers().pending)
            .into_iter()
            .collect()
    }

    /// Whether a read noted a file in a state no marker records.
    pub(super) fn has_pending_records(&self) -> bool {
        !self.markers().pending.is_empty()
    }

    /// Record the generation of every file a read found in a state no marker records, under
    /// the store lock (one directory fsync for them all): after this, the generation a reader
    /// was told is bound to that content. A store that may not be written (read-only, sealed,
    /// poisoned) records nothing; its readers were told the same number a writer would record.
    /// The caller must not hold `inner`.
    pub(super) fn record_pending(&self) -> Result<usize> {
        if !self.has_pending_records() || self.check_writable().is_err() {
            return Ok(0);
        }
        let _guard = self.lock_store(LockMode::Exclusive)?;
        let names: Vec<String> = std::mem::take(&mut self.markers().pending)
            .into_iter()
            .collect();
        let recorded = self.with_ring(|ring| self.record_generations(ring, &names))?;
        // The entries listed from those files carry the generation just recorded.
        let mut inner = lock_guard(&self.inner);
        for name in &names {
            if let (Some(gen), Some(e)) = (self.marker_gen(name), inner.entries.get_mut(name)) {
                e.generation = gen;
            }
        }
        Ok(recorded)
    }

    /// Record the generations of the files reads found in states no marker records (the
    /// daemon's flusher calls it every tick; nothing to do is one mutex check).
    pub fn record_generations_pending(&self) -> Result<usize> {
        self.record_pending()
    }

    /// A generation marker in the directory changed (the daemon's watcher): learn it, if it
    /// is newer than what this process knows. O(1): the name says everything.
    pub(super) fn learn_marker(&self, name: &str) {
        let Some((file, gen, hash)) = parse_marker(name) else {
            return;
        };
        if !markers::marker_exists(&self.cred_dir, name) {
            return;
        }
        let mut m = self.markers();
        if m.by_file.get(&file).is_none_or(|mk| mk.gen < gen) {
            let marker = Marker {
                gen,
                hash: hash.to_owned(),
                seen: None,
            };
            m.by_file.insert(file, marker);
        }
    }

    /// [`Self::record_pending`] for `names`, the store lock held.
    pub(super) fn record_generations(&self, ring: &Keyring, names: &[String]) -> Result<usize> {
        self.fresh_markers()?;
        let mut recorded = 0;
        for name in names {
            let path = self.cred_dir.join(name);
            let Ok(Some(bytes)) = durable::read_capped(&path, MAX_CREDENTIAL_FILE_BYTES) else {
                continue;
            };
            let bytes: Arc<[u8]> = Arc::from(bytes);
            let FileRead::Ok(c, _, _) = read::decode(&bytes, ring) else {
                continue;
            };
            let doc_gen = c.generation();
            if self.resolve_generation(name, &bytes, doc_gen).recorded {
                continue;
            }
            let gen = unrecorded_gen(doc_gen, self.marker_gen(name));
            let hash = token_hash(&bytes);
            markers::set_marker(
                &self.cred_dir,
                self.marker_of(name).as_deref(),
                &marker_name(name, gen, &hash),
                self.faults(),
            )
            .map_err(|e| self.io_failed(e))?;
            self.note_marker(name, gen, hash);
            recorded += 1;
        }
        if recorded > 0 {
            durable::fsync_dir(&self.cred_dir, self.faults()).map_err(|e| self.io_failed(e))?;
            self.note_markers_seen();
        }
        Ok(recorded)
    }

    /// How many markers the store knows (status, tests).
    pub fn generation_markers(&self) -> usize {
        self.markers().by_file.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marker_names_of_the_longest_file_names_fit_and_stay_apart() {
        // hive's longest ids make 255-byte file names; their markers shorten the stem.
        let long = format!("{}.enc", "a".repeat(251));
        let twin = format!("{}b.enc", "a".repeat(250));
        let wide = format!("{}.enc", "é".repeat(125));
        let mut keys = std::collections::BTreeSet::new();
        for file in [&long, &twin, &wide] {
            let n = marker_name(file, u64::MAX, "0123456789abcdef");
            assert!(n.len() <= 255, "{} bytes", n.len());
            let (key, gen, hash) = parse_marker(&n).expect("parses");
            assert_eq!((gen, hash), (u64::MAX, "0123456789abcdef"));
            assert_eq!(key, marker_key(file), "{file}");
            keys.insert(key);
        }
        assert_eq!(keys.len(), 3, "distinct per file");
        // A name that fits keeps its own stem, as before.
        assert_eq!(marker_key("openai.enc"), "openai.enc");
        assert_eq!(
            marker_name("openai.enc", 3, "0123456789abcdef"),
            ".hf-gen-3-0123456789abcdef-openai"
        );
    }

    #[test]
    fn marker_names_round_trip_whatever_the_file_name_holds() {
        for file in [
            "a.enc",
            "a-b-c.enc",
            "x.hf-tmp-1.enc",
            "team_slack.enc",
            "-.enc",
        ] {
            let n = marker_name(file, 42, "0123456789abcdef");
            assert!(n.starts_with(GEN_MARKER));
            assert!(!crate::durable::is_temp_name(&n), "{n}");
            assert!(!crate::durable::is_spare_name(&n), "{n}");
            assert!(!n.ends_with(".enc"), "{n}");
            assert_eq!(
                parse_marker(&n),
                Some((file.to_owned(), 42, "0123456789abcdef")),
                "{n}"
            );
        }
        for bad in [
            ".hf-gen-x-0123456789abcdef-a.enc",
            ".hf-gen-1-0123456789abcde-a.enc",
            ".hf-gen-1-0123456789abcdeg-a.enc",
            ".hf-gen-1-0123456789abcdef-",
            ".hf-gen--0123456789abcdef-a.enc",
            "a.enc",
        ] {
            assert_eq!(parse_marker(bad), None, "{bad}");
        }
    }

    #[test]
    fn an_unrecorded_state_is_above_its_marker_and_never_below_its_document() {
        assert_eq!(unrecorded_gen(1, None), 1);
        assert_eq!(unrecorded_gen(5, None), 5);
        assert_eq!(unrecorded_gen(5, Some(6)), 7);
        assert_eq!(unrecorded_gen(9, Some(6)), 9);
        assert_eq!(unrecorded_gen(0, Some(0)), 1);
    }
}
