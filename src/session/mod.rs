//! Persistent REPL sessions: a table of sessions keyed by id, each one interpreter behind a
//! PTY, driven by its language file.

pub mod artifacts;
pub mod ended;
pub mod entry;
pub mod eval;
pub mod export;
pub mod files;
pub mod history;
pub mod interp;
pub mod journal;
pub mod launch;
pub mod manager;
mod prepare;
pub mod report;
pub mod restore;
pub mod scan;
pub mod snapshot;
pub mod state_dir;
pub mod stdin_wait;
pub mod suspend;
mod table;
mod tools;
pub mod vars;
pub mod warm;
mod watch;

pub use artifacts::FileError;
pub use eval::Answer;
pub use files::InFile;
pub use launch::StartRequest;
pub use manager::SessionManager;
pub use report::{CloseReport, EvalReport, InterruptReport, ListReport, StartReport};
