//! The probe server (`/healthz`, `/livez`, `/readyz`) and the debug server
//! (`/debug/reconciles`), each over HTTP on its own address and thread.
//!
//! `routes.rs` and `debug.rs` are warp filters (the peer's address read from the
//! request's extensions), also answered without a socket (`respond`) for tests and
//! fuzzing; `server.rs` serves them through `warp::service` on its own OS thread and its
//! own current-thread runtime, so the kubelet gets an answer when the operator's runtime
//! is wedged, with a header timeout and a connection cap that a flood of unfinished
//! connections cannot get past.

// The builder serves the probes; what is public here is the error it may return. The
// routes and the server are this crate's (its tests, benchmarks and fuzz targets reach
// them through `internals`).
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub))]
pub(crate) mod debug;
mod response;
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub))]
pub(crate) mod routes;
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub))]
pub(crate) mod server;

pub(crate) use debug::DebugViews;
pub(crate) use routes::Probes;
pub use server::Error;
pub(crate) use server::HttpServer;
