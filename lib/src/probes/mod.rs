//! The probe server (`/healthz`, `/livez`, `/readyz`) and the debug server
//! (`/debug/reconciles`), each over HTTP on its own address and thread.
//!
//! [`routes`] and [`debug`] decide every answer as a plain function of the request
//! (peer address included), so they are tested without a socket; [`server`] serves them
//! on its own OS thread and its own current-thread runtime, so the kubelet gets an
//! answer when the operator's runtime is wedged, with a header timeout and a
//! connection cap that a flood of unfinished connections cannot get past.

pub mod debug;
pub mod routes;
pub mod server;

pub use debug::DebugViews;
pub use routes::Probes;
pub use server::{Error, Handler, HttpServer, Limits, Request};
