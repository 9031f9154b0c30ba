//! libFuzzer's entry for the `uri` target. Its checks are in `fuzz/bodies/uri.rs`, shared
//! with the test suite, which replays `fuzz/corpus/uri/` through them on stable.
#![no_main]

#[path = "../bodies/mod.rs"]
mod bodies;

libfuzzer_sys::fuzz_target!(|data: &[u8]| bodies::uri::run(data));
