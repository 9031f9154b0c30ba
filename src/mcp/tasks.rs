//! `session_eval`, `session_input` and `run-code` as MCP tasks, for clients that declare
//! the `io.modelcontextprotocol/tasks` extension: the call returns a task at once and the
//! tool runs on detached from the request (a client that goes away, or polls from another
//! connection, changes nothing); `tasks/get` shows the latest output line, then the tool's
//! usual result; `tasks/cancel` cancels it as a client's cancel does (a cell is
//! interrupted, its session's state kept); a cell that waits for input asks for it as
//! `input_required`, and `tasks/update` types the answer as `session_input` would.

use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CreateTaskResult, DetailedTask,
    GetTaskResult, InputRequest, JsonObject, TaskPayload,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use serde_json::{Value, json};

use super::{ReplboxServer, reply};
use crate::error::{ErrorKind, ToolError};
use crate::identity::Caller;
use crate::tasks::{Claim, TaskError, TaskHandle, result_object};
use rmcp::handler::server::tool::IntoCallToolResult;

/// The tools a client that speaks the extension gets as tasks.
pub(super) const TASK_TOOLS: [&str; 3] = ["session_eval", "session_input", "run-code"];

/// Whether this request's client declared the tasks extension.
pub(super) fn client_speaks_tasks(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.client_capabilities()
        .is_some_and(|c| c.supports_tasks())
}

/// What a task's status message says of the output a cell printed before it asked.
const ASKED_TAIL: usize = 2000;

impl ReplboxServer {
    /// A call of one of [`TASK_TOOLS`] that runs as a task (`as_task`) or carries an
    /// idempotency key: a retry with the key gets the first call's task or result.
    pub(super) async fn call_tracked(
        &self,
        caller: Caller,
        mut request: CallToolRequestParams,
        mut ctx: RequestContext<RoleServer>,
        as_task: bool,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.get_or_insert_with(JsonObject::new);
        let key = match args.remove("idempotency_key") {
            Some(Value::String(k)) => Some(k),
            _ => None,
        };
        if let Some(k) = &key
            && (k.is_empty() || k.len() > MAX_KEY_BYTES)
        {
            return ToolError::invalid(format!(
                "idempotency_key must be 1 to {MAX_KEY_BYTES} bytes (it is {}); a UUID is a \
good key",
                k.len()
            ))
            .into_call_tool_result();
        }
        let timeout_ms = args.get("timeout_ms").and_then(Value::as_u64);
        let runs_for = self.app.config.timeout(timeout_ms);
        let fingerprint = key.map(|k| (k, fingerprint(&request)));
        let claim = self
            .app
            .tasks
            .claim(&caller, &request.name, runs_for, fingerprint.clone());
        let (task, handle) = match claim {
            Err(e) => {
                return ToolError::new(ErrorKind::Limit, e.to_string()).into_call_tool_result();
            }
            Ok(Claim::Existing { same: false, .. }) => {
                let k = fingerprint.map(|f| f.0).unwrap_or_default();
                return ToolError::invalid(format!(
                    "idempotency_key {k:?} was given to another call (another tool or other \
arguments) that is still remembered; a retry must repeat the call exactly, and a new call \
needs a new key"
                ))
                .into_call_tool_result();
            }
            Ok(Claim::Existing { task, .. }) if as_task => {
                return Ok(CreateTaskResult::new(task).into());
            }
            Ok(Claim::Existing { task, mut done, .. }) => {
                // A retry without the extension waits for the first call's result.
                tokio::select! {
                    _ = done.wait_for(|d| *d) => {}
                    _ = ctx.ct.cancelled() => {
                        return Err(ErrorData::internal_error("cancelled", None));
                    }
                }
                return self.replay_outcome(&caller, &task.task_id);
            }
            Ok(Claim::New(task, handle)) => (task, handle),
        };
        ctx.extensions.insert(caller.clone());
        if !as_task {
            // Run as a plain call (cancelled with its request), the result kept for retries.
            let response = self.call_route(request, &ctx).await;
            let _ = end_with(&handle, &response, ctx.ct.is_cancelled());
            return response;
        }
        // The work is the task's now: only tasks/cancel stops it, and its progress goes to
        // the task's status message, not to a request that has been answered.
        ctx.ct = handle.cancel_token().clone();
        ctx.meta.remove("progressToken");
        ctx.extensions.insert(handle.clone());
        let server = self.clone();
        tracing::debug!(task = %handle.id(), tool = %request.name, "task started");
        tokio::spawn(async move { server.drive(caller, request, ctx, handle).await });
        Ok(CreateTaskResult::new(task).into())
    }

