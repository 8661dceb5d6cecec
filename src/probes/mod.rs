//! The probe server: `/healthz`, `/livez`, `/readyz` and `/debug/reconciles` over HTTP.
//!
//! [`routes`] decides every answer as a plain function of the request, so it is tested
//! without a socket; [`server`] serves it with warp on its own OS thread and its own
//! current-thread runtime, so the kubelet gets an answer when the operator's runtime is
//! wedged.

pub mod routes;
pub mod server;

pub use routes::Probes;
pub use server::{Error, HttpServer, parse_bind_address};
