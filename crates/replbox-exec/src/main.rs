//! `replbox-exec`: the `__exec` helper as a binary of its own, installed beside `replbox`.
//!
//! It runs exactly the same code as `replbox __exec` ([`replbox::exec::helper`]), with the
//! same arguments, but starting it costs much less: the server's binary is large and
//! position-independent, so every exec of it had the dynamic loader apply ~24,000
//! relocations (copy-on-write faults on every page they touch) and Rust's runtime set up
//! its stack-overflow handler, before the helper's first line ran. This binary links only
//! the helper and has no Rust `main` (so no runtime start-up: the helper needs none).
//! The server uses it when it sits next to the server's executable and falls back to
//! `replbox __exec` otherwise (see `exec::spawn::helper_exe`).

#![no_main]

use std::ffi::{c_char, c_int};

use replbox::exec::helper::{self, HelperArgs};

#[unsafe(no_mangle)]
pub extern "C" fn main(_argc: c_int, _argv: *const *const c_char) -> c_int {
    // glibc hands the arguments to std before `main` runs, so `args_os` works without
    // Rust's runtime start-up.
    let mut args = std::env::args_os();
    // The same command line as `replbox __exec …`, so either binary can be used.
    if args.nth(1).is_none_or(|a| a != helper::SUBCOMMAND) {
        eprintln!("replbox-exec: this is replbox's internal helper; run `replbox` instead");
        return 127;
    }
    match HelperArgs::parse(args) {
        Ok(a) => helper::run(a),
        Err(e) => {
            eprintln!("replbox __exec: {e}");
            127
        }
    }
}
