//! Runs kube-runtime controllers with every reconcile under the watchdog's guard.
//!
//! [`Controllers`] takes each `Controller` with its reconcile, error policy and
//! context, as `Controller::run` would, and:
//! - wraps every reconcile in the guard of its controller (the object as
//!   `namespace/name`, the resource's kind), so a hang is seen, reported and probed;
//! - turns a panic or a watchdog cancellation into an error of the user's own type
//!   (`E: From<guard::Error>`), which the untouched error policy then sees;
//! - consumes the output stream, logging reconcile errors at WARN with the object;
//! - releases the `informer-sync` readiness latch once every controller's store has
//!   synced;
//! - stops taking new work when the shutdown token is cancelled, and returns once the
//!   reconciles in flight have finished (the caller bounds that wait);
//! - under [`leader`] election, reconciles only while the lease is held
//!   ([`Controllers::only_while`]).
//!
//! The same source builds on kube 5, 4 or 3 (features `kube-5`, also named `kube`,
//! `kube-4` and `kube-3`), with that major's k8s-openapi; an operator on an older kube
//! wires the core by hand (`docs/older-kube.md`).
//!
//! [`guarded`] (in `reconciler`) is the primitive under it, for an operator that runs its own
//! `Controller::run` pipeline. `docs/embedding.md` shows both ways, with a shutdown on
//! SIGTERM supervised from a plain thread ([`crate::shutdown`]); its examples compile as
//! doc tests.

pub mod apiserver;
mod controllers;
pub mod events;
pub mod leader;
mod log;
pub mod quarantine;
mod reconciler;
pub mod requests;
pub mod restarts;
pub mod watches;

pub use apiserver::ApiServerCheck;
pub use controllers::{Controllers, INFORMER_SYNC};
pub(crate) use log::error_chain;
pub use reconciler::{GuardedReconcile, controller_handle, guarded, object_key};
