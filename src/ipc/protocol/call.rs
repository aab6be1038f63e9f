//! Every method with its typed params: [`Call::parse`] reads a request's params once, from
//! their text, into the method's params type (`creds.rs`, `admin.rs`, `streams.rs`, `runs.rs`,
//! `session.rs`). The method list the daemon serves is [`crate::api::METHODS`]; a test keeps
//! the two the same.

use serde_json::value::RawValue;

use super::admin::AdminCall;
use super::creds::CredCall;
use super::runs::RunCall;
use super::session::{Hello, Unsubscribe};
use super::streams::StreamCall;
use super::{typed, RpcError};

/// A request's method and its typed params.
#[derive(Debug)]
pub enum Call {
    /// `hello`.
    Hello(Hello),
    /// `unsubscribe`.
    Unsubscribe(Unsubscribe),
    /// `cred.*`.
    Cred(CredCall),
    /// `admin.*`.
    Admin(AdminCall),
    /// `stream.*`, `checkpoint.*`.
    Stream(StreamCall),
    /// `run.*`.
    Run(RunCall),
}

impl Call {
    /// `method`'s params read from `params`, the raw text of an object (`None`: `{}`).
    /// An unknown method is `method_not_found`; params that do not fit are `invalid_params`.
    pub fn parse(method: &str, params: Option<&RawValue>) -> Result<Call, RpcError> {
        use AdminCall as A;
        use CredCall as C;
        use RunCall as R;
        use StreamCall as S;
        let p = text(params);
        Ok(match method {
            "hello" => Call::Hello(typed(p)?),
            "unsubscribe" => Call::Unsubscribe(typed(p)?),
            "cred.get" => Call::Cred(C::Get(typed(p)?)),
            "cred.exists" => Call::Cred(C::Exists(typed(p)?)),
            "cred.set" => Call::Cred(C::Set(typed(p)?)),
            "cred.delete" => Call::Cred(C::Delete(typed(p)?)),
            "cred.list" => Call::Cred(C::List(typed(p)?)),
            "cred.watch" => Call::Cred(C::Watch(typed(p)?)),
            "cred.refresh_lease" => Call::Cred(C::RefreshLease(typed(p)?)),
            "cred.release_lease" => Call::Cred(C::ReleaseLease(typed(p)?)),
            "admin.status" => Call::Admin(A::Status(typed(p)?)),
            "admin.fsck" => Call::Admin(A::Fsck(typed(p)?)),
            "admin.reindex" => Call::Admin(A::Reindex(typed(p)?)),
            "admin.rotate_key" => Call::Admin(A::RotateKey(typed(p)?)),
            "admin.prune_keys" => Call::Admin(A::PruneKeys(typed(p)?)),
            "stream.begin" => Call::Stream(S::Begin(typed(p)?)),
            "stream.append" => Call::Stream(S::Append(super::streams::append_params(p)?)),
            "stream.interrupt" => Call::Stream(S::Interrupt(typed(p)?)),
            "stream.resume" => Call::Stream(S::Resume(typed(p)?)),
            "stream.commit" => Call::Stream(S::Commit(typed(p)?)),
            "stream.abort" => Call::Stream(S::Abort(typed(p)?)),
            "stream.subscribe" => Call::Stream(S::Subscribe(typed(p)?)),
            "stream.get" => Call::Stream(S::Get(typed(p)?)),
            "stream.list" => Call::Stream(S::List(typed(p)?)),
            "checkpoint.put" => Call::Stream(S::CheckpointPut(typed(p)?)),
            "checkpoint.get" => Call::Stream(S::CheckpointGet(typed(p)?)),
            "checkpoint.delete" => Call::Stream(S::CheckpointDelete(typed(p)?)),
            "run.log_node" => Call::Run(R::LogNode(typed(p)?)),
            "run.ensure_node" => Call::Run(R::EnsureNode(typed(p)?)),
            "run.log_step" => Call::Run(R::LogStep(typed(p)?)),
            "run.tool_begin" => Call::Run(R::ToolBegin(typed(p)?)),
            "run.tool_end" => Call::Run(R::ToolEnd(typed(p)?)),
            "run.end" => Call::Run(R::End(typed(p)?)),
            "run.start" => Call::Run(R::Start(typed(p)?)),
            "run.get" => Call::Run(R::Get(typed(p)?)),
            "run.list" => Call::Run(R::List(typed(p)?)),
            "run.prune" => Call::Run(R::Prune(typed(p)?)),
            other => return Err(RpcError::method_not_found(other)),
        })
    }

