//! SECURITY-CHECKLIST item 15: fuzz the frame decoder and the request parser, on stable Rust.
//!
//! cargo-fuzz needs nightly (its sanitizers); this is a plain integration test instead, run by
//! every `cargo test`, in three stages:
//!
//! 1. **Corpus replay.** Every file in `tests/corpus/protocol/` (one seed per file; `crash-*`
//!    files are inputs that once broke an invariant) goes through
//!    `holdfast::ipc::protocol::parse_request` and through `holdfast::ipc::frame::FrameReader`
//!    (in-memory readers handing out 1..64-byte chunks behind a `BufReader` of 1..64 bytes, and
//!    a tokio duplex pipe), with frame caps at every line's length boundary, alone and joined
//!    with its neighbours into multi-line inputs.
//! 2. **Mutation fuzzing.** A deterministic xorshift RNG (seed printed; set
//!    `HOLDFAST_FUZZ_SEED=0x…` to replay a run) mutates seeds: bit flips, interesting bytes,
//!    insertions, deletions, duplications, splices between seeds, dictionary tokens, value
//!    swaps, repeated nesting, truncation. `HOLDFAST_FUZZ_ITERS` multi-line inputs (default
//!    100,000: ~10 s in a debug build on 2 cores; split over 2 threads, a fixed number so a seed
//!    replays the same inputs anywhere) go through the same checks.
//! 3. **The daemon.** `HOLDFAST_FUZZ_DAEMON_ITERS` mutated inputs (default 2,000) go, line by
//!    line, to a real `holdfast daemon` (frame cap lowered to 4096 bytes) over one connection
//!    (re-opened only when the daemon closes it). Every line must get exactly one response line
//!    (event notifications aside) or, if it is over the cap, one error line and the close;
//!    the daemon must stay up: a fresh client's `admin.status` answers at the end, SIGTERM exits
//!    0, and its log has no panic.
//!
//! Invariants:
//! - nothing panics;
//! - `parse_request` agrees with an independent reading of the same bytes (`serde_json::Value`
//!   plus the JSON-RPC 2.0 rules): `Ok` exactly when the line is a well-formed request, with
//!   the same id, method and params (absent/null params become `{}`), and a request rebuilt
//!   from the result parses to the same result; an `Err` carries one of the codes the line's
//!   faults allow and the request's id when it had a valid one (null otherwise), and its error
//!   line (`protocol::response_err`) is one line of JSON: `jsonrpc` "2.0", that id, a known
//!   code, a short message (never the client's text), and `data.kind` one of the stable kinds
//!   and the one its code stands for;
//! - `FrameReader` never yields a line longer than its cap; it yields exactly the input's lines
//!   (without `\n` or `\r\n`) while they fit, then `TooLong { max }` at the first that does not
//!   (a partial line at EOF: `Truncated`, or `TooLong` once it cannot fit any more), and
//!   `Ok(None)` at a clean end;
//! - the daemon answers a line `parse_request` refuses with exactly `response_err` of that
//!   refusal, and a request with its id, exactly one of `result`/`error`, an error in the
//!   stable shape, and `-32601` exactly for methods outside `METHODS`.
//!
//! An input that breaks an invariant is written to `tests/corpus/protocol/crash-<sha256[..16]>`
//! (parse and frame failures shrunk first) so that every later run replays it, and the test
//! fails. (Numbers are compared within a few ULP: see [`same_json`].)
// Test code: fixtures are made directly, and a panic is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

#[allow(dead_code)] // each test binary uses only some of the shared helpers
mod common;

use std::collections::BTreeMap;
use std::io::{self, BufRead, BufReader, ErrorKind as IoErrorKind, Write};
use std::os::unix::net::UnixStream;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use holdfast::ipc::frame::{FrameError, FrameReader};
use holdfast::ipc::handlers::METHODS;
use holdfast::ipc::protocol::{self, codes, kind_for};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncWriteExt, ReadBuf};

use common::DaemonEnv;

/// The wire's `data.kind` strings: a public contract (never renamed), hence spelled out here.
const STABLE_KINDS: [&str; 9] = [
    "invalid_params",
    "not_found",
    "conflict",
    "forbidden",
    "sealed",
    "integrity",
    "storage",
    "busy",
    "unsupported",
];

/// Every code the server may send.
const KNOWN_CODES: [i64; 13] = [
    codes::PARSE_ERROR,
    codes::INVALID_REQUEST,
    codes::METHOD_NOT_FOUND,
    codes::INVALID_PARAMS,
    codes::INTERNAL,
    codes::NOT_FOUND,
    codes::CONFLICT,
    codes::FORBIDDEN,
    codes::SEALED,
    codes::INTEGRITY,
    codes::STORAGE,
    codes::BUSY,
    codes::UNSUPPORTED,
];

/// The daemon's frame cap in stage 3 (the long-string seeds cross it).
const DAEMON_MAX_FRAME: usize = 4096;
/// A cap under which every input fits.
const BIG_MAX: usize = 1 << 20;
/// Mutated inputs are cut to this size (bounds the cost of one iteration).
const MAX_INPUT: usize = 128 * 1024;
/// Stage 2 runs on this many threads (fixed, so a seed replays the same inputs anywhere).
const STAGE2_WORKERS: usize = 2;
/// At most this many violations are saved as crash seeds per run.
const MAX_SAVED: usize = 20;

// ---------------------------------------------------------------------------------------------
// RNG

/// xorshift64*: small, fast, deterministic.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform-ish in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// True with probability `num/den`.
    fn chance(&mut self, num: usize, den: usize) -> bool {
        self.below(den) < num
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim().replace('_', "");
    let parsed = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => v.parse(),
    };
    Some(parsed.unwrap_or_else(|e| panic!("{name}={v:?}: {e}")))
}

/// `12345678` → `"12,345,678"`.
fn thousands(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Corpus and crash seeds

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/protocol")
}

fn load_corpus() -> Vec<(String, Vec<u8>)> {
    let mut seeds: Vec<(String, Vec<u8>)> = std::fs::read_dir(corpus_dir())
        .expect("tests/corpus/protocol")
        .map(|e| {
            let e = e.expect("corpus entry");
            let name = e.file_name().to_string_lossy().into_owned();
            (name, std::fs::read(e.path()).expect("read seed"))
        })
        .filter(|(name, _)| !name.starts_with('.'))
        .collect();
    seeds.sort();
    seeds
}

/// A violation: what broke and the input that broke it.
struct Violation {
    stage: &'static str,
    what: String,
    input: Vec<u8>,
    /// For FrameReader violations: the cap and source, to shrink with.
    frame: Option<(usize, Source)>,
}

#[derive(Default)]
struct Found {
    violations: Vec<Violation>,
    panics: usize,
    saved: Vec<PathBuf>,
}

impl Found {
    fn add(&mut self, stage: &'static str, what: String, input: &[u8], panicked: bool) {
        self.add_frame(stage, what, input, panicked, None);
    }

