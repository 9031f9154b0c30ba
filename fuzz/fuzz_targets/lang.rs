//! libFuzzer's entry for the `lang` target. Its checks are in `fuzz/bodies/lang.rs`, shared
//! with the test suite, which replays `fuzz/corpus/lang/` through them on stable.
#![no_main]

#[path = "../bodies/mod.rs"]
mod bodies;

libfuzzer_sys::fuzz_target!(|data: &[u8]| bodies::lang::run(data));
