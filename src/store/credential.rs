//! One credential: hive's plaintext schema, kept as a JSON object so that fields holdfast does
//! not know (on the credential and on each key) survive a rewrite untouched.
//!
//! The value is secret-bearing: it is not `Clone`, its `Debug` shows the id, type, key names
//! and generation only, and every string in it is zeroized on drop.

use serde_json::{Map, Value};
use std::fmt;
use zeroize::{Zeroize, Zeroizing};

use crate::crypto::Secret;
use crate::timefmt;

/// Extra plaintext field holding the credential's generation (hive preserves unknown fields).
pub const GENERATION_FIELD: &str = "holdfast_generation";

/// The credential types hive knows (its model's enum): a write with another is refused, since
/// hive could not load it; a file another program wrote with another is still served.
pub const KNOWN_TYPES: &[&str] = &["api_key", "oauth2", "basic_auth", "bearer_token", "custom"];

/// Key names hive's index treats as metadata rather than secrets' names.
const META_KEYS: &[&str] = &["_alias", "_integration_type"];
const IDENTITY_PREFIX: &str = "_identity_";
const IDENTITY_FIELDS: &[&str] = &["email", "username", "workspace", "account_id"];

/// Why a document is not a credential.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// Not JSON, or not a JSON object.
    #[error("not a JSON object")]
    NotObject,
    /// `id` missing or not a string.
    #[error("missing string field \"id\"")]
    NoId,
    /// `keys` is not an object of `{name, value}` objects.
    #[error(
        "\"keys\" must map names to objects with string \"name\" and \"value\" (bad key #{0})"
    )]
    BadKeys(usize),
    /// A field has the wrong type.
    #[error("field \"{0}\" has the wrong type")]
    BadField(&'static str),
    /// A field of one key has a type hive does not load.
    #[error("key #{key}: field \"{field}\" has a type hive cannot load (expected {expected})")]
    BadKeyField {
        /// Which key (1-based, in document order).
        key: usize,
        /// The field.
        field: &'static str,
        /// What hive loads there.
        expected: &'static str,
    },
    /// A field of the credential has a value hive does not load.
    #[error("field \"{field}\" has a value hive cannot load (expected {expected})")]
    NotHive {
        /// The field.
        field: &'static str,
        /// What hive loads there.
        expected: &'static str,
    },
    /// The document's id is not the id it is being stored under.
    #[error("the document's \"id\" is not the id it is stored under")]
    IdMismatch,
}

/// A credential document.
pub struct Credential {
    doc: Map<String, Value>,
    /// The writer asked for the document's own `updated_at` to be stored (hive's storage
    /// keeps the time its caller saved); otherwise a write stamps it.
    keep_updated_at: bool,
}

/// An upper bound on the compact JSON size of `doc`: every string may need escaping to
/// `\uXXXX` (6 bytes per input byte) plus quotes; numbers and literals are short.
/// Buffers that will hold secrets are allocated at this size up front: a `Vec` that grows
/// leaves the bytes it had in freed memory, where no zeroizing can reach them.
fn json_size_bound(doc: &Map<String, Value>) -> usize {
    json_map_size_bound(doc)
}

/// [`json_size_bound`] for any JSON value.
pub fn json_value_size_bound(v: &Value) -> usize {
    match v {
        Value::String(s) => s.len() * 6 + 2,
        Value::Array(a) => {
            2 + a
                .iter()
                .map(|x| json_value_size_bound(x) + 1)
                .sum::<usize>()
        }
        Value::Object(o) => json_map_size_bound(o),
        _ => 24,
    }
}

fn json_map_size_bound(o: &Map<String, Value>) -> usize {
    2 + o
        .iter()
        .map(|(k, v)| k.len() * 6 + 4 + json_value_size_bound(v))
        .sum::<usize>()
}

/// Zeroize every string in a JSON value (documents that held secrets, before they are dropped).
pub fn zeroize_json(v: &mut Value) {
    match v {
        Value::String(s) => s.zeroize(),
        Value::Array(a) => a.iter_mut().for_each(zeroize_json),
        Value::Object(o) => o.values_mut().for_each(zeroize_json),
        _ => {}
    }
}

impl Drop for Credential {
    fn drop(&mut self) {
        self.doc.values_mut().for_each(zeroize_json);
    }
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credential")
            .field("id", &self.id())
            .field("credential_type", &self.credential_type())
            .field("keys", &self.key_names())
            .field("generation", &self.generation())
            .finish_non_exhaustive()
    }
}

