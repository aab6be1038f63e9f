//! The methods that concern only the connection: `hello` and `unsubscribe`.

use serde::{Deserialize, Serialize};

/// `hello`: which client and plugin this is, and the protocol it speaks.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hello {
    /// The client's name and version, for the log.
    #[serde(default)]
    pub client: Option<String>,
    /// The plugin whose grant binds this connection (`[plugins.NAME]` in the config).
    #[serde(default)]
    pub plugin: Option<String>,
    /// The protocol version the client speaks.
    #[serde(default)]
    pub protocol: Option<u64>,
}

/// `unsubscribe`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Unsubscribe {
    /// One of this connection's subscriptions.
    pub subscription: u64,
}

/// `unsubscribe`'s result.
#[derive(Serialize)]
pub struct Unsubscribed {
    /// `false`: there was no such open subscription.
    pub unsubscribed: bool,
}

/// `hello`'s result.
#[derive(Serialize)]
pub struct Welcome<'a> {
    /// `holdfast`.
    pub server: &'static str,
    /// The daemon's version.
    pub version: &'static str,
    /// The protocol it speaks.
    pub protocol: u64,
    /// This connection's number (as in the daemon's log).
    pub connection: u64,
    /// The methods this connection may call.
    pub methods: Vec<&'static str>,
    /// The grant bound to this connection.
    pub grant: Grant<'a>,
    /// The daemon's data directory.
    pub data_dir: &'a std::path::Path,
    /// The longest request line it reads, in bytes (without the newline): a client refuses a
    /// longer one unsent, since the daemon answers it by closing the connection.
    pub max_frame_bytes: usize,
}

/// The grant in `hello`'s result.
#[derive(Serialize)]
pub struct Grant<'a> {
    /// The plugin named in `hello`, if any.
    pub plugin: Option<&'a str>,
    /// The stores it may use.
    pub stores: Vec<String>,
    /// The run patterns its `stream.*`, `checkpoint.*` and `run.*` calls are limited to
    /// (`["*"]`: every run).
    pub runs: Vec<&'a str>,
}
