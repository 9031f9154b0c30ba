//! One tool call from code to its upstream, through rmcp's client: the grant, the bounds
//! (calls per evaluation, calls at once, time, result size), a replay's recorded answer,
//! and what is kept of it (record, audit line, metrics). The upstream's answer is hostile
//! input: it is measured, hashed and passed on as JSON, never rendered by the server.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, JsonObject};
use rmcp::service::ServiceError;
use serde_json::{Value, json};

use super::Granted;
use super::endpoint::{Inner, Scope, refusal};
use super::instance::Live;
use super::record::{CallRecord, CallStatus, KEPT_ARGUMENTS, canonical, sha256};

/// How long past the evaluation's deadline a call may still run (the interrupt acts first).
const DEADLINE_GRACE: Duration = Duration::from_secs(1);

/// Longest error text passed on from an upstream (its own words), in characters.
const MAX_ERROR: usize = 4000;

/// The code's connection closing (it gave up on the call).
type HungUp<'a> = std::pin::Pin<&'a mut (dyn std::future::Future<Output = ()> + Send + 'a)>;

/// Answer one call: the reply for the code, and whether the code hung up meanwhile.
pub(super) async fn call(
    inner: &Inner,
    server: String,
    tool: String,
    arguments: Value,
    mut gone: HungUp<'_>,
) -> (Value, bool) {
    let started = Instant::now();
    let canon = canonical(&arguments);
    let mut rec = CallRecord {
        arguments: (canon.len() <= KEPT_ARGUMENTS).then(|| arguments.clone()),
        arguments_sha256: sha256(canon.as_bytes()),
        server,
        tool,
        status: CallStatus::Refused,
        duration_ms: 0,
        result_sha256: None,
        result_bytes: 0,
        result: None,
        error: None,
        replayed: false,
    };
    let mut hung_up = false;
    let (reply, kept) = answer(inner, &mut rec, arguments, &mut gone, &mut hung_up).await;
    rec.duration_ms = started.elapsed().as_millis() as u64;
    audit(inner, &rec, started.elapsed());
    if kept {
        inner.keep(rec);
    }
    (reply, hung_up)
}

/// The reply, and whether the call is one of the evaluation's (a call outside any
/// evaluation is not).
async fn answer(
    inner: &Inner,
    rec: &mut CallRecord,
    arguments: Value,
    gone: &mut HungUp<'_>,
    hung_up: &mut bool,
) -> (Value, bool) {
    let Some(scope) = inner.scope() else {
        let m = "tool calls are answered only while a cell (or a run) is being evaluated, \
                 not from code left running after it ended"
            .to_string();
        return (refuse(rec, m), false);
    };
    let (args, granted) = match admit(inner, &scope, rec, arguments) {
        Ok(admitted) => admitted,
        Err(refused) => return (refused, true),
    };
    let limits = &inner.shared.limits;
    if let Some(recorded) = scope.recorded(&rec.server, &rec.tool, &rec.arguments_sha256)
        && let Some(result) = recorded.result.clone()
    {
        *rec = CallRecord {
            replayed: true,
            ..recorded
        };
        return (result_reply(rec, result, limits.max_result_bytes), true);
    }
    // A place among the calls in flight, within the evaluation's time.
    let permit = tokio::select! {
        p = inner.concurrent.clone().acquire_owned() => p.ok(),
        _ = gone.as_mut() => { *hung_up = true; None },
        _ = scope.cancel.cancelled() => None,
        _ = tokio::time::sleep_until(scope.deadline + DEADLINE_GRACE) => None,
    };
    let Some(_permit) = permit else {
        rec.status = CallStatus::Cancelled;
        let m = "the evaluation ended while the call waited for a place (--mcp-max-concurrent)";
        rec.error = Some(m.into());
        return (error_reply("cancelled", m.into(), None), true);
    };
    let live = match live_with_tool(granted, rec).await {
        Ok(live) => live,
        Err(reply) => return (reply, true),
    };
    let call = Call {
        inner,
        scope: &scope,
        granted,
        live: &live,
    };
    (call.send(rec, args, gone, hung_up).await, true)
}

/// Refuse the call before anything was called.
fn refuse(rec: &mut CallRecord, m: String) -> Value {
    rec.status = CallStatus::Refused;
    rec.error = Some(m.clone());
    refusal(m)
}

/// The checks that need no upstream, in order: the arguments' shape, the server granted
/// and the tool allowed, and the evaluation's count of calls (this call counts from here).
/// The arguments and the grant, or the refusal.
fn admit<'a>(
    inner: &'a Inner,
    scope: &Scope,
    rec: &mut CallRecord,
    arguments: Value,
) -> Result<(Option<JsonObject>, &'a Granted), Value> {
    let args = match arguments {
        Value::Object(m) => Some(m),
        Value::Null => None,
        _ => {
            let m = format!(
                "{}.{}: the arguments must be an object",
                rec.server, rec.tool
            );
            return Err(refuse(rec, m));
        }
    };
    let Some(granted) = inner.access.get(&rec.server) else {
        let m = format!(
            "no MCP server {:?} for this code (it may call: {}); name the servers in \
             mcp_servers when starting the session or run",
            rec.server,
            inner.access.names().join(", ")
        );
        return Err(refuse(rec, m));
    };
    if !granted.tools.allows(&rec.tool) {
        let m = format!(
            "{}.{} is not among the tools the server's operator lets you call",
            rec.server, rec.tool
        );
        return Err(refuse(rec, m));
    }
    let max_calls = inner.shared.limits.max_calls;
    if !scope.count(max_calls) {
        let m = format!(
            "this evaluation made {} tool calls, the most one may (--mcp-max-calls); \
             split the work over several cells",
            max_calls
        );
        return Err(refuse(rec, m));
    }
    Ok((args, granted))
}

