//! What the session tools return, and how an evaluation's ending becomes a status.

use base64::Engine;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::files::FileChange;
use super::interp::Ending;
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
    /// When `output` is cut: the whole output, a text resource (`?page=N` reads a part).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_uri: Option<String>,
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
    /// True when the deadline passed and the code was interrupted, but finished all the same
    /// (it caught the interrupt, or was ending as it came): the status is the code's own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<bool>,
    /// Figures the evaluation drew or changed (Python with matplotlib), attached to the
    /// result as PNG image contents in this order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<ImageInfo>,
    /// Figures left out because of the per-evaluation caps (the notes say which cap).
    #[serde(skip_serializing_if = "is_zero")]
    pub images_omitted: u64,
    /// Rich displays (Python's `display()`, a value with `_repr_*_` methods): each one's
    /// MIME types, in the order of its content blocks, and a table's shape, columns and
    /// first and last rows as records.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub displays: Vec<DisplayInfo>,
    /// Files in the session's directory created, modified or deleted since the previous
    /// evaluation (hidden files and directories are not tracked). Each readable one has the
    /// `uri` of an MCP resource.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<FileChange>,
    /// Changed files beyond the ones listed.
    #[serde(skip_serializing_if = "is_zero")]
    pub files_omitted: u64,
    /// Earlier cells' output (threads, timers, jobs) from between evaluations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub background_output: Option<String>,
    /// Input typed with `session_input` that the program did not read before the evaluation
    /// ended. It was discarded, never run as code.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub discarded_input: Option<String>,
    /// Things the agent should know about this result: a cap that was hit, file tracking
    /// turned off.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// The session was suspended and this call restored it first: the number of its cells
    /// replayed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replayed: Option<u64>,
    /// Cells that did not succeed when they were replayed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub replay_failed: Vec<ReplayFailure>,
    /// The image data, sent as image contents (not part of the structured result).
    #[serde(skip)]
    #[schemars(skip)]
    pub attachments: Vec<Attachment>,
    /// The whole output behind `output_uri`: (URI, text).
    #[serde(skip)]
    #[schemars(skip)]
    pub whole: Option<(String, String)>,
    /// The displays' content blocks (not part of the structured result).
    #[serde(skip)]
    #[schemars(skip)]
    pub rich: Vec<RichBlock>,
    /// Displays the end marker announced, still to be read from `out/`.
    #[serde(skip)]
    #[schemars(skip)]
    pub(crate) pending_displays: Vec<DisplayRef>,
    /// Displays the bootstrap left out over its count cap.
    #[serde(skip)]
    #[schemars(skip)]
    pub(crate) displays_omitted: u64,
    /// Images the end marker announced, still to be read from the control directory.
    #[serde(skip)]
    #[schemars(skip)]
    pub(crate) pending_images: Vec<ImageRef>,
    /// Bytes of typed input the program left unread, as the end marker counted them.
    #[serde(skip)]
    #[schemars(skip)]
    pub(crate) unread: u64,
    /// How the output splits, as the end marker said: its last lines that show the value
    /// of the trailing expression, or the traceback of the error (for notebooks).
    #[serde(skip)]
    #[schemars(skip)]
    pub(crate) split: OutputSplit,
}

/// The end marker's word on which trailing lines of the output are the displayed value or
/// the error's traceback (`value_lines`, `traceback_lines`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct OutputSplit {
    pub value_lines: usize,
    pub traceback_lines: usize,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One image of an evaluation's result.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ImageInfo {
    /// A name for it (`figure-N.png`, N the figure's number).
    pub name: String,
    pub mime_type: String,
    pub bytes: u64,
    pub width: u32,
    pub height: u32,
    /// Where `resources/read` returns it again (`replbox://sessions/{id}/figures/…`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub uri: String,
}

/// Bytes sent as an image content, and kept to be read again at `uri`.
#[derive(Debug, Clone)]
pub struct Attachment {
    pub mime_type: String,
    pub data: Vec<u8>,
    pub uri: String,
}

