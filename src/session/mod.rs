//! Persistent REPL sessions: a table of sessions keyed by id, each one interpreter behind a
//! PTY, driven by its language file.

pub mod interp;
pub mod manager;
pub mod report;
pub mod scan;
pub mod stdin_wait;

pub use manager::{Caller, Session, SessionManager, StartRequest};
pub use report::{
    CloseReport, ErrorInfo, EvalReport, EvalStatus, InterruptReport, ListReport, SessionInfo,
    StartReport,
};
