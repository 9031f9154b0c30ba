//! The library's public surface: everything the other targets of the workspace use, and
//! nothing else. The `replbox` binary (`src/main.rs`), the benchmark (`crates/replbox-bench`)
//! and the integration tests (`tests/`) reach the server only through here; the fuzz targets
//! (`fuzz/`) through `replbox::fuzzing` (the `fuzzing` feature). Every other module is private
//! to the crate, so the compiler reports what nothing uses.

// The server: its settings, its shared state, the MCP handler and the two transports.
pub use crate::app::App;
pub use crate::config::{Config, HttpConfig, LogFormat};
pub use crate::http::serve as serve_http;
pub use crate::mcp::ReplboxServer;
/// The `tracing` layer that forwards log events to the MCP clients that asked for them.
pub use crate::mcp::client_log::layer as client_log_layer;
pub use crate::stdio::transport as stdio_transport;

// The command line's other commands: `run`, `install`, `doctor`.
pub use crate::doctor::run as doctor;
pub use crate::install::path_without_own_env;
pub use crate::run::{RunReport, RunRequest};

/// `replbox install --client`: a client's configuration entry, written into its file.
pub mod clients {
    pub use crate::clients::{Change, Client, Entry, default_file, install, render, transient_exe};
}

// Languages: the registry, quoting a string for a language's REPL, finding a program.
pub use crate::lang::protocol::Format;
pub use crate::lang::{Registry, did_you_mean, which};

// The sandbox and the helper (`replbox-exec`), for the helper's own tests and the
// benchmark's floors (the same programs started without replbox's session machinery).
pub use crate::exec::{SpawnSpec, Stdio3, spawn};
pub use crate::sandbox::{
    HELPER_BIN, Jail, Level, Limits, Mode, Sandbox, Settings, reachable_by_others, set_helper_exe,
};

/// A terminal as the server opens one for a session's interpreter.
pub mod pty {
    pub use crate::exec::pty::{PtyMaster, ReadOutcome, open};
}

/// The environment the server gives every program it starts.
pub mod env {
    pub use crate::exec::env::{base_env, set};
}
