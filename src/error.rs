//! The errors a tool call reports to the agent: a kind to branch on and a message that says
//! what happened and what to do next. Sessions and runs return them; the MCP layer turns them
//! into `isError` results with `structuredContent: {"error": {kind, message, …}}`.
//!
//! Below this edge each layer has its own error type (`thiserror`), whose variants carry the
//! data; beside each, one `From` impl into [`ToolError`] decides which [`ErrorKind`] each
//! variant becomes, its message being the error's `Display`.

use serde::Serialize;

/// What went wrong, for agents (and tests) to branch on. The message says the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The session is running an evaluation of another call.
    Busy,
    /// The session's evaluation is paused waiting for input: answer it with
    /// `session_input` or stop it with `session_interrupt` first.
    AwaitingInput,
    /// `session_input` on a session that is not waiting for input.
    NotAwaitingInput,
    /// No such session (another principal's sessions are unknown too).
    UnknownSession,
    /// The session was closed, its interpreter exited, or it was closed for idleness or to
    /// make room.
    EndedSession,
    /// The session is suspended (the server it ran in stopped, or it ended with its
    /// journal kept): `session_restore` starts it again.
    Suspended,
    /// A limit of the server was reached: open sessions, sandbox user ids.
    Limit,
    /// An argument was refused: an environment variable, `cwd`, `files`, a line too long.
    InvalidArgument,
    /// The language is unknown here, or cannot hold a session.
    UnsupportedLanguage,
    /// The language's interpreter is missing on this host or cannot run at its sandbox level.
    NotInstalled,
    /// The interpreter did not start (it exited, or did not answer in time).
    StartFailed,
    /// A package asked for (`packages`, `%pip install`) could not be installed: the message
    /// names it and says why.
    PackageUnavailable,
    /// The server could not do its part (a directory, a file it writes, a task).
    Internal,
    /// Another server of the cluster holds the session (`--cluster`).
    SessionElsewhere,
    /// The server cannot serve this now (its cluster registry is out of reach): try again.
    Unavailable,
}

/// A failed tool call: its kind, the message for the agent, and what it is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ToolError {
    pub kind: ErrorKind,
    pub message: String,
    /// The session concerned, for errors about one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The evaluation concerned: the one in progress (`busy`) or waiting for input.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_id: Option<u64>,
}

impl ToolError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            session_id: None,
            eval_id: None,
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }

    pub fn session(mut self, id: &str) -> Self {
        self.session_id = Some(id.to_string());
        self
    }

    pub fn eval(mut self, eval_id: Option<u64>) -> Self {
        self.eval_id = eval_id;
        self
    }
}

impl std::fmt::Display for ToolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ToolError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serializes_kind_and_what_it_is_about() {
        let e = ToolError::new(ErrorKind::Busy, "session s is busy")
            .session("s")
            .eval(Some(3));
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            serde_json::json!({"kind": "busy", "message": "session s is busy",
                               "session_id": "s", "eval_id": 3})
        );
        let e = ToolError::invalid("bad cwd");
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            serde_json::json!({"kind": "invalid_argument", "message": "bad cwd"})
        );
        assert_eq!(e.to_string(), "bad cwd");
    }
}
