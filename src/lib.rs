//! replbox: an MCP server for persistent interpreter sessions and one-shot code runs.
//!
//! The library serves the `replbox` binary, the benchmark and the tests; only what they use
//! is public.

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
pub mod app;
#[cfg(target_os = "linux")]
pub mod clients;
#[cfg(target_os = "linux")]
pub mod cluster;
#[cfg(target_os = "linux")]
pub mod config;
#[cfg(target_os = "linux")]
pub mod doctor;
#[cfg(target_os = "linux")]
pub mod egress;
#[cfg(target_os = "linux")]
pub(crate) mod error;
#[cfg(target_os = "linux")]
pub mod exec;
#[cfg(all(target_os = "linux", feature = "fuzzing"))]
pub mod fuzzing;
#[cfg(target_os = "linux")]
pub mod hostfs;
#[cfg(target_os = "linux")]
pub mod http;
#[cfg(target_os = "linux")]
pub(crate) mod identity;
#[cfg(target_os = "linux")]
pub mod install;
#[cfg(target_os = "linux")]
pub mod lang;
#[cfg(target_os = "linux")]
pub mod mcp;
#[cfg(target_os = "linux")]
pub mod metrics;
#[cfg(target_os = "linux")]
pub(crate) mod output;
#[cfg(target_os = "linux")]
pub(crate) mod packages;
#[cfg(target_os = "linux")]
pub(crate) mod pool;
#[cfg(target_os = "linux")]
pub(crate) mod proc;
#[cfg(target_os = "linux")]
pub(crate) mod progress;
#[cfg(target_os = "linux")]
pub mod run;
#[cfg(target_os = "linux")]
pub mod sandbox;
#[cfg(target_os = "linux")]
pub(crate) mod session;
#[cfg(target_os = "linux")]
pub(crate) mod share;
#[cfg(target_os = "linux")]
pub mod stdio;
#[cfg(target_os = "linux")]
pub(crate) mod tasks;
#[cfg(target_os = "linux")]
pub mod upstream;
#[cfg(target_os = "linux")]
pub(crate) mod venv;
#[cfg(target_os = "linux")]
pub(crate) mod workspace;
