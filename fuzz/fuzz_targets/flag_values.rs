//! cargo-fuzz target: [`reconcile_watchdog_fuzz::flag_values`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| reconcile_watchdog_fuzz::flag_values(data));
