//! libFuzzer's entry for the `quote` target. Its checks are in `fuzz/bodies/quote.rs`, shared
//! with the test suite, which replays `fuzz/corpus/quote/` through them on stable.
#![no_main]

#[path = "../bodies/mod.rs"]
mod bodies;

libfuzzer_sys::fuzz_target!(|data: &[u8]| bodies::quote::run(data));