    fn add_frame(
        &mut self,
        stage: &'static str,
        what: String,
        input: &[u8],
        panicked: bool,
        frame: Option<(usize, Source)>,
    ) {
        if panicked {
            self.panics += 1;
        }
        if self.violations.len() < 50 {
            eprintln!(
                "fuzz VIOLATION [{stage}]: {what}\n  input ({} bytes): {}",
                input.len(),
                show(input)
            );
        }
        self.violations.push(Violation {
            stage,
            what,
            input: input.to_vec(),
            frame,
        });
    }

    /// Write each distinct violating input to the corpus as `crash-<hash>` (parse-stage inputs
    /// shrunk first).
    fn save(&mut self) {
        let mut seen = std::collections::BTreeSet::new();
        for v in &self.violations {
            if self.saved.len() >= MAX_SAVED {
                break;
            }
            let input = match (v.stage, v.frame) {
                ("parse_request", _) => shrink(&v.input, |c| check_parse(c).is_err()),
                (_, Some((max, source))) => {
                    let rt = runtime();
                    shrink(&v.input, |c| {
                        let mut rng = Rng::new(1);
                        catch_unwind(AssertUnwindSafe(|| {
                            rt.block_on(check_frames(c, max, source, &mut rng))
                        }))
                        .map_or(true, |r| r.is_err())
                    })
                }
                _ => v.input.clone(),
            };
            let hash: String = Sha256::digest(&input)
                .iter()
                .take(8)
                .map(|b| format!("{b:02x}"))
                .collect();
            if !seen.insert(hash.clone()) {
                continue;
            }
            let path = corpus_dir().join(format!("crash-{hash}"));
            if !path.exists() {
                std::fs::write(&path, &input).expect("write crash seed");
            }
            eprintln!(
                "fuzz: saved the input that broke [{}] ({}) as {}",
                v.stage,
                v.what,
                path.display()
            );
            self.saved.push(path);
        }
    }
}

/// Printable form of an input (cut to 300 bytes).
fn show(input: &[u8]) -> String {
    let cut = &input[..input.len().min(300)];
    let mut s = format!("{:?}", String::from_utf8_lossy(cut));
    if cut.len() < input.len() {
        s.push_str(" …");
    }
    s
}

/// Greedy chunk deletion while `still_breaks` holds.
fn shrink(input: &[u8], still_breaks: impl Fn(&[u8]) -> bool) -> Vec<u8> {
    let mut cur = input.to_vec();
    let mut chunk = cur.len().max(1) / 2;
    let mut budget = 5000;
    while chunk >= 1 && budget > 0 {
        let mut i = 0;
        let mut progressed = false;
        while i < cur.len() && budget > 0 {
            budget -= 1;
            let end = (i + chunk).min(cur.len());
            let mut cand = cur[..i].to_vec();
            cand.extend_from_slice(&cur[end..]);
            if still_breaks(&cand) {
                cur = cand;
                progressed = true;
            } else {
                i += chunk;
            }
        }
        if !progressed {
            chunk /= 2;
        }
    }
    cur
}

// ---------------------------------------------------------------------------------------------
// parse_request: invariants

/// Outcome counts by code (0 = Ok).
type Tally = BTreeMap<i64, usize>;

/// JSON equality, numbers compared within a few ULP: serde_json's default float parser is not
/// correctly rounded, so a float it wrote can read back one ULP off (`1.1844674407370955e20`
/// reads as `…57e20`). That is serde_json's (its `float_roundtrip` feature), not holdfast's.
fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            if x.is_f64() || y.is_f64() {
                match (x.as_f64(), y.as_f64()) {
                    (Some(x), Some(y)) if x == y => true,
                    (Some(x), Some(y)) if x.is_sign_negative() == y.is_sign_negative() => {
                        x.to_bits().abs_diff(y.to_bits()) <= 4
                    }
                    _ => false,
                }
            } else {
                x == y
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_json(x, y))
        }
        (Value::Object(x), Value::Object(y)) => same_map(x, y),
        _ => a == b,
    }
}

fn same_map(x: &Map<String, Value>, y: &Map<String, Value>) -> bool {
    x.len() == y.len()
        && x.iter()
            .all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
}

/// What a request line should parse to, decided without `parse_request`.
enum Oracle {
    /// A well-formed request.
    Request {
        id: Value,
        method: String,
        params: Map<String, Value>,
    },
    /// Not one: the codes its faults allow, and the id the error may carry (besides null).
    Refused { codes: Vec<i64>, id: Option<Value> },
}

fn oracle(line: &[u8]) -> Oracle {
    let Ok(v) = serde_json::from_slice::<Value>(line) else {
        return Oracle::Refused {
            codes: vec![codes::PARSE_ERROR],
            id: readable_id(line),
        };
    };
    let Value::Object(obj) = v else {
        return Oracle::Refused {
            codes: vec![codes::INVALID_REQUEST],
            id: None,
        };
    };
    let mut faults = Vec::new();
    let id = match obj.get("id") {
        Some(id @ (Value::Number(_) | Value::String(_) | Value::Null)) => Some(id.clone()),
        _ => {
            faults.push(codes::INVALID_REQUEST);
            None
        }
    };
    if obj.get("jsonrpc") != Some(&json!("2.0")) {
        faults.push(codes::INVALID_REQUEST);
    }
    let method = match obj.get("method") {
        Some(Value::String(m)) => Some(m.clone()),
        _ => {
            faults.push(codes::INVALID_REQUEST);
            None
        }
    };
    let params = match obj.get("params") {
        None | Some(Value::Null) => Some(Map::new()),
        Some(Value::Object(p)) => Some(p.clone()),
        Some(_) => {
            faults.push(codes::INVALID_PARAMS);
            None
        }
    };
    if obj
        .keys()
        .any(|k| !matches!(k.as_str(), "jsonrpc" | "id" | "method" | "params"))
    {
        faults.push(codes::INVALID_REQUEST);
    }
    match (faults.is_empty(), id, method, params) {
        (true, Some(id), Some(method), Some(params)) => Oracle::Request { id, method, params },
        (_, id, _, _) => Oracle::Refused { codes: faults, id },
    }
}

/// The id a parse error is answered with (docs/protocol.md): the line's top-level `id`, a
/// number or a string, when its syntax reads although its value does not (a lone surrogate,
/// nesting past 128, a number beyond f64); the last `id` member wins, as in a request.
fn readable_id(line: &[u8]) -> Option<Value> {
    let members: BTreeMap<String, Box<serde_json::value::RawValue>> =
        serde_json::from_slice(line).ok()?;
    let raw = members.get("id")?;
    match raw.get().as_bytes().first() {
        Some(b'"' | b'-' | b'0'..=b'9') => serde_json::from_str(raw.get()).ok(),
        _ => None,
    }
}

thread_local! {
    /// Error lines already found valid, with their code: the check is a pure function of the
    /// bytes, and most error lines repeat.
    static VALID_ERROR_LINES: std::cell::RefCell<std::collections::HashMap<Vec<u8>, i64>> =
        Default::default();
}