/// One rich display of an evaluation.
#[derive(Debug, Clone, Default, Serialize, JsonSchema)]
pub struct DisplayInfo {
    pub mime_types: Vec<String>,
    /// The resource URI of each of `mime_types`, in the same order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub uris: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frame: Option<serde_json::Value>,
}

/// A display's content block: an image, or a text resource (HTML, Markdown, JSON, …), kept
/// to be read again at `uri`.
#[derive(Debug, Clone)]
pub struct RichBlock {
    pub mime_type: String,
    pub uri: String,
    pub content: RichContent,
}

#[derive(Debug, Clone)]
pub enum RichContent {
    Image(Vec<u8>),
    Text(String),
    /// Kept as a resource and only linked from the result (a bundle's `linked` parts: an R
    /// plot's SVG beside its PNG), so it costs the reader a link, not a copy.
    Link(Vec<u8>),
}

impl RichContent {
    pub fn bytes(&self) -> &[u8] {
        match self {
            RichContent::Image(b) | RichContent::Link(b) => b,
            RichContent::Text(t) => t.as_bytes(),
        }
    }
}

/// A bundle file the bootstrap wrote into `out/`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub(crate) struct DisplayRef {
    pub file: String,
}

/// An image file the bootstrap wrote into the control directory.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub(crate) struct ImageRef {
    /// File name inside the control directory.
    pub file: String,
    /// The figure's number, for naming it.
    #[serde(default)]
    pub figure: Option<u64>,
}

/// What an end marker's payload may carry: an error (`type`, `message`), the images the
/// evaluation produced, and how many it left out. Languages that only report errors send
/// `{type, message}`.
#[derive(Debug, Default, Deserialize)]
struct MarkerPayload {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    images: Vec<ImageRef>,
    #[serde(default)]
    images_omitted: u64,
    #[serde(default)]
    displays: Vec<DisplayRef>,
    #[serde(default)]
    displays_omitted: u64,
    /// Bytes of typed input the bootstrap found unread, and discarded, at the end.
    #[serde(default)]
    unread: u64,
    #[serde(default)]
    value_lines: usize,
    #[serde(default)]
    traceback_lines: usize,
}

impl EvalReport {
    /// A report with status ok and nothing in it yet.
    pub fn empty(session_id: &str, eval_id: u64) -> Self {
        Self {
            session_id: session_id.to_string(),
            eval_id,
            status: EvalStatus::Ok,
            output: String::new(),
            truncated: false,
            output_uri: None,
            whole: None,
            duration_ms: 0,
            exit_code: None,
            signal: None,
            restarted: None,
            interrupted: None,
            error: None,
            images: Vec::new(),
            images_omitted: 0,
            displays: Vec::new(),
            rich: Vec::new(),
            pending_displays: Vec::new(),
            displays_omitted: 0,
            files: Vec::new(),
            files_omitted: 0,
            background_output: None,
            discarded_input: None,
            notes: Vec::new(),
            replayed: None,
            replay_failed: Vec::new(),
            attachments: Vec::new(),
            pending_images: Vec::new(),
            unread: 0,
            split: OutputSplit::default(),
        }
    }

    /// Say which input the program left unread: the last `unread` bytes of what was typed
    /// into the evaluation (the terminal hands input over in order).
    pub(crate) fn discarded(&mut self, typed: &[u8]) {
        if self.unread == 0 || typed.is_empty() {
            return;
        }
        let n = usize::try_from(self.unread)
            .unwrap_or(usize::MAX)
            .min(typed.len());
        let text = String::from_utf8_lossy(&typed[typed.len() - n..]).into_owned();
        let shown: String = text.chars().take(200).collect();
        let more = if shown.len() < text.len() { "…" } else { "" };
        self.notes.push(format!(
            "input the program did not read was discarded, not run: {shown:?}{more}"
        ));
        self.discarded_input = Some(text);
    }

    pub fn is_error(&self) -> bool {
        matches!(
            self.status,
            EvalStatus::Error | EvalStatus::Timeout | EvalStatus::Exited
        )
    }
}

