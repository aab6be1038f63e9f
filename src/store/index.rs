//! `metadata/index.json`: hive's v2.0 index, a derived cache of the credential files.
//!
//! holdfast adds one top-level field, `"holdfast"`, recording for each file the stamp (size,
//! mtime, inode) and id it had when its entry was derived. On open, a file whose stamp still
//! matches is *vouched for* and is not decrypted; any other file is. hive loads the index as a
//! dict and ignores the field; if hive rewrites the index and drops or keeps a stale copy of it,
//! the stamps simply stop matching and those files are decrypted again. Nothing is lost either
//! way: the files are the truth.

use serde_json::{Map, Value};
use std::collections::BTreeMap;

use crate::durable::FileStamp;
use crate::limits::MAX_INDEX_FILE_BYTES;
use crate::timefmt;

/// The index version hive writes and accepts.
pub const INDEX_VERSION: &str = "2.0";
const HOLDFAST_FIELD: &str = "holdfast";

/// What holdfast remembers about one credential file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vouch {
    /// The id inside the file.
    pub id: String,
    /// The file's stamp when its entry was derived.
    pub stamp: FileStamp,
    /// The credential's generation.
    pub generation: u64,
}

/// Why the index on disk could not be used (it is then rebuilt from a scan).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IndexState {
    /// Parsed, version 2.0.
    Ok,
    /// No index.json.
    Missing,
    /// Empty, torn or not JSON.
    Unparseable,
    /// An older or unknown version (hive rebuilds a v1.0 index too).
    WrongVersion(String),
    /// Larger than [`MAX_INDEX_FILE_BYTES`].
    TooBig,
}

impl std::fmt::Display for IndexState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IndexState::Ok => f.write_str("ok"),
            IndexState::Missing => f.write_str("missing"),
            IndexState::Unparseable => f.write_str("unparseable (empty, torn or not JSON)"),
            IndexState::WrongVersion(v) => write!(f, "version {v}, not {INDEX_VERSION}"),
            IndexState::TooBig => write!(f, "larger than {MAX_INDEX_FILE_BYTES} bytes"),
        }
    }
}

/// A parsed index.
#[derive(Debug, Default)]
pub struct Index {
    /// `credentials`: id → entry.
    pub credentials: Map<String, Value>,
    /// holdfast's stamps, by file name.
    pub vouches: BTreeMap<String, Vouch>,
    /// Top-level fields neither hive's nor ours, preserved.
    pub extra: Map<String, Value>,
}

impl Index {
    /// Parse index bytes. `Err` says why the index cannot be used.
    pub fn parse(bytes: &[u8]) -> Result<Index, IndexState> {
        if bytes.len() as u64 > MAX_INDEX_FILE_BYTES {
            return Err(IndexState::TooBig);
        }
        let bytes = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
        let Ok(Value::Object(mut top)) = serde_json::from_slice::<Value>(bytes) else {
            return Err(IndexState::Unparseable);
        };
        match top.get("version") {
            Some(Value::String(v)) if v == INDEX_VERSION => {}
            Some(Value::String(v)) => return Err(IndexState::WrongVersion(v.clone())),
            other => {
                return Err(IndexState::WrongVersion(
                    other
                        .map(|v| v.to_string())
                        .unwrap_or_else(|| "none".into()),
                ))
            }
        }
        let credentials = match top.shift_remove("credentials") {
            Some(Value::Object(c)) => c,
            _ => return Err(IndexState::Unparseable),
        };
        let mut vouches = BTreeMap::new();
        if let Some(Value::Object(hf)) = top.shift_remove(HOLDFAST_FIELD) {
            if let Some(Value::Object(files)) = hf.get("files") {
                for (name, v) in files {
                    if let Some(vouch) = parse_vouch(v) {
                        vouches.insert(name.clone(), vouch);
                    }
                }
            }
        }
        for k in ["version", "store_path", "generated_at"] {
            top.shift_remove(k);
        }
        Ok(Index {
            credentials,
            vouches,
            extra: top,
        })
    }