/// [`check_error_line_uncached`], remembering the lines that passed (with `bound_message`).
fn check_error_line(line: &[u8], id: &Value, bound_message: bool) -> Result<i64, String> {
    if bound_message {
        if let Some(code) = VALID_ERROR_LINES.with(|c| c.borrow().get(line).copied()) {
            return Ok(code);
        }
    }
    let code = check_error_line_uncached(line, id, bound_message)?;
    if bound_message {
        VALID_ERROR_LINES.with(|c| {
            let mut c = c.borrow_mut();
            if c.len() > 100_000 {
                c.clear();
            }
            c.insert(line.to_vec(), code);
        });
    }
    Ok(code)
}

/// Check one error line: one line of JSON in the stable error shape, with `id`.
fn check_error_line_uncached(line: &[u8], id: &Value, bound_message: bool) -> Result<i64, String> {
    let body = line
        .strip_suffix(b"\n")
        .ok_or("error line does not end with a newline")?;
    if body.contains(&b'\n') {
        return Err("error line has an interior newline".into());
    }
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("error line not JSON: {e}"))?;
    let obj = v.as_object().ok_or("error line not an object")?;
    if obj.len() != 3 || obj.get("jsonrpc") != Some(&json!("2.0")) {
        return Err(format!(
            "error line not {{jsonrpc,id,error}}: {}",
            show(body)
        ));
    }
    if !obj.get("id").is_some_and(|got| same_json(got, id)) {
        return Err(format!("error line id {:?}, expected {id}", obj.get("id")));
    }
    let err = obj
        .get("error")
        .and_then(Value::as_object)
        .ok_or("error is not an object")?;
    let code = err
        .get("code")
        .and_then(Value::as_i64)
        .ok_or("error.code not an integer")?;
    if !KNOWN_CODES.contains(&code) {
        return Err(format!("unknown error code {code}"));
    }
    let message = err
        .get("message")
        .and_then(Value::as_str)
        .ok_or("error.message not a string")?;
    if bound_message && message.len() > 256 {
        return Err(format!(
            "error message of {} bytes (echoes the client's text?)",
            message.len()
        ));
    }
    let kind = err
        .get("data")
        .and_then(|d| d.get("kind"))
        .and_then(Value::as_str)
        .ok_or("error.data.kind missing")?;
    if !STABLE_KINDS.contains(&kind) {
        return Err(format!("data.kind {kind:?} is not a stable kind"));
    }
    if kind_for(code).map(|k| k.as_str()) != Some(kind) {
        return Err(format!(
            "code {code} stands for {:?}, data.kind says {kind:?}",
            kind_for(code)
        ));
    }
    Ok(code)
}

/// A parsed envelope's params (kept as raw text) as an object: `{}` when absent.
fn params_of(req: &protocol::Envelope) -> Result<Map<String, Value>, String> {
    match req.params {
        None => Ok(Map::new()),
        Some(p) => serde_json::from_str(p.get()).map_err(|e| format!("params not an object: {e}")),
    }
}

/// All invariants of `parse_request` on one line: `Ok(code)` (0 = a request) or what broke.
/// Panics inside are caught and reported as `Err("panic…")`.
fn check_parse(line: &[u8]) -> Result<i64, String> {
    let parsed = catch_unwind(AssertUnwindSafe(|| protocol::parse_request(line)))
        .map_err(|p| format!("panic in parse_request: {}", panic_text(&p)))?;
    match (parsed, oracle(line)) {
        (Ok(req), Oracle::Request { id, method, params }) => {
            let req_params = params_of(&req)?;
            if req.id != id || req.method != method || req_params != params {
                return Err(format!(
                    "parsed to id {} method {:?} params {}, the line says id {id} method {method:?} params {}",
                    req.id,
                    req.method,
                    Value::Object(req_params.clone()),
                    Value::Object(params)
                ));
            }
            // Rebuilt and parsed again: the same request.
            let rebuilt = serde_json::to_vec(&json!({
                "jsonrpc": "2.0", "id": req.id, "method": req.method, "params": req_params,
            }))
            .map_err(|e| format!("re-serialize: {e}"))?;
            match protocol::parse_request(&rebuilt) {
                Ok(again)
                    if same_json(&again.id, &req.id)
                        && again.method == req.method
                        && same_map(&params_of(&again)?, &req_params) => {}
                Ok(again) => return Err(format!("rebuilt request parses differently: {again:?}")),
                Err(bad) => return Err(format!("rebuilt request refused: {}", bad.1.message)),
            }
            Ok(0)
        }
        (Ok(req), Oracle::Refused { codes, .. }) => Err(format!(
            "accepted (method {:?}) a line with faults {codes:?}",
            req.method
        )),
        (Err(bad), Oracle::Request { .. }) => Err(format!(
            "refused a well-formed request: {} {}",
            bad.1.code, bad.1.message
        )),
        (Err(bad), Oracle::Refused { codes, id }) => {
            let (bad_id, err) = &*bad;
            if !codes.contains(&err.code) {
                return Err(format!(
                    "code {} ({}) but the line's faults allow {codes:?}",
                    err.code, err.message
                ));
            }
            match (&id, bad_id) {
                (_, Value::Null) => {}
                (Some(id), got) if id == got => {}
                (_, got) => return Err(format!("error id {got}, the line's id is {id:?}")),
            }
            let out = protocol::response_err(bad_id, err);
            let code = check_error_line(&out, bad_id, true)?;
            if code != err.code {
                return Err(format!(
                    "error line code {code}, RpcError code {}",
                    err.code
                ));
            }
            Ok(code)
        }
    }
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string payload".into())
}

// ---------------------------------------------------------------------------------------------
// FrameReader: the model and the run

/// What the reader should produce after the lines.
#[derive(Debug, PartialEq)]
enum End {
    Clean,
    TooLong,
    Truncated,
    /// Either (a partial line at EOF that could still have fit or not, by one `\r`).
    TooLongOrTruncated,
}

/// The lines (without `\n` / `\r\n`) a reader capped at `max` must yield, and how it ends.
fn frame_model(input: &[u8], max: usize) -> (Vec<&[u8]>, End) {
    let mut lines = Vec::new();
    let mut rest = input;
    loop {
        match rest.iter().position(|&b| b == b'\n') {
            Some(i) => {
                let seg = &rest[..i];
                let content = seg.strip_suffix(b"\r").unwrap_or(seg);
                if content.len() > max {
                    return (lines, End::TooLong);
                }
                lines.push(content);
                rest = &rest[i + 1..];
            }
            None => {
                let end = if rest.is_empty() {
                    End::Clean
                } else if rest.len() <= max {
                    End::Truncated
                } else if rest.len() == max + 1 && rest.ends_with(b"\r") {
                    // Could still have been a fitting `…\r\n` line: a reader may wait for the
                    // `\n` (then Truncated) or not.
                    End::TooLongOrTruncated
                } else {
                    End::TooLong
                };
                return (lines, end);
            }
        }
    }
}

/// An in-memory source handing out chunks of 1..=`max_chunk` bytes, now and then `Pending`
/// first (waking itself), like a socket.
struct Chunky {
    data: Vec<u8>,
    pos: usize,
    rng: Rng,
    max_chunk: usize,
    pending_one_in: usize,
}

