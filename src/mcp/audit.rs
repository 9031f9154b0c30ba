//! One audit event per tool call (target `replbox::audit`, INFO): who called which tool, on
//! which session and language, how it ended, how long it took and how many bytes it
//! returned; and the call's metrics. Never the code, the output, or the values of `env`:
//! every field is the server's own vocabulary (tool names, language ids, statuses) or a
//! number, and a caller's session id only when it has the shape of one.

use std::time::Instant;

use rmcp::ErrorData;
use rmcp::model::{CallToolRequestParams, CallToolResponse, CallToolResult};
use serde_json::Value;

use crate::app::App;
use crate::identity::Caller;

/// A tool call in progress, as the audit line and the metrics will describe it.
pub(super) struct Call {
    principal: String,
    /// The tool's name when it is one of the server's, else "unknown".
    tool: String,
    session: Option<String>,
    /// The language id (resolved from an alias), when the call names one.
    language: Option<String>,
    started: Instant,
}

/// A session id the server could have made: short, of letters, digits and dashes.
fn session_like(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A status as a metric label and log field: the server's words only.
fn status_word(s: &str) -> bool {
    !s.is_empty() && s.len() <= 32 && s.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
}

impl Call {
    pub(super) fn begin(
        app: &App,
        caller: &Caller,
        request: &CallToolRequestParams,
        known: bool,
    ) -> Self {
        let arg = |k: &str| {
            request
                .arguments
                .as_ref()
                .and_then(|a| a.get(k))
                .and_then(Value::as_str)
        };
        let session = arg("session_id")
            .filter(|s| session_like(s))
            .map(str::to_string);
        let language = match (arg("languageId").or(arg("language")), &session) {
            (Some(name), _) => app.registry.get(name).ok().map(|l| l.id().to_string()),
            (None, Some(id)) => app.sessions.language_of(caller, id),
            (None, None) => None,
        };
        Self {
            principal: caller.principal.clone(),
            tool: if known {
                request.name.to_string()
            } else {
                "unknown".into()
            },
            session,
            language,
            started: Instant::now(),
        }
    }

    /// Log the call's end and count it.
    pub(super) fn end(self, app: &App, response: &Result<CallToolResponse, ErrorData>) {
        let duration_ms = self.started.elapsed().as_millis() as u64;
        let result = match response {
            Ok(CallToolResponse::Complete(r)) => Some(r),
            _ => None,
        };
        let structured = result.and_then(|r| r.structured_content.as_ref());
        let field = |k: &str| structured.and_then(|s| s.get(k));
        let status = match (response, result) {
            (Err(_), _) => "protocol_error".to_string(),
            (Ok(_), None) => "deferred".to_string(),
            (Ok(_), Some(r)) => status_of(r),
        };
        let session = self.session.or_else(|| {
            field("session_id")
                .and_then(Value::as_str)
                .map(str::to_string)
        });
        let language = field("language")
            .and_then(Value::as_str)
            .map(str::to_string)
            .or(self.language);
        let exit_code = field("exit_code").and_then(Value::as_i64);
        let bytes = result.map_or(0, returned_bytes);
        tracing::info!(
            target: "replbox::audit",
            principal = %self.principal,
            tool = %self.tool,
            session = session.as_deref().map(tracing::field::display),
            language = language.as_deref().map(tracing::field::display),
            status = %status,
            exit_code,
            duration_ms,
            bytes,
            "tool call"
        );
        app.metrics.call(&self.tool, &status);
        // The work's own duration (the report's), by language.
        let seconds = field("duration_ms")
            .and_then(Value::as_u64)
            .map(|ms| ms as f64 / 1000.0);
        if let (Some(s), Some(lang)) = (seconds, language.as_deref()) {
            match self.tool.as_str() {
                "run-code" => app.metrics.run(lang, s),
                "session_eval" | "session_input" => app.metrics.eval(lang, s),
                _ => {}
            }
        }
    }
}

/// How a call ended: the kind of a refused call, an evaluation's status, a run's timeout,
/// else ok or error.
fn status_of(r: &CallToolResult) -> String {
    let s = r.structured_content.as_ref();
    fn word(v: Option<&Value>) -> Option<&str> {
        v.and_then(Value::as_str).filter(|w| status_word(w))
    }
    if let Some(kind) = word(s.and_then(|s| s.get("error")).and_then(|e| e.get("kind"))) {
        return kind.to_string();
    }
    if let Some(st) = word(s.and_then(|s| s.get("status"))) {
        return st.to_string();
    }
    if s.and_then(|s| s.get("timed_out")).and_then(Value::as_bool) == Some(true) {
        return "timeout".into();
    }
    if r.is_error == Some(true) {
        "error".into()
    } else {
        "ok".into()
    }
}

/// Bytes of the result's contents (text, and images as sent).
fn returned_bytes(r: &CallToolResult) -> u64 {
    r.content
        .iter()
        .map(|c| {
            if let Some(t) = c.as_text() {
                t.text.len()
            } else if let Some(i) = c.as_image() {
                i.data.len()
            } else {
                0
            }
        })
        .sum::<usize>() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::ContentBlock;
    use serde_json::json;

    fn structured(v: Value, is_error: bool) -> CallToolResult {
        let mut r = if is_error {
            CallToolResult::structured_error(v)
        } else {
            CallToolResult::structured(v)
        };
        r.content = vec![ContentBlock::text("abc")];
        r
    }

    #[test]
    fn statuses() {
        let refused = structured(json!({"error": {"kind": "unknown_session"}}), true);
        assert_eq!(status_of(&refused), "unknown_session");
        let eval = structured(json!({"status": "timeout", "error": {"type": "X"}}), true);
        assert_eq!(status_of(&eval), "timeout");
        let run = structured(json!({"timed_out": true, "error": "cancelled"}), true);
        assert_eq!(status_of(&run), "timeout");
        assert_eq!(
            status_of(&structured(json!({"exit_code": 3}), true)),
            "error"
        );
        assert_eq!(status_of(&structured(json!({"exit_code": 0}), false)), "ok");
        // Not the server's words: not a label.
        let odd = structured(json!({"status": "Ok\nforged=1"}), false);
        assert_eq!(status_of(&odd), "ok");
        assert_eq!(returned_bytes(&run), 3);
    }

    #[test]
    fn only_id_shaped_session_ids_are_logged() {
        assert!(session_like("3f1c2a9e-0b7d-4c1e-9a55-1d2e3f4a5b6c"));
        for bad in ["", "a b", "x\ny", "id\u{1b}[31m", &"a".repeat(65)] {
            assert!(!session_like(bad), "{bad:?}");
        }
    }
}
