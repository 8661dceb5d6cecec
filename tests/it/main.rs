//! The integration tests, one module per topic.

#[path = "../support/mod.rs"]
mod support;

mod docs;
mod metrics_any_registry;
