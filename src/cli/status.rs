//! `holdfast status`: the daemon's state, or the store's when no daemon answers.

use serde_json::{json, Value};

use super::{out, out_json, CliResult, Global};
use crate::store::OpenMode;

/// Show status.
pub fn run(g: &Global) -> CliResult {
    if let Some(mut client) = g.daemon()? {
        let s = client.call("admin.status", json!({}))?;
        if g.json {
            out_json(&s);
            return Ok(());
        }
        let get = |k: &str| s.get(k).cloned().unwrap_or(Value::Null);
        let streaming = match get("lane_connections").as_u64().unwrap_or(0) {
            0 => String::new(),
            n => format!(", {n} streaming"),
        };
        out(format!(
            "daemon: running (pid {}, version {}, up {} s, {} connection(s){streaming})",
            get("pid"),
            get("version").as_str().unwrap_or("?"),
            get("uptime_ms").as_u64().unwrap_or(0) / 1000,
            get("connections")
        ));
        out(format!("socket: {}", get("socket").as_str().unwrap_or("?")));
        out(format!(
            "data dir: {}",
            get("data_dir").as_str().unwrap_or("?")
        ));
        for st in get("stores").as_array().into_iter().flatten() {
            let name = st["name"].as_str().unwrap_or("?");
            let state = if let Some(e) = st.get("error").and_then(Value::as_str) {
                format!("error: {e}")
            } else if st["sealed"].as_bool() == Some(true) {
                format!("SEALED: {}", st["sealed_reason"].as_str().unwrap_or(""))
            } else {
                format!(
                    "unsealed, {} credential(s), key {}",
                    st["credentials"],
                    st["key_fingerprints"][0].as_str().unwrap_or("?")
                )
            };
            out(format!("store {name}: {state}"));
        }
        let audit = get("audit");
        out(match audit.get("dir").and_then(Value::as_str) {
            None => "audit log: off ([audit] enabled = false)".to_string(),
            Some(dir) => match audit["refusing"].as_str() {
                Some(why) => format!(
                    "audit log: {dir}: REFUSING every credential operation until a restart ({why})"
                ),
                None => format!(
                    "audit log: {dir} ({})",
                    audit["durability"].as_str().unwrap_or("?")
                ),
            },
        });
        return Ok(());
    }
    let store = g.open(OpenMode::ReadOnly);
    let socket = g.socket_path()?;
    match store {
        Ok(store) => {
            let files = store.file_count()?;
            let fp = store
                .key_fingerprints()
                .first()
                .cloned()
                .unwrap_or_default();
            if g.json {
                out_json(&json!({
                    "daemon": "not running",
                    "socket": socket,
                    "store": store.config().name,
                    "path": store.config().base,
                    "credentials": files,
                    "key_fingerprint": fp,
                }));
            } else {
                out(format!(
                    "daemon: not running (no answer on {})",
                    socket.display()
                ));
                out(format!(
                    "store {}: unsealed, {files} credential(s), key {fp} ({})",
                    store.config().name,
                    store.config().base.display()
                ));
            }
            Ok(())
        }
        Err(e) => {
            if !g.json {
                out(format!(
                    "daemon: not running (no answer on {})",
                    socket.display()
                ));
            }
            Err(e)
        }
    }
}
