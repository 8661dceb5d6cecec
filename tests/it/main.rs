//! The integration tests, one module per topic.

#[path = "../support/mod.rs"]
mod support;

mod docs;
mod kube_3_operator;
mod metrics_any_registry;
