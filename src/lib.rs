//! replbox: an MCP server for persistent interpreter sessions and one-shot code runs.

pub mod app;
pub mod bench;
pub mod config;
pub mod error;
pub mod exec;
pub mod http;
pub mod identity;
pub mod lang;
pub mod mcp;
pub mod output;
pub mod progress;
pub mod run;
pub mod sandbox;
pub mod session;
pub mod workspace;