impl AsyncRead for Chunky {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.pending_one_in > 0 && this.rng.below(this.pending_one_in) == 0 {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let left = this.data.len() - this.pos;
        let n = left
            .min(buf.remaining())
            .min(1 + this.rng.below(this.max_chunk));
        buf.put_slice(&this.data[this.pos..this.pos + n]);
        this.pos += n;
        Poll::Ready(Ok(()))
    }
}

/// How the bytes reach the reader.
#[derive(Clone, Copy, Debug)]
enum Source {
    /// `BufReader::with_capacity(cap, Chunky)`.
    Chunks {
        cap: usize,
        max_chunk: usize,
        pending: bool,
    },
    /// A tokio duplex pipe of `pipe` bytes, written in chunks by another task.
    Duplex { cap: usize, pipe: usize },
}

/// Run a reader capped at `max` over `input` and check it against the model; the lines it
/// yielded, or what broke.
async fn check_frames(
    input: &[u8],
    max: usize,
    source: Source,
    rng: &mut Rng,
) -> Result<Vec<Vec<u8>>, String> {
    let t = Duration::from_secs(60);
    let newlines = input.iter().filter(|&&b| b == b'\n').count();
    let mut got = Vec::new();
    let (end, writer) = match source {
        Source::Chunks {
            cap,
            max_chunk,
            pending,
        } => {
            let inner = Chunky {
                data: input.to_vec(),
                pos: 0,
                rng: Rng::new(rng.next()),
                max_chunk,
                pending_one_in: if pending { 3 } else { 0 },
            };
            let mut r = FrameReader::new(tokio::io::BufReader::with_capacity(cap, inner), max);
            (read_all_frames(&mut r, &mut got, newlines, t).await, None)
        }
        Source::Duplex { cap, pipe } => {
            let (mut w, r) = tokio::io::duplex(pipe);
            let data = input.to_vec();
            let mut wrng = Rng::new(rng.next());
            let writer = tokio::spawn(async move {
                let mut pos = 0;
                while pos < data.len() {
                    let n = (1 + wrng.below(97)).min(data.len() - pos);
                    if w.write_all(&data[pos..pos + n]).await.is_err() {
                        return;
                    }
                    pos += n;
                    if wrng.chance(1, 4) {
                        tokio::task::yield_now().await;
                    }
                }
                let _ = w.shutdown().await;
            });
            let mut r = FrameReader::new(tokio::io::BufReader::with_capacity(cap, r), max);
            let end = read_all_frames(&mut r, &mut got, newlines, t).await;
            drop(r); // a writer blocked on a full pipe now fails and ends
            (end, Some(writer))
        }
    };
    if let Some(w) = writer {
        w.await.map_err(|e| format!("duplex writer task: {e}"))?;
    }
    let end = end?;
    if let Some(l) = got.iter().find(|l| l.len() > max) {
        return Err(format!(
            "yielded a line of {} bytes, over the cap {max} ({source:?})",
            l.len()
        ));
    }
    let (want, want_end) = frame_model(input, max);
    if got.len() != want.len() || got.iter().zip(&want).any(|(g, w)| g != w) {
        let first = got
            .iter()
            .zip(&want)
            .position(|(g, w)| g != w)
            .unwrap_or(got.len().min(want.len()));
        return Err(format!(
            "yielded {} lines, the input has {} that fit (cap {max}, {source:?}); first difference at line {first}: got {:?}, want {:?}",
            got.len(),
            want.len(),
            got.get(first).map(|l| show(l)),
            want.get(first).map(|l| show(l)),
        ));
    }
    let ok = match (&want_end, &end) {
        (End::Clean, Ok(false)) => true,
        (End::TooLong | End::TooLongOrTruncated, Err(FrameError::TooLong { max: m })) => *m == max,
        (End::Truncated | End::TooLongOrTruncated, Err(FrameError::Truncated)) => true,
        _ => false,
    };
    if !ok {
        return Err(format!(
            "after {} lines ended with {end:?}, expected {want_end:?} (cap {max}, {source:?})",
            got.len()
        ));
    }
    Ok(got)
}