impl Credential {
    /// A new credential with hive's full default schema, stamped now.
    pub fn new(id: &str, credential_type: &str) -> Self {
        let now = Value::String(timefmt::format_z(timefmt::now_micros()));
        let mut doc = Map::new();
        doc.insert("id".into(), id.into());
        doc.insert("credential_type".into(), credential_type.into());
        doc.insert("keys".into(), Value::Object(Map::new()));
        doc.insert("provider_id".into(), Value::Null);
        doc.insert("last_refreshed".into(), Value::Null);
        doc.insert("auto_refresh".into(), false.into());
        doc.insert("last_used".into(), Value::Null);
        doc.insert("use_count".into(), 0.into());
        doc.insert("description".into(), "".into());
        doc.insert("tags".into(), Value::Array(Vec::new()));
        doc.insert("created_at".into(), now.clone());
        doc.insert("updated_at".into(), now);
        Credential {
            doc,
            keep_updated_at: false,
        }
    }

    /// The shorthand hive users know: an `api_key` credential with one key named `api_key`.
    pub fn api_key(id: &str, value: Secret) -> Self {
        let mut c = Credential::new(id, "api_key");
        c.set_key("api_key", value);
        c
    }

    /// Check a JSON value against the schema and wrap it.
    /// Takes ownership: on every error path the document is zeroized too (a non-object here;
    /// a failed check through `Credential`'s own drop), so callers need no copy to scrub.
    pub fn from_value(value: Value) -> Result<Self, SchemaError> {
        let doc = match value {
            Value::Object(doc) => doc,
            mut other => {
                zeroize_json(&mut other);
                return Err(SchemaError::NotObject);
            }
        };
        let c = Credential {
            doc,
            keep_updated_at: false,
        };
        c.check()?;
        Ok(c)
    }

    /// Parse plaintext bytes (UTF-8, a leading BOM accepted as hive's `utf-8-sig` does).
    pub fn parse(bytes: &[u8]) -> Result<Self, SchemaError> {
        let bytes = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
        let value: Value = serde_json::from_slice(bytes).map_err(|_| SchemaError::NotObject)?;
        Credential::from_value(value)
    }

    /// Check the document against the schema (also run before every write, so no code path can
    /// store a document that a later open would quarantine).
    pub(crate) fn check(&self) -> Result<(), SchemaError> {
        if !matches!(self.doc.get("id"), Some(Value::String(_))) {
            return Err(SchemaError::NoId);
        }
        match self.doc.get("keys") {
            None | Some(Value::Null) => {}
            Some(Value::Object(keys)) => {
                for (i, k) in keys.values().enumerate() {
                    let ok = matches!(
                        k,
                        Value::Object(o)
                            if matches!(o.get("value"), Some(Value::String(_)))
                            && matches!(o.get("name"), Some(Value::String(_)))
                    );
                    if !ok {
                        return Err(SchemaError::BadKeys(i + 1));
                    }
                }
            }
            Some(_) => return Err(SchemaError::BadKeys(0)),
        }
        match self.doc.get(GENERATION_FIELD) {
            None | Some(Value::Null) => {}
            Some(v) if v.as_u64().is_some() => {}
            Some(_) => return Err(SchemaError::BadField(GENERATION_FIELD)),
        }
        Ok(())
    }

