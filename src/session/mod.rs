//! Persistent REPL sessions: one interpreter behind a PTY each, driven by its language file,
//! in one table of sessions keyed by id.
//!
//! Layered like the crate, each layer using only its own and lower ones:
//!
//! 1. The protocol and the data: [`scan`] (the PTY stream: output, prompts, markers),
//!    [`interp`] (one interpreter and the evaluation protocol; [`stdin_wait`] from /proc),
//!    [`files`], [`snapshot`] and [`watch`] (a directory and its changes), [`history`] (the
//!    cells), [`journal`] and [`state_dir`] (journals on disk), [`report`] (what the tools
//!    return).
//! 2. The table: [`live`] (one session and its phase), [`table`] (every id, one lock).
//! 3. The services, each with the few dependencies it needs: [`launch`] (a request to an
//!    interpreter up: language, directories, environment, confinement; warm sessions),
//!    [`evaluate`] (evaluations, input, interrupts, names; their report, history and
//!    journal line), [`persist`] (the journals: suspended sessions).
//! 4. The manager and its flows: [`manager`] (the services together, the calls the tools
//!    make), [`start`], [`end`], [`restore`]; then [`present`] (lists, history, exports,
//!    resources).

mod adopt;
mod end;
pub mod evaluate;
pub mod files;
pub mod history;
pub mod interp;
pub mod journal;
pub mod launch;
mod live;
pub mod manager;
mod persist;
pub mod present;
pub mod report;
mod restore;
pub mod scan;
pub mod snapshot;
mod start;
pub mod state_dir;
pub mod stdin_wait;
mod table;
mod tools;
mod watch;

pub use evaluate::Answer;
pub use files::InFile;
pub use launch::StartRequest;
pub use manager::SessionManager;
pub use present::resources::FileError;
pub use report::{CloseReport, EvalReport, InterruptReport, ListReport, StartReport};