    /// The first call's answer, for a retry with its idempotency key.
    fn replay_outcome(&self, caller: &Caller, id: &str) -> Result<CallToolResponse, ErrorData> {
        match self.app.tasks.outcome(caller, id) {
            Some(TaskPayload::Completed { result }) => {
                serde_json::from_value::<CallToolResult>(Value::Object(result))
                    .map(Into::into)
                    .map_err(|e| ErrorData::internal_error(e.to_string(), None))
            }
            Some(TaskPayload::Failed { error }) => {
                Err(serde_json::from_value(Value::Object(error))
                    .unwrap_or_else(|_| ErrorData::internal_error("the first call failed", None)))
            }
            _ => ToolError::new(
                ErrorKind::Internal,
                "the first call with this idempotency_key was cancelled before it ended; use a \
new key to run it again",
            )
            .into_call_tool_result(),
        }
    }

    /// Run the tool, answer its questions through the task, and end the task.
    async fn drive(
        self,
        caller: Caller,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
        handle: TaskHandle,
    ) {
        let args = request.arguments.clone().unwrap_or_default();
        let session_id = args.get("session_id").cloned();
        let response = self.call_route(request, &ctx).await;
        let response = self
            .answer_inputs(&caller, &args, &session_id, &ctx, &handle, response)
            .await;
        let cancelled = handle.cancel_token().is_cancelled();
        if let Some((tool, status, took)) = end_with(&handle, &response, cancelled) {
            // The task's own audit line (the call that started it had its own, at once): the
            // server's words and numbers only.
            tracing::info!(
                target: "replbox::audit",
                principal = %caller.principal,
                task = %handle.id(),
                tool = %tool,
                status = %crate::tasks::status_name(status),
                duration_ms = took.as_millis() as u64,
                "task ended"
            );
        }
    }

    /// While `response` is a cell in session `session_id` waiting for input: ask for it
    /// through the task, type the answer, go on. Returns the response the task ends with.
    async fn answer_inputs(
        &self,
        caller: &Caller,
        args: &JsonObject,
        session_id: &Option<Value>,
        ctx: &RequestContext<RoleServer>,
        handle: &TaskHandle,
        mut response: Result<CallToolResponse, ErrorData>,
    ) -> Result<CallToolResponse, ErrorData> {
        let mut refused: Option<String> = None;
        while let (Ok(CallToolResponse::Complete(r)), Some(sid)) = (&response, session_id) {
            let Some(output) = awaiting_input(r) else {
                break;
            };
            let paused = response.clone();
            let mut message = asked_message(&output);
            if let Some(why) = refused.take() {
                message = format!("the answer was refused: {why}\n{message}");
            }
            let Some(question) = input_request(&message) else {
                response = self.call_route(interrupt_request(sid), ctx).await;
                break;
            };
            // The answer comes by tasks/update, unless another call (session_input,
            // session_interrupt, session_close) moves the cell on first: then this call is
            // over as a plain one would have been, paused for input, and the task says so.
            let eval = r
                .structured_content
                .as_ref()
                .and_then(|s| s.get("eval_id"))
                .and_then(Value::as_u64);
            let sid_str = sid.as_str().unwrap_or_default().to_string();
            let answered = tokio::select! {
                answer = handle.ask(question, message) => answer,
                () = self.moved_on(caller, &sid_str, eval) => {
                    // Reaped, closed or ended meanwhile: the task says so, not "waiting".
                    if let Some(e) = self.app.sessions.not_open(caller, &sid_str) {
                        response = Ok(CallToolResponse::Complete(reply::error_result(&e)));
                    }
                    break;
                }
            };
            let next = match answered {
                Ok(answer) => match read_answer(&answer) {
                    Answer::Text(text, enter) => input_call(sid, text, enter, args),
                    Answer::Malformed => {
                        refused = Some("it needs content.text, a string".into());
                        continue;
                    }
                    Answer::Declined => interrupt_request(sid),
                },
                Err(()) => interrupt_request(sid),
            };
            response = self.call_route(next, ctx).await;
            // An answer session_input refuses (a line too long) leaves the cell waiting.
            if let Some(why) = refused_answer(&response) {
                refused = Some(why);
                response = paused;
            }
        }
        response
    }

