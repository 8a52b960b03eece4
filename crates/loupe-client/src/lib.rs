//! The client side of `loupe serve`, for the binary and the tests alike.
//!
//! * [`spawn`]: starts a `loupe serve` child on 127.0.0.1 with a free port, waits until its
//!   log says it is ready, keeps its log, and stops it one way (SIGTERM, then SIGKILL after a
//!   grace period). `loupe bisect`'s served rung, `loupe bench-serve` without `--url` and the
//!   CLI's server tests all start their server through it.
//! * [`http`]: one blocking HTTP/1.1 request on a fresh connection (status and de-chunked
//!   body), enough for a test or a bisect rung; no keep-alive, no TLS.
//! * [`bench`]: `loupe bench-serve`'s load client (hyper on tokio), for any OpenAI-compatible
//!   server.
//!
//! Nothing here knows the engine: this crate depends on loupe-core only (the seeded
//! generator of the bench's prompts), so a server-side crate never pulls in a client.

pub mod bench;
pub mod http;
pub mod spawn;

pub use http::{HttpClient, HttpError, Response};
pub use spawn::{ServeProcess, SpawnError, SpawnOptions, Stopped};