/// What `session_start` returns.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct StartReport {
    pub session_id: String,
    pub language: String,
    pub version: String,
    /// The interpreter the session runs, and why that one (the server's default, its
    /// `--python`, the `venv` argument, a `.venv` in `cwd`).
    pub interpreter: crate::lang::InterpreterInfo,
    /// Process id of the interpreter.
    pub pid: u32,
    pub cwd: String,
    /// Whether the session's code may create and change files in `cwd` (a caller's directory
    /// its user may not write is used read-only).
    pub cwd_writable: bool,
    pub idle_timeout_s: u64,
    /// The isolation level the interpreter runs under.
    pub sandbox: crate::sandbox::Level,
    /// Files brought into the directory (`files`), relative to it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<String>,
    /// Things the agent should know about the session (file tracking turned off).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Whether it was started ahead of time (`--session-pool`) rather than for this call.
    pub warm: bool,
    /// MCP servers the code may call.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mcp_servers: Vec<crate::upstream::ServerTools>,
    /// The packages installed for it (`packages`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub packages: Option<crate::packages::Installed>,
}

/// What `session_close` returns.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct CloseReport {
    pub session_id: String,
    pub closed: bool,
    /// The interpreter's exit code (absent when it had to be killed).
    #[serde(skip_serializing_if = "Option::is_none")]
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
    /// The open sessions.
    pub sessions: Vec<SessionInfo>,
    /// Sessions that ended recently (their files and history are kept for a while) or are
    /// suspended (restorable with session_restore).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ended: Vec<EndedInfo>,
}

/// One ended (or suspended) session in `session_list`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct EndedInfo {
    pub session_id: String,
    pub language: String,
    /// `ended`, or `suspended`: restorable with session_restore (its journal is kept).
    pub state: String,
    /// How it ended: `closed`, `exited`, `reaped`, `evicted`, `handed_over`, or
    /// `server_stopped`.
    pub reason: String,
    /// Unix time it ended, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<u64>,
    /// Unix time until which its files stay readable as resources (read-only) and its
    /// history stays listable; absent when they are gone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub files_kept_until: Option<u64>,
    pub evals: u64,
    pub restorable: bool,
}

/// A cell that did not succeed when it was replayed.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ReplayFailure {
    pub eval_id: u64,
    pub status: EvalStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorInfo>,
    /// The end of what it printed.
    pub output: String,
}

/// What `session_restore` returns.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct RestoreReport {
    pub session_id: String,
    pub language: String,
    pub version: String,
    pub pid: u32,
    pub cwd: String,
    pub sandbox: crate::sandbox::Level,
    /// Cells run again, in order (those that had succeeded).
    pub replayed: u64,
    /// Cells not run again because they had failed (or been interrupted).
    pub skipped: u64,
    /// Replayed cells that did not succeed this time.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<ReplayFailure>,
    pub duration_ms: u64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
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

/// Fill status, error, exit and images from how the evaluation ended.
pub(super) fn apply_ending(
    report: &mut EvalReport,
    ending: &Ending,
    error_pattern: Option<&regex::Regex>,
) {
    let error = |kind: &str, message: String| {
        Some(ErrorInfo {
            kind: kind.into(),
            message,
        })
    };
    match ending {
        Ending::Done(marker) => apply_marker(report, marker, error_pattern),
        // The code caught the interrupt and finished (or finished as it came): its own
        // status, not a timeout. A bootstrap that cannot tell (`?`, ghci) leaves it a timeout.
        Ending::TimedOut { marker: Some(m) } if m.status != "interrupted" && m.status != "?" => {
            apply_marker(report, m, error_pattern);
            report.interrupted = Some(true);
            report
                .notes
                .push("the deadline passed and the code was interrupted, but it finished".into());
        }
        Ending::TimedOut { marker } => {
            report.status = EvalStatus::Timeout;
            // The interrupted code may still have drawn figures before its marker.
            if let Some(m) = marker {
                (report.pending_images, report.images_omitted) = marker_images(m);
            }
        }
        Ending::Cancelled => {
            report.status = EvalStatus::Error;
            report.error = error(
                "Interrupted",
                "interrupted on request; the session keeps its state".into(),
            );
        }
        Ending::Restarted { .. } => {
            report.status = EvalStatus::Timeout;
            report.restarted = Some(true);
        }
        Ending::Incomplete => {
            report.status = EvalStatus::Error;
            report.error = error("IncompleteInput", "the REPL expected more input".into());
        }
        Ending::Failed(reason) => {
            report.status = EvalStatus::Error;
            report.error = error("ReplboxError", reason.clone());
        }
        Ending::AwaitingInput => report.status = EvalStatus::AwaitingInput,
        Ending::Replaced(program) => {
            report.status = EvalStatus::Exited;
            report.error = error(
                "InterpreterReplaced",
                format!(
                    "the code replaced the interpreter with another program ({program:?}, \
through exec), found waiting for input where the REPL was; replbox cannot drive it, so it \
was stopped and the session has ended. Start a new one with session_start."
                ),
            );
        }
        Ending::Exited(status) => {
            report.status = EvalStatus::Exited;
            if let Some(st) = status {
                let (code, sig) = crate::exec::describe_status(st);
                report.exit_code = code;
                report.signal = sig;
            }
        }
    }
}

