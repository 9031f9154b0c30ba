//! libFuzzer's entry for the `scan` target. Its checks are in `fuzz/bodies/scan.rs`, shared
//! with the test suite, which replays `fuzz/corpus/scan/` through them on stable.
#![no_main]

#[path = "../bodies/mod.rs"]
mod bodies;

libfuzzer_sys::fuzz_target!(|data: &[u8]| bodies::scan::run(data));
