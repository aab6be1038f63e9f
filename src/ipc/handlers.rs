//! Routing: every request line parsed (or read as a `stream.append`) once, admitted (hello first,
//! a known method, the connection's grant), answered inline when that costs no waiting, else
//! handed to its family — `creds.rs`, `admin.rs`, `streams.rs`, `runs.rs` — plus `hello` and
//! `unsubscribe`, which concern only the connection.

use std::sync::Arc;

use serde_json::Value;
use zeroize::Zeroizing;

use super::protocol::creds::CredCall;
use super::protocol::session::{Grant, Hello, Unsubscribe, Unsubscribed, Welcome};
use super::protocol::streams::{Append, StreamCall};
use super::protocol::{self, result, Call, Id, RpcError, PROTOCOL_VERSION};
use super::reply::Answer;
use super::session::Session;
use crate::config::PluginGrant;
use crate::error::ErrorKind;
use crate::service::Daemon;

pub use crate::api::METHODS;

/// Methods every connection may call whatever its plugin grant: they concern only the
/// connection itself.
const ALWAYS_ALLOWED: &[&str] = &["hello", "unsubscribe"];

/// What a connection's reader does with one request line.
pub enum Routed<'a> {
    /// Already answered: a parse error, `hello`, a refusal, or a read served right here.
    Done(Zeroizing<Vec<u8>>),
    /// Needs the async path (a write, a subscription, a store to open): run [`respond`].
    Async(Id, Call, Arc<PluginGrant>),
    /// An admitted `stream.append`: every one takes [`super::streams::append`].
    Append(Id, Append<'a>),
}

/// Parse a request line once into its typed call, admit it (hello first, method known,
/// grant), and answer it at once when that costs no waiting: everything before `hello`,
/// refusals, and `cred.get` / `cred.exists` of a credential whose file is in the store's file
/// cache and unchanged (an `lstat` and a decryption, ~4 µs, less than a trip to the blocking
/// pool and back, ~13 µs). Anything that could wait on the disk goes to the blocking pool;
/// see docs/design.md.
pub fn route<'a>(daemon: &Daemon, session: &Session, line: &'a [u8]) -> Routed<'a> {
    if let Some((id, a)) = protocol::streams::read_append_line(line) {
        daemon.note_request();
        // Admitted as `admit` would, from the answer `hello` noted (no lock, no lookup).
        if session.may_append() {
            return Routed::Append(id, a);
        }
        let admitted = admit(session, "stream.append")
            .and_then(|g| super::run_scope::admit_run(&g, "stream.append", &a.run_id));
        return match admitted {
            Ok(()) => Routed::Append(id, a),
            Err(e) => {
                super::audit::refused_append(daemon, session, &a.run_id, &e);
                Routed::Done(protocol::response_err(&id, &e))
            }
        };
    }
    let env = match protocol::parse_request(line) {
        Ok(r) => r,
        Err(bad) => return Routed::Done(protocol::response_err(&bad.0, &bad.1)),
    };
    let id = env.id;
    let answer = |id: &Id, r: Result<Value, RpcError>| {
        Routed::Done(match r {
            Ok(v) => protocol::response_ok(id, v),
            Err(e) => protocol::response_err(id, &e),
        })
    };
    if env.method == "hello" {
        let r = protocol::typed::<Hello>(protocol::call::text(env.params)).and_then(|p| {
            let (client, plugin) = (p.client.clone(), p.plugin.clone());
            hello(daemon, session, p).inspect_err(|e| {
                super::audit::hello_refused(
                    daemon,
                    session,
                    client.as_deref(),
                    plugin.as_deref(),
                    e,
                )
            })
        });
        return answer(&id, r);
    }
    daemon.note_request();
    let grant = match admit(session, &env.method) {
        Ok(g) => g,
        Err(e) => {
            super::audit::refused(daemon, session, &env.method, env.params, &e);
            return answer(&id, Err(e));
        }
    };
    // An admitted method is one of ours (never the client's text); the params are not logged.
    tracing::trace!(conn = session.id, method = %env.method, "request");
    let call = match Call::parse(&env.method, env.params) {
        Ok(c) => c,
        Err(e) => {
            super::audit::unparsed(daemon, session, &env.method, env.params, &e);
            return answer(&id, Err(e));
        }
    };
    if let Err(e) = super::run_scope::admit(&grant, &call) {
        super::audit::refused(daemon, session, &env.method, env.params, &e);
        return answer(&id, Err(e));
    }
    match call {
        Call::Stream(StreamCall::Append(a)) => Routed::Append(id, a),
        Call::Cred(c @ (CredCall::Get(_) | CredCall::Exists(_)))
            if super::audit::inline_ok(daemon) =>
        {
            // Answered here only once its audit record is written (ipc/audit.rs).
            match super::creds::read_inline(daemon, &grant, &c, &id)
                .and_then(|reply| super::audit::answer_inline(daemon, session, &c, &id, reply))
            {
                Some(reply) => Routed::Done(reply),
                None => Routed::Async(id, Call::Cred(c), grant),
            }
        }
        call => Routed::Async(id, call, grant),
    }
}

