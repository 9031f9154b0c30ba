//! What `run-code` returns: the structured result (its text: src/present/run.rs).

use schemars::JsonSchema;
use serde::Serialize;

use crate::lang::InterpreterInfo;
use crate::sandbox::Level;

/// Which step a result comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Compile,
    Run,
}

/// The result of one `run-code` call (also its `structuredContent`).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct RunReport {
    /// Canonical id of the language that ran.
    pub language: String,
    /// Standard output (head and tail kept when over the cap, with a line saying how many
    /// bytes were left out).
    pub stdout: String,
    pub stderr: String,
    /// Exit code, when the program exited (absent when it was killed by a signal).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Name of the signal that ended the program (for example SIGKILL after a timeout).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    pub timed_out: bool,
    pub duration_ms: u64,
    /// True when stdout or stderr was cut to the cap.
    pub truncated: bool,
    /// `compile` when a compiled language failed to build (exit_code is the compiler's),
    /// else `run`.
    pub phase: Phase,
    /// Set when the program could not be started at all, or the call was cancelled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The isolation level the program ran under.
    pub sandbox: Level,
    /// The interpreter (or compiler) used, and why that one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interpreter: Option<InterpreterInfo>,
    /// MCP servers the code could call.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mcp_servers: Vec<crate::upstream::ServerTools>,
    /// Tool calls made, in the order they ended.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<crate::upstream::CallSummary>,
    /// The packages installed for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub packages: Option<crate::packages::Installed>,
}

impl RunReport {
    /// A report for a run of `language` under `sandbox` that has not happened yet.
    pub(super) fn new(language: &str, sandbox: Level) -> Self {
        Self {
            language: language.to_string(),
            stdout: String::new(),
            stderr: String::new(),
            exit_code: None,
            signal: None,
            timed_out: false,
            duration_ms: 0,
            truncated: false,
            phase: Phase::Run,
            error: None,
            sandbox,
            interpreter: None,
            mcp_servers: Vec::new(),
            tool_calls: Vec::new(),
            packages: None,
        }
    }

    /// Paths in the run's directory shown relative to it in the output, so a traceback
    /// names `main.py` (as the program was started) rather than where the server keeps its
    /// runs (interpreters make the script's path absolute).
    pub(super) fn hide_dir(&mut self, dir: &std::path::Path) {
        let prefix = format!("{}/", dir.display());
        for out in [&mut self.stdout, &mut self.stderr] {
            if out.contains(&prefix) {
                *out = out.replace(&prefix, "");
            }
        }
    }

    /// The program ran and exited 0.
    pub fn success(&self) -> bool {
        self.exit_code == Some(0)
            && !self.timed_out
            && self.error.is_none()
            && self.phase == Phase::Run
    }
}
