//! Code mode's seams in a session's life: the servers it may call (at start), its channel
//! to them, the scope of one evaluation (in which calls are answered) and the calls it made
//! (into the history and the journal). The rest lives in `crate::upstream`.

use std::sync::Arc;

use super::live::Session;
use crate::error::ToolError;
use crate::identity::Caller;
use crate::upstream::{Access, CallRecord, Channel, ScopeGuard, Upstreams};

/// What `caller` may call of the servers it asked for (None: it asked for none).
pub(super) async fn access(
    upstreams: Option<&Arc<Upstreams>>,
    caller: &Caller,
    asked: &[String],
) -> Result<Option<Arc<Access>>, ToolError> {
    match upstreams {
        Some(u) => u.access(caller, asked).await,
        None if asked.is_empty() => Ok(None),
        None => Err(ToolError::invalid(
            "mcp_servers: this server has no MCP servers for code to call",
        )),
    }
}

/// The channel of session `id`, whose code runs as `uid`.
pub(super) fn channel(
    upstreams: Option<&Arc<Upstreams>>,
    access: Option<Arc<Access>>,
    id: &str,
    uid: Option<u32>,
) -> Result<Option<Arc<Channel>>, ToolError> {
    let (Some(access), Some(u)) = (access, upstreams) else {
        return Ok(None);
    };
    Ok(Some(Arc::new(u.channel(
        access,
        &format!("session {id}"),
        uid,
    )?)))
}

/// Answer the session's tool calls for evaluation `eval_id` while the guard lives (within
/// `deadline`); `replay`: the calls the journal recorded for it.
pub(super) fn begin(
    session: &Session,
    eval_id: u64,
    deadline: tokio::time::Instant,
    replay: Vec<CallRecord>,
) -> Option<ScopeGuard> {
    session
        .tools
        .as_ref()
        .map(|t| t.begin(eval_id, deadline, replay))
}

/// The calls evaluation `eval_id` made (taken).
pub(super) fn calls(session: &Session, eval_id: u64) -> Vec<CallRecord> {
    session
        .tools
        .as_ref()
        .map(|t| t.take_calls(eval_id))
        .unwrap_or_default()
}
