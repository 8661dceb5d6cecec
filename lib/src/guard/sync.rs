//! The atomics the entry's state word is built on: std's.
//!
//! The loom model of the state word's protocol (`lib/tests/loom.rs`) compiles
//! `state.rs` beside a module of this name that gives loom's instead, so the model
//! checks the code that ships without a cfg of its own (which would rebuild every
//! dependency for the model).

pub(crate) use std::sync::atomic::{AtomicU64, Ordering, fence};