    /// Check, before a write, that hive's own model loads the document (its pydantic types for
    /// the fields it knows; unknown fields are kept and not checked): a credential holdfast
    /// stores must be one hive can read. Reads stay lenient ([`Credential::check`] only): a
    /// document written elsewhere is served as it is.
    pub(crate) fn check_for_hive(&self) -> Result<(), SchemaError> {
        const TIME: &str =
            "an ISO 8601 time hive reads: YYYY-MM-DD[THH:MM[:SS[.ffffff]]][Z|±HH:MM], a real date";
        const TIME_OR_NULL: &str = "an ISO 8601 time hive reads (YYYY-MM-DD[THH:MM[:SS[.ffffff]]][Z|±HH:MM], a real date) or null";
        // What hive's model (pydantic) certainly reads as a datetime, in the form hive itself
        // writes: an ISO 8601 time it parses (`timefmt::hive_accepts`). Not a number, which
        // pydantic reads as seconds or milliseconds by its size, and which hive never writes
        // (the index holdfast derives would differ from the one hive derives).
        let instant = |v: &Value| v.as_str().is_some_and(timefmt::hive_accepts);
        let time = |v: &Value| v.is_null() || instant(v);
        let want = |field: &'static str, ok: bool, expected: &'static str| {
            if ok {
                Ok(())
            } else {
                Err(SchemaError::NotHive { field, expected })
            }
        };
        let get = |f: &str| self.doc.get(f);
        if let Some(t) = get("credential_type") {
            want(
                "credential_type",
                t.as_str().is_some_and(|t| KNOWN_TYPES.contains(&t)),
                "one of api_key, oauth2, basic_auth, bearer_token, custom",
            )?;
        }
        if let Some(v) = get("keys") {
            want("keys", v.is_object(), "an object of keys")?;
        }
        for field in ["created_at", "updated_at"] {
            if let Some(v) = get(field) {
                want(field, instant(v), TIME)?;
            }
        }
        for field in ["last_refreshed", "last_used"] {
            if let Some(v) = get(field) {
                want(field, time(v), TIME_OR_NULL)?;
            }
        }
        if let Some(v) = get("tags") {
            let ok = v.as_array().is_some_and(|a| a.iter().all(Value::is_string));
            want("tags", ok, "a list of strings")?;
        }
        if let Some(v) = get("description") {
            want("description", v.is_string(), "a string")?;
        }
        if let Some(v) = get("provider_id") {
            want(
                "provider_id",
                v.is_null() || v.is_string(),
                "a string or null",
            )?;
        }
        if let Some(v) = get("auto_refresh") {
            want("auto_refresh", v.is_boolean(), "true or false")?;
        }
        if let Some(v) = get("use_count") {
            want("use_count", v.is_i64() || v.is_u64(), "an integer")?;
        }
        for (i, k) in self.keys().into_iter().flatten().enumerate() {
            let Value::Object(k) = k.1 else { continue };
            let bad = |field, expected| SchemaError::BadKeyField {
                key: i + 1,
                field,
                expected,
            };
            if let Some(v) = k.get("expires_at") {
                if !time(v) {
                    return Err(bad("expires_at", TIME_OR_NULL));
                }
            }
            if let Some(v) = k.get("metadata") {
                if !v.is_object() {
                    return Err(bad("metadata", "an object"));
                }
            }
        }
        Ok(())
    }

    /// Serialize to plaintext bytes (compact JSON; hive loads it). The buffer is sized up front
    /// so that no reallocation frees a partial plaintext unzeroized.
    pub fn to_bytes(&self) -> Zeroizing<Vec<u8>> {
        let mut buf = Zeroizing::new(Vec::with_capacity(json_size_bound(&self.doc)));
        // Serializing a map of JSON values into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *buf, &self.doc);
        buf
    }

    /// Append the whole document, secrets included, as compact JSON to `out` (which the caller
    /// sized with [`Credential::json_size_bound`], so it does not reallocate).
    pub fn write_json(&self, out: &mut Vec<u8>) {
        // Serializing a map of JSON values into a Vec cannot fail.
        let _ = serde_json::to_writer(out, &self.doc);
    }

    /// An upper bound on the size of [`Credential::write_json`]'s output.
    pub fn json_size_bound(&self) -> usize {
        json_size_bound(&self.doc)
    }

    /// The whole document, secrets included, as JSON (for `cred get --json`).
    pub fn expose_json(&self) -> Value {
        Value::Object(self.doc.clone())
    }

    /// Whether two documents hold the same content: every field equal except the bookkeeping
    /// every write stamps (`updated_at`, holdfast's generation counter).
    pub fn same_content(&self, other: &Credential) -> bool {
        let content = |k: &&String| *k != GENERATION_FIELD && *k != "updated_at";
        let fields = |c: &Credential| c.doc.keys().filter(content).count();
        fields(self) == fields(other)
            && self
                .doc
                .iter()
                .filter(|(k, _)| content(k))
                .all(|(k, v)| other.doc.get(k) == Some(v))
    }

    /// The credential id (authoritative over the file name).
    pub fn id(&self) -> &str {
        self.doc.get("id").and_then(Value::as_str).unwrap_or("")
    }

    /// `credential_type`, if set.
    pub fn credential_type(&self) -> Option<&str> {
        self.doc.get("credential_type").and_then(Value::as_str)
    }

    /// The generation: 0 for a credential never written, 1 for a file written without one
    /// (by hive), otherwise the stored counter.
    pub fn generation(&self) -> u64 {
        self.doc
            .get(GENERATION_FIELD)
            .and_then(Value::as_u64)
            .unwrap_or(1)
    }

    pub(crate) fn set_generation(&mut self, generation: u64) {
        self.doc.insert(GENERATION_FIELD.into(), generation.into());
    }

