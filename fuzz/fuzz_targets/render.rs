//! libFuzzer's entry for the `render` target. Its checks are in `fuzz/bodies/render.rs`, shared
//! with the test suite, which replays `fuzz/corpus/render/` through them on stable.
#![no_main]

#[path = "../bodies/mod.rs"]
mod bodies;

libfuzzer_sys::fuzz_target!(|data: &[u8]| bodies::render::run(data));
