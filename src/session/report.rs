//! What the session tools return, and how an evaluation's ending becomes a status.

use base64::Engine;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::scan;

/// Status of one evaluation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EvalStatus {
    Ok,
    Error,
    Timeout,
    Exited,
    AwaitingInput,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub struct ErrorInfo {
    /// The exception or error class, as the language names it.
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
}

/// The result of `session_eval` (also its `structuredContent`).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct EvalReport {
    pub session_id: String,
    /// Number of this evaluation in the session, from 1.
    pub eval_id: u64,
    pub status: EvalStatus,
    /// What a person would have seen in the terminal: no echo, prompts or escape
    /// sequences; the value of a trailing expression shown as the REPL shows it.
    pub output: String,
    pub truncated: bool,
    pub duration_ms: u64,
    /// The interpreter's exit code, when status is `exited`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that ended the interpreter, when status is `exited` because of one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    /// True when the interpreter had to be replaced: the session's state is lost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restarted: Option<bool>,
    /// The error the code raised, where the language tells.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorInfo>,
}

impl EvalReport {
    pub fn is_error(&self) -> bool {
        matches!(
            self.status,
            EvalStatus::Error | EvalStatus::Timeout | EvalStatus::Exited
        )
    }

    /// The text content: the output, then a line saying how it ended when not `ok`.
    pub fn text(&self) -> String {
        let mut t = self.output.clone();
        let trailer = match self.status {
            EvalStatus::Ok => None,
            EvalStatus::Error => Some(match &self.error {
                Some(e) if e.message.is_empty() => format!("[error: {}]", e.kind),
                Some(e) => format!("[error: {}: {}]", e.kind, first_line(&e.message)),
                None => "[error]".to_string(),
            }),
            EvalStatus::Timeout => Some(if self.restarted == Some(true) {
                format!(
                    "[timed out after {} ms; the interpreter did not stop and was restarted: state lost]",
                    self.duration_ms
                )
            } else {
                format!(
                    "[timed out after {} ms; interrupted, the session keeps its state]",
                    self.duration_ms
                )
            }),
            EvalStatus::Exited => Some(format!(
                "[the interpreter exited ({}); start a new session with session_start]",
                match (&self.exit_code, &self.signal) {
                    (Some(c), _) => format!("exit code {c}"),
                    (None, Some(s)) => format!("killed by {s}"),
                    _ => "status unknown".into(),
                }
            )),
            EvalStatus::AwaitingInput => {
                Some("[waiting for input: answer with session_input, or interrupt]".to_string())
            }
        };
        if let Some(tr) = trailer {
            if !t.is_empty() && !t.ends_with('\n') {
                t.push('\n');
            }
            t.push_str(&tr);
        }
        t
    }
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

/// What `session_start` returns.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct StartReport {
    pub session_id: String,
    pub language: String,
    pub version: String,
    /// Process id of the interpreter.
    pub pid: u32,
    pub cwd: String,
    pub idle_timeout_s: u64,
    /// The isolation level the interpreter runs under.
    pub sandbox: crate::sandbox::Level,
}

/// What `session_close` returns.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct CloseReport {
    pub session_id: String,
    pub closed: bool,
    /// The interpreter's exit code (null when it had to be killed).
    pub exit_code: Option<i32>,
}

/// One row of `session_list`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct SessionInfo {
    pub session_id: String,
    pub language: String,
    pub pid: u32,
    pub cwd: String,
    /// Seconds since the Unix epoch.
    pub created_at: u64,
    pub last_used_at: u64,
    pub idle_s: u64,
    pub evals: u64,
    pub busy: bool,
    /// An evaluation is paused waiting for input (answer it with session_input).
    pub awaiting_input: bool,
    pub idle_timeout_s: u64,
    /// Seconds until the session is closed for idleness, if it stays unused.
    pub expires_in_s: u64,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ListReport {
    pub sessions: Vec<SessionInfo>,
}

/// What `session_interrupt` returns.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct InterruptReport {
    pub session_id: String,
    /// Whether there was an evaluation to interrupt.
    pub interrupted: bool,
    /// The evaluation interrupted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_id: Option<u64>,
    /// The interrupted evaluation's result, when it was paused waiting for input (an
    /// evaluation running in another call returns its result to that call).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<EvalReport>,
}

/// Fill status and error from the end marker (or the language's error pattern).
pub(super) fn apply_marker(
    report: &mut EvalReport,
    marker: &scan::EndMarker,
    error_pattern: Option<&str>,
) {
    let payload: Option<ErrorInfo> = if marker.payload.is_empty() {
        None
    } else {
        base64::engine::general_purpose::STANDARD
            .decode(marker.payload.as_bytes())
            .ok()
            .and_then(|b| serde_json::from_slice::<ErrorInfo>(&b).ok())
    };
    report.status = match marker.status.as_str() {
        "ok" => EvalStatus::Ok,
        "error" => EvalStatus::Error,
        // The code itself raised the interrupt (a deadline goes through the timeout path).
        "interrupted" => {
            report.error.get_or_insert(ErrorInfo {
                kind: "KeyboardInterrupt".into(),
                message: String::new(),
            });
            EvalStatus::Error
        }
        _ => {
            // `?`: the REPL cannot tell; look at the output.
            match error_pattern.and_then(|p| regex::Regex::new(p).ok()) {
                Some(re) => match re.captures(&report.output) {
                    Some(c) => {
                        if payload.is_none() {
                            report.error = Some(ErrorInfo {
                                kind: c
                                    .get(1)
                                    .map(|m| m.as_str().to_string())
                                    .unwrap_or_else(|| "error".into()),
                                message: c
                                    .get(2)
                                    .map(|m| m.as_str().trim().to_string())
                                    .unwrap_or_default(),
                            });
                        }
                        EvalStatus::Error
                    }
                    None => EvalStatus::Ok,
                },
                None => EvalStatus::Ok,
            }
        }
    };
    if payload.is_some() {
        report.error = payload;
    }
}
