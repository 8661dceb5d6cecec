//! Truthful liveness and readiness probes for Kubernetes operators built on kube-rs.
//!
//! Every reconcile runs inside a timed [`Guard`](guard::Guard) recorded in a
//! [`Registry`](guard::Registry). A [`Monitor`](monitor::Monitor) on its own OS thread
//! scans the registry, writes a hang report when a guard outlives its deadline and
//! publishes the verdict to the [`health`] checks, which the [`probes`] server answers
//! the kubelet from. Neither the monitor nor the probe server depend on the async
//! runtime that runs the reconciles, so they keep telling the truth when it is wedged.
//!
//! ```
//! use std::time::Duration;
//! use reconcile_watchdog::guard::{ObjectKey, Registry};
//!
//! # async fn example() {
//! let registry = Registry::new(Duration::from_secs(300));
//! let configmaps = registry.controller("configmaps", "ConfigMap");
//! let result = configmaps
//!     .guard(ObjectKey::namespaced("default", "app-config"), async { Ok::<_, ()>(()) })
//!     .await;
//! assert!(matches!(result, Ok(Ok(()))));
//! assert!(registry.is_empty());
//! # }
//! ```
#![deny(unsafe_code)]
#![warn(missing_docs, rust_2018_idioms, unreachable_pub, clippy::all)]

pub mod deadlines;
pub mod guard;
pub mod health;
pub mod kube;
pub mod metrics;
pub mod monitor;
pub mod probes;
pub mod shutdown;
pub mod stack;
pub mod watchdog;

pub use watchdog::{Builder, Watchdog};

/// The README's examples compile and run as doc tests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

#[doc(hidden)]
pub mod cli;
#[doc(hidden)]
pub mod demo;
#[doc(hidden)]
pub mod operator;
