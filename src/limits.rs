//! Every numeric limit in holdfast, in one place, each with the reason for its value.

use std::time::Duration;

/// Largest credential file (`.enc`) holdfast writes and serves. A Fernet token for a
/// credential with a few keys is well under 4 KiB; 1 MiB leaves room for large certificates
/// while keeping a hostile or corrupt file from making a reader allocate without bound. The
/// limit is checked on the *write* side, on the token about to be written (a token is ~4/3 of
/// the document it seals, so documents up to ~768 KiB fit), before anything is written or
/// acknowledged: a credential holdfast acknowledged always reads back.
pub const MAX_CREDENTIAL_FILE_BYTES: u64 = 1024 * 1024;

/// Largest credential file read to learn which key opens it (key rotation, pruning,
/// `holdfast key`): another program (hive) may write files larger than holdfast serves, and
/// they still need their key. A file over this is reported unreadable, and no key is pruned
/// while it exists.
pub const MAX_SCAN_FILE_BYTES: u64 = 64 * 1024 * 1024;

/// Largest `index.json` holdfast will parse. At ~300 bytes per entry this is ~100,000
/// credentials; anything bigger is treated as corrupt and rebuilt from the directory scan.
pub const MAX_INDEX_FILE_BYTES: u64 = 64 * 1024 * 1024;

/// Largest key file. A Fernet key is 44 characters: anything larger is not a key file.
pub const MAX_KEY_FILE_BYTES: u64 = 64 * 1024;

/// Largest archive of retired keys (`<key>.prev`): 45 bytes a key, so some 93,000 rotations
/// without a prune. A rotation that would grow it past this is refused before anything
/// changes (`key prune` first): an archive holdfast cannot read back would seal the store.
pub const MAX_KEY_ARCHIVE_BYTES: u64 = 4 * 1024 * 1024;

/// Longest credential id, in bytes: what hive's own storage takes. The id becomes a file name
/// (`<safe_id>.enc`), which must stay within the 255-byte NAME_MAX of Linux file systems; the
/// names derived from it (temp files, generation markers, quarantined copies) are shortened to
/// fit (`durable::fit_name`).
pub const MAX_ID_BYTES: usize = 251;

/// Longest store name (`--store NAME`); it becomes a directory and a key-file name.
pub const MAX_STORE_NAME_BYTES: usize = 64;

/// Most subscriptions (`cred.watch`, `stream.subscribe`) one connection may hold at once: each
/// is a forwarder task and a receiver every event fans out to. A client needs one watch per
/// store (or one for all) and one subscription per run it shows; more is a leak, refused with
/// `busy` (a client frees one with `unsubscribe`, or when its run finishes).
pub const MAX_SUBSCRIPTIONS_PER_CONNECTION: usize = 16;

/// How long a writer waits for `metadata/index.lock` before answering `busy`. Writes hold the
/// lock for one file write plus fsyncs (milliseconds); ten seconds means something is stuck,
/// and the caller should hear about it rather than hang.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// Seconds a Fernet token may be stamped in the future before it is refused. This is the
/// `MAX_CLOCK_SKEW` of the Fernet spec (and of Python's `cryptography`), so holdfast and hive
/// agree on which tokens are readable.
pub const FERNET_MAX_CLOCK_SKEW_SECS: u64 = 60;

/// Largest request line (one JSON-RPC message) the daemon reads. Every legitimate request is a
/// credential document at most (a few KiB); 1 MiB leaves room for large certificates. A longer
/// line gets an error and the connection is closed, before more than this much is buffered.
pub const MAX_FRAME_BYTES: usize = 1024 * 1024;

/// Connections served at once. Agent processes hold one or two connections each; 1,024 covers
/// a machine full of them. Past the cap a new client gets one `busy` error line and is closed
/// (a permit is tried right after `accept`: mini-redis's acquire-before-accept would leave it
/// hanging in the listen backlog instead). The daemon raises its open-file soft limit to fit.
pub const MAX_CONNECTIONS: usize = 1024;

