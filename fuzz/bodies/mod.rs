//! The fuzz targets' checks: `X::run(data)` checks one input against target X's properties
//! (panicking when one does not hold). libFuzzer drives them from `fuzz_targets/X.rs`; the
//! test suite replays every file of `corpus/X/` through them on stable (`tests/fuzz.rs`).
#![allow(dead_code)]

pub mod common;
pub mod lang;
pub mod marker;
pub mod quote;
pub mod render;
pub mod scan;
pub mod uri;
