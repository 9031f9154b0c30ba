//! Persistent REPL sessions: a table of sessions keyed by id, each one interpreter behind a
//! PTY, driven by its language file.

pub mod artifacts;
pub mod entry;
pub mod eval;
pub mod files;
pub mod interp;
pub mod launch;
pub mod manager;
pub mod report;
pub mod scan;
pub mod stdin_wait;

pub use artifacts::FileError;
pub use files::InFile;
pub use launch::StartRequest;
pub use manager::SessionManager;
pub use report::{CloseReport, EvalReport, InterruptReport, ListReport, StartReport};