/// Pull frames until the reader stops; the final result (`Ok(false)` or the error).
async fn read_all_frames<R: tokio::io::AsyncBufRead + Unpin>(
    r: &mut FrameReader<R>,
    got: &mut Vec<Vec<u8>>,
    newlines: usize,
    t: Duration,
) -> Result<Result<bool, FrameError>, String> {
    loop {
        match r.next(t, t, || true).await {
            Ok(true) => {
                got.push(r.line().to_vec());
                if got.len() > newlines {
                    return Err(format!(
                        "yielded {} lines from an input with {newlines} newlines",
                        got.len()
                    ));
                }
            }
            other => return Ok(other),
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// In-process checks (stages 1 and 2): a runtime, counters, the violations found.
struct Harness {
    rt: tokio::runtime::Runtime,
    found: Found,
    parse_tally: Tally,
    frame_runs: usize,
    frame_lines: usize,
    frame_ends: BTreeMap<&'static str, usize>,
    parse_time: Duration,
    frame_time: Duration,
}

impl Harness {
    fn new() -> Self {
        Harness {
            rt: runtime(),
            found: Found::default(),
            parse_tally: Tally::new(),
            frame_runs: 0,
            frame_lines: 0,
            frame_ends: BTreeMap::new(),
            parse_time: Duration::ZERO,
            frame_time: Duration::ZERO,
        }
    }

    fn parse(&mut self, line: &[u8]) -> Option<i64> {
        let t = Instant::now();
        let checked = check_parse(line);
        self.parse_time += t.elapsed();
        match checked {
            Ok(code) => {
                *self.parse_tally.entry(code).or_default() += 1;
                Some(code)
            }
            Err(what) => {
                let panicked = what.starts_with("panic");
                self.found.add("parse_request", what, line, panicked);
                None
            }
        }
    }

    /// Add another harness's findings and counts to this one's.
    fn absorb(&mut self, other: Harness) {
        self.found.violations.extend(other.found.violations);
        self.found.panics += other.found.panics;
        for (code, n) in other.parse_tally {
            *self.parse_tally.entry(code).or_default() += n;
        }
        self.frame_runs += other.frame_runs;
        self.frame_lines += other.frame_lines;
        for (end, n) in other.frame_ends {
            *self.frame_ends.entry(end).or_default() += n;
        }
        self.parse_time += other.parse_time;
        self.frame_time += other.frame_time;
    }

    /// Frame `input` with cap `max`, then parse every line it yields.
    fn frames(&mut self, input: &[u8], max: usize, source: Source, rng: &mut Rng) {
        self.frames_skipping(input, max, source, rng, &[]);
    }

    /// [`Harness::frames`], not parsing again the yielded lines that are in `parsed`.
    fn frames_skipping(
        &mut self,
        input: &[u8],
        max: usize,
        source: Source,
        rng: &mut Rng,
        parsed: &[Vec<u8>],
    ) {
        self.frame_runs += 1;
        let t = Instant::now();
        let run = catch_unwind(AssertUnwindSafe(|| {
            self.rt.block_on(check_frames(input, max, source, rng))
        }));
        self.frame_time += t.elapsed();
        match run {
            Ok(Ok(lines)) => {
                let (_, end) = frame_model(input, max);
                *self
                    .frame_ends
                    .entry(match end {
                        End::Clean => "clean end",
                        End::TooLong => "too long",
                        End::Truncated => "truncated",
                        End::TooLongOrTruncated => "truncated at cap+1",
                    })
                    .or_default() += 1;
                self.frame_lines += lines.len();
                for l in &lines {
                    if !parsed.contains(l) {
                        self.parse(l);
                    }
                }
            }
            Ok(Err(what)) => {
                self.found
                    .add_frame("FrameReader", what, input, false, Some((max, source)))
            }
            Err(p) => {
                self.found.add_frame(
                    "FrameReader",
                    format!("panic: {} (cap {max}, {source:?})", panic_text(&p)),
                    input,
                    true,
                    Some((max, source)),
                );
                self.rt = runtime(); // do not reuse a runtime a panic unwound through
            }
        }
    }
}

/// A random source, its buffer sizes in 1..=64.
fn random_source(rng: &mut Rng, input_len: usize) -> Source {
    // Long inputs through 1-byte buffers cost a lot of polls and find nothing new.
    let min_cap = if input_len > 8192 { 16 } else { 1 };
    let cap = min_cap + rng.below(65 - min_cap);
    if rng.chance(1, 10) {
        Source::Duplex {
            cap,
            pipe: 1 + rng.below(64),
        }
    } else {
        Source::Chunks {
            cap,
            max_chunk: 1 + rng.below(64),
            pending: rng.chance(1, 8),
        }
    }
}

/// Caps worth trying for `input`: 0, 1, each line's length and its neighbours, and big.
fn boundary_caps(input: &[u8]) -> Vec<usize> {
    let mut caps = std::collections::BTreeSet::from([0, 1, BIG_MAX]);
    for seg in input.split(|&b| b == b'\n') {
        for n in [seg.len(), seg.strip_suffix(b"\r").unwrap_or(seg).len()] {
            caps.extend([n.saturating_sub(1), n, n + 1]);
        }
    }
    caps.into_iter().collect()
}

// ---------------------------------------------------------------------------------------------
// Mutations

const INTERESTING_BYTES: &[u8] = b"\n\r\0\"\\{}[]:,0 -+.eE\x7f\xff\xc0\xed\xef\x01\x1f\x80";

const TOKENS: &[&str] = &[
    "null",
    "true",
    "false",
    "0",
    "-0",
    "1e400",
    "-1e400",
    "1.5e-320",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775809",
    "\"\"",
    "[]",
    "{}",
    "\"\\u0000\"",
    "\"\\ud800\"",
    "\"\\udc00\\ud800\"",
    "\"\\ud83d\\ude00\"",
    "\\u0000",
    "\\ud800",
    "\\",
    "\"",
    "\"id\":",
    "\"method\":",
    "\"params\":",
    "\"jsonrpc\":\"2.0\",",
    "\"id\":1,",
    "\"id\":null,",
    "\"method\":\"hello\",",
    "\"method\":\"admin.status\",",
    "\"params\":null,",
    "\"params\":[],",
    "\"store\":\"default\",",
    "\"store\":\"../x\",",
    "\"id\":\"../../x\",",
    "\"ttl_ms\":0,",
    "\"if_generation\":18446744073709551615,",
    "\"repair\":true,",
    "\r\n",
    "\n",
    "\0",
    "\u{feff}",
    "\u{2028}",
];

const VALUES: &[&str] = &[
    "null",
    "true",
    "1",
    "-1",
    "1.5",
    "1e400",
    "18446744073709551616",
    "\"\"",
    "\"x\"",
    "\"\\ud800\"",
    "[]",
    "{}",
    "[1,\"a\",null]",
    "{\"a\":{\"b\":[]}}",
];

const NEST_DEPTHS: &[usize] = &[1, 2, 16, 126, 127, 128, 129, 130, 200];

/// The seeds, split by size: long ones (over 2 KiB) are picked rarely — they are slow through
/// small buffers and the replay already crosses every cap with them.
struct Seeds<'a> {
    short: Vec<&'a [u8]>,
    long: Vec<&'a [u8]>,
}

impl<'a> Seeds<'a> {
    fn new(all: &'a [Vec<u8>]) -> Self {
        let (short, long) = all.iter().map(Vec::as_slice).partition(|s| s.len() <= 2048);
        Seeds { short, long }
    }

    fn pick(&self, rng: &mut Rng) -> &'a [u8] {
        let from = if !self.long.is_empty() && rng.chance(1, 200) {
            &self.long
        } else {
            &self.short
        };
        from[rng.below(from.len())]
    }
}

fn mutate(rng: &mut Rng, seeds: &Seeds<'_>, base: &[u8]) -> Vec<u8> {
    let mut d = base.to_vec();
    let rounds = 1 + rng.below(4);
    for _ in 0..rounds {
        let len = d.len();
        match rng.below(13) {
            // Bit flip.
            0 if len > 0 => {
                let i = rng.below(len);
                d[i] ^= 1 << rng.below(8);
            }
            // Overwrite with an interesting or random byte.
            1 if len > 0 => {
                let i = rng.below(len);
                d[i] = if rng.chance(2, 3) {
                    *rng.pick(INTERESTING_BYTES)
                } else {
                    rng.next() as u8
                };
            }
            // Insert 1..8 bytes.
            2 => {
                let i = rng.below(len + 1);
                let n = 1 + rng.below(8);
                let ins: Vec<u8> = (0..n)
                    .map(|_| {
                        if rng.chance(1, 2) {
                            *rng.pick(INTERESTING_BYTES)
                        } else {
                            rng.next() as u8
                        }
                    })
                    .collect();
                d.splice(i..i, ins);
            }
            // Delete a range.
            3 if len > 0 => {
                let i = rng.below(len);
                let n = 1 + rng.below((len - i).min(1 + len / 4));
                d.drain(i..i + n);
            }
            // Duplicate a range elsewhere.
            4 if len > 0 => {
                let i = rng.below(len);
                let n = 1 + rng.below((len - i).min(64));
                let chunk = d[i..i + n].to_vec();
                let at = rng.below(len + 1);
                d.splice(at..at, chunk);
            }
            // Splice: our head, another seed's tail.
            5 => {
                let other = seeds.pick(rng);
                let i = rng.below(len + 1);
                let j = rng.below(other.len() + 1);
                // A long seed's tail only now and then (it is slow and finds little).
                let end = if rng.chance(1, 20) {
                    other.len()
                } else {
                    other.len().min(j + 512)
                };
                d.truncate(i);
                d.extend_from_slice(&other[j..end]);
            }
            // Insert a dictionary token.
            6 | 7 => {
                let i = rng.below(len + 1);
                let tok = rng.pick(TOKENS).as_bytes().to_vec();
                d.splice(i..i, tok);
            }
            // Replace the value after a ':' with another value.
            8 => {
                let colons: Vec<usize> = d
                    .iter()
                    .enumerate()
                    .filter(|(_, &b)| b == b':')
                    .map(|(i, _)| i)
                    .collect();
                if !colons.is_empty() {
                    let start = *rng.pick(&colons) + 1;
                    let end = d[start..]
                        .iter()
                        .position(|&b| b == b',' || b == b'}')
                        .map_or(d.len(), |p| start + p);
                    let v = rng.pick(VALUES).as_bytes().to_vec();
                    d.splice(start..end, v);
                }
            }
            // Repeated nesting: `[`×k here, `]`×k later (or a nested value as params).
            9 | 10 => {
                let k = if rng.chance(1, 50) {
                    5000
                } else {
                    *rng.pick(NEST_DEPTHS)
                };
                let (open, close): (&[u8], &[u8]) = if rng.chance(3, 4) {
                    (b"[", b"]")
                } else {
                    (b"{\"a\":", b"}")
                };
                if rng.chance(1, 3) {
                    let mut v =
                        br#"{"jsonrpc":"2.0","id":1,"method":"cred.get","params":{"a":"#.to_vec();
                    v.extend(open.repeat(k));
                    v.push(b'1');
                    v.extend(close.repeat(k));
                    v.extend_from_slice(b"}}");
                    d = v;
                } else {
                    let i = rng.below(len + 1);
                    let j = i + rng.below(len - i + 1);
                    let mut v = d[..i].to_vec();
                    v.extend(open.repeat(k));
                    v.extend_from_slice(&d[i..j]);
                    if rng.chance(3, 4) {
                        v.extend(close.repeat(k));
                    }
                    v.extend_from_slice(&d[j..]);
                    d = v;
                }
            }
            // Truncate.
            11 if len > 0 => d.truncate(rng.below(len)),
            // A whole other seed (so several-line inputs mix kinds).
            _ => d = seeds.pick(rng).to_vec(),
        }
        d.truncate(MAX_INPUT);
    }
    d
}

/// Stage 2, one worker: `iters` multi-line inputs of mutated seeds through `parse_request` (each
/// piece) and a `FrameReader` (the whole, then each line it yields); returns the bytes made.
fn mutation_round(h: &mut Harness, rng: &mut Rng, pool: &Seeds<'_>, iters: usize) -> usize {
    let mut mutated_bytes = 0usize;
    for _ in 0..iters {
        let n_lines = 1 + rng.below(4);
        let mut input = Vec::new();
        let mut pieces = Vec::with_capacity(n_lines);
        for k in 0..n_lines {
            let base = pool.pick(rng);
            let piece = if rng.chance(1, 8) {
                base.to_vec()
            } else {
                mutate(rng, pool, base)
            };
            input.extend_from_slice(&piece);
            let last = k + 1 == n_lines;
            match rng.below(20) {
                0 if !last => {}                           // run into the next piece
                1..=4 => input.extend_from_slice(b"\r\n"), // CRLF
                5 if last => {}                            // unterminated tail
                _ => input.push(b'\n'),
            }
            pieces.push(piece);
        }
        mutated_bytes += input.len();
        for p in &pieces {
            h.parse(p);
        }
        // The cap: big (all fit), at a line's boundary, or small.
        let max = match rng.below(10) {
            0..=4 => BIG_MAX,
            5..=7 => {
                let segs: Vec<&[u8]> = input.split(|&b| b == b'\n').collect();
                let seg = rng.pick(&segs);
                let content = seg.strip_suffix(b"\r").unwrap_or(seg).len();
                (content + rng.below(3)).saturating_sub(1) + usize::from(rng.chance(1, 4))
            }
            _ => rng.below(300),
        };
        let source = random_source(rng, input.len());
        h.frames_skipping(&input, max, source, rng, &pieces);
    }
    mutated_bytes
}

// ---------------------------------------------------------------------------------------------
// Stage 3: the daemon

struct DaemonStats {
    inputs: usize,
    lines: usize,
    responses: BTreeMap<String, usize>,
    events: usize,
    closes: usize,
    found: Found,
}

struct Wire {
    stream: UnixStream,
    reader: BufReader<UnixStream>,
}

impl Wire {
    fn connect(socket: &Path) -> Wire {
        let stream = UnixStream::connect(socket).expect("connect to the daemon");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("read timeout");
        let reader = BufReader::new(stream.try_clone().expect("clone"));
        Wire { stream, reader }
    }

    /// A connection that has said hello.
    fn open(socket: &Path) -> Wire {
        let mut w = Wire::connect(socket);
        let _ = w.stream.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":\"fuzz-hello\",\"method\":\"hello\",\"params\":{\"client\":\"fuzz\",\"protocol\":1}}\n");
        loop {
            let line = w
                .read_line()
                .expect("hello answered")
                .expect("the daemon closed the connection before answering hello");
            let v: Value = serde_json::from_slice(&line).expect("hello response is JSON");
            if v["id"] == "fuzz-hello" {
                assert!(v.get("result").is_some(), "hello failed: {v}");
                return w;
            }
        }
    }

    /// One line, with its newline; `Ok(None)` at EOF (or a reset: the daemon closed on us).
    fn read_line(&mut self) -> io::Result<Option<Vec<u8>>> {
        let mut buf = Vec::new();
        match self.reader.read_until(b'\n', &mut buf) {
            Ok(0) => Ok(None),
            Ok(_) => Ok(Some(buf)),
            Err(e) if e.kind() == IoErrorKind::ConnectionReset => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// A server notification (`"method": "event"`, no id): not a response.
fn is_event(line: &[u8]) -> bool {
    serde_json::from_slice::<Value>(line).is_ok_and(|v| {
        v.get("method") == Some(&json!("event"))
            && v.get("id").is_none()
            && v.get("params").is_some_and(Value::is_object)
    })
}

/// Check the daemon's response to a line that fits the frame cap.
fn check_daemon_response(line: &[u8], resp: &[u8]) -> Result<String, String> {
    let parsed = catch_unwind(AssertUnwindSafe(|| protocol::parse_request(line)))
        .map_err(|p| format!("panic in parse_request: {}", panic_text(&p)))?;
    match parsed {
        Err(bad) => {
            let want = protocol::response_err(&bad.0, &bad.1);
            if resp != &want[..] {
                return Err(format!(
                    "response to a refused line is {}, expected {}",
                    show(resp),
                    show(&want)
                ));
            }
            Ok(format!("error {}", bad.1.code))
        }
        Ok(req) => {
            let v: Value = serde_json::from_slice(resp)
                .map_err(|e| format!("response not JSON ({e}): {}", show(resp)))?;
            let obj = v.as_object().ok_or("response not an object")?;
            if obj.get("jsonrpc") != Some(&json!("2.0"))
                || !obj.get("id").is_some_and(|id| same_json(id, &req.id))
            {
                return Err(format!(
                    "response {} to a request with id {}",
                    show(resp),
                    req.id
                ));
            }
            match (obj.get("result"), obj.get("error")) {
                (Some(_), None) if obj.len() == 3 => {
                    if !METHODS.contains(&req.method.as_ref()) {
                        return Err(format!("unknown method {:?} succeeded", req.method));
                    }
                    Ok(format!("ok {}", req.method))
                }
                (None, Some(_)) => {
                    let code = check_error_line(resp, &req.id, false)?;
                    let known = METHODS.contains(&req.method.as_ref());
                    if known == (code == codes::METHOD_NOT_FOUND) {
                        return Err(format!("method {:?} answered with code {code}", req.method));
                    }
                    Ok(format!("error {code}"))
                }
                _ => Err(format!(
                    "response is not one of result/error: {}",
                    show(resp)
                )),
            }
        }
    }
}

fn daemon_fuzz(seeds: Vec<Vec<u8>>, seed: u64, iters: usize) -> DaemonStats {
    let mut rng = Rng::new(seed ^ 0xD43_D43_D43);
    let pool = Seeds::new(&seeds);
    let mut env = DaemonEnv::new(&format!("[limits]\nmax_frame_bytes = {DAEMON_MAX_FRAME}\n"));
    let d = env.start();
    let mut stats = DaemonStats {
        inputs: 0,
        lines: 0,
        responses: BTreeMap::new(),
        events: 0,
        closes: 0,
        found: Found::default(),
    };
    let mut wire = Wire::open(&d.socket);
    'inputs: for _ in 0..iters {
        stats.inputs += 1;
        let base = pool.pick(&mut rng);
        let input = if rng.chance(1, 10) {
            base.to_vec()
        } else {
            mutate(&mut rng, &pool, base)
        };
        // Line by line, as the daemon's framing splits it (an unterminated tail gets a `\n`).
        let segs: Vec<&[u8]> = input
            .strip_suffix(b"\n")
            .unwrap_or(&input)
            .split(|&b| b == b'\n')
            .collect();
        for seg in segs {
            stats.lines += 1;
            let line = seg.strip_suffix(b"\r").unwrap_or(seg);
            let mut framed = seg.to_vec();
            framed.push(b'\n');
            let _ = wire.stream.write_all(&framed); // a close shows on the read side
            if line.len() > DAEMON_MAX_FRAME {
                // One error line, then the close (event notifications may come before or
                // after it: e.g. a lease this connection held, released by its own close).
                let mut answers = Vec::new();
                let end = loop {
                    match wire.read_line() {
                        Ok(Some(l)) if is_event(&l) => stats.events += 1,
                        Ok(Some(l)) => answers.push(l),
                        Ok(None) => break "EOF".to_string(),
                        Err(e) => break format!("error {e}"),
                    }
                };
                let ok = end == "EOF"
                    && answers.len() == 1
                    && check_error_line(&answers[0], &Value::Null, false)
                        .is_ok_and(|code| code == codes::INVALID_REQUEST)
                    && String::from_utf8_lossy(&answers[0])
                        .contains(&format!("longer than {DAEMON_MAX_FRAME} bytes"));
                if !ok {
                    let got: Vec<String> = answers.iter().map(|l| show(l)).collect();
                    stats.found.add(
                        "daemon",
                        format!(
                            "over-cap line: got {got:?} then {end}, expected one error line then the close"
                        ),
                        &framed,
                        false,
                    );
                }
                stats.closes += 1;
                *stats
                    .responses
                    .entry("closed: too long".into())
                    .or_default() += 1;
                wire = Wire::open(&d.socket);
                continue;
            }
            loop {
                let resp = match wire.read_line() {
                    Ok(Some(r)) => r,
                    Ok(None) => {
                        stats.found.add(
                            "daemon",
                            "connection closed without a response".into(),
                            &framed,
                            false,
                        );
                        wire = Wire::open(&d.socket);
                        continue 'inputs;
                    }
                    Err(e) => {
                        stats.found.add(
                            "daemon",
                            format!("no response within 10 s: {e}"),
                            &framed,
                            false,
                        );
                        wire = Wire::open(&d.socket);
                        continue 'inputs;
                    }
                };
                if is_event(&resp) {
                    stats.events += 1;
                    continue;
                }
                match check_daemon_response(line, &resp) {
                    Ok(label) => *stats.responses.entry(label).or_default() += 1,
                    Err(what) => {
                        let panicked = what.starts_with("panic");
                        stats.found.add("daemon", what, &framed, panicked);
                        // Out of step now, perhaps: start over on a new connection.
                        wire = Wire::open(&d.socket);
                        continue 'inputs;
                    }
                }
                break;
            }
        }
    }
    // Nothing left over: a last request's response is the next line (events aside).
    let _ = wire
        .stream
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":\"fuzz-last\",\"method\":\"admin.status\"}\n");
    loop {
        match wire.read_line() {
            Ok(Some(l)) => {
                if is_event(&l) {
                    stats.events += 1;
                    continue;
                }
                let v: Value = serde_json::from_slice(&l).unwrap_or(Value::Null);
                if v["id"] != "fuzz-last" || v.get("result").is_none() {
                    stats.found.add(
                        "daemon",
                        format!("extra or wrong line before the last response: {}", show(&l)),
                        b"",
                        false,
                    );
                }
                break;
            }
            other => {
                stats.found.add(
                    "daemon",
                    format!("last admin.status on the fuzzed connection: {other:?}"),
                    b"",
                    false,
                );
                break;
            }
        }
    }
    drop(wire);
    // The daemon is up and serves a fresh client.
    let mut fresh = common::Conn::open(&d.socket);
    let status = fresh.ok("admin.status", json!({}));
    assert_eq!(status["server"], "holdfast", "{status}");
    drop(fresh);
    let log = d.stop();
    if log.contains("panicked") {
        stats.found.add(
            "daemon",
            format!("the daemon's log has a panic:\n{log}"),
            b"",
            true,
        );
    }
    stats
}

// ---------------------------------------------------------------------------------------------
// The test

#[test]
fn fuzz_frame_decoder_and_request_parser() {
    let started = Instant::now();
    let seed = env_u64("HOLDFAST_FUZZ_SEED").unwrap_or_else(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Rng::new(t.as_nanos() as u64 ^ u64::from(std::process::id())).next()
    });
    let iters = env_u64("HOLDFAST_FUZZ_ITERS").map_or(100_000, |n| n as usize);
    let daemon_iters = env_u64("HOLDFAST_FUZZ_DAEMON_ITERS").map_or(2_000, |n| n as usize);
    println!(
        "fuzz: seed {seed:#018x} (replay with HOLDFAST_FUZZ_SEED={seed:#x}), {iters} iterations, {daemon_iters} through the daemon"
    );

    let corpus = load_corpus();
    assert!(corpus.len() >= 30, "corpus has {} seeds", corpus.len());
    let seeds: Vec<Vec<u8>> = corpus.iter().map(|(_, d)| d.clone()).collect();

    // Stage 3 runs beside stages 1 and 2.
    let daemon = {
        let seeds = seeds.clone();
        std::thread::spawn(move || {
            let t = Instant::now();
            let stats = daemon_fuzz(seeds, seed, daemon_iters);
            (stats, t.elapsed())
        })
    };

    let mut h = Harness::new();
    let mut rng = Rng::new(seed);

    // Stage 1: replay.
    let t1 = Instant::now();
    let mut valid_methods = std::collections::BTreeSet::new();
    for (i, (name, data)) in corpus.iter().enumerate() {
        let code = h.parse(data);
        if name.starts_with("valid-") {
            match catch_unwind(|| protocol::parse_request(data)) {
                Ok(Ok(req)) => {
                    let known = METHODS.contains(&req.method.as_ref());
                    if known {
                        valid_methods.insert(req.method.to_string());
                    }
                    assert_eq!(
                        known,
                        name != "valid-unknown-method",
                        "seed {name}: method {:?}",
                        req.method
                    );
                }
                Ok(Err(bad)) => panic!("seed {name} is not a valid request: {:?}", bad.1),
                Err(_) => {} // a panic: already counted by `h.parse` above
            }
            if !h.found.violations.iter().any(|v| v.input == *data) {
                assert_eq!(code, Some(0), "seed {name}");
            }
        }
        let next = &corpus[(i + 1) % corpus.len()].1;
        let mut lf = data.clone();
        lf.push(b'\n');
        let mut multi = lf.clone();
        multi.extend_from_slice(next);
        multi.extend_from_slice(b"\r\n");
        multi.extend_from_slice(data);
        for input in [data.clone(), lf, multi] {
            for max in boundary_caps(&input) {
                let long = input.len() > 8192;
                let caps: &[usize] = if long { &[64] } else { &[1, 2, 3, 7, 64] };
                for &cap in caps {
                    let source = Source::Chunks {
                        cap,
                        max_chunk: 1 + rng.below(64),
                        pending: false,
                    };
                    h.frames(&input, max, source, &mut rng);
                }
                if !long {
                    let source = Source::Duplex {
                        cap: 1 + rng.below(64),
                        pipe: 1 + rng.below(64),
                    };
                    h.frames(&input, max, source, &mut rng);
                }
            }
        }
    }
    let missing: Vec<&&str> = METHODS
        .iter()
        .filter(|m| !valid_methods.contains(**m))
        .collect();
    assert!(missing.is_empty(), "no valid-* seed for {missing:?}");
    let replay_frames = h.frame_runs;
    let replay_time = t1.elapsed();
    println!(
        "fuzz: stage 1: {} seeds replayed ({} valid-* seeds cover all {} methods), {} FrameReader runs at boundary caps, {:.1} s",
        corpus.len(),
        corpus.iter().filter(|(n, _)| n.starts_with("valid-")).count(),
        METHODS.len(),
        thousands(replay_frames),
        replay_time.as_secs_f64()
    );

    // Stage 2: mutations.
    let t2 = Instant::now();
    let pool = Seeds::new(&seeds);
    let per_worker = |w: usize| iters / STAGE2_WORKERS + usize::from(w < iters % STAGE2_WORKERS);
    let results: Vec<(Harness, usize)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..STAGE2_WORKERS)
            .map(|w| {
                let pool = &pool;
                let worker_seed = seed ^ (w as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                scope.spawn(move || {
                    let mut wh = Harness::new();
                    let mut wrng = Rng::new(worker_seed);
                    let bytes = mutation_round(&mut wh, &mut wrng, pool, per_worker(w));
                    (wh, bytes)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("stage 2 worker"))
            .collect()
    });
    let mut mutated_bytes = 0usize;
    for (wh, bytes) in results {
        h.absorb(wh);
        mutated_bytes += bytes;
    }
    let mutate_time = t2.elapsed();

    h.found.save();
    let (mut dstats, daemon_time) = match daemon.join() {
        Ok(done) => done,
        Err(p) => panic!(
            "the daemon stage failed: {} (in-process stages: {} panics, {} violations, saved {:?})",
            panic_text(&p),
            h.found.panics,
            h.found.violations.len(),
            h.found.saved
        ),
    };
    dstats.found.save();

    let tally = |t: &Tally| {
        t.iter()
            .map(|(c, n)| {
                let label = if *c == 0 {
                    "Ok".to_string()
                } else {
                    c.to_string()
                };
                format!("{label}: {}", thousands(*n))
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "fuzz: stage 2: {} mutated inputs ({} MB) in {:.1} s (parse checks {:.1} s, frame checks {:.1} s over stages 1+2); over stages 1+2, parse_request outcomes by code over {} lines [{}]; {} FrameReader runs yielded {} lines, ends [{}]",
        thousands(iters),
        mutated_bytes / 1_000_000,
        mutate_time.as_secs_f64(),
        h.parse_time.as_secs_f64(),
        h.frame_time.as_secs_f64(),
        thousands(h.parse_tally.values().sum()),
        tally(&h.parse_tally),
        thousands(h.frame_runs),
        thousands(h.frame_lines),
        h.frame_ends
            .iter()
            .map(|(k, n)| format!("{k}: {}", thousands(*n)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "fuzz: stage 3: {} mutated inputs = {} lines through the daemon in {:.1} s: responses [{}], {} events skipped, {} closes for over-cap lines; the daemon stayed up (fresh admin.status answered, SIGTERM exit 0)",
        thousands(dstats.inputs),
        thousands(dstats.lines),
        daemon_time.as_secs_f64(),
        dstats
            .responses
            .iter()
            .map(|(k, n)| format!("{k}: {n}"))
            .collect::<Vec<_>>()
            .join(", "),
        dstats.events,
        dstats.closes
    );
    let panics = h.found.panics + dstats.found.panics;
    let violations = h.found.violations.len() + dstats.found.violations.len();
    println!(
        "fuzz: corpus {} seeds replayed; {} mutated inputs through parse_request and FrameReader (seed {seed:#x}), {} through the daemon; {panics} panics, {violations} invariant violations ({:.1} s)",
        corpus.len(),
        thousands(iters),
        thousands(dstats.inputs),
        started.elapsed().as_secs_f64()
    );
    let saved: Vec<PathBuf> = h
        .found
        .saved
        .iter()
        .chain(&dstats.found.saved)
        .cloned()
        .collect();
    let mut classes: BTreeMap<String, usize> = BTreeMap::new();
    for v in h.found.violations.iter().chain(&dstats.found.violations) {
        let what: String = v.what.chars().take(90).collect();
        *classes.entry(format!("[{}] {what}", v.stage)).or_default() += 1;
    }
    let mut classes: Vec<(String, usize)> = classes.into_iter().collect();
    classes.sort_by_key(|c| std::cmp::Reverse(c.1));
    let top: Vec<String> = classes
        .iter()
        .take(10)
        .map(|(c, n)| format!("{n} x {c}"))
        .collect();
    assert!(
        panics == 0 && violations == 0,
        "{panics} panics, {violations} invariant violations (seed {seed:#x}); most frequent:\n  {}\ninputs saved as {saved:?}",
        top.join("\n  ")
    );
}