    /// Returns once the session is no longer paused on evaluation `eval` (never, when the
    /// result did not say which evaluation it was).
    async fn moved_on(&self, caller: &Caller, session_id: &str, eval: Option<u64>) {
        let Some(eval) = eval else {
            return std::future::pending().await;
        };
        // The session table has no change notification; a few checks a second are cheap
        // and a client polls the task no faster.
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(200));
        loop {
            tick.tick().await;
            if !self.app.sessions.awaits_input(caller, session_id, eval) {
                return;
            }
        }
    }

    /// One tool of the router, as `call_tool` would call it.
    async fn call_route(
        &self,
        request: CallToolRequestParams,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let tcc = ToolCallContext::new(self, request, ctx.clone());
        self.tool_router.call(tcc).await
    }

    /// `tasks/get`.
    pub(super) fn task_get(&self, caller: &Caller, id: &str) -> Result<GetTaskResult, ErrorData> {
        let task: DetailedTask = self.app.tasks.get(caller, id).map_err(task_error)?;
        Ok(GetTaskResult::new(task))
    }
}

/// End the task with the tool's answer (or as cancelled); what `TaskHandle::end` says.
fn end_with(
    handle: &TaskHandle,
    response: &Result<CallToolResponse, ErrorData>,
    cancelled: bool,
) -> Option<(String, rmcp::model::TaskStatus, std::time::Duration)> {
    match response {
        _ if cancelled => handle.end(
            TaskPayload::Cancelled,
            Some("cancelled: the work was interrupted (a session keeps its state)".into()),
        ),
        Ok(CallToolResponse::Complete(r)) => handle.end(
            TaskPayload::Completed {
                result: result_object(r),
            },
            last_line(r),
        ),
        Ok(_) => handle.end(
            TaskPayload::Failed {
                error: result_object(&ErrorData::internal_error(
                    "the tool did not complete",
                    None,
                )),
            },
            None,
        ),
        Err(e) => handle.end(
            TaskPayload::Failed {
                error: result_object(e),
            },
            None,
        ),
    }
}

/// The longest idempotency key taken.
const MAX_KEY_BYTES: usize = 200;

