//! The plugin API: newline-delimited JSON-RPC 2.0 over a pathname Unix socket.
//!
//! - [`conn`]: a connection's socket (registered with tokio for reading only, speculative reads,
//!   non-blocking sends).
//! - [`frame`]: bounded line framing with idle and read timeouts.
//! - [`protocol`]: request parsing, response/notification lines, error codes and kinds.
//! - [`server`]: bind (singleton, stale socket, 0600), accept (peer uid), connections, shutdown.
//! - [`session`]: what a connection's handlers share; answers to pipelined requests held back.
//! - [`lane`]: the append lane, the thread that reads a connection once it streams appends.
//! - [`handlers`]: routing (admission, hello, unsubscribe) to the method families: [`creds`]
//!   (`cred.*`), [`admin`] (`admin.*`), [`streams`] (`stream.*`, `checkpoint.*`), [`runs`] (`run.*`).
//! - [`reply`]: the answer to one request, sent once by whichever thread has it; the blocking
//!   pool; a subscription within the cap.
//! - [`run_scope`]: a plugin grant's `runs`: calls naming other runs refused, listings filtered.
//! - [`audit`]: what each call records in the audit log, and when its answer may leave.
//! - [`subscriptions`]: a connection's subscriptions, their cap and `unsubscribe`.

pub mod activation;
pub mod admin;
pub mod answers;
pub mod audit;
pub mod conn;
pub mod creds;
pub mod frame;
pub mod handlers;
pub mod lane;
pub mod outbox;
pub mod protocol;
pub mod reply;
pub mod run_scope;
pub mod runs;
pub mod server;
pub mod session;
pub mod streams;
pub mod subscriptions;