    /// Carry `generation` (the file's, `store::credentials::generations`) if the document
    /// says otherwise; a document that already says it (hive's, without the field, at 1) is
    /// left as it was written.
    pub(crate) fn carry_generation(&mut self, generation: u64) {
        if self.generation() != generation {
            self.set_generation(generation);
        }
    }

    fn keys(&self) -> Option<&Map<String, Value>> {
        self.doc.get("keys").and_then(Value::as_object)
    }

    /// Names of the keys, in stored order.
    pub fn key_names(&self) -> Vec<&str> {
        self.keys()
            .map(|k| k.keys().map(String::as_str).collect())
            .unwrap_or_default()
    }

    /// The secret value of key `name`.
    pub fn key_value(&self, name: &str) -> Option<&str> {
        self.keys()?.get(name)?.get("value")?.as_str()
    }

    /// Set key `name` to `value`, keeping the key's other fields (expires_at, metadata, extras).
    pub fn set_key(&mut self, name: &str, value: Secret) {
        let keys = self
            .doc
            .entry("keys")
            .or_insert_with(|| Value::Object(Map::new()));
        if !keys.is_object() {
            *keys = Value::Object(Map::new());
        }
        let Value::Object(keys) = keys else { return };
        let entry = keys.entry(name).or_insert_with(|| {
            let mut k = Map::new();
            k.insert("name".into(), name.into());
            k.insert("value".into(), "".into());
            k.insert("expires_at".into(), Value::Null);
            k.insert("metadata".into(), Value::Object(Map::new()));
            Value::Object(k)
        });
        if let Value::Object(k) = entry {
            if let Some(Value::String(old)) = k.get_mut("value") {
                old.zeroize();
            }
            k.insert("value".into(), Value::String(value.into_string()));
            k.insert("name".into(), name.into());
        }
    }

    /// Remove key `name`; whether it existed.
    pub fn remove_key(&mut self, name: &str) -> bool {
        match self.doc.get_mut("keys").and_then(Value::as_object_mut) {
            Some(keys) => match keys.shift_remove(name) {
                Some(mut v) => {
                    zeroize_json(&mut v);
                    true
                }
                None => false,
            },
            None => false,
        }
    }

    /// Set a top-level non-secret field (`description`, `tags`, `credential_type`, …).
    pub fn set_field(&mut self, name: &str, value: Value) {
        self.doc.insert(name.into(), value);
    }

    /// Read a top-level field.
    pub fn field(&self, name: &str) -> Option<&Value> {
        self.doc.get(name)
    }

    /// Store the document's own `updated_at` (a time hive's model reads: checked with the
    /// rest) instead of stamping the write's time; a document without one is stamped.
    pub fn keep_updated_at(&mut self) {
        self.keep_updated_at = true;
    }

    /// Stamp `updated_at` now, unless [`Credential::keep_updated_at`] asked to keep the one it
    /// has (and `created_at`, if missing, from `created` or now).
    pub(crate) fn stamp_write(&mut self, created: Option<&Value>) {
        let now = Value::String(timefmt::format_z(timefmt::now_micros()));
        if !matches!(self.doc.get("created_at"), Some(Value::String(_))) {
            let created = created.cloned().unwrap_or_else(|| now.clone());
            self.doc.insert("created_at".into(), created);
        }
        if !(self.keep_updated_at && matches!(self.doc.get("updated_at"), Some(Value::String(_)))) {
            self.doc.insert("updated_at".into(), now);
        }
    }

