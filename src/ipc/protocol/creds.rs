//! `cred.*` on the wire: each method's params, read once from the request's text, and the
//! results the handlers build.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A `cred.*` call with its typed params.
#[derive(Debug)]
pub enum CredCall {
    /// `cred.get`.
    Get(ById),
    /// `cred.exists`.
    Exists(ById),
    /// `cred.set`.
    Set(Set),
    /// `cred.delete`.
    Delete(ById),
    /// `cred.list`.
    List(StoreOnly),
    /// `cred.watch`.
    Watch(StoreOnly),
    /// `cred.refresh_lease`.
    RefreshLease(Lease),
    /// `cred.release_lease`.
    ReleaseLease(ById),
}

/// One credential of a store (`store` absent: the default store).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ById {
    /// The store's name.
    #[serde(default)]
    pub store: Option<String>,
    /// The credential's id.
    pub id: String,
}

/// A store (absent: the default store).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreOnly {
    /// The store's name.
    #[serde(default)]
    pub store: Option<String>,
}

/// `cred.set`: a full credential document, or the shorthand `{id, value}`. Its `Debug` names
/// the fields given, never their values.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Set {
    /// The store's name.
    #[serde(default)]
    pub store: Option<String>,
    /// `{id, keys: {name: {value, expires_at?}}, …}`.
    #[serde(default)]
    pub credential: Option<Value>,
    /// The shorthand's id.
    #[serde(default)]
    pub id: Option<String>,
    /// The shorthand's secret (must be a string).
    #[serde(default)]
    pub value: Option<Value>,
    /// Compare-and-set: write only if the credential is at this generation (0: absent).
    #[serde(default)]
    pub if_generation: Option<u64>,
    /// Store the document's own `updated_at` instead of the write's time (hive's storage
    /// keeps what its caller saved).
    #[serde(default)]
    pub keep_updated_at: bool,
}

impl std::fmt::Debug for Set {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Set")
            .field("store", &self.store)
            .field(
                "credential",
                &self.credential.as_ref().map(|_| "<redacted>"),
            )
            .field("id", &self.id)
            .field("value", &self.value.as_ref().map(|_| "<redacted>"))
            .field("if_generation", &self.if_generation)
            .field("keep_updated_at", &self.keep_updated_at)
            .finish()
    }
}

/// `cred.refresh_lease`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lease {
    /// The store's name.
    #[serde(default)]
    pub store: Option<String>,
    /// The credential's id.
    pub id: String,
    /// How long the lease holds, in ms.
    pub ttl_ms: u64,
}

/// `cred.exists`.
#[derive(Serialize)]
pub struct Exists {
    /// Whether the credential exists.
    pub exists: bool,
}

/// `cred.set`.
#[derive(Serialize)]
pub struct Written {
    /// The credential's id.
    pub id: String,
    /// Its new generation.
    pub generation: u64,
}

/// `cred.delete`.
#[derive(Serialize)]
pub struct Deleted {
    /// Whether there was a credential to delete.
    pub deleted: bool,
}

/// `cred.list`: each credential's id, generation and its metadata's fields.
#[derive(Serialize)]
pub struct Listing {
    /// The readable credentials.
    pub credentials: Vec<serde_json::Map<String, Value>>,
    /// How many credential files could not be read.
    pub unreadable: usize,
    /// How many credentials are not listed because their ids break holdfast's rules (another
    /// program made them; `admin.fsck` names their files).
    pub refused_ids: usize,
}

/// `cred.release_lease`.
#[derive(Serialize)]
pub struct Released {
    /// Whether this connection held the lease.
    pub released: bool,
}

/// `cred.watch`: the new subscription (`unsubscribe` ends it).
#[derive(Serialize)]
pub struct Subscribed {
    /// The subscription's number on this connection.
    pub subscription: u64,
}

/// A `cred.watch` event: a credential written or deleted.
#[derive(Serialize)]
pub struct ChangedEvent<'a> {
    /// The watch's subscription.
    pub subscription: u64,
    /// `cred.changed`.
    #[serde(rename = "type")]
    pub kind: &'a str,
    /// The store.
    pub store: &'a str,
    /// The credential.
    pub id: &'a str,
    /// Its new generation (`None`: deleted).
    pub generation: Option<u64>,
    /// Whether it was deleted.
    pub deleted: bool,
    /// `daemon` (written through the socket) or `external` (another process).
    pub source: &'a str,
}

/// A `cred.watch` event: a refresh lease ended without a write (`lease.released`).
#[derive(Serialize)]
pub struct LeaseEvent<'a> {
    /// The watch's subscription.
    pub subscription: u64,
    /// `lease.released`.
    #[serde(rename = "type")]
    pub kind: &'a str,
    /// The store.
    pub store: &'a str,
    /// The credential.
    pub id: &'a str,
    /// `released` or `holder_disconnected`.
    pub reason: &'a str,
}

/// A `cred.watch` event: this watcher fell behind and missed events; it should list again.
#[derive(Serialize)]
pub struct ResyncEvent {
    /// The watch's subscription.
    pub subscription: u64,
    /// `resync`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// How many events were dropped.
    pub missed: u64,
    /// What to do.
    pub hint: &'static str,
}
