//! Progress of long work, as the transport reports it (MCP progress notifications).

/// Receives the latest output line of a running evaluation or run, about twice a second.
pub type Progress = dyn Fn(String) + Send + Sync;