/// Run an admitted call on the async path and send its answer. A durable credential write is
/// answered by the blocking-pool thread that made it durable (see [`Answer`]); every other
/// call, by this task once its result is ready.
pub async fn respond(
    daemon: &Arc<Daemon>,
    session: &Arc<Session>,
    id: Id,
    call: Call,
    grant: Arc<PluginGrant>,
) {
    let (pending, delivered) = super::audit::pending(daemon, &call).unzip();
    let mut answer = Answer::with_audit(id, session, pending);
    if answer.audits_a_change() && !matches!(call, Call::Cred(_)) {
        // An admin change's `begun` record is synced before it starts (a credential write's
        // is written on the pool thread that makes it: `creds::write_and_answer`).
        let mut a = answer;
        let begun = tokio::task::spawn_blocking(move || {
            let r = a.begin();
            (a, r)
        })
        .await;
        let Ok((a, r)) = begun else { return };
        answer = a;
        if let Err(e) = r {
            return answer.send(Err(e));
        }
    }
    let result = match call {
        Call::Cred(c) => {
            super::creds::dispatch(daemon, session, c, grant, answer).await;
            if let Some(delivered) = delivered {
                let _ = delivered.await;
            }
            return;
        }
        Call::Stream(c) => super::streams::dispatch(daemon, session, c, &grant).await,
        Call::Run(c) => super::runs::dispatch(daemon, c, &grant).await,
        Call::Admin(c) => super::admin::dispatch(daemon, c, grant).await,
        Call::Unsubscribe(p) => unsubscribe(session, p),
        // Answered by `route` before admission (a second one is refused there).
        Call::Hello(_) => Err(RpcError::method_not_found("hello")),
    };
    answer.send(result);
    // The answer may wait for its audit record: the request holds its in-flight slot until
    // the answer left.
    if let Some(delivered) = delivered {
        let _ = delivered.await;
    }
}

/// May this connection call `method`? Its grant if so.
fn admit(session: &Session, method: &str) -> Result<Arc<PluginGrant>, RpcError> {
    if !METHODS.contains(&method) || method == "hello" {
        return Err(RpcError::method_not_found(method));
    }
    let Some(grant) = session.grant() else {
        return Err(RpcError::invalid_request(
            "send `hello` first (it says which protocol you speak and binds a plugin grant)",
        ));
    };
    if !ALWAYS_ALLOWED.contains(&method) && !grant.allows_method(method) {
        return Err(RpcError::new(
            ErrorKind::Forbidden,
            format!("this connection's plugin grant does not include {method}"),
        ));
    }
    Ok(grant)
}