/// The granted server's running instance (started if it is not), when it lists the tool;
/// else the reply that says why not.
async fn live_with_tool(granted: &Granted, rec: &mut CallRecord) -> Result<Arc<Live>, Value> {
    let live = match granted.instance.get().await {
        Ok(l) => l,
        Err(e) => {
            let e = e.to_string();
            rec.status = CallStatus::Failed;
            rec.error = Some(e.clone());
            return Err(error_reply("failed", e, None));
        }
    };
    if live.tool(&rec.tool).is_none() {
        let names: Vec<&str> = live
            .tools
            .iter()
            .filter(|t| granted.tools.allows(&t.name))
            .map(|t| t.name.as_ref())
            .collect();
        let m = format!(
            "MCP server {} has no tool {:?}; its tools: {}",
            rec.server,
            rec.tool,
            names.join(", ")
        );
        return Err(refuse(rec, m));
    }
    Ok(live)
}

/// An admitted call, with its place among the calls in flight, to the instance that
/// lists its tool.
struct Call<'a> {
    inner: &'a Inner,
    scope: &'a Scope,
    granted: &'a Granted,
    live: &'a Arc<Live>,
}

impl Call<'_> {
    /// Send the call and wait for the upstream's answer, within the call's time: the reply
    /// for its result, or the one that says why there is none.
    async fn send(
        &self,
        rec: &mut CallRecord,
        args: Option<JsonObject>,
        gone: &mut HungUp<'_>,
        hung_up: &mut bool,
    ) -> Value {
        let limits = &self.inner.shared.limits;
        // Past the evaluation's deadline the interpreter interrupts the code (which closes
        // the connection) and the scope ends: the call's own timeout leaves them a moment.
        let timeout = Duration::from_millis(limits.call_timeout_ms).min(
            (self.scope.deadline + DEADLINE_GRACE)
                .saturating_duration_since(tokio::time::Instant::now()),
        );
        let mut params = CallToolRequestParams::new(rec.tool.clone());
        params.arguments = args;
        // Dropping the call (cancel, timeout) sends the upstream notifications/cancelled.
        let outcome = tokio::select! {
            r = self.live.peer().call_tool(params) => Some(r),
            _ = gone.as_mut() => { *hung_up = true; None },
            _ = self.scope.cancel.cancelled() => None,
            _ = tokio::time::sleep(timeout) => {
                rec.status = CallStatus::Timeout;
                let m = format!(
                    "{}.{} did not answer within {} ms ({})",
                    rec.server,
                    rec.tool,
                    timeout.as_millis(),
                    if timeout.as_millis() as u64 >= limits.call_timeout_ms {
                        "--mcp-call-timeout-ms"
                    } else {
                        "the evaluation's deadline"
                    }
                );
                rec.error = Some(m.clone());
                return error_reply("timeout", m, None);
            }
        };
        let Some(outcome) = outcome else {
            rec.status = CallStatus::Cancelled;
            let m = format!(
                "{}.{}: cancelled, {}",
                rec.server,
                rec.tool,
                if *hung_up {
                    "the code stopped waiting for it (interrupted)"
                } else {
                    "the evaluation ended"
                }
            );
            rec.error = Some(m.clone());
            return error_reply("cancelled", m, None);
        };
        match outcome {
            Ok(result) => {
                let value = serde_json::to_value(&result).unwrap_or(Value::Null);
                result_reply(rec, value, limits.max_result_bytes)
            }
            Err(e) => {
                rec.status = CallStatus::Failed;
                let m = self.failure(rec, e).await;
                rec.error = Some(m.clone());
                error_reply("failed", m, None)
            }
        }
    }

    /// What the code is told of a call that failed; an instance whose transport closed is
    /// let go, to be started again at the next call.
    async fn failure(&self, rec: &CallRecord, e: ServiceError) -> String {
        match e {
            ServiceError::McpError(e) => format!(
                "{}.{} failed: {}",
                rec.server,
                rec.tool,
                cut(&e.message, MAX_ERROR)
            ),
            ServiceError::TransportClosed => {
                self.granted.instance.reset(self.live).await;
                format!(
                    "MCP server {} ended during the call; it is started again at the next call",
                    rec.server
                )
            }
            other => {
                tracing::warn!(who = %self.inner.who, server = %rec.server, "tool call failed: {other}");
                format!(
                    "{}.{} failed (the server's log says why)",
                    rec.server, rec.tool
                )
            }
        }
    }
}

