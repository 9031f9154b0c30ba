//! `replbox-exec`, installed beside `replbox`: see the library's documentation.
//!
//! It has no Rust `main` (so no runtime start-up: the helper needs none) and links only the
//! helper. Starting the server's own large, position-independent binary instead cost the
//! dynamic loader ~24,000 relocations before the helper's first line ran.

#![no_main]

use std::ffi::{c_char, c_int};

#[unsafe(no_mangle)]
pub extern "C" fn main(_argc: c_int, _argv: *const *const c_char) -> c_int {
    replbox_exec::main()
}
