//! The integration and end-to-end tests, as one test crate: the dependencies are linked
//! once, not once per file. Each module is a topic of its own; CI runs every test in a
//! process of its own (cargo-nextest), so process-wide state (the global tracing
//! subscriber, rlimits, signal handlers) stays per test.

#[path = "../support/mod.rs"]
mod support;

mod bad_input;
mod controller_names;
mod crd;
mod deadlines;
mod debug_reconciles;
mod demo;
mod demo_hangs;
mod doc_examples;
mod docs;
mod driver_rescue;
mod e2e;
mod flag_conflicts;
mod flags_doc;
mod flood;
mod fuzz_corpus;
mod guard;
mod guard_hot_path;
mod hangs;
mod kube_3_operator;
mod log_records;
mod metrics;
mod metrics_any_registry;
mod metrics_registry;
// Its every test needs the capture of x86_64 Linux: without it, the module's helpers would
// be dead code.
#[cfg(all(feature = "stack-capture", target_os = "linux", target_arch = "x86_64"))]
mod no_frame_pointers;
mod pause;
mod request_timeouts;
mod scrape_while_stalled;
mod termination_message;