    /// The method's name.
    pub fn method(&self) -> &'static str {
        use AdminCall as A;
        use CredCall as C;
        use RunCall as R;
        use StreamCall as S;
        match self {
            Call::Hello(_) => "hello",
            Call::Unsubscribe(_) => "unsubscribe",
            Call::Cred(c) => match c {
                C::Get(_) => "cred.get",
                C::Exists(_) => "cred.exists",
                C::Set(_) => "cred.set",
                C::Delete(_) => "cred.delete",
                C::List(_) => "cred.list",
                C::Watch(_) => "cred.watch",
                C::RefreshLease(_) => "cred.refresh_lease",
                C::ReleaseLease(_) => "cred.release_lease",
            },
            Call::Admin(a) => match a {
                A::Status(_) => "admin.status",
                A::Fsck(_) => "admin.fsck",
                A::Reindex(_) => "admin.reindex",
                A::RotateKey(_) => "admin.rotate_key",
                A::PruneKeys(_) => "admin.prune_keys",
            },
            Call::Stream(s) => match s {
                S::Begin(_) => "stream.begin",
                S::Append(_) => "stream.append",
                S::Interrupt(_) => "stream.interrupt",
                S::Resume(_) => "stream.resume",
                S::Commit(_) => "stream.commit",
                S::Abort(_) => "stream.abort",
                S::Subscribe(_) => "stream.subscribe",
                S::Get(_) => "stream.get",
                S::List(_) => "stream.list",
                S::CheckpointPut(_) => "checkpoint.put",
                S::CheckpointGet(_) => "checkpoint.get",
                S::CheckpointDelete(_) => "checkpoint.delete",
            },
            Call::Run(r) => match r {
                R::LogNode(_) => "run.log_node",
                R::EnsureNode(_) => "run.ensure_node",
                R::LogStep(_) => "run.log_step",
                R::ToolBegin(_) => "run.tool_begin",
                R::ToolEnd(_) => "run.tool_end",
                R::End(_) => "run.end",
                R::Start(_) => "run.start",
                R::Get(_) => "run.get",
                R::List(_) => "run.list",
                R::Prune(_) => "run.prune",
            },
        }
    }
}

impl Call {
    /// The run the call names, if it names one: what a grant's `runs` admits
    /// (`ipc::run_scope`). Exhaustive on purpose: a method added later must say here whether
    /// it names a run. `stream.list`, `run.list` and `run.prune` name none; they enumerate
    /// runs, and their handlers keep to the grant's.
    pub fn run_id(&self) -> Option<&str> {
        use RunCall as R;
        use StreamCall as S;
        match self {
            Call::Hello(_) | Call::Unsubscribe(_) | Call::Cred(_) | Call::Admin(_) => None,
            Call::Stream(s) => match s {
                S::Begin(p) => Some(&p.run_id),
                S::Append(p) => Some(&p.run_id),
                S::Interrupt(p) => Some(&p.run_id),
                S::Resume(p) => Some(&p.run_id),
                S::Commit(p) => Some(&p.run_id),
                S::Abort(p) => Some(&p.run_id),
                S::Subscribe(p) => Some(&p.run_id),
                S::Get(p) | S::CheckpointGet(p) | S::CheckpointDelete(p) => Some(&p.run_id),
                S::CheckpointPut(p) => Some(&p.run_id),
                S::List(_) => None,
            },
            Call::Run(r) => match r {
                R::LogNode(p) => Some(&p.run_id),
                R::EnsureNode(p) => Some(&p.run_id),
                R::LogStep(p) => Some(&p.run_id),
                R::ToolBegin(p) => Some(&p.run_id),
                R::ToolEnd(p) => Some(&p.run_id),
                R::End(p) => Some(&p.run_id),
                R::Start(p) => Some(&p.run_id),
                R::Get(p) => Some(&p.run_id),
                R::List(_) | R::Prune(_) => None,
            },
        }
    }
}

