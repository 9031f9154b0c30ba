//! What a tool call sends back: results with a text and a structured form, evaluation
//! results with their images, errors, and progress notifications while it runs.

use base64::Engine;
use rmcp::handler::server::tool::IntoCallToolResult;
use rmcp::model::{
    CallToolResponse, CallToolResult, ContentBlock, ProgressNotificationParam, ResourceContents,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use serde::Serialize;
use serde_json::Value;

use crate::error::ToolError;
use crate::progress::Progress;
use crate::session::EvalReport;
use crate::session::report::RichContent;

/// A result with both a text and a structured form.
pub(super) fn result<T: Serialize>(text: String, structured: &T, is_error: bool) -> CallToolResult {
    let value = structured_value(structured);
    let mut r = if is_error {
        CallToolResult::structured_error(value)
    } else {
        CallToolResult::structured(value)
    };
    r.content = vec![ContentBlock::text(text)];
    r
}

/// A structured result (the result types write no `null`: an optional field is absent).
pub(super) fn structured_value<T: Serialize>(structured: &T) -> Value {
    serde_json::to_value(structured).unwrap_or(Value::Null)
}

/// An evaluation's result: its text, then its images as image contents.
pub(super) fn eval_result(r: &EvalReport) -> CallToolResult {
    let mut out = result(r.text(), r, r.is_error());
    let b64 = base64::engine::general_purpose::STANDARD;
    // The whole output, when the text holds only its head and tail.
    if let Some((uri, text)) = &r.whole {
        let name = uri.rsplit('/').next().unwrap_or_default();
        out.content
            .push(shown_link(uri, name, "text/plain", text.len()));
    }
    // Each figure, then a link that reads it again later.
    for (a, info) in r.attachments.iter().zip(&r.images) {
        out.content.push(ContentBlock::image(
            b64.encode(&a.data),
            a.mime_type.clone(),
        ));
        out.content
            .push(shown_link(&a.uri, &info.name, &a.mime_type, a.data.len()));
    }
    // Files the evaluation created or changed, as links the client can read (`resources/read`)
    // instead of copies; at most the ten the text names.
    for f in r.files.iter().take(10) {
        if let Some(uri) = &f.uri {
            let mut link =
                rmcp::model::Resource::new(uri.clone(), f.path.clone()).with_size(f.size);
            if let Some(m) = crate::session::files::mime_for(&f.path) {
                link = link.with_mime_type(m);
            }
            out.content.push(ContentBlock::resource_link(link));
        }
    }
    // A display's images are followed by their links; its text parts carry their URI; its
    // linked parts are links only.
    for block in &r.rich {
        match &block.content {
            RichContent::Image(data) => {
                out.content.push(ContentBlock::image(
                    b64.encode(data),
                    block.mime_type.clone(),
                ));
                let name = block.uri.rsplit('/').next().unwrap_or_default();
                out.content
                    .push(shown_link(&block.uri, name, &block.mime_type, data.len()));
            }
            RichContent::Link(data) => {
                let name = block.uri.rsplit('/').next().unwrap_or_default();
                out.content
                    .push(shown_link(&block.uri, name, &block.mime_type, data.len()));
            }
            RichContent::Text(text) => out.content.push(ContentBlock::resource(
                ResourceContents::text(text.clone(), block.uri.clone())
                    .with_mime_type(&block.mime_type),
            )),
        }
    }
    out
}

/// A `resource_link` to a figure or display part the session keeps.
fn shown_link(uri: &str, name: &str, mime: &str, size: usize) -> ContentBlock {
    ContentBlock::resource_link(
        rmcp::model::Resource::new(uri.to_string(), name.to_string())
            .with_mime_type(mime.to_string())
            .with_size(size as u64),
    )
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