/// Requests one connection may have in flight at once (pipelining). Bounds the memory and the
/// blocking-pool threads one client can occupy.
pub const MAX_INFLIGHT_PER_CONNECTION: usize = 32;

/// Bytes of responses and events queued for one connection. A client that stops reading is
/// disconnected when its queue passes this, so it cannot make the daemon buffer without bound.
pub const MAX_OUTPUT_QUEUE_BYTES: usize = 8 * 1024 * 1024;

/// Bytes of responses and events queued across every connection (counted by the capacity of
/// the buffers holding them). Past half of it, a connection that owes anything stops being
/// read until its client reads; a line that would pass it closes its connection (logged).
pub const MAX_OUTPUT_TOTAL_BYTES: usize = 256 * 1024 * 1024;

/// A connection with nothing in flight, no subscription and no bytes received for this long is
/// closed (a client that connects and sends nothing).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(120);

/// Once the first byte of a request line arrives, the whole line must arrive within this time
/// (a slowloris client sending one byte a second is cut off).
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long graceful shutdown waits for in-flight requests to reach a safe point before the
/// daemon exits anyway (systemd's default TimeoutStopSec is 90 s; stay well inside it).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

/// How often the daemon checks that its socket file is still its own (gpg-agent's
/// CHECK_OWN_SOCKET_INTERVAL): deleted or replaced → it stops and does not unlink the other's.
pub const SOCKET_CHECK_INTERVAL: Duration = Duration::from_secs(5);

/// Quiet time the change watcher waits for before reconciling (events arrive in bursts: a
/// temp file, a rename, an index rewrite). Well under the one second the daemon promises.
pub const WATCH_DEBOUNCE: Duration = Duration::from_millis(200);

/// ... or once the first of them is this old, under changes that never pause.
pub const WATCH_MAX_DELAY: Duration = Duration::from_millis(500);

/// While events keep coming, the watcher's thread sleeps this long between reads of them
/// instead of waiting on the inotify descriptor: a stream of writes wakes it once per tick,
/// not once per write (`service/dirwatch.rs`).
pub const WATCH_TICK: Duration = Duration::from_millis(50);

/// Longest refresh lease a client may ask for. A refresh that takes longer than this has
/// failed; the next client may try.
pub const MAX_LEASE: Duration = Duration::from_secs(300);

/// How often the daemon looks for stores whose index has pending changes. Writes are
/// acknowledged once their credential file is durable; the index (a cache hive lists from)
/// follows once the writes pause for `INDEX_QUIET`, and at least every `INDEX_MAX_LAG` while
/// they never pause.
pub const INDEX_FLUSH_INTERVAL: Duration = Duration::from_millis(250);

/// A store's index is rewritten once no write changed it for this long: the end of a burst.
pub const INDEX_QUIET: Duration = Duration::from_millis(250);

/// ... or once its oldest unwritten change is this old, under writes that never pause. At
/// 10,000 credentials a rewrite is ~4 MB of JSON and two fsyncs; one per flusher tick halved a
/// lone writer's rate (docs/benchmarks.md), one per 5 s costs it a few percent. hive, which lists
/// from the index, sees a credential written through holdfast about 0.5 s after a pause and
/// within 5.25 s under a sustained stream of writes.
pub const INDEX_MAX_LAG: Duration = Duration::from_secs(5);

/// `[streams] orphan_timeout_s`: how long a run may have no producer before it ends as
/// `abandoned`.
pub const STREAM_ORPHAN_TIMEOUT: Duration = Duration::from_secs(300);

/// How often the daemon re-arms its inotify watches and rescans every store in full, as a
/// safety net under the watcher: a store directory that was replaced (restored from a backup,
/// moved) silently loses its watch. A rescan is a stat per file: at 10,000 credentials ~20 ms
/// every 30 s.
pub const RESCAN_INTERVAL: Duration = Duration::from_secs(30);

