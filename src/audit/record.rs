//! One audit record: what the caller says ([`Record`], [`Who`]), the line the writer makes of
//! it (JSON with its sequence number, time, the previous record's hash and its own), and the
//! check of one line ([`check_line`]).
//!
//! A line is one JSON object whose members come in a fixed order and whose **last** member is
//! `"hash"`: `{"v":1,"seq":…,"ts":…,"op":…,…,"prev":"<64 hex>","hash":"<64 hex>"}`. `hash` is
//! the SHA-256 of the line's bytes up to (not including) `,"hash":` — everything before it,
//! `prev` included — so the hash covers the exact bytes written, with no canonical form to
//! agree on, and a record that names its predecessor's hash chains to it.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The format's version (`"v"`), bumped if a line's meaning changes.
pub const VERSION: u32 = 1;

/// The `prev` of the first record of a chain.
pub const GENESIS: [u8; 32] = [0; 32];

/// Client-chosen names (`hello`'s `client` and `plugin`) are cut to this many characters.
pub const MAX_NAME_CHARS: usize = 64;

/// A store's name (a path, for `--store-dir`) is cut to this many characters.
pub const MAX_STORE_CHARS: usize = 1024;

/// `,"hash":"` + 64 hex digits + `"}`: how every line ends.
const HASH_SUFFIX_LEN: usize = 9 + 64 + 2;

/// Who asked: through the daemon (a connection) or the CLI on the store directly.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Who {
    /// `daemon` or `cli`.
    pub via: Via,
    /// The name the client gave in `hello` (the CLI: `holdfast-cli`).
    pub client: Option<std::sync::Arc<str>>,
    /// The plugin grant the connection is bound to.
    pub plugin: Option<std::sync::Arc<str>>,
    /// The peer's pid (`SO_PEERCRED` at accept; the CLI's own).
    pub pid: Option<u32>,
    /// The peer's uid (`SO_PEERCRED`; the CLI's own effective uid).
    pub uid: Option<u32>,
    /// The daemon's connection number.
    pub conn: Option<u64>,
}

/// Where an operation came in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Via {
    /// Through the daemon's socket.
    #[default]
    Daemon,
    /// The admin CLI, on the store directly (`--offline`, `--store-dir`, `--hive`, no daemon).
    Cli,
    /// The audit log's own bookkeeping (`audit.*` records).
    Audit,
}

impl Via {
    fn as_str(self) -> &'static str {
        match self {
            Via::Daemon => "daemon",
            Via::Cli => "cli",
            Via::Audit => "audit",
        }
    }
}

/// The result of an operation that took no action yet: a change's first record, written
/// (durably) before the change is made.
pub const BEGUN: &str = "begun";
/// The result of an operation that succeeded.
pub const OK: &str = "ok";

/// What to record: an operation, on what, by whom, with what result. Never a value or key
/// material: nothing here can hold one (ids, store names, error kinds, client-chosen names).
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    /// The operation: the wire method (`cred.get`, `admin.rotate_key`), `import`, `connect`,
    /// `hello`, or the log's own `audit.*`.
    pub op: &'static str,
    /// The store's name (a path for a store opened by directory).
    pub store: Option<String>,
    /// The credential id (only a valid one: an id the request got wrong is not recorded).
    pub id: Option<String>,
    /// [`OK`], [`BEGUN`], or the error kind (`forbidden`, `not_found`, …).
    pub result: &'static str,
    /// Who asked.
    pub who: Who,
    /// For the outcome of a change: the sequence number of its [`BEGUN`] record.
    pub refers: Option<u64>,
    /// What else the operation needs said (counts, the log's own bookkeeping); never a value.
    pub detail: Option<Value>,
}

impl Record {
    /// A record of `op` by `who`, with `result`, on nothing in particular yet.
    pub fn new(op: &'static str, result: &'static str, who: Who) -> Record {
        Record {
            op,
            store: None,
            id: None,
            result,
            who,
            refers: None,
            detail: None,
        }
    }

    /// On store `store`.
    pub fn store(mut self, store: &str) -> Record {
        self.store = Some(cut_chars(store, MAX_STORE_CHARS));
        self
    }

    /// On credential `id` (recorded only if it is a valid id).
    pub fn id(mut self, id: &str) -> Record {
        self.id = crate::store::id::validate(id)
            .is_ok()
            .then(|| id.to_owned());
        self
    }