    /// The hive `index.json` entry for this credential (no secret values; see HIVE-FORMAT.md).
    pub fn index_entry(&self) -> Value {
        let key_val = |name: &str| -> Value {
            self.key_value(name)
                .map(|v| Value::String(v.to_owned()))
                .unwrap_or(Value::Null)
        };
        let mut identity = Map::new();
        for f in IDENTITY_FIELDS {
            if let Some(v) = self.key_value(&format!("{IDENTITY_PREFIX}{f}")) {
                if !v.is_empty() {
                    identity.insert((*f).into(), v.into());
                }
            }
        }
        let mut key_names: Vec<&str> = self
            .key_names()
            .into_iter()
            .filter(|n| !META_KEYS.contains(n) && !n.starts_with(IDENTITY_PREFIX))
            .collect();
        key_names.sort_unstable();
        let date = |field: &str| -> Value {
            match self.doc.get(field) {
                Some(Value::String(s)) => Value::String(timefmt::z_to_offset(s)),
                _ => Value::Null,
            }
        };
        let expires = self
            .keys()
            .into_iter()
            .flat_map(|k| k.values())
            .filter_map(|k| k.get("expires_at")?.as_str())
            .min_by_key(|s| (timefmt::parse(s).unwrap_or(i64::MAX), s.to_string()))
            .map(|s| Value::String(timefmt::z_to_offset(s)))
            .unwrap_or(Value::Null);
        let mut e = Map::new();
        e.insert(
            "credential_type".into(),
            self.doc
                .get("credential_type")
                .cloned()
                .unwrap_or(Value::Null),
        );
        e.insert("provider".into(), key_val("_integration_type"));
        e.insert("alias".into(), key_val("_alias"));
        e.insert("identity".into(), Value::Object(identity));
        e.insert("key_names".into(), key_names.into());
        e.insert("created_at".into(), date("created_at"));
        e.insert("updated_at".into(), date("updated_at"));
        e.insert("last_refreshed".into(), date("last_refreshed"));
        e.insert("expires_at".into(), expires);
        e.insert(
            "auto_refresh".into(),
            self.doc
                .get("auto_refresh")
                .cloned()
                .unwrap_or(false.into()),
        );
        e.insert(
            "tags".into(),
            self.doc
                .get("tags")
                .cloned()
                .unwrap_or(Value::Array(Vec::new())),
        );
        Value::Object(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_fields_survive_and_keys_update_in_place() {
        let doc = json!({"id": "x", "keys": {"api_key": {"name": "api_key", "value": "old",
            "expires_at": null, "metadata": {"m": 1}, "extra_key_field": true}},
            "custom_top": [1, 2]});
        let mut c = Credential::from_value(doc).unwrap();
        c.set_key("api_key", Secret::new("new".into()));
        let out: Value = serde_json::from_slice(&c.to_bytes()).unwrap();
        assert_eq!(out["custom_top"], json!([1, 2]));
        assert_eq!(out["keys"]["api_key"]["extra_key_field"], json!(true));
        assert_eq!(out["keys"]["api_key"]["metadata"], json!({"m": 1}));
        assert_eq!(out["keys"]["api_key"]["value"], json!("new"));
    }

    #[test]
    fn schema_errors() {
        assert_eq!(
            Credential::parse(b"[]").unwrap_err(),
            SchemaError::NotObject
        );
        assert_eq!(Credential::parse(b"{}").unwrap_err(), SchemaError::NoId);
        assert!(matches!(
            Credential::parse(br#"{"id":"x","keys":{"a":{"name":"a","value":5}}}"#),
            Err(SchemaError::BadKeys(1))
        ));
        assert!(Credential::parse(b"\xef\xbb\xbf{\"id\":\"x\"}").is_ok());
    }

    #[test]
    fn index_entry_follows_hive() {
        let doc = json!({"id": "gh", "credential_type": "oauth2", "keys": {
            "access_token": {"name": "access_token", "value": "s1", "expires_at": "2026-05-01T00:00:00Z"},
            "refresh_token": {"name": "refresh_token", "value": "s2", "expires_at": "2026-04-01T00:00:00Z"},
            "_alias": {"name": "_alias", "value": "work"},
            "_integration_type": {"name": "_integration_type", "value": "github"},
            "_identity_email": {"name": "_identity_email", "value": "a@b.c"},
            "_identity_username": {"name": "_identity_username", "value": ""}},
            "created_at": "2026-01-01T00:00:00Z", "tags": ["t"]});
        let e = Credential::from_value(doc).unwrap().index_entry();
        assert_eq!(e["provider"], json!("github"));
        assert_eq!(e["alias"], json!("work"));
        assert_eq!(e["identity"], json!({"email": "a@b.c"}));
        assert_eq!(e["key_names"], json!(["access_token", "refresh_token"]));
        assert_eq!(e["expires_at"], json!("2026-04-01T00:00:00+00:00"));
        assert_eq!(e["created_at"], json!("2026-01-01T00:00:00+00:00"));
        assert_eq!(e["tags"], json!(["t"]));
        assert!(!e.to_string().contains("s1"));
    }

    #[test]
    fn to_bytes_never_reallocates() {
        let mut c = Credential::api_key("x", Secret::new("\u{1}\"\\ é ✓ \n".repeat(50)));
        c.set_field("tags", json!(["a", 1, null, true, {"k": "v"}]));
        let b = c.to_bytes();
        assert!(b.len() <= b.capacity());
        assert_eq!(b.capacity(), json_size_bound(&c.doc));
        assert!(Credential::parse(&b).is_ok());
    }

    #[test]
    fn debug_hides_values() {
        let c = Credential::api_key("x", Secret::new("sk-hidden".into()));
        assert!(!format!("{c:?}").contains("sk-hidden"));
    }
}
