//! What a tool call sends back: results with a text and a structured form, evaluation
//! results with their images, errors, and progress notifications while it runs.

use rmcp::handler::server::tool::IntoCallToolResult;
use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock, ProgressNotificationParam};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use serde::Serialize;
use serde_json::Value;

use crate::error::ToolError;
use crate::progress::Progress;
use crate::session::EvalReport;

/// A result with both a text and a structured form.
pub(super) fn result<T: Serialize>(text: String, structured: &T, is_error: bool) -> CallToolResult {
    with_content(vec![ContentBlock::text(text)], structured, is_error)
}

/// A result with these contents (the presentation layer's, text first) and a structured form.
pub(super) fn with_content<T: Serialize>(
    content: Vec<ContentBlock>,
    structured: &T,
    is_error: bool,
) -> CallToolResult {
    let value = structured_value(structured);
    let mut r = if is_error {
        CallToolResult::structured_error(value)
    } else {
        CallToolResult::structured(value)
    };
    r.content = content;
    r
}

/// An evaluation's result: its contents and its report as the structured form.
pub(super) fn eval_result(r: &EvalReport) -> CallToolResult {
    with_content(r.content(), r, r.is_error())
}

/// A structured result (the result types write no `null`: an optional field is absent).
pub(super) fn structured_value<T: Serialize>(structured: &T) -> Value {
    serde_json::to_value(structured).unwrap_or(Value::Null)
}

/// Tell the client its resource list changed when the evaluation created or deleted files
/// or returned figures or displays (each one a resource)
/// (`notifications/resources/list_changed`); a client that cannot take it is not an error.
pub(super) async fn announce_files(ctx: &RequestContext<RoleServer>, r: &EvalReport) {
    use crate::session::files::Change;
    if !r.attachments.is_empty()
        || !r.rich.is_empty()
        || r.whole.is_some()
        || r.files
            .iter()
            .any(|f| matches!(f.change, Change::Created | Change::Deleted))
    {
        let _ = ctx.peer.notify_resource_list_changed().await;
    }
}

/// When the request carries a progress token, a reporter that forwards the latest output
/// line as a progress notification (in order, through one task); when it runs as an MCP
/// task, one that makes the line the task's status message.
pub(super) fn progress_reporter(
    ctx: &RequestContext<RoleServer>,
    timeout: std::time::Duration,
) -> Option<Box<Progress>> {
    if let Some(task) = ctx.extensions.get::<crate::tasks::TaskHandle>() {
        let task = task.clone();
        let started = std::time::Instant::now();
        return Some(Box::new(move |line: String| {
            task.status(if line.trim().is_empty() {
                format!("running for {:.0} s", started.elapsed().as_secs_f64())
            } else {
                line
            })
        }));
    }
    let token = ctx.meta.get_progress_token()?;
    let peer = ctx.peer.clone();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<ProgressNotificationParam>();
    tokio::spawn(async move {
        while let Some(p) = rx.recv().await {
            if peer.notify_progress(p).await.is_err() {
                break;
            }
        }
    });
    let started = std::time::Instant::now();
    let total = timeout.as_secs_f64();
    Some(Box::new(move |line: String| {
        let elapsed = started.elapsed().as_secs_f64();
        let message = if line.trim().is_empty() {
            format!("running for {elapsed:.0} s")
        } else {
            line
        };
        let _ = tx.send(
            ProgressNotificationParam::new(token.clone(), elapsed)
                .with_total(total)
                .with_message(message),
        );
    }))
}

/// A failure the agent should read: `isError`, the message as the text (it says what to do
/// next) and `{"error": {kind, message, …}}` as the structured content, to branch on.
pub(super) fn error_result(e: &ToolError) -> CallToolResult {
    let mut r = CallToolResult::structured_error(serde_json::json!({ "error": e }));
    r.content = vec![ContentBlock::text(e.message.clone())];
    r
}

/// Tools return `Result<_, ToolError>`; the error side becomes [`error_result`].
impl IntoCallToolResult for ToolError {
    fn into_call_tool_result(self) -> Result<CallToolResponse, ErrorData> {
        Ok(error_result(&self).into())
    }
}