/// The `client` name the daemon's watchdog probe says in its `hello` (logged at debug only).
pub const WATCHDOG_CLIENT: &str = "holdfast-watchdog";

/// How often the daemon deletes runs idle past `[runs] retention_days`: retention is counted
/// in days, so an hour late is nothing, and the sweep lists every run directory.
pub const RUN_PRUNE_INTERVAL: Duration = Duration::from_secs(3600);

/// Largest run-log record (a node detail or a step with its text and tool calls): a step's LLM
/// text and tool results can be long, but a line of more than a mebibyte is a bug upstream, and
/// a replacement rewrites the whole file.
pub const MAX_RUN_RECORD_BYTES: usize = 1024 * 1024;

/// Runs whose parsed run logs the daemon keeps in memory; past this the cache starts over (each
/// run is re-read from its files on next use: a cost, never a loss). Agents work on a handful
/// of runs at a time.
pub const RUN_LOG_CACHED_RUNS: usize = 256;

/// A run log's torn last line younger than this may still be being written by a process that
/// does not take the lock (hive's own logger flushes long lines in pieces): it is waited for,
/// not cut. Two seconds covers a flush of any sane line on a loaded machine.
pub const RUN_LOG_FRESH_TAIL: Duration = Duration::from_secs(2);

/// Events queued for one stream subscriber before it counts as lagging. Four appends of the
/// largest size (1,024 events each) fit, so a subscriber that keeps up never lags on a burst;
/// one that does not is dropped by the run and re-subscribes after the last seq it took, from
/// the run's durable backlog (`streams::feed`): bounded memory, no event lost or repeated.
pub const SUBSCRIBER_QUEUE_EVENTS: usize = 4096;

// ---- Stores, files and the journal ----

/// File descriptors the daemon needs beyond the connection cap (stores, locks, watcher, logs),
/// added when it raises its open-file soft limit.
pub const SPARE_FDS: u64 = 256;

/// Bytes of a run-log file's end remembered to recognize it again (an inode number can be
/// reused).
pub const RUN_LOG_TAIL_BYTES: usize = 64;

/// How long a `client::Client` call waits for the daemon by default (a key rotation of a large store is the
/// slowest legitimate call). `set_read_timeout` changes it.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// Sleep between polls of a lock that has no wake-up to wait on (`durable::lock`).
pub const POLL_FALLBACK: Duration = Duration::from_millis(10);

/// Bytes per stream-journal segment (zero-filled ahead of use, so an append's `fdatasync`
/// flushes data only); a segment is released once no active run has records in it.
pub const SEGMENT_BYTES: u64 = 16 * 1024 * 1024;

/// How long a repairing scan waits before it quarantines a file that did not read: a writer
/// that rewrites files in place (hive: truncate, then write) may have been mid-write when the
/// scan read it. Found by `test_the_daemon_two_offline_clis_and_hive_write_one_store_at_once`.
pub const QUARANTINE_SETTLE: Duration = Duration::from_millis(100);

/// How often a read that found a credential file empty or torn looks again, for up to
/// [`QUARANTINE_SETTLE`] (a writer in place may be between its truncate and its write).
pub const READ_SETTLE_STEP: Duration = Duration::from_millis(10);

/// Largest payload of one stream-journal frame (a run's snapshot at a key rotation is the largest record).
pub const MAX_PAYLOAD: usize = 12 * 1024 * 1024;

/// Most bytes the stream journal writes in one batch: a torn write can only damage this much past the last
/// good frame, so non-zero bytes further away are corruption, not a torn tail.
pub const MAX_BATCH_BYTES: usize = 8 * 1024 * 1024;

/// Credential files larger than this are not kept in the daemon's file cache (a credential is
/// a few hundred bytes; a certificate chain a few KiB).
pub const FILE_CACHE_MAX_ENTRY_BYTES: usize = 64 * 1024;