/// The params' text: `{}` when absent or null.
pub fn text(params: Option<&RawValue>) -> &str {
    params.map_or("{}", RawValue::get)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{codes, METHODS};
    use serde_json::{json, Value};

    /// Params every method accepts (the required fields of each family, plus what one method
    /// needs on top).
    fn sample(method: &str) -> Value {
        match method {
            "unsubscribe" => json!({"subscription": 1}),
            "cred.set" => json!({"id": "x", "value": "v"}),
            "cred.refresh_lease" => json!({"id": "x", "ttl_ms": 1}),
            m if m.starts_with("cred.") && !matches!(m, "cred.list" | "cred.watch") => {
                json!({"id": "x"})
            }
            "stream.begin" | "stream.resume" | "stream.get" | "checkpoint.get"
            | "checkpoint.delete" | "run.get" | "run.start" | "stream.subscribe" => {
                json!({"run_id": "r"})
            }
            "stream.append" => json!({"run_id": "r", "stream_id": "s", "seq": 1,
                "events": [{"type": "text", "text": "hi"}]}),
            "stream.interrupt" => json!({"run_id": "r", "stream_id": "s", "cause": {}}),
            "stream.commit" => json!({"run_id": "r", "stream_id": "s", "final_message": {}}),
            "stream.abort" => json!({"run_id": "r", "stream_id": "s"}),
            "checkpoint.put" => json!({"run_id": "r", "snapshot": {}}),
            "run.log_node" => json!({"run_id": "r", "detail": {}}),
            "run.ensure_node" => json!({"run_id": "r", "node_id": "n"}),
            "run.log_step" => json!({"run_id": "r", "step": {}}),
            "run.tool_begin" => json!({"run_id": "r", "tool_call_id": "t", "name": "n"}),
            "run.tool_end" => json!({"run_id": "r", "tool_call_id": "t"}),
            "run.end" => json!({"run_id": "r", "status": "success"}),
            "run.prune" => json!({"older_than_days": 1}),
            _ => json!({}),
        }
    }

    #[test]
    fn every_method_served_has_typed_params_and_no_other() {
        for m in METHODS {
            let text = sample(m).to_string();
            let raw = RawValue::from_string(text).unwrap();
            let call = Call::parse(m, Some(&raw)).unwrap_or_else(|e| panic!("{m}: {e:?}"));
            assert_eq!(call.method(), *m);
            // An unknown field is refused, for every method.
            let mut extra = sample(m);
            extra["sk-unknown"] = json!(1);
            let raw = RawValue::from_string(extra.to_string()).unwrap();
            let e = Call::parse(m, Some(&raw)).unwrap_err();
            assert_eq!(e.code, codes::INVALID_PARAMS, "{m}");
            assert!(!e.message.contains("sk-unknown"), "{m}: {}", e.message);
        }
        let e = Call::parse("cred.steal", None).unwrap_err();
        assert_eq!(e.code, codes::METHOD_NOT_FOUND);
        // A field given twice is refused, not read as its last value.
        let twice = RawValue::from_string(r#"{"id":"a","id":"sk-b"}"#.into()).unwrap();
        let e = Call::parse("cred.get", Some(&twice)).unwrap_err();
        assert_eq!(e.code, codes::INVALID_PARAMS);
        assert!(e.message.contains("duplicate field"), "{}", e.message);
        assert!(!e.message.contains("sk-b"), "{}", e.message);
    }

    /// What a grant's `runs` checks: every `stream.*`, `checkpoint.*` and `run.*` method names
    /// its run, except the three that enumerate runs (their handlers filter instead).
    #[test]
    fn every_method_of_the_run_families_but_the_listings_names_its_run() {
        for m in METHODS {
            let raw = RawValue::from_string(sample(m).to_string()).unwrap();
            let call = Call::parse(m, Some(&raw)).unwrap();
            let family = m.split_once('.').map(|(f, _)| f);
            let names_a_run = matches!(family, Some("stream" | "checkpoint" | "run"))
                && !matches!(*m, "stream.list" | "run.list" | "run.prune");
            assert_eq!(call.run_id(), names_a_run.then_some("r"), "{m}");
        }
    }

    #[test]
    fn an_append_reads_its_events_typed_or_keeps_them_for_the_streams_to_judge() {
        use super::super::streams::Events;
        let ok = RawValue::from_string(sample("stream.append").to_string()).unwrap();
        let Call::Stream(StreamCall::Append(a)) = Call::parse("stream.append", Some(&ok)).unwrap()
        else {
            panic!("not an append")
        };
        assert!(matches!(a.events, Events::Checked(ref e) if e.len() == 1));
        // A null field the typed reader does not take: kept for Event::parse to judge.
        let odd = json!({"run_id": "r", "stream_id": "s", "seq": 1,
            "events": [{"type": "text", "text": "hi", "id": null}]});
        let odd = RawValue::from_string(odd.to_string()).unwrap();
        let Call::Stream(StreamCall::Append(a)) = Call::parse("stream.append", Some(&odd)).unwrap()
        else {
            panic!("not an append")
        };
        assert!(matches!(a.events, Events::Unchecked(ref e) if e.len() == 1));
        assert_eq!((&*a.run_id, &*a.stream_id, a.seq), ("r", "s", 1));
        // Many events, typed in order as they are read (the events' Vec grows past its
        // one-event start); one bad event anywhere sends them all the general way, none lost.
        let text = |i: usize| json!({"type": "text", "text": format!("t{i} \" é")});
        for n in [0, 1, 2, 5, 40] {
            let events: Vec<Value> = (0..n).map(text).collect();
            let line = json!({"jsonrpc": "2.0", "id": 7, "method": "stream.append",
                "params": {"run_id": "r", "stream_id": "s", "seq": 1, "events": events}})
            .to_string();
            let (_, a) = super::super::streams::read_append_line(line.as_bytes()).unwrap();
            let Events::Checked(got) = a.events else {
                panic!("{n} events not typed")
            };
            let want: Vec<String> = (0..n).map(|i| format!("t{i} \" é")).collect();
            let texts: Vec<&str> = got
                .iter()
                .map(|e| match e {
                    crate::streams::Event::Text(t) => t.as_str(),
                    other => panic!("{other:?}"),
                })
                .collect();
            assert_eq!(texts, want, "{n} events");
            for bad_at in 0..n.min(3) {
                let mut events = events.clone();
                events[bad_at]["id"] = Value::Null;
                let params = json!({"run_id": "r", "stream_id": "s", "seq": 1, "events": events});
                let line = json!({"jsonrpc": "2.0", "id": 7, "method": "stream.append",
                    "params": params})
                .to_string();
                assert!(super::super::streams::read_append_line(line.as_bytes()).is_none());
                let raw = RawValue::from_string(params.to_string()).unwrap();
                let Call::Stream(StreamCall::Append(a)) =
                    Call::parse("stream.append", Some(&raw)).unwrap()
                else {
                    panic!("not an append")
                };
                assert!(
                    matches!(a.events, Events::Unchecked(ref e) if e.len() == n),
                    "{n} events, bad at {bad_at}"
                );
            }
        }
    }
}
