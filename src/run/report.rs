//! What `run-code` returns: the structured result and its text.

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

    /// The text content: exactly stdout on a clean success (as mcp-server-code-runner
    /// returns it), else stdout, stderr and a trailer saying how it ended.
    pub fn text(&self) -> String {
        let mut t = self.text_of_run();
        if let Some(p) = &self.packages {
            end_line(&mut t);
            t.push_str(&format!("[{}]", p.line()));
        }
        t
    }

    fn text_of_run(&self) -> String {
        if self.success() && self.stderr.is_empty() {
            return self.stdout.clone();
        }
        let mut t = self.stdout.clone();
        if !self.stderr.is_empty() {
            end_line(&mut t);
            t.push_str("[stderr]\n");
            t.push_str(&self.stderr);
        }
        end_line(&mut t);
        t.push_str(&self.trailer());
        t
    }

    fn trailer(&self) -> String {
        let during = if self.phase == Phase::Compile {
            " while compiling"
        } else {
            ""
        };
        if self.timed_out {
            return format!("[timed out after {} ms{during}]", self.duration_ms);
        }
        if let Some(e) = &self.error {
            return format!("[{e}]");
        }
        let how = match (&self.exit_code, &self.signal) {
            (Some(c), _) => format!("exit code {c}"),
            (None, Some(s)) => format!("killed by {s}"),
            (None, None) => "ended".to_string(),
        };
        if self.phase == Phase::Compile {
            format!("[compile error: {how}]")
        } else {
            format!("[{how}]")
        }
    }
}

fn end_line(t: &mut String) {
    if !t.is_empty() && !t.ends_with('\n') {
        t.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> RunReport {
        RunReport {
            language: "python".into(),
            stdout: "out\n".into(),
            stderr: String::new(),
            exit_code: Some(0),
            signal: None,
            timed_out: false,
            duration_ms: 12,
            truncated: false,
            phase: Phase::Run,
            error: None,
            sandbox: Level::Bwrap,
            interpreter: None,
            mcp_servers: Vec::new(),
            tool_calls: Vec::new(),
            packages: None,
        }
    }

    #[test]
    fn clean_success_is_exactly_stdout() {
        assert_eq!(report().text(), "out\n");
        let mut r = report();
        r.stdout = "no newline".into();
        assert_eq!(r.text(), "no newline");
    }

    #[test]
    fn stderr_and_exit_code_are_kept() {
        let mut r = report();
        r.stderr = "warn".into();
        assert!(r.success());
        assert_eq!(r.text(), "out\n[stderr]\nwarn\n[exit code 0]");
        r.exit_code = Some(3);
        r.stdout = "partial".into();
        r.stderr.clear();
        assert!(!r.success());
        assert_eq!(r.text(), "partial\n[exit code 3]");
    }

    #[test]
    fn trailers() {
        let mut r = report();
        r.timed_out = true;
        r.exit_code = None;
        r.signal = Some("SIGKILL".into());
        r.duration_ms = 2003;
        assert!(r.text().ends_with("[timed out after 2003 ms]"));
        let mut r = report();
        r.phase = Phase::Compile;
        r.exit_code = Some(1);
        r.stdout.clear();
        r.stderr = "main.c:1: error".into();
        assert_eq!(
            r.text(),
            "[stderr]\nmain.c:1: error\n[compile error: exit code 1]"
        );
        let mut r = report();
        r.exit_code = None;
        r.signal = Some("SIGSEGV".into());
        assert!(r.text().ends_with("[killed by SIGSEGV]"));
    }
}
