//! The credential store's readers: `index.json`, and a decrypted credential's plaintext.

use super::{Fault, OrFault, Outcome};
use serde_json::{Map, Value};

use crate::crypto::Secret;
use crate::limits::MAX_INDEX_FILE_BYTES;
use crate::store::credential::GENERATION_FIELD;
use crate::store::index::{Index, IndexState, INDEX_VERSION};
use crate::store::Credential;

/// serde_json's reading of `bytes` after a UTF-8 BOM (hive writes with `utf-8-sig` at times).
fn json(bytes: &[u8]) -> Option<Value> {
    let bytes = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    serde_json::from_slice(bytes).ok()
}

/// `index.json` as the store reads it at every open. Checked against serde_json's reading:
/// usable exactly when it is an object whose `version` is the string "2.0" and whose
/// `credentials` is an object (otherwise the right state: unparseable, or the version it
/// says); a usable index written again (`Index::to_bytes`) reads back with the same entries,
/// the same foreign fields, and none of the vouches it did not have.
pub fn index_json(data: &[u8]) -> Outcome {
    let parsed = Index::parse(data);
    let model = json(data);
    let expected: Result<(), IndexState> = if data.len() as u64 > MAX_INDEX_FILE_BYTES {
        Err(IndexState::TooBig)
    } else {
        match &model {
            Some(Value::Object(top)) => match top.get("version") {
                Some(Value::String(v)) if v == INDEX_VERSION => {
                    if matches!(top.get("credentials"), Some(Value::Object(_))) {
                        Ok(())
                    } else {
                        Err(IndexState::Unparseable)
                    }
                }
                Some(Value::String(v)) => Err(IndexState::WrongVersion(v.clone())),
                Some(other) => Err(IndexState::WrongVersion(other.to_string())),
                None => Err(IndexState::WrongVersion("none".into())),
            },
            _ => Err(IndexState::Unparseable),
        }
    };
    let idx = match (parsed, expected) {
        (Ok(idx), Ok(())) => idx,
        (Err(got), Err(want)) => {
            check_eq!(got, want, "the index's state");
            return Ok(false);
        }
        (got, want) => {
            return Err(Fault::Broken(format!(
                "index read as {:?}, the model says {want:?}",
                got.map(|_| "usable")
            )))
        }
    };
    if let Some(Value::Object(top)) = &model {
        let want: &Map<String, Value> = match top.get("credentials") {
            Some(Value::Object(c)) => c,
            _ => unreachable!("checked above"),
        };
        check_eq!(&idx.credentials, want, "entries differ from the JSON's");
    }
    let again = Index::parse(&idx.to_bytes("/fuzz/store")).broken("a written index is refused")?;
    check_eq!(
        again.credentials,
        idx.credentials,
        "entries changed on a rewrite"
    );
    check_eq!(
        again.extra,
        idx.extra,
        "foreign fields changed on a rewrite"
    );
    for (file, vouch) in &again.vouches {
        check_eq!(
            idx.vouches.get(file),
            Some(vouch),
            "a rewrite invented or changed the vouch of {file:?}"
        );
    }
    Ok(true)
}

/// A credential's plaintext as the store reads every file it decrypts. Checked against the
/// schema written out by hand (an object; `id` a string; `keys` absent, null, or an object of
/// objects each with string `name` and `value`; holdfast's generation absent, null or a
/// non-negative integer); a credential that reads is written (`to_bytes`) and read back with
/// the same content and id; its `Debug` never shows a key's value.
pub fn credential_plaintext(data: &[u8]) -> Outcome {
    let parsed = Credential::parse(data);
    let model_ok = match json(data) {
        Some(Value::Object(doc)) => {
            let id = matches!(doc.get("id"), Some(Value::String(_)));
            let keys = match doc.get("keys") {
                None | Some(Value::Null) => true,
                Some(Value::Object(keys)) => keys.values().all(|k| {
                    k.get("name").is_some_and(Value::is_string)
                        && k.get("value").is_some_and(Value::is_string)
                }),
                Some(_) => false,
            };
            let generation = match doc.get(GENERATION_FIELD) {
                None | Some(Value::Null) => true,
                Some(v) => v.as_u64().is_some(),
            };
            id && keys && generation
        }
        _ => false,
    };
    let c = match parsed {
        Ok(c) => c,
        Err(e) => {
            check!(!model_ok, "a credential the schema allows was refused: {e}");
            return Ok(false);
        }
    };
    check!(model_ok, "a credential the schema refuses was read");
    let bytes = c.to_bytes();
    let again = Credential::parse(&bytes).broken("a written credential does not read")?;
    check!(
        again.same_content(&c),
        "content changed when written and read back"
    );
    check_eq!(again.id(), c.id());
    // The same credential with every value blanked: whatever `Debug` shows more of a value
    // than this one shows, it took from the value.
    let mut blank = Credential::parse(&bytes).broken("read above")?;
    let names: Vec<String> = c.key_names().into_iter().map(str::to_owned).collect();
    for name in &names {
        blank.set_key(name, Secret::new(String::new()));
    }
    let (debug, blanked) = (format!("{c:?}"), format!("{blank:?}"));
    for name in &names {
        if let Some(value) = c.key_value(name).filter(|v| !v.is_empty()) {
            check!(
                debug.matches(value).count() <= blanked.matches(value).count(),
                "Debug shows the value of key {name:?}"
            );
        }
    }
    Ok(true)
}
