//! replbox: an MCP server for persistent interpreter sessions and one-shot code runs.
//!
//! The library serves the `replbox` binary, the benchmark, the fuzz targets and the tests;
//! what they use is public through [`api`] (and `fuzzing`, with the `fuzzing` feature),
//! every module else is private to the crate.

// replbox is built on Linux interfaces throughout (bubblewrap, Landlock, seccomp, /proc,
// PTYs, fs credentials), so on any other target this is the one error a build reports:
// every module below is left out there.
#[cfg(not(target_os = "linux"))]
compile_error!(
    "replbox runs on Linux only (it needs bubblewrap, Landlock, seccomp and /proc); \
     macOS and Windows are not supported yet. Build it on Linux, or run it in a Linux \
     container or VM."
);

#[cfg(target_os = "linux")]
pub mod api;
#[cfg(target_os = "linux")]
mod app;
#[cfg(target_os = "linux")]
mod bounded_read;
#[cfg(target_os = "linux")]
mod clients;
#[cfg(target_os = "linux")]
mod cluster;
#[cfg(target_os = "linux")]
mod config;
#[cfg(target_os = "linux")]
mod doctor;
#[cfg(target_os = "linux")]
mod egress;
#[cfg(target_os = "linux")]
mod error;
#[cfg(target_os = "linux")]
mod exec;
#[cfg(all(target_os = "linux", feature = "fuzzing"))]
pub mod fuzzing;
#[cfg(target_os = "linux")]
mod hostfs;
#[cfg(target_os = "linux")]
mod http;
#[cfg(target_os = "linux")]
mod identity;
#[cfg(target_os = "linux")]
mod install;
#[cfg(target_os = "linux")]
mod lang;
#[cfg(target_os = "linux")]
mod mcp;
#[cfg(target_os = "linux")]
mod metrics;
#[cfg(target_os = "linux")]
mod output;
#[cfg(target_os = "linux")]
mod packages;
#[cfg(target_os = "linux")]
mod pool;
#[cfg(target_os = "linux")]
mod present;
#[cfg(target_os = "linux")]
mod proc;
#[cfg(target_os = "linux")]
mod progress;
#[cfg(target_os = "linux")]
mod run;
#[cfg(target_os = "linux")]
mod sandbox;
#[cfg(target_os = "linux")]
mod session;
#[cfg(target_os = "linux")]
mod share;
#[cfg(target_os = "linux")]
mod stdio;
#[cfg(target_os = "linux")]
mod tasks;
#[cfg(target_os = "linux")]
mod upstream;
#[cfg(target_os = "linux")]
mod venv;
#[cfg(target_os = "linux")]
mod workspace;
