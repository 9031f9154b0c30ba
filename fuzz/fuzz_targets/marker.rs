//! libFuzzer's entry for the `marker` target. Its checks are in `fuzz/bodies/marker.rs`, shared
//! with the test suite, which replays `fuzz/corpus/marker/` through them on stable.
#![no_main]

#[path = "../bodies/mod.rs"]
mod bodies;

libfuzzer_sys::fuzz_target!(|data: &[u8]| bodies::marker::run(data));