    /// With `detail`.
    pub fn detail(mut self, detail: Value) -> Record {
        self.detail = Some(detail);
        self
    }
}

/// `s`, cut to at most `n` characters.
pub fn cut_chars(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((at, _)) => s[..at].to_owned(),
        None => s.to_owned(),
    }
}

/// The members of a line before `hash`, in their order.
#[derive(Serialize)]
struct Body<'a> {
    v: u32,
    seq: u64,
    ts: &'a str,
    op: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    store: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    result: &'a str,
    via: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    client: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    plugin: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    uid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    conn: Option<u64>,
    #[serde(rename = "ref", skip_serializing_if = "Option::is_none")]
    refers: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<&'a Value>,
    prev: &'a str,
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

/// The 32 bytes of 64 lowercase hex digits.
pub fn unhex(s: &str) -> Option<[u8; 32]> {
    let b = s.as_bytes();
    if b.len() != 64 {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; 32];
    for (i, pair) in b.chunks_exact(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

/// Append the line of `rec` — number `seq`, made at `ts_micros`, chained to `prev` — with its
/// newline to `out`; its hash.
pub fn encode(
    rec: &Record,
    seq: u64,
    ts_micros: i64,
    prev: &[u8; 32],
    out: &mut Vec<u8>,
) -> [u8; 32] {
    let ts = crate::timefmt::format_z(ts_micros);
    let prev_hex = hex(prev);
    let body = Body {
        v: VERSION,
        seq,
        ts: &ts,
        op: rec.op,
        store: rec.store.as_deref(),
        id: rec.id.as_deref(),
        result: rec.result,
        via: rec.who.via.as_str(),
        client: rec.who.client.as_deref(),
        plugin: rec.who.plugin.as_deref(),
        pid: rec.who.pid,
        uid: rec.who.uid,
        conn: rec.who.conn,
        refers: rec.refers,
        detail: rec.detail.as_ref(),
        prev: &prev_hex,
    };
    let start = out.len();
    // Serializing plain strings, numbers and a `Value` into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, &body);
    // The object's closing brace comes back after the hash.
    if out.last() == Some(&b'}') {
        out.pop();
    }
    let hash: [u8; 32] = Sha256::digest(&out[start..]).into();
    out.extend_from_slice(b",\"hash\":\"");
    out.extend_from_slice(hex(&hash).as_bytes());
    out.extend_from_slice(b"\"}\n");
    hash
}

/// A record as read back: every member of its line.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[allow(missing_docs)] // the members are the line's, documented in docs/design.md
pub struct Entry {
    pub v: u32,
    pub seq: u64,
    pub ts: String,
    pub op: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub result: String,
    pub via: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conn: Option<u64>,
    #[serde(rename = "ref", default, skip_serializing_if = "Option::is_none")]
    pub refers: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<Value>,
    pub prev: String,
    pub hash: String,
}

impl Entry {
    /// Its hash as bytes (checked by [`check_line`]).
    pub fn hash_bytes(&self) -> [u8; 32] {
        unhex(&self.hash).unwrap_or(GENESIS)
    }

    /// Its `prev` as bytes, if well formed.
    pub fn prev_bytes(&self) -> Option<[u8; 32]> {
        unhex(&self.prev)
    }

    /// Its time, in microseconds since the epoch.
    pub fn micros(&self) -> Option<i64> {
        crate::timefmt::parse(&self.ts)
    }
}

/// Why one line is not a sound record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    /// It does not end with `,"hash":"<64 hex>"}`.
    #[error("does not end with its hash")]
    NoHash,
    /// The hash it carries is not the SHA-256 of its bytes: the line was edited.
    #[error("its hash does not match its contents (the line was changed after it was written)")]
    HashMismatch,
    /// Its bytes hash right but do not read as a record of this format.
    #[error("not a record of this format: {0}")]
    NotARecord(String),
}

/// Check one line (without its newline): its hash over its bytes, then its members.
pub fn check_line(line: &[u8]) -> Result<Entry, LineError> {
    if line.len() < HASH_SUFFIX_LEN {
        return Err(LineError::NoHash);
    }
    let (body, suffix) = line.split_at(line.len() - HASH_SUFFIX_LEN);
    let (Some(b"\"}"), Some(b",\"hash\":\"")) = (suffix.get(73..), suffix.get(..9)) else {
        return Err(LineError::NoHash);
    };
    let claimed = std::str::from_utf8(&suffix[9..73])
        .ok()
        .and_then(unhex)
        .ok_or(LineError::NoHash)?;
    let actual: [u8; 32] = Sha256::digest(body).into();
    if claimed != actual {
        return Err(LineError::HashMismatch);
    }
    let entry: Entry =
        serde_json::from_slice(line).map_err(|e| LineError::NotARecord(e.to_string()))?;
    if entry.v != VERSION {
        return Err(LineError::NotARecord(format!("version {}", entry.v)));
    }
    if entry.prev_bytes().is_none() {
        return Err(LineError::NotARecord("prev is not 64 hex digits".into()));
    }
    Ok(entry)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who() -> Who {
        Who {
            via: Via::Daemon,
            client: Some("agent \"x\"\n".into()),
            plugin: Some("reader".into()),
            pid: Some(42),
            uid: Some(1000),
            conn: Some(7),
        }
    }

    fn line_of(rec: &Record, seq: u64, prev: &[u8; 32]) -> (Vec<u8>, [u8; 32]) {
        let mut out = Vec::new();
        let h = encode(rec, seq, 1_780_000_000_123_456, prev, &mut out);
        (out, h)
    }

    #[test]
    fn a_line_reads_back_with_every_member_and_its_hash() {
        let rec = Record::new("cred.get", OK, who())
            .store("default")
            .id("team/github");
        let (line, hash) = line_of(&rec, 5, &GENESIS);
        assert_eq!(line.last(), Some(&b'\n'));
        assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1, "one line");
        let text = std::str::from_utf8(&line).unwrap();
        assert!(
            text.starts_with("{\"v\":1,\"seq\":5,\"ts\":\"2026-"),
            "{text}"
        );
        let e = check_line(&line[..line.len() - 1]).unwrap();
        assert_eq!(e.seq, 5);
        assert_eq!(e.op, "cred.get");
        assert_eq!(e.id.as_deref(), Some("team/github"));
        assert_eq!(e.client.as_deref(), Some("agent \"x\"\n"));
        assert_eq!((e.pid, e.uid, e.conn), (Some(42), Some(1000), Some(7)));
        assert_eq!(e.hash_bytes(), hash);
        assert_eq!(e.prev_bytes(), Some(GENESIS));
        assert_eq!(e.micros(), Some(1_780_000_000_123_456));
    }

    #[test]
    fn an_invalid_id_is_not_recorded_and_long_names_are_cut() {
        let mut w = who();
        w.client = Some("c".repeat(500).into());
        let rec = Record::new("cred.get", "invalid_params", w).id("../etc/passwd");
        assert_eq!(rec.id, None);
        let rec = rec.store(&"s".repeat(5000));
        assert_eq!(rec.store.as_ref().unwrap().len(), MAX_STORE_CHARS);
        assert_eq!(cut_chars("héllo", 2), "hé");
    }

    #[test]
    fn every_single_byte_edit_is_detected() {
        let rec = Record::new("cred.set", OK, who())
            .store("default")
            .id("openai");
        let (line, _) = line_of(&rec, 9, &[7; 32]);
        let line = &line[..line.len() - 1];
        let mut detected = 0;
        for i in 0..line.len() {
            for flip in [1u8, 0x20] {
                let mut bad = line.to_vec();
                bad[i] ^= flip;
                if check_line(&bad).is_err() {
                    detected += 1;
                } else {
                    panic!(
                        "an edit at byte {i} went unseen: {}",
                        String::from_utf8_lossy(&bad)
                    );
                }
            }
        }
        println!(
            "record format: {} single-byte edits of one {}-byte line, {detected} detected",
            2 * line.len(),
            line.len()
        );
        assert!(check_line(b"{}").is_err());
        assert!(check_line(&line[..line.len() - 1]).is_err(), "a cut line");
    }

    #[test]
    fn hex_round_trips() {
        let b: [u8; 32] = core::array::from_fn(|i| (i * 37) as u8);
        assert_eq!(unhex(&hex(&b)), Some(b));
        assert_eq!(unhex("zz"), None);
        assert_eq!(unhex(&"G".repeat(64)), None);
    }
}
