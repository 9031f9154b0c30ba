//! replbox: an MCP server for persistent interpreter sessions and one-shot code runs.
//!
//! The library serves the `replbox` and `replbox-exec` binaries and the tests; only what
//! they use is public.

pub mod app;
pub mod bench;
pub mod config;
pub(crate) mod error;
pub mod exec;
pub mod http;
pub(crate) mod identity;
pub mod lang;
pub mod mcp;
pub(crate) mod output;
pub(crate) mod progress;
pub mod run;
pub mod sandbox;
pub(crate) mod session;
pub(crate) mod workspace;
