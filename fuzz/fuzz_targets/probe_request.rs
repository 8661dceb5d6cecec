//! cargo-fuzz target: [`reconcile_watchdog_fuzz::probe_request`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| reconcile_watchdog_fuzz::probe_request(data));