fn hello(daemon: &Daemon, session: &Session, p: Hello) -> Result<Value, RpcError> {
    if session.grant().is_some() {
        // A connection bound to a plugin's grant must not rebind itself to a wider one.
        return Err(RpcError::invalid_request(
            "hello was already sent on this connection; open a new connection to bind another plugin",
        ));
    }
    if let Some(v) = p.protocol {
        if v != PROTOCOL_VERSION {
            return Err(RpcError::new(
                ErrorKind::Unsupported,
                format!("this server speaks protocol {PROTOCOL_VERSION}, not {v}"),
            ));
        }
    }
    let grant = match &p.plugin {
Some(name) => daemon.config().plugins.get(name).map(|g| g.bound_as(name)).ok_or_else(|| {
            // Not echoed: the name is the client's text.
            RpcError::new(
                ErrorKind::Forbidden,
                "no such plugin in the config file; ask the user to declare it under [plugins.NAME]",
            )
        })?,
        None if daemon.config().require_plugin => {
            return Err(RpcError::new(
                ErrorKind::Forbidden,
                "this daemon requires every client to name its plugin in hello {plugin}",
            ))
        }
        None => PluginGrant::all(),
    };
    let stores: Vec<String> = daemon
        .stores()
        .into_iter()
        .map(|(n, _)| n)
        .filter(|s| grant.allows_store(s))
        .collect();
    let methods: Vec<&str> = METHODS
        .iter()
        .copied()
        .filter(|m| ALWAYS_ALLOWED.contains(m) || grant.allows_method(m))
        .collect();
    // The append fast path skips the grant only when nothing in it can refuse an append.
    let appends = methods.contains(&"stream.append") && grant.covers_every_run();
    let grant = Arc::new(grant);
    session.bind(Arc::clone(&grant), appends);
    session.name(p.client.as_deref(), p.plugin.as_deref());
    let shown = |s: &Option<String>| s.as_deref().map(|s| s.chars().take(64).collect::<String>());
    if p.client.as_deref() == Some(crate::limits::WATCHDOG_CLIENT) {
        // The daemon's own liveness probe, every few seconds: not worth a journal line each.
        tracing::debug!(conn = session.id, "hello from the watchdog probe");
    } else {
        tracing::info!(conn = session.id, client = ?shown(&p.client), plugin = ?shown(&p.plugin), "hello");
    }
    result(&Welcome {
        server: "holdfast",
        version: env!("CARGO_PKG_VERSION"),
        protocol: PROTOCOL_VERSION,
        connection: session.id,
        methods,
        grant: Grant {
            plugin: p.plugin.as_deref(),
            stores,
            runs: grant.run_patterns(),
        },
        data_dir: daemon.data_dir(),
        max_frame_bytes: daemon.config().limits().max_frame,
    })
}

/// `unsubscribe`: close one of this connection's subscriptions. Once answered, no event of it
/// follows (see `subscriptions.rs`). `unsubscribed: false`: there was no such open
/// subscription (a run's subscription ends by itself with `finish`).
fn unsubscribe(session: &Session, p: Unsubscribe) -> Result<Value, RpcError> {
    result(&Unsubscribed {
        unsubscribed: session.subscriptions.close(p.subscription),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};
    use std::os::unix::net::UnixStream;

    use crate::ipc::conn::Conn;

    /// A handler that panics on the blocking pool drops its `Answer` unsent: the client still
    /// gets exactly one answer for that request (an internal error with its id), and the
    /// connection goes on answering the next one.
    #[test]
    fn an_answer_dropped_unsent_still_answers_with_an_error() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        let session = Session::for_test(1, Arc::new(Conn::from_std(ours)));
        let answer = Answer::with_audit(serde_json::json!(7), &session, None);
        let panicked = std::thread::spawn(move || {
            let _answer = answer;
            panic!("a handler failed (this panic is the test)");
        })
        .join();
        assert!(panicked.is_err());
        Answer::with_audit(serde_json::json!(8), &session, None)
            .send(Ok(serde_json::json!({"ok": true})));
        let mut lines = BufReader::new(theirs).lines();
        let first: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
        assert_eq!(first["id"], 7, "{first}");
        let message = first["error"]["message"].as_str().unwrap();
        assert!(message.starts_with("internal error"), "{first}");
        let second: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
        assert_eq!(second["id"], 8, "{second}");
        assert_eq!(second["result"]["ok"], true, "{second}");
        println!("a dropped answer: {message}");
    }
}