/// The reply for a result (`isError` or not), after its size is checked; fills the record.
fn result_reply(rec: &mut CallRecord, result: Value, limit: usize) -> Value {
    let text = result.to_string();
    rec.result_bytes = text.len() as u64;
    rec.result_sha256 = Some(sha256(text.as_bytes()));
    // The operator's bound, for a replayed record too.
    if text.len() > limit {
        rec.status = CallStatus::TooLarge;
        let m = format!(
            "the result of {}.{} is {} bytes, over the {} this server hands to code \
             (--mcp-max-result-bytes); ask the tool for less (a page, a filter)",
            rec.server,
            rec.tool,
            text.len(),
            limit
        );
        rec.error = Some(m.clone());
        return error_reply("too_large", m, None);
    }
    if result.get("isError") == Some(&Value::Bool(true)) {
        rec.status = CallStatus::ToolError;
        let message = error_text(&result);
        rec.error = Some(cut(&message, 200));
        rec.result = Some(result.clone());
        return error_reply("tool_error", message, Some(result));
    }
    rec.status = CallStatus::Ok;
    rec.result = Some(result.clone());
    json!({"ok": true, "result": result})
}

/// The text of an `isError` result: its text blocks, joined.
fn error_text(result: &Value) -> String {
    let text: Vec<&str> = result["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["text"].as_str())
        .collect();
    let t = text.join("\n");
    if t.is_empty() {
        "the tool reported an error".into()
    } else {
        cut(&t, MAX_ERROR)
    }
}

fn error_reply(kind: &str, message: String, result: Option<Value>) -> Value {
    let mut e = json!({"kind": kind, "message": message});
    if let Some(r) = result {
        e["result"] = r;
    }
    json!({"ok": false, "error": e})
}

fn cut(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// The call's audit line and metrics: the server's words, the operator's server names, and
/// a tool name only when it is one the upstream lists in the usual shape.
fn audit(inner: &Inner, rec: &CallRecord, took: Duration) {
    let tool = if rec.tool.len() <= 128
        && rec
            .tool
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'/'))
    {
        rec.tool.as_str()
    } else {
        "invalid"
    };
    let server = if inner.access.get(&rec.server).is_some() {
        rec.server.as_str()
    } else {
        "unknown"
    };
    tracing::info!(
        target: "replbox::audit",
        principal = %inner.access.principal,
        who = %inner.who,
        server,
        tool,
        status = rec.status.word(),
        duration_ms = took.as_millis() as u64,
        bytes = rec.result_bytes,
        replayed = rec.replayed,
        "upstream tool call"
    );
    if let Some(m) = &inner.shared.metrics {
        m.upstream_call(server, rec.status.word(), took.as_secs_f64());
    }
}
