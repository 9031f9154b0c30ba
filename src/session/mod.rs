//! Persistent REPL sessions: a table of sessions keyed by id, each one interpreter behind a
//! PTY, driven by its language file.

pub mod files;
pub mod interp;
pub mod manager;
pub mod report;
pub mod scan;
pub mod stdin_wait;

pub use files::InFile;
pub use manager::{Caller, FileData, FileError, Session, SessionManager, StartRequest};
pub use report::{
    Attachment, CloseReport, ErrorInfo, EvalReport, EvalStatus, ImageInfo, InterruptReport,
    ListReport, SessionInfo, StartReport,
};
