//! The probe server (`/healthz`, `/livez`, `/readyz`) and the debug server
//! (`/debug/reconciles`), each over HTTP on its own address and thread.
//!
//! [`routes`] and [`debug`] are warp filters (the peer's address read from the
//! request's extensions), also answered without a socket (`respond`) for tests and
//! fuzzing; [`server`] serves them through `warp::service` on its own OS thread and its
//! own current-thread runtime, so the kubelet gets an answer when the operator's runtime
//! is wedged, with a header timeout and a connection cap that a flood of unfinished
//! connections cannot get past.

pub mod debug;
mod response;
pub mod routes;
pub mod server;

pub use debug::DebugViews;
pub use routes::Probes;
pub use server::{Error, HttpServer, Limits, Peer, Request};