/// A spare whose inode has not changed for this long belongs to no live pool (a pool unlinks
/// its spares after a minute unused, and reuse rewrites them): it is a crash leftover, even if
/// its owner's pid has been reused by another process.
pub const SPARE_ORPHAN_AGE: Duration = Duration::from_secs(600);

/// How long a retired credential file (a spare) waits before it is reused.
pub const SPARE_MIN_AGE: Duration = Duration::from_secs(1);

/// How many spares wait at most. Spares are reused only for their own file, so a workload
/// that rewrites many different credentials needs one per file rewritten in the last minute
/// (a cap of 4,096 made `holdfast bench`'s 10,000-credential rewrite loop evict, i.e. free
/// and discard, on every write: 1,168 sets/s instead of 3,876). At most 64 MiB of 4 KiB
/// blocks, and only while writes keep coming: idle spares are unlinked after a minute.
pub const SPARE_CAP: usize = 16_384;

/// Orphaned spares removed by one sweep at most. A daemon killed under load leaves thousands;
/// unlinking them all at once puts thousands of block discards into one file-system journal
/// commit, which every fsync on that file system then waits for (the test suite saw another
/// store's write time out after 10 s behind such a sweep). The rest go in later sweeps.
pub const ORPHAN_SWEEP_BATCH: usize = 64;

/// How many times a read-modify-write through the daemon retries after losing a race.
pub const CAS_RETRIES: usize = 8;

/// How many times a read re-reads a credential whose bytes no generation marker names (written
/// by another program, or overtaken by a write while they were read) after recording what the
/// file holds: each round is a lock hold and a read, and only a writer changing the file every
/// round keeps it going; then the read answers `busy`.
pub const GENERATION_READ_RETRIES: usize = 8;

/// The largest generation a write gives: 2^53 − 1, the largest integer every client reads
/// exactly from JSON (JavaScript's `Number.MAX_SAFE_INTEGER`). Only a document another program
/// wrote can carry a larger one; holdfast refuses to write over it rather than wrap or round.
pub const MAX_GENERATION: u64 = (1 << 53) - 1;

/// Snapshots `holdfast recovery plan` reads larger than this are refused (a turn's text and
/// tool arguments, not a corpus).
pub const MAX_SNAPSHOT_BYTES: u64 = 64 * 1024 * 1024;

/// Longest secret a person can type at the prompt (the terminal's line buffer is 4 KiB).
pub const PROMPT_MAX: usize = 64 * 1024;

/// How many credential change events a slow `cred.watch` may fall behind before it is told to
/// re-list (`resync`).
pub const EVENT_BACKLOG: usize = 1024;

/// Spare files (recycled credential files) unused this long are unlinked by the flusher.
pub const SPARE_IDLE: Duration = Duration::from_secs(60);

/// Most refresh leases one connection may hold at once (each is a (store, id) it is
/// refreshing; an agent refreshes a handful). Bounds the lease table under a hostile client.
pub const MAX_LEASES_PER_CONNECTION: usize = 64;

/// Writes one store may have on the blocking pool at once. They serialize on the store's lock
/// anyway; more would only park blocking-pool threads that reads need.
pub const MAX_WRITERS_PER_STORE: usize = 4;

/// Ciphertext the daemon's file cache may hold per store.
pub const FILE_CACHE_BYTES: usize = 16 * 1024 * 1024;

/// Most unreported changes kept (a daemon drains them within a flush interval; this only
/// bounds memory if nothing drains). Past it, the oldest are dropped.
pub const MAX_PENDING_CHANGES: usize = 100_000;

/// Default of `[runs] retention_days`: a month of history, like a CI system's logs.
pub const DEFAULT_RETENTION_DAYS: u64 = 30;

// ---- Streams and run logs ----

