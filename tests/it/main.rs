//! The integration tests, one module per topic.

mod log_records;
#[path = "../support/mod.rs"]
mod support;
mod termination_message;
