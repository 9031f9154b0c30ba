//! The integration tests, one module per file beside this one, compiled and linked as one
//! binary: the harness (`common/`) and every dependency are built once rather than once per
//! file. Run one file's tests with `cargo nextest run --test suite -E 'test(/^sessions::/)'`
//! or `cargo test --test suite -- sessions::`; see docs/testing.md.

mod common;

mod cli;
mod cluster;
mod code_mode;
mod data;
mod display;
mod durable;
mod egress;
mod fuzz;
mod ghci_attacks;
mod helper;
mod http;
mod http_limits;
mod inspect_attacks;
mod install;
mod interrupts;
mod isolation;
mod languages;
mod lifecycle;
mod nginx;
mod package_builds;
mod package_cache;
mod package_layer_attacks;
mod packages;
mod pool;
mod r;
mod render;
mod run_code;
mod security_env;
mod security_files;
mod security_fsview;
mod security_misc;
mod security_render;
mod security_review;
mod security_review2;
mod security_review3_kernel;
mod server;
mod session_pool;
mod sessions;
mod surface;
mod tasks;
mod terminal;
mod venv;