/// What identifies a call for its idempotency key: the tool and its arguments (the key
/// aside), objects' keys in order, hashed (SHA-256, hex: the same in the next server, which
/// reads the keys of the tasks kept in the state directory).
fn fingerprint(request: &CallToolRequestParams) -> String {
    use sha2::{Digest, Sha256};
    fn canonical(v: &Value, out: &mut String) {
        match v {
            Value::Object(o) => {
                let mut keys: Vec<&String> = o.keys().collect();
                keys.sort();
                out.push('{');
                for k in keys {
                    out.push_str(&Value::from(k.as_str()).to_string());
                    out.push(':');
                    canonical(&o[k.as_str()], out);
                    out.push(',');
                }
                out.push('}');
            }
            Value::Array(a) => {
                out.push('[');
                for x in a {
                    canonical(x, out);
                    out.push(',');
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut s = String::new();
    s.push_str(&request.name);
    if let Some(a) = &request.arguments {
        canonical(&Value::Object(a.clone()), &mut s);
    }
    Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A refused `tasks/*` request as the protocol error it is.
pub(super) fn task_error(e: TaskError) -> ErrorData {
    ErrorData::invalid_params(e.to_string(), None)
}

/// The output so far of an evaluation that paused for input, if it did.
fn awaiting_input(r: &CallToolResult) -> Option<String> {
    let s = r.structured_content.as_ref()?;
    (s.get("status")?.as_str()? == "awaiting_input")
        .then(|| s.get("output").and_then(Value::as_str).unwrap_or("").into())
}

/// What the task says while it waits: the end of what the cell printed (its prompt last).
fn asked_message(output: &str) -> String {
    let start = output
        .char_indices()
        .rev()
        .nth(ASKED_TAIL - 1)
        .map_or(0, |(i, _)| i);
    format!(
        "the program is waiting for input; answer with tasks/update (content.text is typed, then \
Enter unless content.enter is false). It printed:\n{}",
        &output[start..]
    )
}

/// The question, as an elicitation of one text field.
fn input_request(message: &str) -> Option<InputRequest> {
    let request = json!({
        "method": "elicitation/create",
        "params": {
            "mode": "form",
            "message": message,
            "requestedSchema": {
                "type": "object",
                "properties": {
                    "text": {"type": "string", "description": "typed to the program"},
                    "enter": {"type": "boolean", "description": "press Enter after it (default true)"}
                },
                "required": ["text"]
            }
        }
    });
    // A constant shape that parses (the unit test below checks it).
    serde_json::from_value(request).ok()
}

/// An answer from `tasks/update`.
#[derive(Debug, PartialEq)]
enum Answer {
    /// Type this, then Enter if true.
    Text(String, bool),
    /// The client declined or cancelled: the cell is interrupted.
    Declined,
    /// Not an answer: asked again.
    Malformed,
}

/// An elicitation result (`{"action": "accept", "content": {"text", "enter"}}`).
fn read_answer(answer: &Value) -> Answer {
    let action = answer.get("action").and_then(Value::as_str);
    if matches!(action, Some(a) if a != "accept") {
        return Answer::Declined;
    }
    let content = answer.get("content").unwrap_or(answer);
    let text = match content.get("text") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => return Answer::Malformed,
    };
    let enter = content
        .get("enter")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    Answer::Text(text, enter)
}

/// Why session_input refused an answer, when it did for the answer itself.
fn refused_answer(response: &Result<CallToolResponse, ErrorData>) -> Option<String> {
    let Ok(CallToolResponse::Complete(r)) = response else {
        return None;
    };
    let error = r.structured_content.as_ref()?.get("error")?;
    (error.get("kind")?.as_str()? == "invalid_argument").then(|| {
        error
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("")
            .into()
    })
}

/// The client's answer typed into session `session_id` as `session_input` would, with the
/// first call's `timeout_ms`.
fn input_call(
    session_id: &Value,
    text: String,
    enter: bool,
    args: &JsonObject,
) -> CallToolRequestParams {
    let mut a = JsonObject::new();
    a.insert("session_id".into(), session_id.clone());
    a.insert("text".into(), Value::from(text));
    a.insert("enter".into(), Value::from(enter));
    if let Some(t) = args.get("timeout_ms") {
        a.insert("timeout_ms".into(), t.clone());
    }
    CallToolRequestParams::new("session_input").with_arguments(a)
}

fn interrupt_request(session_id: &Value) -> CallToolRequestParams {
    let mut a = JsonObject::new();
    a.insert("session_id".into(), session_id.clone());
    CallToolRequestParams::new("session_interrupt").with_arguments(a)
}

/// The last non-empty line of a result's text, for the ended task's status message.
fn last_line(r: &CallToolResult) -> Option<String> {
    let text = r.content.first()?.as_text()?.text.as_str();
    let line = text.lines().rev().find(|l| !l.trim().is_empty())?;
    Some(line.chars().take(200).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_question_is_an_elicitation() {
        let v = serde_json::to_value(input_request("what?").unwrap()).unwrap();
        assert_eq!(v["method"], "elicitation/create");
        assert_eq!(v["params"]["message"], "what?");
        assert_eq!(v["params"]["requestedSchema"]["required"][0], "text");
    }

    #[test]
    fn answers_are_read_as_elicitation_results() {
        let accept = json!({"action": "accept", "content": {"text": "42"}});
        assert_eq!(read_answer(&accept), Answer::Text("42".into(), true));
        let no_enter = json!({"action": "accept", "content": {"text": "y", "enter": false}});
        assert_eq!(read_answer(&no_enter), Answer::Text("y".into(), false));
        assert_eq!(read_answer(&json!({"action": "decline"})), Answer::Declined);
        let empty = json!({"action": "accept", "content": {}});
        assert_eq!(read_answer(&empty), Answer::Malformed);
        assert_eq!(
            read_answer(&json!({"text": "bare"})),
            Answer::Text("bare".into(), true)
        );
    }
}