/// Fill status and error from the end marker (or the language's error pattern). Public for
/// the fuzz targets (`fuzz/`): the payload is bytes user code can forge.
pub fn apply_marker(
    report: &mut EvalReport,
    marker: &scan::EndMarker,
    error_pattern: Option<&regex::Regex>,
) {
    let extras = decode_payload(&marker.payload);
    report.pending_images = extras.images;
    report.images_omitted = extras.images_omitted;
    report.pending_displays = extras.displays;
    report.displays_omitted = extras.displays_omitted;
    report.unread = extras.unread;
    report.split = OutputSplit {
        value_lines: extras.value_lines,
        traceback_lines: extras.traceback_lines,
    };
    let payload: Option<ErrorInfo> = extras.kind.map(|kind| ErrorInfo {
        kind,
        message: extras.message.unwrap_or_default(),
    });
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
            match error_pattern {
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

/// An end marker's payload as JSON (null when empty or not base64 JSON).
pub(super) fn payload_json(payload: &str) -> serde_json::Value {
    base64::engine::general_purpose::STANDARD
        .decode(payload.as_bytes())
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(serde_json::Value::Null)
}

fn decode_payload(payload: &str) -> MarkerPayload {
    if payload.is_empty() {
        return MarkerPayload::default();
    }
    base64::engine::general_purpose::STANDARD
        .decode(payload.as_bytes())
        .ok()
        .and_then(|b| serde_json::from_slice::<MarkerPayload>(&b).ok())
        .unwrap_or_default()
}

/// The images a marker announced, for an evaluation that ended another way (an interrupted
/// evaluation's late marker still carries the figures it drew).
fn marker_images(marker: &scan::EndMarker) -> (Vec<ImageRef>, u64) {
    let extras = decode_payload(&marker.payload);
    (extras.images, extras.images_omitted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marker(json: &str) -> scan::EndMarker {
        scan::EndMarker {
            n: 1,
            status: "error".into(),
            payload: base64::engine::general_purpose::STANDARD.encode(json),
        }
    }

    #[test]
    fn payloads_carry_errors_and_images() {
        let mut r = EvalReport::empty("s", 1);
        apply_marker(
            &mut r,
            &marker(r#"{"type":"ValueError","message":"bad"}"#),
            None,
        );
        assert_eq!(
            r.error.as_ref().map(|e| e.kind.as_str()),
            Some("ValueError")
        );
        assert!(r.pending_images.is_empty());
        let mut r = EvalReport::empty("s", 1);
        apply_marker(
            &mut r,
            &marker(r#"{"images":[{"file":"img-1-1.png","figure":3}],"images_omitted":2}"#),
            None,
        );
        assert_eq!(r.error, None);
        assert_eq!(
            r.pending_images,
            vec![ImageRef {
                file: "img-1-1.png".into(),
                figure: Some(3)
            }]
        );
        assert_eq!(r.images_omitted, 2);
    }
}