/// Longest run id, in bytes: it names a directory (`runs/<run_id>/`) and is echoed in every
/// event; 128 fits a UUID with any prefix an agent framework puts on it.
pub const MAX_RUN_ID_BYTES: usize = 128;

/// Default of `[streams] max_events_per_append`: one append carries what a producer buffered
/// while the previous one was in flight; a thousand deltas is seconds of a fast model.
pub const MAX_EVENTS_PER_APPEND: usize = 1024;

/// Default of `[streams] max_active_runs`: every active run lives in memory (its events and
/// accumulator); ten thousand is far past a developer machine's concurrent agents.
pub const MAX_ACTIVE_RUNS: usize = 10_000;

/// Default of `[streams] stale_after_secs`: a checkpoint with no event for an hour is stale on
/// resume (RECOVERY-RULES gap 5: the model's context or the user has moved on).
pub const STREAM_STALE_AFTER: Duration = Duration::from_secs(3600);

/// Default of `[streams] expire_after_secs`: a run with no event for a week is ended as
/// `expired` (its producer is gone for good; the state file keeps what it was).
pub const STREAM_EXPIRE_AFTER: Duration = Duration::from_secs(7 * 86_400);

/// Longest string key of a run-log record (`node_id`, `tool_call_id`, …): an identifier,
/// not content.
pub const MAX_RUN_LOG_KEY_BYTES: usize = 256;

/// Largest run-log file rewritten to replace one entry (`run.log_node` with new content):
/// the rewrite holds the whole file in memory.
pub const MAX_RUN_LOG_REWRITE_BYTES: usize = 256 * MAX_RUN_RECORD_BYTES;

/// Longest lock-holder description read from a lock file (who holds it, for the `busy`
/// message); anything longer is not one of ours.
pub const MAX_LOCK_HOLDER_BYTES: usize = 256;

/// How long a connection to PostgreSQL (or a pooled one) may take before the request that
/// needed it fails with `storage`: long enough for a server across a data centre, short
/// enough that a client sees a dead server as an error, not a hang.
pub const PG_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Default of `[backend] pool_size`: connections for reads, loads and checkpoints (commits
/// and LISTEN have one each); a developer machine's agents rarely run more than a few at once.
pub const PG_POOL_SIZE: usize = 8;

/// Most operations one PostgreSQL group commit carries: bounds a transaction's arrays (and so
/// the statement size) while still sharing one commit across hundreds of streams.
pub const PG_BATCH_MAX: usize = 1024;

/// Largest password file read (`[backend] password_file`, pgpass): a password, not a document.
pub const MAX_PASSWORD_FILE_BYTES: u64 = 64 << 10;

/// How often a stream follower on the PostgreSQL backend looks for new events even with no
/// notification (a lost LISTEN connection must delay events, never lose them).
pub const PG_FOLLOW_POLL: Duration = Duration::from_secs(2);

/// How often a `stream.begin` (takeover) or `stream.resume` on a shared store is tried again
/// when another host wrote the run between its load and the takeover: the old holder's last
/// in-flight append; more than a few in a row means two takers are racing, and one gets
/// `conflict`.
pub const SHARED_RETRIES: usize = 3;

/// How long the events of an ended run stay in PostgreSQL (`hf_stream_events`): a follower
/// still reading a run when it ended reads its tail within seconds; a new subscriber to an
/// ended run gets only its `finish`, from the run's state. Swept by the stream-expiry job.
pub const PG_ENDED_EVENTS_KEPT: Duration = Duration::from_secs(3600);

/// Default of `[streams] memory_events`: how many of an active run's latest published events
/// the daemon keeps in memory on the file backend (~121 bytes each; up to twice this many, as
/// they are dropped a window at a time). A subscriber asking for
/// older ones (a page refreshed late in a long answer) gets them derived from the run's records
/// in the journal, as a restart would; 1,024 covers most answers whole.
pub const STREAM_MEMORY_EVENTS: usize = 1024;