    /// Serialize, stamped now, for the store at `store_path`.
    pub fn to_bytes(&self, store_path: &str) -> Vec<u8> {
        let entries: Vec<EntryRef<'_>> = self
            .credentials
            .iter()
            .map(|(id, meta)| {
                let file = self.vouches.iter().find(|(_, v)| v.id == *id);
                EntryRef {
                    file: file.map_or("", |(f, _)| f.as_str()),
                    id,
                    meta,
                    vouch: file.map(|(_, v)| (v.stamp, v.generation)),
                }
            })
            .collect();
        write_index(store_path, &self.extra, &entries)
    }
}

/// One credential's part of the index, borrowed: the index is written straight from the
/// store's entries, with no copy of them (at 10,000 credentials a copy is most of the cost).
pub struct EntryRef<'a> {
    /// File name in `credentials/`.
    pub file: &'a str,
    /// Credential id.
    pub id: &'a str,
    /// hive's entry.
    pub meta: &'a Value,
    /// The file's stamp and generation, if vouched for.
    pub vouch: Option<(FileStamp, u64)>,
}

fn put<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, v: &T) {
    // Serializing strings, numbers and JSON values into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, v);
}

/// Serialize an index (compact JSON, stamped now) from borrowed entries and the preserved
/// unknown top-level fields.
pub fn write_index(
    store_path: &str,
    extra: &Map<String, Value>,
    entries: &[EntryRef<'_>],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + entries.len() * 512);
    out.extend_from_slice(b"{\"credentials\":{");
    for (i, e) in entries.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        put(&mut out, e.id);
        out.push(b':');
        put(&mut out, e.meta);
    }
    out.extend_from_slice(b"},\"version\":");
    put(&mut out, INDEX_VERSION);
    out.extend_from_slice(b",\"store_path\":");
    put(&mut out, store_path);
    out.extend_from_slice(b",\"generated_at\":");
    put(&mut out, &timefmt::format_offset(timefmt::now_micros()));
    for (k, v) in extra {
        out.push(b',');
        put(&mut out, k);
        out.push(b':');
        put(&mut out, v);
    }
    out.extend_from_slice(b",\"holdfast\":{\"format\":1,\"files\":{");
    let mut first = true;
    for e in entries {
        let Some((stamp, generation)) = e.vouch else {
            continue;
        };
        if !std::mem::take(&mut first) {
            out.push(b',');
        }
        put(&mut out, e.file);
        out.extend_from_slice(b":{\"id\":");
        put(&mut out, e.id);
        out.extend_from_slice(
            format!(
                ",\"size\":{},\"mtime_ns\":{},\"ino\":{},\"generation\":{generation}}}",
                stamp.size, stamp.mtime_ns, stamp.ino
            )
            .as_bytes(),
        );
    }
    out.extend_from_slice(b"}}}");
    out
}

fn parse_vouch(v: &Value) -> Option<Vouch> {
    Some(Vouch {
        id: v.get("id")?.as_str()?.to_owned(),
        stamp: FileStamp {
            size: v.get("size")?.as_u64()?,
            mtime_ns: v.get("mtime_ns")?.as_i64()?,
            ino: v.get("ino")?.as_u64()?,
        },
        generation: v.get("generation")?.as_u64()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn roundtrip_keeps_vouches_and_extras() {
        let mut idx = Index::default();
        idx.credentials
            .insert("a".into(), json!({"credential_type": "api_key"}));
        idx.vouches.insert(
            "a.enc".into(),
            Vouch {
                id: "a".into(),
                stamp: FileStamp {
                    size: 10,
                    mtime_ns: 5,
                    ino: 7,
                },
                generation: 3,
            },
        );
        idx.extra.insert("other_tool".into(), json!(1));
        let back = Index::parse(&idx.to_bytes("/s")).unwrap();
        assert_eq!(back.credentials, idx.credentials);
        assert_eq!(back.vouches, idx.vouches);
        assert_eq!(back.extra, idx.extra);
    }

    #[test]
    fn unusable_indexes() {
        assert_eq!(Index::parse(b"").unwrap_err(), IndexState::Unparseable);
        assert_eq!(
            Index::parse(b"{\"credentials\": {").unwrap_err(),
            IndexState::Unparseable
        );
        assert_eq!(
            Index::parse(br#"{"credentials": {}, "version": "1.0"}"#).unwrap_err(),
            IndexState::WrongVersion("1.0".into())
        );
        assert!(Index::parse(br#"{"credentials": {}, "version": "2.0"}"#).is_ok());
    }
}
